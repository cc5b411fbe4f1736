//! Real dependencies for tests: etcd members spawned on free loopback ports.
//!
//! [`Etcd::single`] starts one member, [`Etcd::cluster`] a cluster of any size; each member gets
//! its own temporary data directory, and every process is killed when the [`Etcd`] is dropped.
//! The `etcd` binary is taken from `$ETCD_BIN`, else from `PATH`. [`Etcd::secured`] starts a
//! member with TLS, client certificates and authentication on, its certificates from [`pki`].
//!
//! [`v3_hostile`] is the seeded hostile `/v3` request generator and its sentinels, shared by the
//! proxy's tests and the fault campaign.
//!
//! [`openapi`] checks a served OpenAPI 3.1 document and lists its operations; [`docs`] reads the
//! documents' flag and problem tables so tests can hold them to the code; [`layers`] holds a
//! crate's imports to its layer table.
//!
//! [`process::Spawned`] runs a workspace binary as a child process and collects its log.
//!
//! [`postgres::PrivatePostgres`] is a PostgreSQL server of a test's own (server settings, a
//! superuser), beside the shared one the tests use otherwise.
//! [`poll::eventually`] waits for a condition with a deadline instead of sleeping for it
//! ([`poll::until`] for a yes-or-no condition; with the feature `http`, `poll::answers` for a URL
//! answering a status).
//!
//! [`Etcd::shared`] is the etcd a test uses unless it needs one of its own: under the test
//! command, the one etcd it started for the whole run ([`RUN_ETCD`]); otherwise one member shared
//! by the tests of a process that run at once. A test on it isolates its keys under a [`prefix`]
//! of its own (`proxy::Proxy::on` does that), and one that kills, pauses, restarts, compacts or
//! authenticates etcd, or reads what is not under its prefix (etcd's metrics, every lease),
//! starts its own with [`Etcd::single`].
//!
//! With the feature `http`, `recording::Storage` is a storage service that records what reaches
//! it. With the feature `proxy`, `proxy::Proxy` runs a lease-proxy in the test's own process, and
//! `storage::start_gateway` fence-gateway in front of a storage.
#![forbid(unsafe_code)]
#![allow(clippy::expect_used)] // a test helper that cannot start etcd must stop the test loudly

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

pub mod docs;
pub mod layers;
#[cfg(feature = "http")]
pub mod metrics;
pub mod openapi;
pub mod pki;
pub mod poll;
pub mod postgres;
pub mod process;
#[cfg(feature = "proxy")]
pub mod proxy;
#[cfg(feature = "http")]
pub mod recording;
#[cfg(feature = "proxy")]
pub mod storage;
pub mod v3_hostile;

/// How long a member or cluster may take to elect a leader and answer.
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// One etcd member process.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Member {
    /// SIGKILLs the process this member runs in, if this process started it, and reaps it
    /// (resumed first, in case a test paused it).
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A running etcd cluster (one or more members) owned by a test.
#[derive(Debug)]
pub struct Etcd {
    members: Vec<Member>,
    cluster_token: String,
    security: Option<Security>,
    /// Flags given to every member after the ones set here.
    extra_args: Vec<String>,
    /// The test command's etcd for the whole run ([`RUN_ETCD`]): not this process's to stop.
    external: bool,
    /// Handed out by [`Etcd::shared`]: other tests use it at the same time.
    shared: bool,
    _dir: Option<TempDir>,
}

/// The environment variable through which the test command names the one etcd it started for
/// the whole run (its client URL, `http://127.0.0.1:PORT`): [`Etcd::shared`] hands that out
/// instead of starting one per test process, as the test runner makes a process of each test.
pub const RUN_ETCD: &str = "LEASE_PROXY_TEST_ETCD";

/// A key prefix (`/{name}-{random}/`) no other test uses, in this process or any other on the
/// same etcd: the isolation of the tests that share one ([`Etcd::shared`]).
pub fn prefix(name: &str) -> String {
    format!("/{name}-{:08x}/", rand::random::<u32>())
}

/// A member serving clients over TLS, with client certificates required and (once enabled)
/// etcd's authentication on.
#[derive(Debug, Clone)]
pub struct Security {
    /// The CA that signed the server's and the clients' certificates.
    pub ca: PathBuf,
    /// The member's certificate.
    pub server: pki::Issued,
    /// A client certificate (common name `lease-proxy`: no etcd user of that name exists, so
    /// it authenticates nobody by itself; the password does).
    pub client: pki::Issued,
    /// The `root` user's password, once authentication is enabled.
    pub root_password: Option<String>,
}

/// A free TCP port on 127.0.0.1 for a process the test starts, never handed out twice by this
/// test process nor by another one running at the same time (see [`claim`]).
///
/// A port found free and released is only free until someone takes it, and the kernel hands out
/// ports of its ephemeral range to every outgoing connection: a port from that range, released
/// here and bound by a child process a moment later, can meanwhile have become the local end of
/// an etcd peer connection or a client's (that is how a replica of the fault campaign once failed
/// to start in CI). So the port is drawn *below* the ephemeral range, where only explicit binds
/// go, and checked bindable; on a machine whose ephemeral range leaves no room below it, the
/// kernel's choice is used as before.
pub fn free_port() -> u16 {
    use rand::Rng;
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock, PoisonError};

    static GIVEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let mut given = GIVEN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LOWEST: u16 = 10_000;
    if ephemeral_low > LOWEST + 1_000 {
        let mut rng = rand::rng();
        for _ in 0..1_000 {
            let port = rng.random_range(LOWEST..ephemeral_low);
            if !given.contains(&port)
                && TcpListener::bind(("127.0.0.1", port)).is_ok()
                && claim(port)
            {
                given.insert(port);
                return port;
            }
        }
    }
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("no free loopback port");
        if !given.contains(&port) && claim(port) {
            given.insert(port);
            return port;
        }
    }
}

/// Claims `port` for this process against every other test process on the machine: an
/// exclusive lock on `$TMPDIR/lease-proxy-test-ports/PORT`, held until the process exits (the
/// kernel drops it then, however the process ends). Test binaries run side by side (a test
/// runner's processes, several checkouts' suites), and a port one of them found free and
/// released is free for the other too until a child binds it. Where the lock file cannot be
/// made, the port is taken unclaimed, as before.
fn claim(port: u16) -> bool {
    use std::fs::{File, OpenOptions, TryLockError};
    use std::sync::{Mutex, PoisonError};

    static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("lease-proxy-test-ports");
    let file = std::fs::create_dir_all(&dir).and_then(|()| {
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
    });
    let Ok(file) = file else { return true };
    match file.try_lock() {
        Ok(()) => {
            HELD.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(file);
            true
        }
        Err(TryLockError::WouldBlock) => false,
        Err(TryLockError::Error(_)) => true,
    }
}

impl Etcd {
    /// Starts a single-member etcd and waits until it answers.
    pub async fn single() -> Self {
        Self::cluster(1).await
    }

    /// One single-member etcd shared by every caller that holds it at the same time: the
    /// tests of one binary running at once use one member (each under a key prefix of its
    /// own); it is killed when the last holder drops it, and the next caller starts another.
    ///
    /// Under the test command, the etcd it started for the run ([`RUN_ETCD`]), shared by every
    /// test process: a test that holds it isolates its keys under a [`prefix`] of its own and
    /// never kills, pauses or restarts it.
    pub async fn shared() -> std::sync::Arc<Self> {
        use std::sync::{Arc, Mutex, PoisonError, Weak};
        if let Some(etcd) = Self::of_the_run() {
            return etcd;
        }
        static SHARED: Mutex<Weak<Etcd>> = Mutex::new(Weak::new());
        static STARTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let _one = STARTING.lock().await;
        let running = SHARED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .upgrade();
        if let Some(etcd) = running {
            return etcd;
        }
        let mut etcd = Self::single().await;
        etcd.shared = true;
        let etcd = Arc::new(etcd);
        *SHARED.lock().unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(&etcd);
        etcd
    }

    /// The etcd [`RUN_ETCD`] names, if it is set.
    fn of_the_run() -> Option<std::sync::Arc<Self>> {
        use std::sync::{Arc, OnceLock};
        static RUN: OnceLock<Option<Arc<Etcd>>> = OnceLock::new();
        let run = RUN.get_or_init(|| {
            let url = std::env::var(RUN_ETCD).ok().filter(|u| !u.is_empty())?;
            Some(Arc::new(Self::external(&url)))
        });
        run.clone()
    }

    /// The etcd serving clients at `url` (`http://127.0.0.1:PORT`), started by someone else:
    /// it is not stopped when dropped, and [`Etcd::kill`], [`Etcd::restart`] and
    /// [`Etcd::signal`] refuse it.
    fn external(url: &str) -> Self {
        let port = (url.strip_prefix("http://127.0.0.1:"))
            .and_then(|p| p.parse::<u16>().ok())
            .unwrap_or_else(|| panic!("{RUN_ETCD}={url:?} is not http://127.0.0.1:PORT"));
        Etcd {
            members: vec![Member {
                name: "run".to_owned(),
                client_port: port,
                peer_port: 0,
                data_dir: PathBuf::new(),
                log: PathBuf::new(),
                child: None,
            }],
            cluster_token: String::new(),
            security: None,
            extra_args: Vec::new(),
            external: true,
            shared: true,
            _dir: None,
        }
    }

    /// Whether `m` is running, as far as this process knows (the run's etcd always is).
    fn running(&self, m: &Member) -> bool {
        self.external || m.child.is_some()
    }

    /// Refuses to stop, pause or restart a shared etcd ([`Etcd::shared`]).
    fn own(&self) {
        assert!(
            !self.shared,
            "this etcd is shared with other tests: start one of the test's own to stop it"
        );
    }

    /// Refuses to read etcd-wide state (its metrics, every key, every lease) of a shared etcd
    /// ([`Etcd::shared`]): other tests change it meanwhile, so a count or a comparison read
    /// there is wrong now and then, not always. `what` says what the caller reads.
    pub fn alone(&self, what: &str) {
        assert!(
            !self.shared,
            "{what} is etcd-wide and this etcd is shared with other tests: start one of the \
             test's own (Etcd::single)"
        );
    }

    /// Starts an `n`-member cluster and waits until every member answers and a leader exists.
    pub async fn cluster(n: usize) -> Self {
        Self::cluster_with(n, &[]).await
    }

    /// Starts one member with these extra etcd flags (e.g.
    /// `--experimental-watch-progress-notify-interval=300ms`) and waits until it answers.
    pub async fn single_with(args: &[&str]) -> Self {
        Self::cluster_with(1, args).await
    }

    /// [`Etcd::cluster`] with these extra etcd flags on every member (restarts keep them).
    pub async fn cluster_with(n: usize, args: &[&str]) -> Self {
        let mut etcd = Self::unstarted(n, None);
        etcd.extra_args = args.iter().map(|a| (*a).to_owned()).collect();
        for i in 0..n {
            etcd.spawn(i);
        }
        etcd.wait_ready().await;
        etcd
    }

    /// `n` members on free ports in a fresh temporary directory, none started yet.
    fn unstarted(n: usize, security: Option<Security>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("lease-proxy-etcd-")
            .tempdir()
            .expect("temp dir for etcd");
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                data_dir: dir.path().join(format!("m{i}.etcd")),
                log: dir.path().join(format!("m{i}.log")),
                child: None,
            })
            .collect();
        Self {
            members,
            cluster_token: format!("t{}", free_port()),
            security,
            extra_args: Vec::new(),
            external: false,
            shared: false,
            _dir: Some(dir),
        }
    }

    /// Starts one member serving clients over TLS only (certificates from `pki`, client
    /// certificates required), then enables etcd's authentication with user `root` and
    /// `password` (etcd's own `root` role).
    pub async fn secured(pki: &pki::Pki, password: &str) -> Self {
        let mut etcd = Self::unstarted(
            1,
            Some(Security {
                ca: pki.ca().to_owned(),
                server: pki.server("etcd-server"),
                client: pki.client("etcd-client", "lease-proxy", &[]),
                root_password: None,
            }),
        );
        etcd.spawn(0);
        etcd.wait_ready().await;
        let mut client = etcd.client().await;
        client
            .user_add("root", password, None)
            .await
            .expect("add etcd user root");
        client
            .user_grant_role("root", "root")
            .await
            .expect("grant root its role");
        client.auth_enable().await.expect("enable etcd auth");
        if let Some(security) = &mut etcd.security {
            security.root_password = Some(password.to_owned());
        }
        etcd
    }

    /// The TLS files and password of a [`Etcd::secured`] member.
    pub fn security(&self) -> Option<&Security> {
        self.security.as_ref()
    }

    fn client_url(&self, port: u16) -> String {
        let scheme = if self.security.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{port}")
    }

    fn connect_options(&self) -> etcd_client::ConnectOptions {
        let options = etcd_client::ConnectOptions::new();
        let Some(security) = &self.security else {
            return options;
        };
        let read = |p: &std::path::Path| std::fs::read(p).expect("read a TLS file");
        let options = options.with_tls(
            etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(read(&security.ca)))
                .identity(etcd_client::Identity::from_pem(
                    read(&security.client.cert),
                    read(&security.client.key),
                )),
        );
        match &security.root_password {
            Some(password) => options.with_user("root", password.clone()),
            None => options,
        }
    }

    fn spawn(&mut self, i: usize) {
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let m = &mut self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .expect("etcd log file");
        let bin = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".to_owned());
        let scheme = if self.security.is_some() {
            "https"
        } else {
            "http"
        };
        let client_url = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let peer_url = format!("http://127.0.0.1:{}", m.peer_port);
        let mut command = Command::new(&bin);
        if let Some(security) = &self.security {
            command
                .arg("--cert-file")
                .arg(&security.server.cert)
                .arg("--key-file")
                .arg(&security.server.key)
                .arg("--trusted-ca-file")
                .arg(&security.ca)
                .arg("--client-cert-auth");
        }
        let child = command
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.cluster_token])
            .args(["--logger", "zap", "--log-level", "warn"])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{bin}` (install etcd-server): {e}"));
        m.child = Some(child);
    }

    async fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + READY_DEADLINE;
        loop {
            if self.leader().await.is_some() {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                let logs: Vec<String> = self
                    .members
                    .iter()
                    .map(|m| std::fs::read_to_string(&m.log).unwrap_or_default())
                    .collect();
                panic!(
                    "etcd not ready within {READY_DEADLINE:?}; logs:\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Client URLs of all members, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| self.client_url(m.client_port))
            .collect()
    }

    /// The client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        self.client_url(self.members[i].client_port)
    }

    /// A client connected to all running members (over TLS and as `root` when secured).
    pub async fn client(&self) -> etcd_client::Client {
        let eps: Vec<String> = self
            .members
            .iter()
            .filter(|m| self.running(m))
            .map(|m| self.client_url(m.client_port))
            .collect();
        etcd_client::Client::connect(eps, Some(self.connect_options()))
            .await
            .expect("connect to etcd")
    }

    /// Index of the current leader among running members, if every running member answers and
    /// they agree on one.
    pub async fn leader(&self) -> Option<usize> {
        let mut leader_id = None;
        let mut index = None;
        for (i, m) in self.members.iter().enumerate() {
            if !self.running(m) {
                continue;
            }
            let url = self.client_url(m.client_port);
            let opts = self
                .connect_options()
                .with_connect_timeout(Duration::from_millis(500))
                .with_timeout(Duration::from_millis(1000));
            let mut c = etcd_client::Client::connect([url], Some(opts)).await.ok()?;
            let status = c.status().await.ok()?;
            let header = status.header()?;
            if status.leader() == 0 {
                return None;
            }
            if *leader_id.get_or_insert(status.leader()) != status.leader() {
                return None;
            }
            if header.member_id() == status.leader() {
                index = Some(i);
            }
        }
        index
    }

    /// Waits until a leader is elected among the running members.
    pub async fn wait_leader(&self, within: Duration) -> Option<usize> {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if let Some(i) = self.leader().await {
                return Some(i);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// The process id of member `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members
            .get(i)?
            .child
            .as_ref()
            .map(std::process::Child::id)
    }

    /// SIGKILLs member `i` (it can be started again with [`Etcd::restart`]).
    pub fn kill(&mut self, i: usize) {
        self.own();
        self.members[i].stop();
    }

    /// Starts a killed member again on the same ports and data directory.
    pub async fn restart(&mut self, i: usize) {
        self.own();
        self.kill(i);
        self.spawn(i);
        self.wait_ready().await;
    }

    /// Sends a signal (`"STOP"`, `"CONT"`, …) to member `i`.
    pub fn signal(&self, i: usize, signal: &str) {
        self.own();
        if let Some(child) = &self.members[i].child {
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(child.id().to_string())
                .status();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // The run's etcd has no child here: only what this process started is stopped.
        for m in &mut self.members {
            m.stop();
        }
    }
}

/// The package of a workspace binary and the cargo features it requires (its Cargo.toml's
/// `required-features`, comma-separated), so that cargo can build it on its own; `None` for a
/// name that is not one of [`workspace_binary`]'s.
pub fn binary_package(name: &str) -> Option<(&'static str, &'static str)> {
    match name {
        "lease-proxy" => Some(("lease-proxy", "")),
        // fencing's default features are the library alone: without `server` cargo skips the
        // binary, or refuses to build it by name.
        "fence-gateway" => Some(("fencing", "server")),
        // Built only with the negative controls (never in a release build).
        "fence-gateway-control" => Some(("fencing", "server,negative-controls")),
        _ => None,
    }
}

/// A binary of this workspace (`lease-proxy`, `fence-gateway`, …) built with the same profile
/// as the running executable: looked up next to it (or next to its parent, for test
/// executables in `deps/`), and built with cargo when missing.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current executable");
    let mut dir = exe.parent().expect("executable directory").to_owned();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if !path.exists() {
        let Some((package, features)) = binary_package(name) else {
            panic!("unknown workspace binary `{name}`")
        };
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["build", "-p", package, "--bin", name]);
        if !features.is_empty() {
            build.args(["--features", features]);
        }
        if dir.ends_with("release") {
            build.arg("--release");
        }
        let ok = build.status().map(|s| s.success()).unwrap_or(false);
        assert!(
            ok && path.exists(),
            "cannot build {name} ({})",
            path.display()
        );
    }
    path
}

/// A binary of this workspace that exists only with a cargo feature (`lease-proxy-controls`,
/// the proxy with `negative-controls`), built for the profile of the running executable, next
/// to it. Cargo is asked every time — it does nothing when the binary is fresh — so a test never
/// runs one older than the sources; the feature's library build sits beside the ordinary one,
/// and the ordinary binaries are left as they are. A test command that built it already names
/// it in `{NAME}_BIN` (`LEASE_PROXY_CONTROLS_BIN`): cargo is then not asked, so the test does
/// not wait for the build directory's lock while other cargo commands run beside it.
pub fn feature_binary(package: &str, name: &str, feature: &str) -> PathBuf {
    let named = format!("{}_BIN", name.to_uppercase().replace('-', "_"));
    if let Some(path) = std::env::var_os(&named).map(PathBuf::from) {
        assert!(
            path.exists(),
            "{named} names {}, which does not exist",
            path.display()
        );
        return path;
    }
    let exe = std::env::current_exe().expect("current executable");
    let mut dir = exe.parent().expect("executable directory").to_owned();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_owned(),
        Some(other) => other.to_owned(),
    };
    let target = dir.parent().expect("target directory").to_owned();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let ok = Command::new(cargo)
        .args(["build", "--quiet", "-p", package, "--bin", name])
        .args(["--features", feature, "--profile", &profile])
        .arg("--target-dir")
        .arg(&target)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let path = dir.join(name);
    assert!(
        ok && path.exists(),
        "cannot build {name} with `{feature}` ({})",
        path.display()
    );
    path
}

/// Sends a signal (`"STOP"`, `"CONT"`, `"KILL"`, …) to process `pid`.
pub fn signal_pid(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// When the peer closed `stream`, measured from `since`; `None` if it was still open at
/// `since + within`. Whatever the peer sends meanwhile is read and dropped.
pub async fn closed_at(
    stream: &mut tokio::net::TcpStream,
    since: tokio::time::Instant,
    within: Duration,
) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(since + within, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(since.elapsed()),
            Ok(Ok(_)) => continue,
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{claim, free_port, prefix, Etcd};

    /// The run's etcd as the tests see it: the same data as the member it names, still serving
    /// after a holder dropped it, and never stopped by a test.
    #[tokio::test]
    async fn the_runs_etcd_is_used_and_never_stopped_by_a_test() {
        let member = Etcd::single().await;
        let mut etcd = Etcd::external(&member.endpoint(0));
        let mut direct = member.client().await;
        direct.put("seen", "yes", None).await.expect("put");
        let got = etcd.client().await.get("seen", None).await.expect("get");
        assert_eq!(got.kvs()[0].value(), b"yes");
        assert_eq!(etcd.leader().await, Some(0), "the run's etcd has no leader");
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| etcd.kill(0)));
        assert!(refused.is_err(), "a test killed the run's etcd");
        let refused =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| etcd.alone("a metric")));
        assert!(
            refused.is_err(),
            "a test read etcd-wide state of the run's etcd"
        );
        member.alone("a metric");
        drop(etcd);
        assert!(
            member.leader().await.is_some(),
            "dropping it stopped the etcd"
        );
    }

    #[test]
    fn prefixes_are_distinct() {
        let prefixes: std::collections::HashSet<String> = (0..1_000).map(|_| prefix("t")).collect();
        assert_eq!(prefixes.len(), 1_000);
        assert!(prefixes
            .iter()
            .all(|p| p.starts_with("/t-") && p.ends_with('/')));
    }

    /// A claimed port is refused to every later claim while its claimant lives: a second open
    /// of the lock file is a second open file description, refused as another process's would be.
    #[test]
    fn a_port_given_out_is_claimed_against_other_processes() {
        let port = free_port();
        assert!(!claim(port), "{port} claimed twice");
    }

    #[test]
    fn free_ports_are_distinct_and_bindable() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        for p in ports.iter().take(20) {
            assert!(
                std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok(),
                "{p}"
            );
        }
    }
}
