//! The campaign's private PostgreSQL under two real fence-gateways: marks are read straight from
//! the database, the gateways' sessions are killed and the server is crashed, and both gateways
//! serve again afterwards with the marks intact.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fencing::{KeyId, Keyring, Token, RESOURCE_HEADER, TOKEN_HEADER};
use lease_proxy_campaign::postgres::Postgres;
use lease_proxy_testkit::{free_port, workspace_binary};
use tokio::time::Instant;

/// How long a gateway may take to serve writes again after its sessions died.
const RECOVERY: Duration = Duration::from_secs(15);

struct Gateway {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Gateway {
    fn spawn(postgres: &Postgres, name: &str, upstream: &str, key_file: &Path, dir: &Path) -> Self {
        let port = free_port();
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(workspace_binary("fence-gateway"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", upstream])
            .args(["--store", &postgres.url(name)])
            .args(["--max-connections", "4"])
            .args(["--drain-timeout", "1s"])
            // A registration lives `--upstream-timeout + --write-grace + --store-timeout`: short,
            // so that one the crash left behind expires well within the test.
            .args(["--upstream-timeout", "2s"])
            .args(["--write-grace", "200ms"])
            .args(["--store-timeout", "1s"])
            .arg("--key-file")
            .arg(key_file)
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap();
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Writer {
    client: reqwest::Client,
    keys: Keyring,
    resource: String,
    postgres_log: PathBuf,
}

impl Writer {
    /// PUTs through `gateway` with token `(0, revision)`: the status, or 0 if no answer.
    async fn put(&self, gateway: &Gateway, revision: u64) -> u16 {
        self.client
            .put(format!("{}/aisle", gateway.url))
            .header(RESOURCE_HEADER, &self.resource)
            .header(
                TOKEN_HEADER,
                self.keys.mint(&self.resource, Token::new(0, revision)),
            )
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map_or(0, |r| r.status().as_u16())
    }

    /// Retries the write until it is accepted (within [`RECOVERY`]); every answer on the way.
    async fn put_until_ok(&self, gateway: &Gateway, revision: u64, what: &str) -> Vec<u16> {
        let started = Instant::now();
        let mut answers = Vec::new();
        loop {
            let status = self.put(gateway, revision).await;
            answers.push(status);
            if status == 200 {
                eprintln!(
                    "{what}: {} accepted {revision} after {:?}, answers {answers:?}",
                    gateway.url,
                    started.elapsed()
                );
                return answers;
            }
            assert!(
                started.elapsed() < RECOVERY,
                "{what}: {} still refuses {revision} after {RECOVERY:?}: {answers:?}\n{}\n\
                 PostgreSQL:\n{}",
                gateway.url,
                gateway.log_tail(),
                std::fs::read_to_string(&self.postgres_log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// How many in-flight registrations are live in the gateways' database.
async fn in_flight(postgres: &Postgres) -> i64 {
    let (client, connection) =
        tokio_postgres::connect(&postgres.url("test-observer"), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    client
        .query_one(
            "SELECT count(*) FROM fence_inflight WHERE expires_at > clock_timestamp()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn wait_ready(gateway: &Gateway) {
    let client = reqwest::Client::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        if client
            .get(format!("{}/readyz", gateway.url))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("gateway {} not ready:\n{}", gateway.url, gateway.log_tail());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_survive_session_kills_and_a_crash() {
    let started = Instant::now();
    let postgres = Postgres::start().await.unwrap();
    eprintln!("PostgreSQL up in {:?}", started.elapsed());

    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("fencing.key");
    Keyring::create_file(&key_file, &KeyId::parse("c1").unwrap()).unwrap();
    let app = axum::Router::new().fallback(|| async { "ok" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let gateways = ["fence-gateway-a", "fence-gateway-b"]
        .map(|name| Gateway::spawn(&postgres, name, &upstream, &key_file, dir.path()));
    for gateway in &gateways {
        wait_ready(gateway).await;
    }
    let [a, b] = &gateways;
    let writer = Writer {
        client: reqwest::Client::new(),
        keys: Keyring::load(&key_file).unwrap(),
        resource: "campaign-postgres-aisle".into(),
        postgres_log: postgres.log_file().to_owned(),
    };
    let mark = || postgres.mark(&writer.resource);

    assert_eq!(mark().await.unwrap(), None);
    assert_eq!(writer.put(a, 10).await, 200);
    assert_eq!(mark().await.unwrap(), Some(Token::new(0, 10)));
    assert_eq!(writer.put(b, 9).await, 409, "b must see a's mark");

    // Session kills: every gateway session goes, none of the module's own.
    let killed = postgres.terminate_sessions("fence-gateway").await.unwrap();
    eprintln!("terminated {killed} gateway sessions");
    assert!(killed >= 2, "only {killed} sessions terminated");
    writer.put_until_ok(a, 11, "after session kill").await;
    writer.put_until_ok(b, 12, "after session kill").await;
    assert_eq!(mark().await.unwrap(), Some(Token::new(0, 12)));

    // A crash: the marks are committed, so recovery keeps them.
    let crash = Instant::now();
    postgres
        .crash_and_restart(Duration::from_millis(300))
        .await
        .unwrap();
    eprintln!("crash and restart took {:?}", crash.elapsed());
    assert_eq!(mark().await.unwrap(), Some(Token::new(0, 12)));
    // The crash may have come before the end of write 12 was recorded (the gateway deletes
    // its registration in a task after answering): its row then keeps the resource closed to
    // higher tokens until it expires, `--upstream-timeout + --write-grace + --store-timeout`
    // after admission (3.2 s here; 45 s with the gateway's defaults).
    eprintln!(
        "registrations left by the crash: {}",
        in_flight(&postgres).await
    );
    writer.put_until_ok(a, 13, "after crash").await;
    writer.put_until_ok(b, 14, "after crash").await;
    eprintln!("both gateways serve {:?} after the crash", crash.elapsed());
    assert_eq!(writer.put(a, 13).await, 409, "stale through a");
    assert_eq!(writer.put(b, 5).await, 409, "stale through b");
    assert_eq!(mark().await.unwrap(), Some(Token::new(0, 14)));

    // The server and the marks also survive a second crash straight after.
    postgres.crash_and_restart(Duration::ZERO).await.unwrap();
    assert_eq!(mark().await.unwrap(), Some(Token::new(0, 14)));
    eprintln!("whole test {:?}", started.elapsed());
}
