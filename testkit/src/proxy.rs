//! A lease-proxy running in this process on a free loopback port (feature `proxy`): the one
//! launcher of the proxy's, the SDK's and leasectl's integration tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fencing::{KeyId, Keyring};
use lease_proxy::Config;
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a starting proxy has to answer `/readyz` with 200.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// A fresh fencing key file (key id `k1`) in `dir`.
pub fn key_file(dir: &Path) -> PathBuf {
    let path = dir.join("fencing.key");
    let id = KeyId::parse("k1").expect("`k1` is a valid key id");
    std::fs::write(&path, Keyring::generate_file(&id)).expect("write the fencing key file");
    path
}

/// A proxy running in this process; dropping it aborts it, [`Proxy::stop`] drains it.
#[derive(Debug)]
pub struct Proxy {
    /// Its base URL (`http://…` or, when the configuration sets a certificate, `https://…`).
    pub url: String,
    /// The fencing key file it signs with.
    pub key_file: PathBuf,
    /// Its etcd key prefix (`--etcd-prefix`).
    pub prefix: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), lease_proxy::StartError>>>,
    _dir: TempDir,
}

impl Proxy {
    /// Starts a proxy on `etcd` under a key prefix of its own ([`crate::prefix`]), so that
    /// tests can share one etcd ([`crate::Etcd::shared`]), with test defaults adjusted by `tweak`.
    pub async fn on(etcd: &crate::Etcd, tweak: impl FnOnce(&mut Config)) -> Self {
        let prefix = crate::prefix("proxy");
        Self::start(etcd.endpoints(), |c| {
            c.etcd_prefix = prefix;
            tweak(c);
        })
        .await
    }

    /// Starts a proxy on `endpoints` with test defaults, adjusted by `tweak`.
    pub async fn start(endpoints: Vec<String>, tweak: impl FnOnce(&mut Config)) -> Self {
        Self::start_https(endpoints, &reqwest::Client::new(), tweak).await
    }

    /// Starts a proxy whose readiness is seen with `client`: when `tweak` sets `--tls-cert` and
    /// friends it serves HTTPS, and `client` must trust its certificate.
    pub async fn start_https(
        endpoints: Vec<String>,
        client: &reqwest::Client,
        tweak: impl FnOnce(&mut Config),
    ) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let key_file = key_file(dir.path());
        Self::launch(endpoints, key_file, dir, tweak, client).await
    }

    /// Starts a proxy signing with an existing key file.
    pub async fn start_with_keys(
        endpoints: Vec<String>,
        key_file: PathBuf,
        tweak: impl FnOnce(&mut Config),
    ) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        Self::launch(endpoints, key_file, dir, tweak, &reqwest::Client::new()).await
    }

    /// Starts another replica sharing this proxy's key file and key prefix.
    pub async fn replica(&self, endpoints: Vec<String>, tweak: impl FnOnce(&mut Config)) -> Self {
        let prefix = self.prefix.clone();
        Self::start_with_keys(endpoints, self.key_file.clone(), |c| {
            c.etcd_prefix = prefix;
            tweak(c);
        })
        .await
    }

    async fn launch(
        endpoints: Vec<String>,
        key_file: PathBuf,
        dir: TempDir,
        tweak: impl FnOnce(&mut Config),
        client: &reqwest::Client,
    ) -> Self {
        let mut config = Config::with_endpoints(endpoints);
        config.key_file = Some(key_file.clone());
        config.data_dir = dir.path().to_owned();
        config.etcd_timeout = Duration::from_secs(3);
        config.drain_timeout = Duration::from_secs(3);
        tweak(&mut config);
        config.validate().expect("a valid test proxy configuration");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let scheme = if config.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        let addr = listener.local_addr().expect("the bound port");
        let prefix = config.etcd_prefix.clone();
        let url = format!("{scheme}://{addr}");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(lease_proxy::run(listener, config, async move {
            let _ = stopped.await;
        }));
        let proxy = Self {
            url,
            key_file,
            prefix,
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        };
        let readyz = format!("{}/readyz", proxy.url);
        crate::poll::answers(client, &readyz, 200, READY_WITHIN).await;
        proxy
    }

    /// Stops the proxy and waits for its drain to finish.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await
                .expect("the proxy task ended without panicking")
                .expect("the proxy stopped cleanly");
        }
    }

    /// The keys it signs with.
    pub fn keyring(&self) -> Keyring {
        Keyring::load(&self.key_file).expect("load the proxy's key file")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
