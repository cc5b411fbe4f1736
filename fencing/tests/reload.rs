//! The fence-gateway binary reloads its key file without a restart: SIGHUP never
//! ends it (with or without TLS), a key file replaced by rename is in force within a few polls,
//! and a file that does not load changes nothing and is logged with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fencing::{KeyId, Keyring, Token};
use lease_proxy_testkit::free_port;
use lease_proxy_testkit::metrics;
use lease_proxy_testkit::poll::{eventually, Probe};
use lease_proxy_testkit::process::Spawned;

const BIN: &str = env!("CARGO_BIN_EXE_fence-gateway");

/// A storage that answers 200 to everything.
async fn storage() -> String {
    let app = axum::Router::new().fallback(|| async { "stored" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// A gateway process (SQLite marks, no TLS) and its log.
struct Gateway {
    process: Spawned,
    url: String,
}

impl Gateway {
    async fn start(dir: &Path, keys: &Path) -> Self {
        let port = free_port();
        let mut command = Command::new(BIN);
        command
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", &storage().await])
            .arg("--store")
            .arg(format!("sqlite:{}", dir.join("marks.db").display()))
            .arg("--key-file")
            .arg(keys);
        let gw = Self {
            process: Spawned::start(command),
            url: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..400 {
            if let Ok(r) = reqwest::get(format!("{}/readyz", gw.url)).await {
                if r.status() == 200 {
                    return gw;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("fence-gateway did not become ready:\n{}", gw.log());
    }

    fn log(&self) -> String {
        self.process.log()
    }

    /// The status of a write to a resource of its own, with a token `keys` signed.
    async fn put(&self, keys: &Keyring) -> u16 {
        let resource = format!("r-{}", rand::random::<u32>());
        reqwest::Client::new()
            .put(format!("{}/items/{resource}", self.url))
            .header("fencing-resource", &resource)
            .header("fencing-token", keys.mint(&resource, Token::new(0, 10)))
            .body("x")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// `fence_reloads_total{file="key-file",outcome}` from its `/metrics`.
    async fn key_file_reloads(&self, outcome: &str) -> f64 {
        let outcome = format!(r#"outcome="{outcome}""#);
        let labels = [r#"file="key-file""#, &outcome];
        let client = reqwest::Client::new();
        metrics::value(&client, &self.url, "fence_reloads_total", &labels).await
    }

    /// Waits (polling, up to 15 s) until a write signed by `keys` gets `status`.
    async fn until(&self, keys: &Keyring, status: u16, what: &str) {
        let what = format!("{what}: {status}");
        eventually(Duration::from_secs(15), &what, || async {
            match self.put(keys).await {
                got if got == status => Probe::Done(()),
                got => Probe::Not(format!("{got}\n{}", self.log())),
            }
        })
        .await;
    }
}

fn key(kid: &str) -> String {
    Keyring::generate_file(&KeyId::parse(kid).unwrap())
}

/// Replaces `path` by rename, as the docs say to: a temporary file in the same directory.
fn replace(path: &Path, text: &str) {
    let tmp: PathBuf = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_never_ends_a_gateway_without_tls() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, key("k1")).unwrap();
    let ring = Keyring::load(&keys).unwrap();
    let gw = Gateway::start(dir.path(), &keys).await;
    for n in 0..3 {
        gw.process.signal("HUP");
        let reloaded = "fencing key file reloaded";
        // A gateway that SIGHUP ends never logs this (its log ends instead).
        tokio::time::timeout(
            Duration::from_secs(10),
            gw.process.wait_logged(reloaded, n, Duration::from_secs(10)),
        )
        .await
        .unwrap_or_else(|_| panic!("no reload {n}"));
    }
    assert!(
        gw.process.alive(),
        "SIGHUP ended the gateway:\n{}",
        gw.log()
    );
    assert_eq!(gw.put(&ring).await, 200, "{}", gw.log());
    assert!(
        gw.log().contains("fencing key file reloaded"),
        "{}",
        gw.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_file_is_reloaded_whole_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    let (k1, k2) = (key("k1"), key("k2"));
    std::fs::write(&path, &k1).unwrap();
    let old = Keyring::parse(&k1).unwrap();
    let new = Keyring::parse(&k2).unwrap();
    let gw = Gateway::start(dir.path(), &path).await;
    assert_eq!(gw.put(&old).await, 200);
    assert_eq!(gw.put(&new).await, 401, "k2 is not a key yet");
    assert_eq!(gw.key_file_reloads("loaded").await, 0.0);
    assert_eq!(gw.key_file_reloads("refused").await, 0.0);

    // Step 1 of a rotation: k2 added as a verifying line; noticed by polling (no signal).
    replace(&path, &format!("{k1}{k2}"));
    gw.until(&new, 200, "k2 added").await;
    assert_eq!(gw.put(&old).await, 200, "k1 still verifies");

    // The last step: k1 removed. Its tokens are refused from the reload on.
    replace(&path, &k2);
    gw.until(&old, 401, "k1 removed").await;
    assert_eq!(gw.put(&new).await, 200);

    // A file that does not parse, and one cut mid-line: nothing changes, the log says why.
    let mut reasons = vec![];
    for (bad, why) in [
        ("k3 c2hvcnQ\n", "secret must be at least 32 bytes"),
        (&k1[..k1.len() - 5], "the last line has no newline"),
    ] {
        let refused = "fencing key file NOT reloaded";
        let before = gw.process.logged(refused);
        replace(&path, bad);
        gw.process.signal("HUP");
        gw.process
            .wait_logged(refused, before, Duration::from_secs(10))
            .await;
        reasons.push(why);
        assert_eq!(gw.put(&new).await, 200, "k2 must still verify");
        assert_eq!(gw.put(&old).await, 401, "k1 must stay removed");
    }
    let log = gw.log();
    for why in reasons {
        assert!(log.contains(why), "the log does not say {why:?}:\n{log}");
    }
    // Counted too, so an operator can alert on a refused file: each file was read once (a
    // change is read once it has held for a poll, or at once on SIGHUP).
    assert_eq!(gw.key_file_reloads("refused").await, 2.0);
    assert!(gw.key_file_reloads("loaded").await >= 2.0);
}
