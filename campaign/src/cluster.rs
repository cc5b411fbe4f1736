//! The system under test, all on loopback: 3 etcd members, two lease-proxy replicas (and a third
//! that stays idle for 30 s before it serves), two fence-gateways sharing their marks in a private
//! PostgreSQL (or one gateway on SQLite) in front of the recording storage, with a fault relay on
//! every client→proxy, proxy→gateway, client→gateway and proxy→etcd path, and on the
//! gateway→storage hop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use fencing::{KeyId, Keyring};
use lease_proxy_testkit::{feature_binary, free_port, signal_pid, workspace_binary, Etcd};

use crate::postgres::Postgres;
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
    /// The enforcer ends a write's permit with the caller's request (`fence-gateway-control
    /// --negative-control release-with-caller`): a client that gives up frees the resource
    /// while the storage is still applying its write.
    ReleaseWithCaller,
    /// The gateways share their marks in PostgreSQL but not their writes in flight
    /// (`--negative-control local-gate`): one gateway raises over another's write in flight,
    /// as when a killed session's lock vanished.
    LocalGate,
    /// The proxies do not pre-fence: a grant is announced before the enforcer's mark is raised.
    NoPrefence,
    /// A gateway's exchange deadline counts from when it reads its admission, and a late answer
    /// is taken (`--negative-control deadline-from-admission`): a gateway paused between a
    /// write's registration and its answer delivers the write after the registration lapsed.
    DeadlineFromAdmission,
    /// The clients that lock with etcd's Mutex recipe over gRPC never exchange their lock for
    /// a fencing token (`/v3/lock/token`): they write straight to the storage, unfenced; client
    /// pauses go for them.
    UnexchangedLocks,
    /// In the [`Marks::InDatabase`] deployment, the table is never protected
    /// (`fencing.protect`): the SQL clients present their tokens and the proxies raise the
    /// marks, but nothing in the database checks a write.
    TriggerRemoved,
    /// The proxies are `lease-proxy-controls` (the proxy built with its `negative-controls`
    /// feature) with `LEASE_PROXY_NEGATIVE_CONTROL=no-revoke-before-grant`: a fleet grants a
    /// resource to its next member while another still holds it, overwriting that grant. Needs
    /// a fleet.
    NoRevokeBeforeGrant,
}

impl Control {
    /// The lease-proxy binary the deployment runs, and the environment it runs with: the
    /// proxy's own negative controls exist only in a build of their own.
    fn proxy(self) -> (PathBuf, Vec<(String, String)>) {
        match self {
            Control::NoRevokeBeforeGrant => (
                feature_binary("lease-proxy", "lease-proxy-controls", "negative-controls"),
                vec![(
                    "LEASE_PROXY_NEGATIVE_CONTROL".into(),
                    "no-revoke-before-grant".into(),
                )],
            ),
            _ => (workspace_binary("lease-proxy"), Vec::new()),
        }
    }
}

/// Which faults a run draws from.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Faults {
    /// Every kind the deployment has (the campaign).
    #[default]
    All,
    /// Only [`Fault::GatewayPauseMidAdmission`](crate::nemesis::Fault), every few seconds, on
    /// gateways whose registrations are short ([`PAUSED_TIMING`]), so that a pause can outlast
    /// one within a few seconds.
    PausedAdmissions,
}

/// The gateways' timing: `--upstream-timeout`, `--write-grace`, `--store-timeout`.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// `--upstream-timeout`.
    pub upstream: Duration,
    /// `--write-grace`.
    pub grace: Duration,
    /// `--store-timeout`.
    pub store: Duration,
}

/// The timing of the campaign's gateways: a registration lasts 17 s.
pub const TIMING: Timing = Timing {
    upstream: UPSTREAM_TIMEOUT,
    grace: WRITE_GRACE,
    store: Duration::from_secs(2),
};

/// The timing under [`Faults::PausedAdmissions`]: a registration lasts 1 + 2 + 1 = 4 s; the
/// storage's processing stays far below the grace (its writes take at most 60 ms; the paused
/// write, [`Shape::paused_write`], 1.5 s).
pub const PAUSED_TIMING: Timing = Timing {
    upstream: Duration::from_secs(1),
    grace: Duration::from_secs(2),
    store: Duration::from_secs(1),
};

/// Where the gateways keep their marks.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Marks {
    /// Two gateways sharing a private PostgreSQL (session kills and restarts in the plan).
    Postgres,
    /// One gateway on a SQLite file.
    Sqlite,
    /// No gateway: the storage is a private PostgreSQL fenced inside the database, written by
    /// SQL clients in their own transactions ([`crate::indb`]).
    InDatabase,
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
    /// Where the marks live.
    pub marks: Marks,
    /// Which faults the run draws from.
    pub faults: Faults,
}

impl Shape {
    /// The gateways' timing.
    pub fn timing(&self) -> Timing {
        match self.faults {
            Faults::All => TIMING,
            Faults::PausedAdmissions => PAUSED_TIMING,
        }
    }

    /// How long the storage takes to apply the write of a holder whose gateway is paused
    /// mid-admission: three quarters of the write grace, within what the storage promises.
    pub fn paused_write(&self) -> Duration {
        self.timing().grace * 3 / 4
    }

    /// How many gateways the deployment runs: none without fencing, one with memory marks or
    /// SQLite, two sharing PostgreSQL.
    pub fn gateways(&self) -> usize {
        match (self.control, self.marks) {
            (Control::NoFencing, _) | (_, Marks::InDatabase) => 0,
            (Control::MemoryMarks, _) | (_, Marks::Sqlite) => 1,
            (_, Marks::Postgres) => 2,
        }
    }

    /// Whether the marks are in the private PostgreSQL.
    pub fn on_postgres(&self) -> bool {
        self.gateways() == 2
    }
}

/// The gateway's write grace in the real deployment. It must exceed the storage's longest
/// processing time — the slow writes of stalled clients ([`crate::client::SLOW_WRITE`]) — plus
/// the longest delay fault on the storage hop: the storage must finish a write within the grace
/// after its exchange ended (e.g. its connection was reset after the body arrived). A shorter
/// grace is a misconfigured deployment, and the campaign shows it (seed 7 with a 2 s grace:
/// a stalled write reset at 4.4 s was applied at 9 s, after a newer holder's).
pub const WRITE_GRACE: Duration = Duration::from_secs(7);

/// The gateways' `--upstream-timeout`: above the slowest write, so that a slow write is not cut
/// off (and left uncertain) only for being slow.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(8);

/// One restartable process.
pub struct Proc {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    ready_url: String,
    env: Vec<(String, String)>,
    child: Mutex<Option<Child>>,
}

impl Proc {
    pub(crate) fn new(
        name: &str,
        program: PathBuf,
        args: Vec<String>,
        dir: &Path,
        ready_url: String,
    ) -> Self {
        Self {
            name: name.to_owned(),
            program,
            args,
            log: dir.join(format!("{name}.log")),
            ready_url,
            env: Vec::new(),
            child: Mutex::new(None),
        }
    }

    /// The same, run with these environment variables too.
    pub(crate) fn with_env(mut self, env: Vec<(String, String)>) -> Self {
        self.env = env;
        self
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
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {}", self.name))?;
            *slot = Some(child);
        }
        let ready = wait_ready(&self.ready_url, Duration::from_secs(30));
        tokio::pin!(ready);
        let mut exit_check = tokio::time::interval(Duration::from_millis(100));
        let failure = loop {
            tokio::select! {
                outcome = &mut ready => match outcome {
                    Ok(()) => return Ok(()),
                    Err(e) => break e,
                },
                _ = exit_check.tick() => {
                    let exited = self.slot().as_mut().and_then(|c| c.try_wait().ok().flatten());
                    if let Some(status) = exited {
                        break anyhow::anyhow!("exited before it was ready ({status})");
                    }
                }
            }
        };
        // The run's directory goes with the run: the error carries what the process said.
        Err(failure.context(format!(
            "{} not ready; the end of {}:\n{}",
            self.name,
            self.log.display(),
            log_tail(&self.log)
        )))
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

/// The last lines of a process's log.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Waits until `url` answers 2xx.
pub async fn wait_ready(url: &str, within: Duration) -> anyhow::Result<()> {
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

/// How long the idle replica serves nothing before the run uses it: etcd connections left alone
/// this long with default keepalive settings must still work.
pub const IDLE: Duration = Duration::from_secs(30);

/// The running deployment.
pub struct Cluster {
    /// The etcd members.
    pub etcd: tokio::sync::Mutex<Etcd>,
    /// The lease-proxy replicas clients use from the start.
    pub proxies: Vec<Arc<Proc>>,
    /// Each replica's relays, by replica index.
    pub paths: Vec<ProxyPaths>,
    /// A third replica nobody uses until it has been idle for [`IDLE`] (no relays, no faults).
    pub idle: Arc<Proc>,
    /// Its URL.
    pub idle_url: String,
    /// The enforcers (none with [`Control::NoFencing`]); proxy *i* uses gateway *i* mod their
    /// number.
    pub gateways: Vec<Arc<Proc>>,
    /// The enforcers' own URLs (not relayed), by gateway index.
    pub gateway_urls: Vec<String>,
    /// The storage.
    pub storage: Storage,
    /// The signing keys shared by proxies and gateways.
    pub keys: Keyring,
    /// Clients → each gateway (or the storage without fencing): direct writes.
    pub direct: Vec<Relay>,
    /// The gateways → the storage (their `--upstream`).
    pub storage_path: Relay,
    /// The gateways' shared mark store, when on PostgreSQL.
    pub postgres: Option<Postgres>,
    /// What the deployment was made of.
    pub shape: Shape,
    sqlite: Option<PathBuf>,
    _dir: tempfile::TempDir,
}

fn addr(url: &str) -> anyhow::Result<SocketAddr> {
    Ok(url.trim_start_matches("http://").parse()?)
}

/// The PostgreSQL `application_name` of gateway `i`'s sessions.
pub fn gateway_app(i: usize) -> String {
    format!("fence-gateway-{i}")
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
        let postgres = if shape.on_postgres() {
            Some(Postgres::start().await?)
        } else {
            None
        };
        let sqlite = dir.path().join("marks.db");

        let mut gateways = Vec::new();
        let mut gateway_urls = Vec::new();
        for i in 0..shape.gateways() {
            let port = free_port();
            let url = format!("http://127.0.0.1:{port}");
            let store = match (&postgres, control) {
                (_, Control::MemoryMarks) => "memory".to_owned(),
                (Some(pg), _) => pg.url(&gateway_app(i)),
                (None, _) => format!("sqlite:{}", sqlite.display()),
            };
            let mut args = vec![
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--upstream".into(),
                storage_path.url(),
                "--store".into(),
                store,
                "--key-file".into(),
                key_file.display().to_string(),
                "--drain-timeout".into(),
                "1s".into(),
                "--store-timeout".into(),
                humantime::format_duration(shape.timing().store).to_string(),
            ];
            match control {
                Control::ForgetInFlight => {
                    let below = (shape.processing.0 / 2).max(Duration::from_millis(1));
                    args.extend([
                        "--write-grace".into(),
                        "1ms".into(),
                        "--upstream-timeout".into(),
                        format!("{}ms", below.as_millis()),
                    ]);
                }
                _ => {
                    args.extend([
                        "--write-grace".into(),
                        humantime::format_duration(shape.timing().grace).to_string(),
                        "--upstream-timeout".into(),
                        humantime::format_duration(shape.timing().upstream).to_string(),
                    ]);
                }
            }
            match control {
                Control::ReleaseWithCaller => {
                    args.extend(["--negative-control".into(), "release-with-caller".into()]);
                }
                Control::LocalGate => {
                    args.extend(["--negative-control".into(), "local-gate".into()]);
                }
                Control::DeadlineFromAdmission => {
                    args.extend([
                        "--negative-control".into(),
                        "deadline-from-admission".into(),
                    ]);
                }
                _ => {}
            }
            // A gateway broken on purpose is fence-gateway's test-only twin (never shipped).
            let broken = args.iter().any(|a| a == "--negative-control");
            let program = if broken {
                "fence-gateway-control"
            } else {
                "fence-gateway"
            };
            let name = if shape.gateways() == 1 {
                "fence-gateway".to_owned()
            } else {
                format!("fence-gateway-{i}")
            };
            let p = Arc::new(Proc::new(
                &name,
                workspace_binary(program),
                args,
                dir.path(),
                format!("{url}/readyz"),
            ));
            p.start().await?;
            gateways.push(p);
            gateway_urls.push(url);
        }
        // Where writes go: the gateways, or the storage itself without fencing.
        let protected: Vec<String> = if gateway_urls.is_empty() {
            vec![storage.url().to_owned()]
        } else {
            gateway_urls.clone()
        };

        let (proxy_bin, proxy_env) = control.proxy();
        let mut proxies = Vec::new();
        let mut paths = Vec::new();
        for i in 0..2 {
            let port = free_port();
            let clients = Relay::start(addr(&format!("http://127.0.0.1:{port}"))?).await?;
            let to_gateway = Relay::start(addr(&protected[i % protected.len()])?).await?;
            let mut to_etcd = Vec::new();
            for url in etcd.endpoints() {
                to_etcd.push(Relay::start(addr(&url)?).await?);
            }
            let endpoints: Vec<String> = to_etcd.iter().map(Relay::url).collect();
            let prefence = !gateways.is_empty() && control != Control::NoPrefence;
            let args = proxy_args(
                port,
                &endpoints,
                &key_file,
                &dir.path().join(format!("proxy-{i}")),
                &to_gateway.url(),
                prefence,
            );
            let p = Arc::new(
                Proc::new(
                    &format!("lease-proxy-{i}"),
                    proxy_bin.clone(),
                    args,
                    dir.path(),
                    format!("http://127.0.0.1:{port}/readyz"),
                )
                .with_env(proxy_env.clone()),
            );
            p.start().await?;
            proxies.push(p);
            paths.push(ProxyPaths {
                clients,
                gateway: to_gateway,
                etcd: to_etcd,
            });
        }
        // The idle replica: default settings towards etcd, straight to every member.
        let idle_port = free_port();
        let idle_url = format!("http://127.0.0.1:{idle_port}");
        // Every replica decides for the fleets, this one too: under a proxy control it is as
        // broken as the others.
        let idle = Arc::new(
            Proc::new(
                "lease-proxy-idle",
                proxy_bin,
                proxy_args(
                    idle_port,
                    &etcd.endpoints(),
                    &key_file,
                    &dir.path().join("proxy-idle"),
                    &protected[0],
                    !gateways.is_empty() && control != Control::NoPrefence,
                ),
                dir.path(),
                format!("{idle_url}/readyz"),
            )
            .with_env(proxy_env),
        );
        idle.start().await?;
        let mut direct = Vec::new();
        for url in &protected {
            direct.push(Relay::start(addr(url)?).await?);
        }
        Ok(Self {
            etcd: tokio::sync::Mutex::new(etcd),
            proxies,
            paths,
            idle,
            idle_url,
            direct,
            storage_path,
            gateways,
            gateway_urls,
            storage,
            keys,
            sqlite: (shape.gateways() == 1 && control != Control::MemoryMarks).then_some(sqlite),
            postgres,
            shape,
            _dir: dir,
        })
    }

    /// The URLs clients reach the proxies at (through their relays).
    pub fn proxy_urls(&self) -> Vec<String> {
        self.paths.iter().map(|p| p.clients.url()).collect()
    }

    /// The URLs clients write straight to the enforcers at (through their relays).
    pub fn direct_urls(&self) -> Vec<String> {
        self.direct.iter().map(Relay::url).collect()
    }

    /// The mark of `resource` as the gateways' store holds it, read from the store itself
    /// (`None` when the deployment keeps no durable marks, or the resource has none).
    pub async fn stored_mark(&self, resource: &str) -> anyhow::Result<Option<fencing::Token>> {
        if let Some(pg) = &self.postgres {
            return pg.mark(resource).await;
        }
        let Some(path) = &self.sqlite else {
            return Ok(None);
        };
        // Read beside the running gateway, which holds the store itself.
        Ok(fencing::SqliteStore::read_mark(path, resource)?)
    }

    /// Whether marks are kept durably where [`Cluster::stored_mark`] can read them.
    pub fn marks_readable(&self) -> bool {
        self.postgres.is_some() || self.sqlite.is_some()
    }

    /// Undoes every fault: relays pass, paused processes continue, everything is running and
    /// ready, etcd has a leader.
    pub async fn heal(&self) -> anyhow::Result<()> {
        for relay in self
            .paths
            .iter()
            .flat_map(ProxyPaths::all)
            .chain(self.direct.iter())
            .chain([&self.storage_path])
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
        for p in self.proxies.iter().chain(self.gateways.iter()) {
            p.signal("CONT");
            if p.slot().is_none() {
                p.start().await?;
            }
            wait_ready(&p.ready_url, Duration::from_secs(20)).await?;
        }
        Ok(())
    }
}

/// A lease-proxy replica's flags.
fn proxy_args(
    port: u16,
    endpoints: &[String],
    key_file: &Path,
    data_dir: &Path,
    gateway: &str,
    prefence: bool,
) -> Vec<String> {
    let mut args = vec![
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--etcd-endpoints".into(),
        endpoints.join(","),
        "--key-file".into(),
        key_file.display().to_string(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--etcd-timeout".into(),
        "2s".into(),
        "--forward-timeout".into(),
        "3s".into(),
        "--drain-timeout".into(),
        "1s".into(),
        "--upstream".into(),
        gateway.to_owned(),
    ];
    if prefence {
        args.push("--prefence-url".into());
        args.push(gateway.to_owned());
    }
    args
}
