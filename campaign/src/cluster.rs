//! The system under test, all on loopback: 3 etcd members, two lease-proxy replicas and
//! fence-gateway (SQLite marks) in front of the recording storage, with a fault relay on every
//! client→proxy, proxy→gateway and proxy→etcd path, and on the gateway→storage hop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use fencing::{KeyId, Keyring};
use lease_proxy_testkit::{free_port, signal_pid, workspace_binary, Etcd};

use crate::relay::{Mode, Relay};
use crate::storage::Storage;

/// A negative control: a deliberately broken deployment the checker must catch. Test-only.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Control {
    /// The real deployment.
    None,
    /// No enforcer: proxies forward, and clients write, straight to storage; no pre-fence.
    NoFencing,
    /// The enforcer keeps its marks in memory only, so a restart forgets them.
    MemoryMarks,
    /// The enforcer forgets in-flight writes early: `--upstream-timeout` below the storage's
    /// shortest processing time and `--write-grace 1ms`, so a write still being applied no
    /// longer holds its resource closed to higher tokens.
    ForgetInFlight,
}

/// What the deployment is made of, besides the control.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The deployment or a negative control.
    pub control: Control,
    /// The run's seed (the storage draws its processing times from it).
    pub seed: u64,
    /// The storage's processing time per write: shortest and longest.
    pub processing: (Duration, Duration),
}

/// The gateway's write grace in the real deployment: above the storage's longest processing
/// time plus the longest delay fault on the storage hop (the storage must finish a write within
/// the grace after its exchange ended).
pub const WRITE_GRACE: Duration = Duration::from_secs(2);

/// One restartable process.
pub struct Proc {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    ready_url: String,
    child: Mutex<Option<Child>>,
}

impl Proc {
    fn new(name: &str, program: PathBuf, args: Vec<String>, dir: &Path, ready_url: String) -> Self {
        Self {
            name: name.to_owned(),
            program,
            args,
            log: dir.join(format!("{name}.log")),
            ready_url,
            child: Mutex::new(None),
        }
    }

    /// The process name, for reports.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.child
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts the process and waits until it is ready.
    pub async fn start(&self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        {
            // Two overlapping faults may restart the same process: a start replaces whatever
            // runs (under the lock, so that no process is ever lost track of — it would keep
            // running, untouched by later faults, and outlive the run).
            let mut slot = self.slot();
            if let Some(mut earlier) = slot.take() {
                let _ = earlier.kill();
                let _ = earlier.wait();
            }
            let child = Command::new(&self.program)
                .args(&self.args)
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {}", self.name))?;
            *slot = Some(child);
        }
        wait_ready(&self.ready_url, Duration::from_secs(30))
            .await
            .with_context(|| format!("{} not ready; see {}", self.name, self.log.display()))
    }

    /// SIGKILLs the process.
    pub fn kill(&self) {
        if let Some(mut c) = self.slot().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`).
    pub fn signal(&self, signal: &str) {
        if let Some(c) = self.slot().as_ref() {
            signal_pid(c.id(), signal);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.signal("CONT");
        self.kill();
    }
}

async fn wait_ready(url: &str, within: Duration) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()?;
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{url} not ready within {within:?}")
}

/// Everything one proxy replica talks through.
pub struct ProxyPaths {
    /// Clients → this proxy.
    pub clients: Relay,
    /// This proxy → the gateway (forwards and pre-fences).
    pub gateway: Relay,
    /// This proxy → each etcd member.
    pub etcd: Vec<Relay>,
}

impl ProxyPaths {
    /// Every relay of this proxy.
    pub fn all(&self) -> impl Iterator<Item = &Relay> {
        [&self.clients, &self.gateway]
            .into_iter()
            .chain(self.etcd.iter())
    }
}

/// The running deployment.
pub struct Cluster {
    /// The etcd members.
    pub etcd: tokio::sync::Mutex<Etcd>,
    /// The lease-proxy replicas.
    pub proxies: Vec<Arc<Proc>>,
    /// Each replica's relays, by replica index.
    pub paths: Vec<ProxyPaths>,
    /// The enforcer (absent with [`Control::NoFencing`]).
    pub gateway: Option<Arc<Proc>>,
    /// The enforcer's own URL (not relayed).
    pub gateway_url: String,
    /// The storage.
    pub storage: Storage,
    /// The signing keys shared by proxies and gateway.
    pub keys: Keyring,
    /// Clients → the gateway (or the storage without fencing): direct writes.
    pub direct: Relay,
    /// The gateway → the storage (the gateway's `--upstream`).
    pub storage_path: Relay,
    _dir: tempfile::TempDir,
}

fn addr(url: &str) -> anyhow::Result<SocketAddr> {
    Ok(url.trim_start_matches("http://").parse()?)
}

impl Cluster {
    /// Starts everything and waits until it is ready.
    pub async fn start(shape: Shape) -> anyhow::Result<Self> {
        let control = shape.control;
        let dir = tempfile::Builder::new().prefix("campaign-").tempdir()?;
        let key_file = dir.path().join("fencing.key");
        Keyring::create_file(&key_file, &KeyId::parse("c1").context("key id")?)?;
        let keys = Keyring::load(&key_file)?;
        let storage = Storage::start(
            Keyring::load(&key_file)?,
            shape.processing,
            crate::plan::stream(shape.seed, "storage", 0),
        )
        .await?;
        let storage_path = Relay::start(addr(storage.url())?).await?;
        let etcd = Etcd::cluster(3).await;

        let gateway_port = free_port();
        let gateway_url = format!("http://127.0.0.1:{gateway_port}");
        let gateway = match control {
            Control::NoFencing => None,
            Control::None | Control::MemoryMarks | Control::ForgetInFlight => {
                let store = match control {
                    Control::MemoryMarks => "memory".to_owned(),
                    _ => format!("sqlite:{}", dir.path().join("marks.db").display()),
                };
                let mut args = vec![
                    "--listen".into(),
                    format!("127.0.0.1:{gateway_port}"),
                    "--upstream".into(),
                    storage_path.url(),
                    "--store".into(),
                    store,
                    "--key-file".into(),
                    key_file.display().to_string(),
                    "--drain-timeout".into(),
                    "1s".into(),
                ];
                if control == Control::ForgetInFlight {
                    let below = (shape.processing.0 / 2).max(Duration::from_millis(1));
                    args.extend([
                        "--write-grace".into(),
                        "1ms".into(),
                        "--upstream-timeout".into(),
                        format!("{}ms", below.as_millis()),
                    ]);
                } else {
                    // Above the storage's processing time (tens of milliseconds), short enough
                    // that uncertain writes (clients killed mid-request, resets) do not stall
                    // new holders for long.
                    args.extend([
                        "--write-grace".into(),
                        humantime::format_duration(WRITE_GRACE).to_string(),
                    ]);
                }
                let p = Arc::new(Proc::new(
                    "fence-gateway",
                    workspace_binary("fence-gateway"),
                    args,
                    dir.path(),
                    format!("{gateway_url}/readyz"),
                ));
                p.start().await?;
                Some(p)
            }
        };
        let protected = match &gateway {
            Some(_) => gateway_url.clone(),
            None => storage.url().to_owned(),
        };

        let mut proxies = Vec::new();
        let mut paths = Vec::new();
        for i in 0..2 {
            let port = free_port();
            let clients = Relay::start(addr(&format!("http://127.0.0.1:{port}"))?).await?;
            let to_gateway = Relay::start(addr(&protected)?).await?;
            let mut to_etcd = Vec::new();
            for url in etcd.endpoints() {
                to_etcd.push(Relay::start(addr(&url)?).await?);
            }
            let endpoints: Vec<String> = to_etcd.iter().map(Relay::url).collect();
            let mut args = vec![
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--etcd-endpoints".into(),
                endpoints.join(","),
                "--key-file".into(),
                key_file.display().to_string(),
                "--data-dir".into(),
                dir.path().join(format!("proxy-{i}")).display().to_string(),
                "--etcd-timeout".into(),
                "2s".into(),
                "--forward-timeout".into(),
                "3s".into(),
                "--drain-timeout".into(),
                "1s".into(),
                "--upstream".into(),
                to_gateway.url(),
            ];
            if gateway.is_some() {
                args.push("--prefence-url".into());
                args.push(to_gateway.url());
            }
            let p = Arc::new(Proc::new(
                &format!("lease-proxy-{i}"),
                workspace_binary("lease-proxy"),
                args,
                dir.path(),
                format!("http://127.0.0.1:{port}/readyz"),
            ));
            p.start().await?;
            proxies.push(p);
            paths.push(ProxyPaths {
                clients,
                gateway: to_gateway,
                etcd: to_etcd,
            });
        }
        let direct = Relay::start(addr(&protected)?).await?;
        Ok(Self {
            etcd: tokio::sync::Mutex::new(etcd),
            proxies,
            paths,
            direct,
            storage_path,
            gateway,
            gateway_url,
            storage,
            keys,
            _dir: dir,
        })
    }

    /// The URLs clients reach the proxies at (through their relays).
    pub fn proxy_urls(&self) -> Vec<String> {
        self.paths.iter().map(|p| p.clients.url()).collect()
    }

    /// Undoes every fault: relays pass, paused processes continue, everything is running and
    /// ready, etcd has a leader.
    pub async fn heal(&self) -> anyhow::Result<()> {
        for relay in self
            .paths
            .iter()
            .flat_map(ProxyPaths::all)
            .chain([&self.direct, &self.storage_path])
        {
            relay.set(Mode::Pass);
        }
        {
            let etcd = self.etcd.lock().await;
            for i in 0..3 {
                etcd.signal(i, "CONT");
            }
            if etcd.wait_leader(Duration::from_secs(20)).await.is_none() {
                bail!("etcd has no leader after healing");
            }
        }
        for p in self.proxies.iter().chain(self.gateway.iter()) {
            p.signal("CONT");
            if p.slot().is_none() {
                p.start().await?;
            }
            wait_ready(&p.ready_url, Duration::from_secs(20)).await?;
        }
        Ok(())
    }
}
