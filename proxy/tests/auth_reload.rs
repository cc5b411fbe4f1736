//! The token file changing under a running proxy: a file caught mid-rewrite
//! is never taken — no principal gets a wider permission, nobody is locked out — and a caller
//! whose line is removed or narrowed while its acquire or `/v3` lock waits gets 401 or 403,
//! never a grant or a lock.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use lease_proxy_testkit::metrics;
use lease_proxy_testkit::poll::until;
use lease_proxy_testkit::process::exit_within;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

const ALICE: &str = "alice-7d1c0e5b9a";
const BOB: &str = "bob-2f8a6c4e1d";
const CAROL: &str = "carol-9b3e5a7c0f";

fn line(name: &str, token: &str, perms: &str) -> String {
    format!(
        "{name} {} {perms}\n",
        hex::encode(Sha256::digest(token.as_bytes()))
    )
}

/// alice acquires `a-…`; bob acquires anything; both read everything.
fn tokens() -> String {
    line("alice", ALICE, "acquire:a-,read:*") + &line("bob", BOB, "acquire:*,read:*")
}

async fn acquire_as(
    url: &str,
    token: &str,
    resource: &str,
    wait_ms: u64,
) -> (u16, serde_json::Value) {
    send(
        http()
            .post(format!("{url}/v1/leases/{resource}"))
            .bearer_auth(token)
            .json(&json!({"holder": "h", "ttl_seconds": 30, "wait_ms": wait_ms})),
    )
    .await
}

async fn read_as(url: &str, token: &str) -> u16 {
    send(
        http()
            .get(format!("{url}/v1/leases/any"))
            .bearer_auth(token),
    )
    .await
    .0
}

/// Probes for `hold`: alice must never acquire outside `a-` (a permission cut short would let
/// her), and neither alice nor bob may ever be refused as unknown (a half or empty file would).
async fn probe(url: &str, hold: Duration) {
    let end = Instant::now() + hold;
    let mut n = 0;
    while Instant::now() < end {
        n += 1;
        let (status, body) = acquire_as(url, ALICE, &format!("ax-{n}"), 0).await;
        assert_eq!(
            status, 403,
            "alice outside `a-` (wider permission, or locked out): {body}"
        );
        assert_eq!(read_as(url, BOB).await, 404, "bob locked out");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until carol's token is known: the file written last is in force.
async fn until_known(url: &str, token: &str) {
    until(PATIENCE, "the whole file loaded", || async {
        read_as(url, token).await != 401
    })
    .await;
}

/// Rewrites `path` in place (as an editor or `cat >` would, not by rename): `first`, then after
/// `pause`, `rest`. Probes throughout.
async fn rewrite_in_two_halves(url: &str, path: &Path, first: &str, rest: &str, pause: Duration) {
    let mut file = std::fs::File::create(path).unwrap();
    file.write_all(first.as_bytes()).unwrap();
    file.flush().unwrap();
    probe(url, pause).await;
    file.write_all(rest.as_bytes()).unwrap();
    file.flush().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_caught_mid_rewrite_is_never_taken() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    std::fs::write(&path, tokens()).unwrap();
    let proxy = Proxy::on(&etcd, |c| c.auth_tokens = Some(path.clone())).await;
    let url = &proxy.url;
    probe(url, Duration::ZERO).await;

    // Cut after `acquire:a` (meant: `acquire:a-`), bob's line not yet written, for longer than
    // two polls: it holds still, but its last line has no newline.
    let whole = tokens() + &line("carol", CAROL, "read:*");
    let cut = whole.find("acquire:a-").unwrap() + "acquire:a".len();
    let (first, rest) = whole.split_at(cut);
    rewrite_in_two_halves(url, &path, first, rest, Duration::from_secs(5)).await;
    until_known(url, CAROL).await;
    probe(url, Duration::ZERO).await;

    // Cut after a whole line (alice's), for less than a poll: never read while still changing.
    let whole = tokens();
    let (first, rest) = whole.split_at(whole.find("bob").unwrap());
    rewrite_in_two_halves(url, &path, first, rest, Duration::from_millis(1500)).await;
    // Written whole again: carol is gone once it is loaded.
    until(PATIENCE, "the rewrite loaded", || async {
        read_as(url, CAROL).await == 401
    })
    .await;
    probe(url, Duration::ZERO).await;

    // Emptied (a rewrite's first step), for longer than two polls: the table is kept.
    std::fs::File::create(&path).unwrap();
    probe(url, Duration::from_secs(5)).await;
    // The two files that held still (cut mid-line, then empty) were each read once and
    // refused, which an operator sees in the counter, not only in the log.
    until(PATIENCE, "two refused reloads counted", || async {
        let text = metrics_text(url).await;
        let labels = [r#"file="auth-tokens""#, r#"outcome="refused""#];
        metrics::series(&text, "lease_proxy_reloads_total", &labels) == Some(2.0)
    })
    .await;
}

#[test]
fn a_token_file_cut_short_stops_the_binary_with_64() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    let whole = tokens();
    std::fs::write(&path, whole.trim_end_matches('\n')).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lease-proxy"))
        .args([
            "--listen",
            &format!("127.0.0.1:{}", lease_proxy_testkit::free_port()),
        ])
        .args(["--etcd-endpoints", "http://127.0.0.1:1"])
        .arg("--auth-tokens")
        .arg(&path)
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A proxy that took the file serves (etcd is dialled lazily): stopped after 20 s.
    let started = exit_within(&mut child, Duration::from_secs(20)).is_none();
    if started {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!started, "started with a cut token file: {stderr}");
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("the last line has no newline"), "{stderr}");
}

/// Replaces `path` by rename, as the docs say to.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The keys under `prefix` in etcd.
async fn keys_under(etcd: &Etcd, prefix: &str) -> Vec<String> {
    let mut client = etcd.client().await;
    let resp = client
        .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// How long a reload or a waiter's move may take to be seen.
const PATIENCE: Duration = Duration::from_secs(15);

/// bob waits for a resource alice holds; then the token file changes (by rename) to `after`,
/// and `reloaded` says when it is in force. bob's wait must end with `status` at once — before
/// alice lets go — and once she has, nobody holds the resource and nobody stands in its line.
async fn a_waiter_judged_again(after: &str, status: u16, reloaded: impl Fn(String) -> bool) {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    std::fs::write(&path, tokens()).unwrap();
    let proxy = Proxy::on(&etcd, |c| c.auth_tokens = Some(path.clone())).await;
    let url = proxy.url.clone();
    let (s, held) = acquire_as(&url, ALICE, "a-1", 0).await;
    assert_eq!(s, 201, "{held}");
    let waiter = {
        let url = url.clone();
        tokio::spawn(async move { acquire_as(&url, BOB, "a-1", 30_000).await })
    };
    let line_of = &format!("{}waiters/a-1/", proxy.prefix);
    until(PATIENCE, "bob never stood in line", || async {
        keys_under(&etcd, line_of).await.len() == 1
    })
    .await;

    replace(&path, after);
    until(PATIENCE, "the new token file was never loaded", || async {
        let (s, _) = acquire_as(&url, BOB, "a-1", 0).await;
        reloaded(format!("{s}"))
    })
    .await;
    let (s, body) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("bob still waits, under a table that no longer lets him")
        .unwrap();
    assert_eq!(s, status, "{body}");

    let (s, _) = send(
        http()
            .delete(format!("{url}/v1/leases/a-1"))
            .bearer_auth(ALICE)
            .header("lease-secret", str_field(&held, "secret")),
    )
    .await;
    assert_eq!(s, 204);
    until(PATIENCE, "bob's place in line was left behind", || async {
        keys_under(&etcd, line_of).await.is_empty()
    })
    .await;
    assert!(keys_under(&etcd, &format!("{}holders/", proxy.prefix))
        .await
        .is_empty());
    let (s, body) = send(
        http()
            .get(format!("{url}/v1/leases/a-1"))
            .bearer_auth(ALICE),
    )
    .await;
    assert_eq!(s, 404, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_of_a_removed_principal_ends_with_401() {
    let alice_only = line("alice", ALICE, "acquire:a-,read:*");
    a_waiter_judged_again(&alice_only, 401, |s| s == "401").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_of_a_narrowed_principal_ends_with_403() {
    let narrowed =
        line("alice", ALICE, "acquire:a-,read:*") + &line("bob", BOB, "acquire:b-,read:*");
    a_waiter_judged_again(&narrowed, 403, |s| s == "403").await;
}

/// An acquire authorised when its headers arrived, whose body comes only after the caller's line
/// was removed: judged again right before the create transaction, it gets 401 and no grant
/// (without a wait, so no wake-up is involved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_principal_was_removed_before_its_create_gets_401() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    std::fs::write(&path, tokens()).unwrap();
    let proxy = Proxy::on(&etcd, |c| {
        c.auth_tokens = Some(path.clone());
        c.header_read_timeout = Duration::from_secs(30);
    })
    .await;
    let url = proxy.url.clone();
    let (body_tx, body_rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let pending = {
        let url = url.clone();
        tokio::spawn(async move {
            let chunks = futures::stream::unfold(body_rx, |mut rx| async move {
                rx.recv().await.map(|chunk| (chunk, rx))
            });
            let body = reqwest::Body::wrap_stream(chunks);
            send(
                http()
                    .post(format!("{url}/v1/leases/b-1"))
                    .bearer_auth(BOB)
                    .header("content-type", "application/json")
                    .body(body),
            )
            .await
        })
    };
    // bob's headers are in (his request is authorised, the body awaited) …
    body_tx.send(Ok(b"{".to_vec())).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // … when his line goes.
    replace(&path, &line("alice", ALICE, "acquire:a-,read:*"));
    until(PATIENCE, "the new token file was never loaded", || async {
        read_as(&url, BOB).await == 401
    })
    .await;
    let rest = br#""holder": "h", "ttl_seconds": 30}"#;
    body_tx.send(Ok(rest.to_vec())).await.unwrap();
    drop(body_tx);
    let (s, body) = pending.await.unwrap();
    assert_eq!(s, 401, "{body}");
    assert!(keys_under(&etcd, &format!("{}holders/", proxy.prefix))
        .await
        .is_empty());
}

/// `POST /v3/lock/lock` as `token`, under `lease`, for the lock named `m`.
async fn lock_as(url: &str, token: &str, lease: &str) -> (u16, serde_json::Value) {
    send(
        http()
            .post(format!("{url}/v3/lock/lock"))
            .bearer_auth(token)
            .json(&json!({"name": "bQ==", "lease": lease})),
    )
    .await
}

/// The same rule for a `/v3` lock: alice waits for the lock `m`, which
/// she holds under another lease; the token file then changes to `after`. The waiting lock must
/// end with etcd's `code` while the first is still held — no lock, no fencing token — and its
/// key must go, leaving the holder's alone.
async fn a_lock_waiter_judged_again(after: &str, status: u16, code: i64) {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    std::fs::write(
        &path,
        line("alice", ALICE, "v3:*") + &line("bob", BOB, "read:*"),
    )
    .unwrap();
    let proxy = Proxy::on(&etcd, |c| c.auth_tokens = Some(path.clone())).await;
    let url = proxy.url.clone();
    let mut leases = Vec::new();
    for _ in 0..2 {
        let (s, granted) = send(
            http()
                .post(format!("{url}/v3/lease/grant"))
                .bearer_auth(ALICE)
                .json(&json!({"TTL": 60})),
        )
        .await;
        assert_eq!(s, 200, "{granted}");
        leases.push(str_field(&granted, "ID"));
    }
    let (s, held) = lock_as(&url, ALICE, &leases[0]).await;
    assert_eq!(s, 200, "{held}");
    let waiter = {
        let (url, lease) = (url.clone(), leases[1].clone());
        tokio::spawn(async move { lock_as(&url, ALICE, &lease).await })
    };
    let lock_keys = &format!("{}v3/kv/alice/m/", proxy.prefix);
    until(PATIENCE, "the second lock never waited", || async {
        keys_under(&etcd, lock_keys).await.len() == 2
    })
    .await;

    replace(&path, after);
    let (s, body) = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the lock still waits, under a table that no longer lets its principal")
        .unwrap();
    assert_eq!((s, body["code"].as_i64()), (status, Some(code)), "{body}");
    until(
        PATIENCE,
        "the refused lock's key was left behind",
        || async { keys_under(&etcd, lock_keys).await.len() == 1 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_v3_lock_of_a_removed_principal_gets_no_lock() {
    a_lock_waiter_judged_again(&line("bob", BOB, "read:*"), 401, 16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_v3_lock_of_a_narrowed_principal_gets_no_lock() {
    a_lock_waiter_judged_again(
        &(line("alice", ALICE, "read:*") + &line("bob", BOB, "read:*")),
        403,
        7,
    )
    .await;
}
