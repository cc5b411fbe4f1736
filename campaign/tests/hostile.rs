//! The campaign's background hostile `/v3` traffic against one real lease-proxy on a real etcd:
//! while a `/v1` grant is held, seconds of hostile requests aimed at its lease must leave every
//! sentinel and everything outside the namespace untouched, carry nothing from outside in any
//! answer, and leave the grant renewable. And the checks can fail: `verify` reports a sentinel
//! changed behind its back, a deleted one, a stray key outside the namespace and a namespaced key
//! on a lease `/v3` did not grant.
//!
//! The seed is printed; `HOSTILE_SEED=<seed>` replays a run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fencing::{KeyId, Keyring};
use lease_proxy_campaign::hostile::{plant, traffic, verify, Settings};
use lease_proxy_testkit::poll::answers;
use lease_proxy_testkit::{free_port, workspace_binary, Etcd};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// A lease-proxy process, killed on drop.
struct Proxy {
    url: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_proxy(etcd: &Etcd) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("fencing.key");
    Keyring::create_file(&key_file, &KeyId::parse("h1").unwrap()).unwrap();
    let log = std::fs::File::create(dir.path().join("lease-proxy.log")).unwrap();
    let port = free_port();
    let child = Command::new(workspace_binary("lease-proxy"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd-endpoints", &etcd.endpoints().join(",")])
        .arg("--key-file")
        .arg(&key_file)
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let proxy = Proxy {
        url: format!("http://127.0.0.1:{port}"),
        child,
        _dir: dir,
    };
    let readyz = format!("{}/readyz", proxy.url);
    answers(
        &reqwest::Client::new(),
        &readyz,
        200,
        Duration::from_secs(30),
    )
    .await;
    proxy
}

async fn post(url: String, body: Option<Value>, secret: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new().post(url);
    if let Some(body) = body {
        req = req.json(&body);
    }
    if let Some(secret) = secret {
        req = req.header("lease-secret", secret);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_traffic_changes_nothing_outside_the_namespace() {
    let seed: u64 = std::env::var("HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("hostile seed: {seed} (replay with HOSTILE_SEED={seed})");

    let etcd = Etcd::single().await;
    let mut client = etcd.client().await;
    let sentinels = plant(&mut client).await.unwrap();
    let proxy = start_proxy(&etcd).await;

    // Two live /v1 grants, and a spare lease (a refused acquire's, kept for reuse).
    let acquire = |resource: &str, holder: &str| {
        post(
            format!("{}/v1/leases/{resource}", proxy.url),
            Some(json!({"holder": holder, "ttl_seconds": 60})),
            None,
        )
    };
    let (status, grant) = acquire("shard-0", "robot-1").await;
    assert_eq!(status, 201, "{grant}");
    let (status, other) = acquire("shard-1", "robot-1").await;
    assert_eq!(status, 201, "{other}");
    let (status, refused) = acquire("shard-0", "robot-2").await;
    assert_eq!(status, 409, "{refused}");
    let native: i64 = grant["lease_id"].as_str().unwrap().parse().unwrap();

    let mut settings = Settings::new(
        vec![proxy.url.clone(), proxy.url.clone()],
        etcd.endpoints(),
        seed,
    );
    settings.rate = 30.0;
    let stop = CancellationToken::new();
    let running = tokio::spawn(traffic(settings, stop.clone()));
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.cancel();
    let stats = running.await.unwrap();
    println!("{}", serde_json::to_string_pretty(&stats).unwrap());

    assert!(stats.violations.is_empty(), "{:#?}", stats.violations);
    assert!(stats.answered >= 120, "only {} answered", stats.answered);
    assert_eq!(
        stats.answered + stats.timeouts + stats.transport_errors,
        stats.sent,
        "{stats:?}"
    );
    let class = |c: &str| stats.by_class.get(c).copied().unwrap_or(0);
    assert!(class("2xx") >= 30 && class("4xx") >= 30, "{stats:?}");
    assert!(
        stats.aimed_at_native >= 20,
        "few requests aimed at proxy leases"
    );
    assert!(stats.native_answers_judged >= 1, "{stats:?}");
    assert!(stats.harvests >= 5, "{stats:?}");

    let problems = verify(&mut client, &sentinels).await;
    assert!(problems.is_empty(), "{problems:#?}");

    // The /v1 grant was neither revoked nor lost: it is still renewable.
    assert!(client.lease_time_to_live(native, None).await.unwrap().ttl() > 0);
    let secret = grant["secret"].as_str().unwrap();
    let (status, renewed) = post(
        format!("{}/v1/leases/shard-0/renew", proxy.url),
        None,
        Some(secret),
    )
    .await;
    assert_eq!(status, 200, "{renewed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reports_what_changed_behind_its_back() {
    let etcd = Etcd::single().await;
    let mut client = etcd.client().await;
    let sentinels = plant(&mut client).await.unwrap();
    assert_eq!(verify(&mut client, &sentinels).await, Vec::<String>::new());

    // A sentinel rewritten with its own value (only its revision moves), one deleted, a stray
    // key outside, a key among the proxy's own that it never writes, and a namespaced key on a
    // lease that /v3 did not grant.
    client
        .put("/outside/secret", "PLANTED-outside", None)
        .await
        .unwrap();
    client.delete("/lease-proxy/hidden", None).await.unwrap();
    client.put("/outside/stray", "x", None).await.unwrap();
    client
        .put("/lease-proxy/holders/a/b", "x", None)
        .await
        .unwrap();
    let lease = client.lease_grant(60, None).await.unwrap().id();
    client
        .put(
            "/lease-proxy/v3/kv/on-a-foreign-lease",
            "x",
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await
        .unwrap();

    let problems = verify(&mut client, &sentinels).await;
    let expect = [
        "sentinel \"/outside/secret\" changed",
        "sentinel \"/lease-proxy/hidden\" was deleted",
        "\"/outside/stray\" was created outside the namespace",
        "\"/lease-proxy/holders/a/b\" lies among the proxies' own keys",
        "\"/lease-proxy/v3/kv/on-a-foreign-lease\" in the namespace is attached to lease",
    ];
    for e in expect {
        assert!(
            problems.iter().any(|p| p.contains(e)),
            "`{e}` not reported: {problems:#?}"
        );
    }
    assert_eq!(problems.len(), expect.len(), "{problems:#?}");
}
