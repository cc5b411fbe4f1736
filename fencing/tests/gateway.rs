//! The fence-gateway binary in front of a recording storage service: crash safety of the marks,
//! pre-fence, pass-through reads, header hygiene and bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axum::body::Bytes;
use fencing::{KeyId, Keyring, Token};
use lease_proxy_testkit::free_port;
use lease_proxy_testkit::metrics;
use lease_proxy_testkit::process::exited;
use lease_proxy_testkit::recording::Storage;

const BIN: &str = env!("CARGO_BIN_EXE_fence-gateway");

/// A storage that answers each request with its body, an end-to-end header and a hop-by-hop
/// one (which the gateway must not pass on), recording what it received.
async fn storage() -> Storage {
    Storage::builder()
        .echo()
        .header("x-storage", "yes")
        .header("connection", "x-hop")
        .header("x-hop", "1")
        .start()
        .await
}

struct Gateway {
    child: Child,
    url: String,
}

impl Gateway {
    async fn start(upstream: &str, store: &Path, keys: &Path, port: u16) -> Self {
        Self::start_with(upstream, store, keys, port, &[]).await
    }

    async fn start_with(
        upstream: &str,
        store: &Path,
        keys: &Path,
        port: u16,
        extra: &[&str],
    ) -> Self {
        let child = Command::new(BIN)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", upstream])
            .arg("--store")
            .arg(format!("sqlite:{}", store.display()))
            .arg("--key-file")
            .arg(keys)
            .args(["--max-body-bytes", "65536"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Owned from here on, so a failed start is still killed (by Drop).
        let gw = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..200 {
            if let Ok(r) = reqwest::get(format!("{}/readyz", gw.url)).await {
                if r.status() == 200 {
                    return gw;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("fence-gateway did not become ready");
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn setup() -> (tempfile::TempDir, PathBuf, Keyring) {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("keys");
    std::fs::write(
        &key_file,
        Keyring::generate_file(&KeyId::parse("k1").unwrap()),
    )
    .unwrap();
    let keys = Keyring::load(&key_file).unwrap();
    (dir, key_file, keys)
}

async fn put(gw: &Gateway, keys: &Keyring, resource: &str, revision: u64) -> u16 {
    reqwest::Client::new()
        .put(format!("{}/inventory/{resource}", gw.url))
        .header("fencing-resource", resource)
        .header(
            "fencing-token",
            keys.mint(resource, Token::new(0, revision)),
        )
        .body(format!("count from {revision}"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marks_survive_sigkill() {
    let (dir, key_file, keys) = setup();
    let Storage {
        url: upstream,
        log: received,
    } = storage().await;
    let store = dir.path().join("marks.db");
    let port = free_port();
    let gw = Gateway::start(&upstream, &store, &key_file, port).await;
    assert_eq!(put(&gw, &keys, "aisle-1", 10).await, 200);
    // Killed right after accepting token 10: no graceful shutdown, no flush.
    gw.kill();
    let gw = Gateway::start(&upstream, &store, &key_file, port).await;
    assert_eq!(put(&gw, &keys, "aisle-1", 9).await, 409);
    assert_eq!(put(&gw, &keys, "aisle-1", 10).await, 200);
    assert_eq!(put(&gw, &keys, "aisle-1", 11).await, 200);
    let bodies: Vec<Bytes> = received.all().into_iter().map(|r| r.body).collect();
    assert_eq!(
        bodies,
        vec!["count from 10", "count from 10", "count from 11"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefence_reads_and_headers() {
    let (dir, key_file, keys) = setup();
    let Storage {
        url: upstream,
        log: received,
    } = storage().await;
    let gw = Gateway::start(&upstream, &dir.path().join("m.db"), &key_file, free_port()).await;
    let client = reqwest::Client::new();

    assert_eq!(put(&gw, &keys, "aisle-2", 5).await, 200);
    // Pre-fence with the next holder's token: the old holder is cut off before any new write.
    let resp = client
        .post(format!("{}/fence/aisle-2", gw.url))
        .header("fencing-token", keys.mint("aisle-2", Token::new(0, 8)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(put(&gw, &keys, "aisle-2", 5).await, 409);
    let stale = client
        .put(format!("{}/inventory/aisle-2", gw.url))
        .header("fencing-resource", "aisle-2")
        .header("fencing-token", keys.mint("aisle-2", Token::new(0, 7)))
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), 409);
    assert_eq!(stale.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = stale.json().await.unwrap();
    assert!(body["type"]
        .as_str()
        .unwrap()
        .ends_with("/stale-fencing-token"));
    assert_eq!(body["mark"]["revision"], "8");
    let before = received.len();
    assert_eq!(before, 1, "only the first write reached storage");

    // Reads pass through without a token; end-to-end headers travel, hop-by-hop ones do not.
    let resp = client
        .get(format!("{}/inventory/aisle-2?x=1", gw.url))
        .header("x-end-to-end", "kept")
        .header("connection", "x-private")
        .header("x-private", "dropped")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-storage"], "yes");
    assert!(resp.headers().get("x-hop").is_none());
    let last = received.all().last().cloned().unwrap();
    assert_eq!(
        (last.method.as_str(), last.path.as_str()),
        ("GET", "/inventory/aisle-2")
    );
    assert_eq!(last.headers["x-end-to-end"], "kept");
    assert!(last.headers.get("x-private").is_none());
    assert!(last.headers.get("fencing-token").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_changes_nothing() {
    let (dir, key_file, keys) = setup();
    let Storage {
        url: upstream,
        log: received,
    } = storage().await;
    let store = dir.path().join("m.db");
    let gw = Gateway::start(&upstream, &store, &key_file, free_port()).await;
    assert_eq!(put(&gw, &keys, "bin-1", 50).await, 200);
    received.take();
    // A fresh connection per request: after an early refusal of an oversized body the gateway
    // closes the connection, and a pooled client could race to reuse it.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let good = keys.mint("bin-1", Token::new(0, 60));
    let url = format!("{}/inventory/bin-1", gw.url);
    let cases: Vec<(&str, reqwest::RequestBuilder, u16)> = vec![
        (
            "no token",
            client.put(&url).header("fencing-resource", "bin-1"),
            428,
        ),
        (
            "no resource",
            client.put(&url).header("fencing-token", &good),
            400,
        ),
        (
            "two token headers",
            client
                .put(&url)
                .header("fencing-resource", "bin-1")
                .header("fencing-token", &good)
                .header("x-fencing-token", &good),
            400,
        ),
        (
            "token twice",
            client
                .put(&url)
                .header("fencing-resource", "bin-1")
                .header("fencing-token", &good)
                .header("fencing-token", &good),
            400,
        ),
        (
            "two resources",
            client
                .put(&url)
                .header("fencing-resource", "bin-1")
                .header("fencing-resource", "bin-2")
                .header("fencing-token", &good),
            400,
        ),
        (
            "malformed token",
            client
                .put(&url)
                .header("fencing-resource", "bin-1")
                .header("fencing-token", "v1.k1.0.x"),
            401,
        ),
        (
            "token for another resource",
            client
                .put(&url)
                .header("fencing-resource", "bin-1")
                .header("fencing-token", keys.mint("bin-2", Token::new(0, 99))),
            403,
        ),
        (
            "oversized token header",
            client
                .put(&url)
                .header("fencing-resource", "bin-1")
                .header("fencing-token", "v".repeat(200_000)),
            401,
        ),
        (
            "oversized resource header",
            client
                .put(&url)
                .header("fencing-resource", "r".repeat(10_000))
                .header("fencing-token", &good),
            400,
        ),
        (
            "oversized body",
            client
                .put(&url)
                .header("fencing-resource", "bin-1")
                .header("fencing-token", &good)
                .body(vec![b'x'; 100_000]),
            413,
        ),
        (
            "prefence without token",
            client.post(format!("{}/fence/bin-1", gw.url)),
            428,
        ),
        (
            "prefence forged",
            client
                .post(format!("{}/fence/bin-1", gw.url))
                .header("fencing-token", good.replacen(".60.", ".61.", 1)),
            401,
        ),
    ];
    for (name, req, want) in cases {
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), want, "{name}");
    }
    assert!(received.is_empty(), "a refused request reached storage");
    // The mark did not move: token 50 is still admitted, 49 is not.
    assert_eq!(put(&gw, &keys, "bin-1", 49).await, 409);
    assert_eq!(put(&gw, &keys, "bin-1", 50).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_outcomes_and_sigterm_exits_zero() {
    let (dir, key_file, keys) = setup();
    let upstream = storage().await.url;
    let mut gw = Gateway::start(&upstream, &dir.path().join("m.db"), &key_file, free_port()).await;
    assert_eq!(put(&gw, &keys, "m-1", 3).await, 200);
    assert_eq!(put(&gw, &keys, "m-1", 2).await, 409);
    assert_eq!(
        reqwest::get(format!("{}/inventory/m-1", gw.url))
            .await
            .unwrap()
            .status(),
        200
    );
    let text = metrics::scrape(&reqwest::Client::new(), &gw.url).await;
    for line in [
        "fence_requests_total{outcome=\"admitted\"} 1",
        "fence_requests_total{outcome=\"stale\"} 1",
        "fence_requests_total{outcome=\"passed\"} 1",
        "# TYPE fence_requests_total counter",
        // The watched key file's reloads, at 0 from start-up; no TLS, so no TLS series.
        "fence_reloads_total{file=\"key-file\",outcome=\"loaded\"} 0",
        "fence_reloads_total{file=\"key-file\",outcome=\"refused\"} 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in:\n{text}"
        );
    }
    assert!(
        !text.contains(r#"file="tls""#),
        "TLS reloads without TLS:\n{text}"
    );
    Command::new("kill")
        .args(["-TERM", &gw.child.id().to_string()])
        .status()
        .unwrap();
    let status = exited(
        &mut gw.child,
        Duration::from_secs(10),
        "an exit after SIGTERM",
    )
    .await;
    assert_eq!(status.code(), Some(0));
}

/// SIGTERM with a write in flight: `/readyz` answers 503 during the shutdown delay, the write
/// completes, the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_writes_finish() {
    let (dir, key_file, keys) = setup();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    let slow = axum::Router::new().fallback(|| async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        "stored"
    });
    tokio::spawn(async move { axum::serve(listener, slow).await });
    let mut gw = Gateway::start_with(
        &upstream,
        &dir.path().join("d.db"),
        &key_file,
        free_port(),
        &["--shutdown-delay", "1s", "--drain-timeout", "5s"],
    )
    .await;
    let write = {
        let url = gw.url.clone();
        let token = keys.mint("d-1", Token::new(0, 4));
        tokio::spawn(async move {
            let resp = reqwest::Client::new()
                .put(format!("{url}/inventory/d-1"))
                .header("fencing-resource", "d-1")
                .header("fencing-token", token)
                .body("count=4")
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    Command::new("kill")
        .args(["-TERM", &gw.child.id().to_string()])
        .status()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ready = reqwest::Client::new()
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503, "readyz during the drain");
    assert_eq!(write.await.unwrap(), (200, "stored".to_owned()));
    let status = exited(
        &mut gw.child,
        Duration::from_secs(10),
        "an exit after the drain",
    )
    .await;
    assert_eq!(status.code(), Some(0));
}

#[test]
fn print_config_completions_and_man_page() {
    let out = std::process::Command::new(BIN)
        .args(["--upstream", "http://s:1", "--key-file", "k"])
        .args([
            "--store",
            "postgres://fence:hunter2@db/marks",
            "--print-config",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("store = \"postgres://***@db/marks\""),
        "{text}"
    );
    assert!(!text.contains("hunter2"));
    // Completions and the man page need no other setting.
    let out = std::process::Command::new(BIN)
        .args(["--completions", "bash"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("--resource-path"));
    let out = std::process::Command::new(BIN)
        .arg("--man")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(".TH fence-gateway"));
    // Without them the required settings are still required.
    let out = std::process::Command::new(BIN).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

#[test]
fn settings_layer_flags_over_env_over_file_over_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.toml");
    std::fs::write(
        &file,
        "upstream = \"http://from-file:1\"\nkey_file = \"/etc/fence/keys\"\n\
         store = \"sqlite:/from/file.db\"\nmax_body_bytes = 1234\nmax_connections = 3\n",
    )
    .unwrap();
    let print = |config: &std::path::Path, args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .arg("--config")
            .arg(config)
            .args(args)
            .arg("--print-config")
            .env("FENCE_GATEWAY_STORE", "memory")
            .env("FENCE_GATEWAY_MAX_CONNECTIONS", "5")
            .env_remove("FENCE_GATEWAY_UPSTREAM")
            .env_remove("FENCE_GATEWAY_KEY_FILE")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let text = print(
        &file,
        &["--max-body-bytes", "999", "--max-connections", "7"],
    );
    let effective: toml::Table = text.parse().unwrap();
    assert_eq!(
        effective["upstream"].as_str(),
        Some("http://from-file:1"),
        "file"
    );
    assert_eq!(
        effective["key_file"].as_str(),
        Some("/etc/fence/keys"),
        "file"
    );
    assert_eq!(
        effective["store"].as_str(),
        Some("memory"),
        "env beats file"
    );
    assert_eq!(
        effective["max_body_bytes"].as_integer(),
        Some(999),
        "flag beats file"
    );
    assert_eq!(
        effective["max_connections"].as_integer(),
        Some(7),
        "flag beats env"
    );
    assert_eq!(effective["drain_timeout"].as_str(), Some("10s"), "default");
    // What --print-config prints is a configuration file giving the same settings.
    let printed = dir.path().join("printed.toml");
    std::fs::write(&printed, &text).unwrap();
    assert_eq!(
        print(&printed, &["--max-connections", "7"]),
        text,
        "round trip"
    );
    // A file naming something that is no setting, or a command-line-only one, is refused.
    for bad in [
        "no_such_setting = 1\n",
        "man = true\n",
        "max_body_bytes = \"ten\"\n",
    ] {
        std::fs::write(&file, bad).unwrap();
        let out = std::process::Command::new(BIN)
            .args(["--upstream", "http://s:1", "--key-file", "k", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{bad}: {out:?}");
    }
}

/// Sends `request` verbatim on a fresh connection and returns what came back (until the
/// gateway closes the connection or 2 s pass).
async fn raw(gw: &Gateway, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(gw.url.trim_start_matches("http://"))
        .await
        .unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_hygiene_protocols_and_limits() {
    let (dir, key_file, keys) = setup();
    let Storage {
        url: upstream,
        log: received,
    } = storage().await;
    let gw = Gateway::start_with(
        &upstream,
        &dir.path().join("m.db"),
        &key_file,
        free_port(),
        &["--header-read-timeout", "500ms"],
    )
    .await;
    let token = keys.mint("aisle-5", Token::new(0, 3));

    // `Connection: fencing-token` must not strip the verified token on its way to the storage,
    // and a client's second resource header never reaches it.
    let answer = raw(
        &gw,
        format!(
            "PUT /inventory/aisle-5 HTTP/1.1\r\nhost: x\r\nconnection: close, fencing-token, \
             fencing-resource\r\nfencing-resource: aisle-5\r\nfencing-token: {token}\r\n\
             content-length: 2\r\n\r\nok"
        )
        .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let last = received.all().last().cloned().unwrap();
    assert_eq!(last.headers.get_all("fencing-token").iter().count(), 1);
    assert_eq!(last.headers["fencing-token"], token.as_str());
    assert_eq!(last.headers["fencing-resource"], "aisle-5");

    // Underscore spellings, which CGI/WSGI/Rack/PHP storages read as the same header, are
    // fencing headers too: none reaches the storage.
    let answer = raw(
        &gw,
        format!(
            "PUT /inventory/aisle-5 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             fencing_resource: aisle-8\r\nx_fencing_token: forged\r\nFENCING_TOKEN: forged\r\n\
             fencing-resource: aisle-5\r\nfencing-token: {token}\r\ncontent-length: 2\r\n\r\nok"
        )
        .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let last = received.all().last().cloned().unwrap();
    assert!(
        last.headers
            .keys()
            .all(|k| !k.as_str().contains("fencing_")),
        "{:?}",
        last.headers
    );

    // A read carries no client-sent fencing header to the storage.
    let resp = reqwest::Client::new()
        .get(format!("{}/inventory/aisle-5", gw.url))
        .header("fencing-resource", "aisle-9")
        .header("fencing-token", "v1.forged")
        .header("x-fencing-token", "v1.forged")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let last = received.all().last().cloned().unwrap();
    assert!(
        last.headers.keys().all(|k| !k.as_str().contains("fencing")),
        "{:?}",
        last.headers
    );

    // h2c (prior knowledge) is served, and forwarded to the HTTP/1.1 storage.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let resp = h2
        .put(format!("{}/inventory/aisle-5", gw.url))
        .header("fencing-resource", "aisle-5")
        .header("fencing-token", &token)
        .body("over h2")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "h2c write");
    assert_eq!(received.all().last().unwrap().body, "over h2");

    // A chunked body over --max-body-bytes (64 KiB here) is refused with 413, not 502.
    let chunk = format!("{:x}\r\n{}\r\n", 40_000, "x".repeat(40_000));
    let answer = raw(
        &gw,
        format!(
            "PUT /inventory/aisle-5 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             fencing-resource: aisle-5\r\nfencing-token: {token}\r\n\
             transfer-encoding: chunked\r\n\r\n{chunk}{chunk}0\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // A client that never finishes its headers is cut off after the header-read timeout.
    let started = tokio::time::Instant::now();
    let answer = raw(&gw, b"PUT /inventory/aisle-5 HTTP/1.1\r\nhost: x\r\n").await;
    assert!(
        started.elapsed() < Duration::from_millis(1900),
        "a silent client kept its connection ({answer:?})"
    );

    // At most 4 connections are served at once: a fifth waits until one closes.
    let gw = Gateway::start_with(
        &upstream,
        &dir.path().join("m2.db"),
        &key_file,
        free_port(),
        &["--max-client-connections", "4"],
    )
    .await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        let mut s = tokio::net::TcpStream::connect(gw.url.trim_start_matches("http://"))
            .await
            .unwrap();
        // A complete request keeps each connection open and past the header timeout.
        tokio::io::AsyncWriteExt::write_all(
            &mut s,
            b"GET /inventory/x HTTP/1.1\r\nhost: x\r\n\r\n",
        )
        .await
        .unwrap();
        idle.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = tokio::spawn({
        let url = format!("{}/livez", gw.url);
        async move { reqwest::get(url).await.map(|r| r.status().as_u16()) }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a fifth connection was served");
    drop(idle);
    assert_eq!(waiting.await.unwrap().unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_idle_and_preface_only_connections_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (dir, key_file, keys) = setup();
    let Storage {
        url: upstream,
        log: received,
    } = storage().await;
    let gw = Gateway::start_with(
        &upstream,
        &dir.path().join("m.db"),
        &key_file,
        free_port(),
        &["--header-read-timeout", "600ms", "--idle-timeout", "900ms"],
    )
    .await;
    let addr = gw.url.trim_start_matches("http://").to_owned();
    let t0 = tokio::time::Instant::now();

    // Silent: not a byte sent (hyper's own header timeout never starts for these).
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // An HTTP/2 preface and SETTINGS, then nothing.
    let mut preface = tokio::net::TcpStream::connect(&addr).await.unwrap();
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    // One request answered, then idle on keep-alive.
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /inventory/x HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // A write whose body trickles in for longer than the idle timeout: busy, never cut.
    let mut busy = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let token = keys.mint("aisle-6", Token::new(0, 2));
    busy.write_all(
        format!(
            "PUT /inventory/aisle-6 HTTP/1.1\r\nhost: x\r\nfencing-resource: aisle-6\r\n\
             fencing-token: {token}\r\ncontent-length: 4\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    for byte in b"slow" {
        tokio::time::sleep(Duration::from_millis(400)).await;
        busy.write_all(&[*byte]).await.unwrap();
    }
    let mut answer = [0u8; 12];
    busy.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200", "a busy connection was cut");
    assert_eq!(received.all().last().unwrap().body, "slow");

    let within = Duration::from_secs(5);
    for (name, stream, limit) in [
        ("silent", &mut silent, Duration::from_millis(600)),
        ("preface only", &mut preface, Duration::from_millis(600)),
        ("idle", &mut idle, Duration::from_millis(900)),
    ] {
        let at = lease_proxy_testkit::closed_at(stream, t0, within)
            .await
            .unwrap_or_else(|| panic!("{name} connection still open after {within:?}"));
        assert!(at >= limit, "{name} closed before its limit ({at:?})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_sqlite_store_fails_closed_within_the_store_timeout() {
    let (dir, key_file, keys) = setup();
    let Storage {
        url: upstream,
        log: received,
    } = storage().await;
    let marks = dir.path().join("m.db");
    let gw = Gateway::start_with(
        &upstream,
        &marks,
        &key_file,
        free_port(),
        &["--store-timeout", "1s"],
    )
    .await;
    // Another process holds the database's write lock.
    let locker = rusqlite::Connection::open(&marks).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let client = reqwest::Client::new();
    for resource in ["new-1", "new-2", "new-3"] {
        let started = tokio::time::Instant::now();
        let status = put(&gw, &keys, resource, 4).await;
        let took = started.elapsed();
        assert_eq!(status, 503, "{resource}");
        // One deadline per call, not a queue of them: at most a couple of seconds each.
        assert!(took < Duration::from_secs(3), "{resource} took {took:?}");
    }
    let started = tokio::time::Instant::now();
    let _ = client
        .get(format!("{}/readyz", gw.url))
        .send()
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(3), "/readyz hung");
    assert!(received.is_empty(), "a write went through");
    locker.execute_batch("ROLLBACK").unwrap();
    // The store recovers.
    let mut status = 0;
    for _ in 0..50 {
        status = put(&gw, &keys, "new-1", 4).await;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200);
}
