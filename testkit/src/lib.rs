//! Real dependencies for tests: etcd members spawned on free loopback ports.
//!
//! [`Etcd::single`] starts one member, [`Etcd::cluster`] a cluster of any size; each member gets
//! its own temporary data directory, and every process is killed when the [`Etcd`] is dropped.
//! The `etcd` binary is taken from `$ETCD_BIN`, else from `PATH`.
//!
//! [`v3_hostile`] is the seeded hostile `/v3` request generator and its sentinels, shared by the
//! proxy's tests and the fault campaign.
#![forbid(unsafe_code)]
#![allow(clippy::expect_used)] // a test helper that cannot start etcd must stop the test loudly

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

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

/// A running etcd cluster (one or more members) owned by a test.
#[derive(Debug)]
pub struct Etcd {
    members: Vec<Member>,
    cluster_token: String,
    _dir: TempDir,
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

impl Etcd {
    /// Starts a single-member etcd and waits until it answers.
    pub async fn single() -> Self {
        Self::cluster(1).await
    }

    /// Starts an `n`-member cluster and waits until every member answers and a leader exists.
    pub async fn cluster(n: usize) -> Self {
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
        let cluster_token = format!("t{}", free_port());
        let mut etcd = Self {
            members,
            cluster_token,
            _dir: dir,
        };
        for i in 0..n {
            etcd.spawn(i);
        }
        etcd.wait_ready().await;
        etcd
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
        let client_url = format!("http://127.0.0.1:{}", m.client_port);
        let peer_url = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new(&bin)
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
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// The client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// A client connected to all running members.
    pub async fn client(&self) -> etcd_client::Client {
        let eps: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect();
        etcd_client::Client::connect(eps, None)
            .await
            .expect("connect to etcd")
    }

    /// Index of the current leader among running members, if every running member answers and
    /// they agree on one.
    pub async fn leader(&self) -> Option<usize> {
        let mut leader_id = None;
        let mut index = None;
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let url = format!("http://127.0.0.1:{}", m.client_port);
            let opts = etcd_client::ConnectOptions::new()
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

    /// SIGKILLs member `i` (it can be started again with [`Etcd::restart`]).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed member again on the same ports and data directory.
    pub async fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_ready().await;
    }

    /// Sends a signal (`"STOP"`, `"CONT"`, …) to member `i`.
    pub fn signal(&self, i: usize, signal: &str) {
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
        for i in 0..self.members.len() {
            self.signal(i, "CONT");
            self.kill(i);
        }
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
        let package = match name {
            "lease-proxy" => "lease-proxy",
            "fence-gateway" => "fencing",
            other => panic!("unknown workspace binary `{other}`"),
        };
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["build", "-p", package, "--bin", name]);
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
