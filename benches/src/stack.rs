//! Processes a benchmark starts for itself: etcd (through the testkit, fsync on), `lease-proxy`,
//! `fence-gateway` or any helper binary, on free loopback ports; all killed when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, Context};

pub use lease_proxy_testkit::{free_port, workspace_binary, Etcd};

/// Serves `app` on `listen` the way both project binaries do (the fencing library's server:
/// its limits, graceful drain), until the process is killed: the in-process helpers a
/// benchmark starts as a role of its own binary (a storage stand-in, a pass-through).
pub async fn serve_forever(listen: std::net::SocketAddr, app: axum::Router) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    runtime::serve::until_shutdown(
        listener,
        app,
        std::future::pending(),
        &std::sync::atomic::AtomicBool::new(false),
        tokio_util::sync::CancellationToken::new(),
        runtime::serve::Drain {
            delay: Duration::ZERO,
            deadline: Duration::from_secs(1),
        },
        runtime::serve::Limits::default(),
    )
    .await?;
    Ok(())
}

/// Child processes owned by a benchmark, killed on drop, with a scratch directory.
pub struct Stack {
    children: Vec<Child>,
    dir: tempfile::TempDir,
}

impl Drop for Stack {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A started process: its pid, for reading its memory use.
#[derive(Debug, Clone, Copy)]
pub struct Spawned {
    /// The process id.
    pub pid: u32,
}

impl Stack {
    /// An empty stack with a fresh scratch directory.
    pub fn new() -> anyhow::Result<Self> {
        Ok(Self {
            children: Vec::new(),
            dir: tempfile::Builder::new().prefix("bench-").tempdir()?,
        })
    }

    /// The scratch directory, removed with the stack.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts `cmd` with its output discarded and keeps it until the stack is dropped.
    pub fn spawn(&mut self, mut cmd: Command) -> anyhow::Result<Spawned> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
        let pid = child.id();
        self.children.push(child);
        Ok(Spawned { pid })
    }

    /// Starts the `lease-proxy` at `bin` against `etcd_url` with `extra` arguments; returns its
    /// base URL once ready.
    pub async fn lease_proxy(
        &mut self,
        bin: &Path,
        etcd_url: &str,
        extra: &[&str],
    ) -> anyhow::Result<(String, Spawned)> {
        let (mut cmd, port) = self.proxy_command(bin, etcd_url);
        cmd.args(extra);
        let spawned = self.spawn(cmd)?;
        let url = format!("http://127.0.0.1:{port}");
        wait_ready(&format!("{url}/readyz")).await?;
        Ok((url, spawned))
    }

    /// Starts the `lease-proxy` at `bin` against `etcd_url` serving HTTPS with `tls` (a
    /// certificate and key) and authenticating bearer tokens with the token file `tokens`;
    /// returns its base URL once ready (`/readyz` checked over TLS trusting `ca`).
    pub async fn secure_lease_proxy(
        &mut self,
        bin: &Path,
        etcd_url: &str,
        tls: &lease_proxy_testkit::pki::Issued,
        ca: &Path,
        tokens: &Path,
    ) -> anyhow::Result<(String, Spawned)> {
        let (mut cmd, port) = self.proxy_command(bin, etcd_url);
        cmd.arg("--tls-cert")
            .arg(&tls.cert)
            .arg("--tls-key")
            .arg(&tls.key)
            .arg("--auth-tokens")
            .arg(tokens);
        let spawned = self.spawn(cmd)?;
        let url = format!("https://127.0.0.1:{port}");
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(ca)?)?)
            .build()?;
        wait_ready_with(&client, &format!("{url}/readyz")).await?;
        Ok((url, spawned))
    }

    fn proxy_command(&self, bin: &Path, etcd_url: &str) -> (Command, u16) {
        let port = free_port();
        let mut cmd = Command::new(bin);
        cmd.args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--etcd-endpoints", etcd_url])
            .arg("--data-dir")
            .arg(self.dir().join(format!("proxy-{port}")))
            .env("RUST_LOG", "error");
        (cmd, port)
    }
}

/// Waits until `url` answers 2xx (up to 15 s).
pub async fn wait_ready(url: &str) -> anyhow::Result<()> {
    wait_ready_with(&reqwest::Client::new(), url).await
}

/// Waits until `url` answers 2xx to `client` (up to 15 s).
pub async fn wait_ready_with(client: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    for _ in 0..300 {
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
    Err(anyhow!("{url} did not become ready"))
}

/// Resident and peak resident memory of `pid` in MiB, from `/proc/{pid}/status`.
pub fn rss_mib(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_memory() {
        let (rss, peak) = rss_mib(std::process::id()).unwrap();
        assert!(rss > 0.0 && peak >= rss);
        assert!(rss_mib(u32::MAX).is_none());
    }
}
