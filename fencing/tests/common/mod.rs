//! Helpers shared by the fencing integration tests: a recording storage service and the
//! concurrent-holders scenario that checks the order in which storage sees tokens.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use fencing::{KeyId, Keyring, Token};
use http::{Request, Response};
use lease_proxy_testkit::poll::{eventually, Probe};
use lease_proxy_testkit::process::exit_within;
use rand::Rng;
use tower::{Service, ServiceExt};

/// The PostgreSQL the tests use (the README's test command provides it).
pub fn postgres_url() -> String {
    std::env::var("FENCING_TEST_POSTGRES").unwrap_or_else(|_| {
        "postgres://lease_proxy:lease_proxy@127.0.0.1:5432/lease_proxy_test".to_owned()
    })
}

/// A name no other test run uses.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        rand::rng().random::<u32>()
    )
}

pub fn keyring(kid: &str) -> Keyring {
    Keyring::parse(&Keyring::generate_file(&KeyId::parse(kid).unwrap())).unwrap()
}

/// What reached the storage: (resource, token revision) in arrival order.
pub type Log = Arc<Mutex<Vec<(String, u64)>>>;

/// A storage service that takes a random short time per write and records what it applied.
pub fn recording_upstream(
    log: Log,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(move |req: Request<Body>| {
        let log = log.clone();
        async move {
            let resource = req.headers()["fencing-resource"]
                .to_str()
                .unwrap()
                .to_owned();
            let wire = req.headers()["fencing-token"].to_str().unwrap().to_owned();
            let revision: u64 = wire.split('.').nth(3).unwrap().parse().unwrap();
            let delay = rand::rng().random_range(0..3000);
            tokio::time::sleep(Duration::from_micros(delay)).await;
            log.lock().unwrap().push((resource, revision));
            Ok::<_, Infallible>(Response::new(Body::from("ok")))
        }
    })
}

pub fn write(keys: &Keyring, resource: &str, revision: u64) -> Request<Body> {
    Request::post("/w")
        .header("fencing-resource", resource)
        .header(
            "fencing-token",
            keys.mint(resource, Token::new(0, revision)),
        )
        .body(Body::empty())
        .unwrap()
}

/// Holders with rising tokens hammer `resources` concurrently through `services` (chosen at
/// random per write, like clients behind a load balancer); a new holder starts every `step`
/// and sends its writes within `spread`, so several holders' writes are in flight together.
/// Returns how often a resource's storage saw a token lower than one it had already applied.
pub async fn reorderings<S>(
    services: Vec<S>,
    keys: Arc<Keyring>,
    log: Log,
    resources: &[String],
    holders: u64,
    (step, spread): (Duration, Duration),
) -> usize
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug + Send,
{
    let mut tasks = Vec::new();
    for resource in resources {
        for revision in 1..=holders {
            for _ in 0..4 {
                let svc = services[rand::rng().random_range(0..services.len())].clone();
                let keys = keys.clone();
                let resource = resource.clone();
                tasks.push(tokio::spawn(async move {
                    // Holders overlap in time: each starts a little after the previous one.
                    let jitter = rand::rng().random_range(0..spread.as_micros() as u64);
                    let start = step * revision as u32 + Duration::from_micros(jitter);
                    tokio::time::sleep(start).await;
                    let resp = svc
                        .oneshot(write(&keys, &resource, revision))
                        .await
                        .unwrap();
                    let status = resp.status().as_u16();
                    // Read to its end, as a client does: the write's exchange is then complete.
                    let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
                    status
                }));
            }
        }
    }
    let mut statuses: HashMap<u16, usize> = HashMap::new();
    for t in tasks {
        *statuses.entry(t.await.unwrap()).or_default() += 1;
    }
    assert!(
        statuses.keys().all(|s| *s == 200 || *s == 409),
        "{statuses:?}"
    );
    let log = log.lock().unwrap();
    assert_eq!(
        log.len(),
        statuses.get(&200).copied().unwrap_or(0),
        "a refused write reached storage"
    );
    let mut highest: HashMap<&str, u64> = HashMap::new();
    let mut violations = 0;
    for (resource, revision) in log.iter() {
        let h = highest.entry(resource.as_str()).or_default();
        if *revision < *h {
            violations += 1;
        }
        *h = (*h).max(*revision);
    }
    violations
}

/// A fresh key file `keys` in `dir` (one key, id `k1`) and the keyring it holds.
pub fn key_file(dir: &std::path::Path) -> (std::path::PathBuf, Keyring) {
    let path = dir.join("keys");
    Keyring::create_file(&path, &KeyId::parse("k1").unwrap()).unwrap();
    let keys = Keyring::load(&path).unwrap();
    (path, keys)
}

/// A fence-gateway process (the real binary) on a free loopback port with a memory mark store,
/// killed when dropped.
pub struct GatewayProcess {
    pub child: std::process::Child,
    pub addr: std::net::SocketAddr,
    pub url: String,
}

impl GatewayProcess {
    /// Starts the gateway (memory store) in front of `upstream` with `key_file` and the
    /// `extra` flags, and waits (at most 10 s) until `/readyz` answers 200.
    pub async fn start(upstream: &str, key_file: &std::path::Path, extra: &[&str]) -> Self {
        Self::start_with_store(upstream, "memory", key_file, extra).await
    }

    /// [`GatewayProcess::start`] with marks in `store` (`memory`, `sqlite:PATH`, a PostgreSQL
    /// URL).
    pub async fn start_with_store(
        upstream: &str,
        store: &str,
        key_file: &std::path::Path,
        extra: &[&str],
    ) -> Self {
        let program = env!("CARGO_BIN_EXE_fence-gateway");
        Self::start_program(program, upstream, store, key_file, extra).await
    }

    /// [`GatewayProcess::start_with_store`] running `program` (fence-gateway or
    /// fence-gateway-control).
    pub async fn start_program(
        program: &str,
        upstream: &str,
        store: &str,
        key_file: &std::path::Path,
        extra: &[&str],
    ) -> Self {
        let port = lease_proxy_testkit::free_port();
        let child = std::process::Command::new(program)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", upstream, "--store", store])
            .arg("--key-file")
            .arg(key_file)
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(if std::env::var_os("GATEWAY_LOG").is_some() {
                std::process::Stdio::inherit()
            } else {
                std::process::Stdio::null()
            })
            .spawn()
            .unwrap();
        // Owned from here on, so a failed start is still killed (by Drop).
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let mut gw = Self {
            child,
            addr,
            url: format!("http://{addr}"),
        };
        let readyz = format!("{}/readyz", gw.url);
        eventually(Duration::from_secs(10), "fence-gateway ready", || {
            if let Ok(Some(status)) = gw.child.try_wait() {
                panic!(
                    "fence-gateway exited ({status}) before it was ready: GATEWAY_LOG=1 shows why"
                );
            }
            let asked = reqwest::get(&readyz);
            async move {
                match asked.await.map(|r| r.status().as_u16()) {
                    Ok(200) => Probe::Done(()),
                    answer => Probe::Not(format!("{answer:?}")),
                }
            }
        })
        .await;
        gw
    }
}

/// Runs the gateway binary with `store` and `extra` flags, expecting it to refuse to start:
/// its exit status and what it wrote to stderr. Panics if it is still running after 10 s.
pub fn gateway_refuses(
    upstream: &str,
    store: &str,
    key_file: &std::path::Path,
    extra: &[&str],
) -> (std::process::ExitStatus, String) {
    let port = lease_proxy_testkit::free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fence-gateway"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--upstream", upstream, "--store", store])
        .arg("--key-file")
        .arg(key_file)
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let Some(status) = exit_within(&mut child, Duration::from_secs(10)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("fence-gateway on {store} was expected to refuse to start, and is running");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status, stderr)
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
