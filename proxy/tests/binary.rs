//! The `lease-proxy` binary: configuration errors, the development key, and the SIGTERM drain.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_lease-proxy");

#[test]
fn bad_configuration_exits_64() {
    for args in [
        &["--min-ttl", "1"][..],
        &["--etcd-prefix", "no-trailing-slash"],
        &["--etcd-endpoints", "127.0.0.1:2379"],
        &["--listen", "not-an-address"],
        &["--worker-threads", "0"],
        &["--no-such-flag"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{args:?} printed no reason");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "max_ttl = \"ten\"\n").unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert_eq!(
        Command::new(BIN)
            .arg("--help")
            .output()
            .unwrap()
            .status
            .code(),
        Some(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_exits_zero() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let port = lease_proxy_testkit::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(BIN)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd-endpoints", &etcd.endpoint(0)])
        .args(["--etcd-prefix", &lease_proxy_testkit::prefix("binary")])
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--drain-timeout", "5s"])
        // One runtime thread: serving and draining must not need a second.
        .args(["--worker-threads", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = http();
    wait_ready(&url).await;

    // No --key-file: a development key was generated, private to the owner.
    let key = dir.path().join("dev-fencing.key");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    fencing::Keyring::load(&key).unwrap();

    // One holder, and a second acquire waiting on it when SIGTERM arrives.
    let (status, _) = send(
        client
            .post(format!("{url}/v1/leases/drain-1"))
            .json(&json!({"holder": "a", "ttl_seconds": 30})),
    )
    .await;
    assert_eq!(status, 201);
    let waiter = {
        let client = client.clone();
        let url = url.clone();
        tokio::spawn(async move {
            send(
                client
                    .post(format!("{url}/v1/leases/drain-1"))
                    .json(&json!({"holder": "b", "ttl_seconds": 30, "wait_ms": 30000})),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let signalled = Instant::now();
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let (status, body) = waiter.await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["type"],
        format!("{}shutting-down", lease_proxy::PROBLEM_BASE)
    );
    let status = tokio::task::spawn_blocking(move || {
        let status = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        (status, err)
    })
    .await
    .unwrap();
    assert_eq!(status.0.code(), Some(0), "stderr: {}", status.1);
    assert!(
        status.1.contains("DEVELOPMENT fencing key"),
        "no warning about the dev key"
    );
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "drain took {:?}",
        signalled.elapsed()
    );
}

#[test]
fn print_config_layers_and_redacts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "max_ttl = 120\nmin_ttl = 5\n").unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&file)
        .args(["--min-ttl", "3", "--print-config"])
        .args(["--upstream", "http://robot:hunter2@storage:8080/base"])
        .env("LEASE_PROXY_ERA", "7")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let printed: toml::Table = text.parse().unwrap();
    // Flag over file, file over default, environment over default.
    assert_eq!(printed["min_ttl"].as_integer(), Some(3), "{text}");
    assert_eq!(printed["max_ttl"].as_integer(), Some(120), "{text}");
    assert_eq!(printed["era"].as_integer(), Some(7), "{text}");
    assert_eq!(
        printed["upstream"].as_str(),
        Some("http://***@storage:8080/base")
    );
    assert!(!text.contains("hunter2"));
    // What it prints is a valid configuration file.
    let again = dir.path().join("again.toml");
    std::fs::write(&again, &text).unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&again)
        .arg("--print-config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn completions_and_man_page() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(BIN)
            .args(["--completions", shell])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("etcd-endpoints"), "{shell}: {text}");
    }
    let out = Command::new(BIN).arg("--man").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let man = String::from_utf8(out.stdout).unwrap();
    assert!(man.contains(".TH lease-proxy"), "{man}");
    assert!(man.contains("LEASE_PROXY_LEASE_SPARES"));
}

/// SIGTERM with a forwarded write in flight: during the shutdown delay `/readyz` answers 503 to
/// new connections while the write goes on; it completes, and the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_requests_finish() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    // An upstream that takes 1.5 s to answer.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    let slow = axum::Router::new().fallback(|| async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        "stored"
    });
    tokio::spawn(async move { axum::serve(listener, slow).await });
    let port = lease_proxy_testkit::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(BIN)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd-endpoints", &etcd.endpoint(0)])
        .args(["--etcd-prefix", &lease_proxy_testkit::prefix("binary")])
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--upstream", &upstream])
        .args(["--shutdown-delay", "1s", "--drain-timeout", "5s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = http();
    wait_ready(&url).await;
    let (status, grant) = send(
        client
            .post(format!("{url}/v1/leases/drain-2"))
            .json(&json!({"holder": "a", "ttl_seconds": 30})),
    )
    .await;
    assert_eq!(status, 201, "{grant}");
    let write = {
        let client = client.clone();
        let url = url.clone();
        let secret = str_field(&grant, "secret");
        tokio::spawn(async move {
            send(
                client
                    .put(format!("{url}/v1/leases/drain-2/forward/inventory"))
                    .header("lease-secret", secret)
                    .body("count=3"),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    lease_proxy_testkit::signal_pid(child.id(), "TERM");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ready = reqwest::Client::new()
        .get(format!("{url}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503, "readyz during the drain");
    let (status, body) = write.await.unwrap();
    assert_eq!(status, 200, "the in-flight write: {body}");
    assert_eq!(body, "stored");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

/// The binary, killed when dropped.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_binary(etcd: &Etcd, dir: &std::path::Path, extra: &[&str]) -> (Running, String) {
    let port = lease_proxy_testkit::free_port();
    let child = Command::new(BIN)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd-endpoints", &etcd.endpoint(0)])
        .args(["--etcd-prefix", &lease_proxy_testkit::prefix("binary")])
        .arg("--data-dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&url).await;
    (Running(child), url)
}

/// One `GET /livez` on `s`, read to the end of its answer; the status line.
async fn livez(s: &mut tokio::net::TcpStream) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed mid-answer");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                return head.lines().next().unwrap_or_default().to_owned();
            }
        }
    }
}

/// Silent, slow-header and idle connections are closed within the configured
/// timeouts; past the connection limit new ones are not served while existing clients are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_limits_close_slow_and_idle_connections_and_bound_their_number() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let (_proxy, url) = start_binary(
        &etcd,
        dir.path(),
        &["--header-read-timeout", "2s", "--idle-timeout", "700ms"],
    )
    .await;
    let addr = url.trim_start_matches("http://").to_owned();
    let t0 = Instant::now();
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    idle.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
    // A header trickled in one line every 200 ms, for ever.
    let mut trickle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    trickle.write_all(b"GET /livez HTTP/1.1\r\n").await.unwrap();
    let trickling = tokio::spawn(async move {
        for i in 0.. {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if trickle
                .write_all(format!("x-slow-{i}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                return t0.elapsed();
            }
            if t0.elapsed() > Duration::from_secs(10) {
                break;
            }
        }
        Duration::MAX
    });
    let within = Duration::from_secs(5);
    for (name, stream, limit) in [
        ("silent", &mut silent, Duration::from_millis(600)),
        ("idle", &mut idle, Duration::from_millis(900)),
    ] {
        let at = lease_proxy_testkit::closed_at(stream, t0, within)
            .await
            .unwrap_or_else(|| panic!("{name} connection still open after {within:?}"));
        assert!(at >= limit, "{name} closed before its limit ({at:?})");
    }
    let cut = trickling.await.unwrap();
    assert!(
        cut < within,
        "a trickled header kept its connection {cut:?}"
    );
    // A body that never arrives in full is cut off at the same deadline: 408 on /v1, etcd's
    // code 3 on /v3 — never a request held open for ever.
    for (path, want) in [
        ("/v1/leases/stalled", "HTTP/1.1 408"),
        ("/v3/kv/range", "HTTP/1.1 400"),
    ] {
        let mut stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
        stalled
            .write_all(
                format!(
                    "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                     content-length: 50\r\n\r\n{{\"holder\""
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let started = Instant::now();
        let mut answer = [0u8; 12];
        tokio::time::timeout(within, stalled.read_exact(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("{path}: a stalled body held the request open"))
            .unwrap();
        assert_eq!(&answer, want.as_bytes(), "{path}");
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "{path}: too early"
        );
    }

    // At most 4 connections served; the others wait while those 4 keep working.
    let (_limited, url) = start_binary(
        &etcd,
        tempfile::tempdir().unwrap().path(),
        &["--max-client-connections", "4"],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // readiness probes' connections closed
    let addr = url.trim_start_matches("http://").to_owned();
    let mut served = Vec::new();
    for _ in 0..4 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        assert_eq!(livez(&mut s).await, "HTTP/1.1 200 OK");
        served.push(s);
    }
    let waiting = tokio::spawn({
        let url = format!("{url}/livez");
        async move { reqwest::get(url).await.map(|r| r.status().as_u16()) }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "a fifth connection was served");
    // The four keep working meanwhile.
    for s in &mut served {
        assert_eq!(livez(s).await, "HTTP/1.1 200 OK");
    }
    assert!(!waiting.is_finished());
    drop(served);
    assert_eq!(waiting.await.unwrap().unwrap(), 200);
}

/// A client that asks and then reads nothing (paused, or its link gone quiet while its kernel
/// still acknowledges) fills the socket buffers, and the answer's writes wait: such a connection
/// is busy, so no idle deadline closes it. `--client-write-timeout` does, and its slot of
/// `--max-client-connections` comes back.
#[tokio::test]
async fn a_connection_whose_reader_takes_nothing_is_closed_at_the_write_deadline() {
    use tokio::io::AsyncWriteExt;

    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let (_proxy, url) = one_connection_proxy(&etcd, dir.path()).await;
    let address: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(address).await.unwrap();
    // Pipelined asks for the OpenAPI document: megabytes of answers nobody reads.
    let ask = "GET /openapi.json HTTP/1.1\r\nhost: x\r\n\r\n".repeat(300);
    stalled.write_all(ask.as_bytes()).await.unwrap();
    next_client_served(
        &url,
        "a connection whose reader took nothing kept the only slot",
    )
    .await;
    drop(stalled);
}

/// The same over HTTP/2, where no write ever waits: a client that opens no flow-control window
/// takes none of an answer, and hyper then never polls its body — the request stays in flight
/// and its connection busy. The answer not taken for `--client-write-timeout` closes the
/// connection all the same.
#[tokio::test]
async fn an_http2_client_that_opens_no_window_is_closed_at_the_write_deadline() {
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let (_proxy, url) = one_connection_proxy(&etcd, dir.path()).await;
    let address = url.trim_start_matches("http://").to_owned();
    let tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .adaptive_window(false)
        .initial_stream_window_size(0)
        .handshake::<_, http_body_util::Empty<bytes::Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    // The connection itself stays lively (it answers pings); only no window is ever opened.
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get(format!("http://{address}/openapi.json"))
        .body(http_body_util::Empty::new())
        .unwrap();
    let stalled = sender.send_request(request).await.unwrap();
    assert_eq!(stalled.status(), 200);
    next_client_served(
        &url,
        "an HTTP/2 client that opened no window kept the only slot",
    )
    .await;
    drop(stalled);
    driver.abort();
}

/// A proxy serving one client connection at a time, with a 2 s write deadline (and an idle
/// deadline far beyond the tests' patience), once its readiness probes' connections are closed.
async fn one_connection_proxy(etcd: &Etcd, dir: &std::path::Path) -> (Running, String) {
    let started = start_binary(
        etcd,
        dir,
        &[
            "--max-client-connections",
            "1",
            "--client-write-timeout",
            "2s",
            "--idle-timeout",
            "600s",
        ],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    started
}

/// Asserts that a new client of the proxy at `url` is answered within 20 s.
async fn next_client_served(url: &str, failure: &str) {
    let next = tokio::spawn({
        let url = format!("{url}/livez");
        async move { reqwest::get(url).await.map(|r| r.status().as_u16()) }
    });
    let answered = tokio::time::timeout(Duration::from_secs(20), next)
        .await
        .unwrap_or_else(|_| panic!("{failure}"));
    assert_eq!(answered.unwrap().unwrap(), 200);
}
