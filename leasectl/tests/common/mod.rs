//! What leasectl's tests share: a real etcd (from `lease-proxy-testkit`) with a lease-proxy
//! running in this process in front of it, leasectl run as a process against it, and plain HTTP
//! calls to look at the proxy's state.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fencing::Keyring;
use lease_proxy_testkit::pki::{Issued, Pki};
use lease_proxy_testkit::proxy::Proxy;
use lease_proxy_testkit::Etcd;
use serde_json::Value;
use tempfile::TempDir;
use tokio::process::{Child, Command};

/// A proxy under a key prefix of its own on the shared etcd, stopped when dropped.
pub struct Stack {
    pub url: String,
    /// The proxy's signing keys.
    pub keys: Keyring,
    /// A temporary directory for the test's own files.
    pub dir: TempDir,
    /// A client of the proxy (trusting its certificate when it serves HTTPS).
    http: reqwest::Client,
    // Declared before `etcd`: the proxy is dropped (aborted) first.
    _proxy: Proxy,
    etcd: std::sync::Arc<Etcd>,
}

impl Stack {
    /// A proxy on a free port.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// A proxy on a free port, its configuration adjusted by `tweak`.
    pub async fn start_with(tweak: impl FnOnce(&mut lease_proxy::Config)) -> Self {
        Self::launch(tweak, reqwest::Client::new()).await
    }

    /// A proxy serving HTTPS with `server`'s certificate, requiring client
    /// certificates of `pki`; `http` is the test's client of it.
    pub async fn start_tls(pki: &Pki, server: &Issued, http: reqwest::Client) -> Self {
        let tweak = |c: &mut lease_proxy::Config| {
            c.tls_cert = Some(server.cert.clone());
            c.tls_key = Some(server.key.clone());
            c.tls_client_ca = Some(pki.ca().to_owned());
            c.tls_client_certs = runtime::tls::ClientCerts::Required;
        };
        Self::launch(tweak, http).await
    }

    async fn launch(tweak: impl FnOnce(&mut lease_proxy::Config), http: reqwest::Client) -> Self {
        let etcd = Etcd::shared().await;
        let prefix = lease_proxy_testkit::prefix("leasectl");
        let proxy = Proxy::start_https(etcd.endpoints(), &http, |c| {
            c.etcd_prefix = prefix;
            tweak(c);
        })
        .await;
        Self {
            url: proxy.url.clone(),
            keys: proxy.keyring(),
            dir: tempfile::tempdir().unwrap(),
            http,
            _proxy: proxy,
            etcd,
        }
    }

    /// A path in this stack's temporary directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `leasectl ARGS…` against this proxy, its output captured.
    pub fn leasectl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_leasectl"));
        cmd.args(args)
            .env("LEASECTL_URL", &self.url)
            .env_remove("LEASECTL_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Runs `leasectl ARGS…` to its end: (exit status, stdout, stderr).
    pub async fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = tokio::time::timeout(Duration::from_secs(60), self.leasectl(args).output())
            .await
            .expect("leasectl did not finish within 60 s")
            .unwrap();
        (
            out.status.code().expect("leasectl ended by a signal"),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    }

    /// Starts `leasectl exec --resource RESOURCE --ttl TTL EXTRA… -- sh -c SCRIPT`.
    pub fn exec(&self, resource: &str, ttl: u64, extra: &[&str], script: &str) -> Child {
        let ttl = ttl.to_string();
        let mut args = vec!["exec", "--resource", resource, "--ttl", &ttl];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        self.leasectl(&args).spawn().unwrap()
    }

    /// Revokes etcd lease `lease_id` (decimal, as the API writes it) behind the proxy's back.
    pub async fn revoke_in_etcd(&self, lease_id: &str) {
        let mut etcd = self.etcd.client().await;
        etcd.lease_revoke(lease_id.parse::<i64>().unwrap())
            .await
            .unwrap();
    }

    /// `GET /v1/leases/{resource}`: (status, body).
    pub async fn get(&self, resource: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}/v1/leases/{resource}", self.url))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// `POST /v1/leases/{resource}` as `holder` with `wait_ms`: (status, body).
    pub async fn acquire(
        &self,
        resource: &str,
        holder: &str,
        ttl: u64,
        wait_ms: u64,
    ) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}/v1/leases/{resource}", self.url))
            .json(&serde_json::json!({"holder": holder, "ttl_seconds": ttl, "wait_ms": wait_ms}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }
}

/// The text of `path` once something was written to it (waits up to 30 s).
pub async fn wait_for_file(path: &Path) -> String {
    for _ in 0..1200 {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{} was never written", path.display());
}

/// The exit status of `child` (waits up to `within`).
pub async fn exit_status(child: &mut Child, within: Duration) -> i32 {
    let status = tokio::time::timeout(within, child.wait())
        .await
        .expect("leasectl did not exit in time")
        .unwrap();
    status.code().expect("leasectl ended by a signal")
}

/// Whether process `pid` still runs (exists and is no zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}
