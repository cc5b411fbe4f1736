//! The lease-proxy binary reloads its key file without a restart, beside fence-gateway: SIGHUP never ends it (without `--auth-tokens` or TLS too), and the rotation
//! procedure of docs/OPERATIONS.md runs on live binaries with no restart and no refused grant,
//! on a key file made and rotated by `fence-gateway keys generate | add | promote | remove`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use lease_proxy_testkit::free_port;
use lease_proxy_testkit::process::Spawned;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_lease-proxy");
const RELOADED: &str = "fencing key file reloaded";
const REFUSED: &str = "fencing key file NOT reloaded";
const SOON: Duration = Duration::from_secs(15);

/// A lease-proxy process on `etcd` (no authentication, no TLS) with `extra` arguments.
async fn proxy(etcd: &Etcd, dir: &Path, extra: &[&str]) -> (Spawned, String) {
    let port = free_port();
    let mut command = Command::new(BIN);
    command
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd-endpoints", &etcd.endpoint(0)])
        .arg("--data-dir")
        .arg(dir)
        .args(extra);
    let process = Spawned::start(command);
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&url).await;
    (process, url)
}

/// A fence-gateway process (SQLite marks, header mode) in front of a storage answering 200.
async fn gateway(dir: &Path, keys: &Path) -> (Spawned, String) {
    let storage = Storage::start().await.url;
    let port = free_port();
    let mut command = Command::new(lease_proxy_testkit::workspace_binary("fence-gateway"));
    command
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--upstream", &storage])
        .arg("--store")
        .arg(format!("sqlite:{}", dir.join("marks.db").display()))
        .arg("--key-file")
        .arg(keys);
    let process = Spawned::start(command);
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&url).await;
    (process, url)
}

/// Runs `fence-gateway keys ARGS…` (the key file is changed by rename, as the docs say) and,
/// when `both` are given, waits until both processes logged the outcome `what` once more.
/// Returns what the command printed.
async fn keys_command(args: &[&str], reloaded: Option<(&str, [&Spawned; 2])>) -> String {
    let seen = reloaded.map(|(what, both)| both.map(|p| p.logged(what)));
    let out = Command::new(lease_proxy_testkit::workspace_binary("fence-gateway"))
        .arg("keys")
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "keys {args:?}: {out:?}");
    if let (Some((what, both)), Some(seen)) = (reloaded, seen) {
        for (p, seen) in both.into_iter().zip(seen) {
            p.wait_logged(what, seen, SOON).await;
        }
    }
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Replaces `path` by rename, as the docs say to, and waits until both processes logged the
/// outcome `what` once more (polling notices the change: no signal is sent).
async fn replace(path: &Path, text: &str, what: &str, both: [&Spawned; 2]) {
    let seen = both.map(|p| p.logged(what));
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
    for (p, seen) in both.into_iter().zip(seen) {
        p.wait_logged(what, seen, SOON).await;
    }
}

async fn acquire_as(url: &str, resource: &str, idempotency_key: Option<&str>) -> (u16, Value) {
    let mut req = http()
        .post(format!("{url}/v1/leases/{resource}"))
        .json(&json!({"holder": "h", "ttl_seconds": 60}));
    if let Some(k) = idempotency_key {
        req = req.header("idempotency-key", k);
    }
    send(req).await
}

/// A write through the gateway with `token` for `resource`.
async fn write(gw: &str, resource: &str, token: &str) -> u16 {
    http()
        .put(format!("{gw}/items/{resource}"))
        .header("fencing-resource", resource)
        .header("fencing-token", token)
        .body("x")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_never_ends_a_proxy_without_auth_or_tls() {
    let etcd = Etcd::single().await;
    let dir = tempfile::tempdir().unwrap();
    // No --key-file: the development key in the data directory is the file watched.
    let (proxy, url) = proxy(&etcd, dir.path(), &[]).await;
    for n in 0..3 {
        proxy.signal("HUP");
        proxy.wait_logged(RELOADED, n, SOON).await;
    }
    assert!(proxy.alive(), "SIGHUP ended the proxy:\n{}", proxy.log());
    let (status, grant) = acquire_as(&url, "hup-1", None).await;
    assert_eq!(status, 201, "{grant}");
    assert!(str_field(&grant, "fencing_token").starts_with("v1.dev."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotation_needs_no_restart() {
    let etcd = Etcd::single().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fencing.key");
    let key_file = path.to_str().unwrap();
    // The file as a newcomer makes it: one command, and both binaries load it.
    keys_command(&["generate", key_file], None).await;
    let (gw, gw_url) = gateway(dir.path(), &path).await;
    let (proxy, url) = proxy(
        &etcd,
        dir.path(),
        &["--key-file", key_file, "--prefence-url", &gw_url],
    )
    .await;
    let both = [&proxy, &gw];

    // Before: k1 signs. A grant, and a keyed one to be retried across the rotation.
    let (status, first) = acquire_as(&url, "rot-1", None).await;
    assert_eq!(status, 201, "{first}");
    let k1_token = str_field(&first, "fencing_token");
    assert!(k1_token.starts_with("v1.k1."), "{k1_token}");
    let (status, keyed) = acquire_as(&url, "rot-2", Some("order-1")).await;
    assert_eq!(status, 201, "{keyed}");
    assert_eq!(write(&gw_url, "rot-1", &k1_token).await, 200);

    // 1. k2 added as a verifying line everywhere; 2. then made the signing line.
    let k2 = keys_command(&["add", key_file], Some((RELOADED, both))).await;
    assert_eq!(k2, "k2");
    keys_command(&["promote", key_file, "k2"], Some((RELOADED, both))).await;
    // The gateway verifies k2 (the pre-fence of every grant below proves it).
    let (status, later) = acquire_as(&url, "rot-3", None).await;
    assert_eq!(status, 201, "{later}");
    assert!(str_field(&later, "fencing_token").starts_with("v1.k2."));
    // A grant made before: renewed, it carries the same revision signed with k2.
    let (status, renewed) = renew_url(&url, "rot-1", &str_field(&first, "secret")).await;
    assert_eq!(status, 200, "{renewed}");
    let k2_token = str_field(&renewed, "fencing_token");
    assert!(k2_token.starts_with("v1.k2."), "{k2_token}");
    assert_eq!(renewed["token"], first["token"]);
    // A retry of the keyed acquire gets its grant back, with the very same secret.
    let (status, again) = acquire_as(&url, "rot-2", Some("order-1")).await;
    assert_eq!(status, 201, "{again}");
    assert_eq!(
        again["secret"], keyed["secret"],
        "the replayed secret changed"
    );
    assert_eq!(write(&gw_url, "rot-1", &k1_token).await, 200, "k1 verifies");

    // 3. k1 removed: its tokens are refused, the holders' secrets still work.
    keys_command(&["remove", key_file, "k1"], Some((RELOADED, both))).await;
    assert_eq!(write(&gw_url, "rot-1", &k1_token).await, 401);
    assert_eq!(write(&gw_url, "rot-1", &k2_token).await, 200);
    let (status, body) = release_url(&url, "rot-1", &str_field(&first, "secret")).await;
    assert_eq!(status, 204, "{body}");

    // A bad file changes nothing on either side, and both logs say why.
    replace(&path, "k3 c2hvcnQ\n", REFUSED, both).await;
    for p in both {
        assert!(
            p.log().contains("secret must be at least 32 bytes"),
            "{}",
            p.log()
        );
    }
    let (status, last) = acquire_as(&url, "rot-4", None).await;
    assert_eq!(status, 201, "{last}");
    assert!(str_field(&last, "fencing_token").starts_with("v1.k2."));
    assert_eq!(
        write(&gw_url, "rot-4", &str_field(&last, "fencing_token")).await,
        200
    );
}

async fn renew_url(url: &str, resource: &str, secret: &str) -> (u16, Value) {
    send(
        http()
            .post(format!("{url}/v1/leases/{resource}/renew"))
            .header("lease-secret", secret),
    )
    .await
}

async fn release_url(url: &str, resource: &str, secret: &str) -> (u16, Value) {
    send(
        http()
            .delete(format!("{url}/v1/leases/{resource}"))
            .header("lease-secret", secret),
    )
    .await
}
