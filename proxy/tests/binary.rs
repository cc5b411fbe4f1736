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
    let etcd = Etcd::single().await;
    let dir = tempfile::tempdir().unwrap();
    let port = lease_proxy_testkit::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(BIN)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd-endpoints", &etcd.endpoint(0)])
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--drain-timeout", "5s"])
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
    let etcd = Etcd::single().await;
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
