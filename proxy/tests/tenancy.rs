//! Tenancy with `--auth-tokens`: every principal's `/v3` is a namespace of its own (keys,
//! locks and `/v3` leases of other principals are invisible and untouchable), and quotas per
//! principal (`--quota-held`, `--quota-acquire-rate`) refuse with 429 `quota-exceeded` without
//! touching other principals.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use common::*;
use lease_proxy_testkit::poll::{eventually, Probe};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const ACME: &str = "acme-token-6c1d0e";
const GLOBEX: &str = "globex-token-93ab7f";

fn token_file(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("tokens");
    let line = |name: &str, token: &str| {
        format!(
            "{name} {} acquire:*,read:*,v3:*\n",
            hex::encode(Sha256::digest(token.as_bytes()))
        )
    };
    std::fs::write(&path, line("acme", ACME) + &line("globex", GLOBEX)).unwrap();
    path
}

fn b64(s: &[u8]) -> String {
    B64.encode(s)
}

fn unb64(v: &Value) -> Vec<u8> {
    B64.decode(v.as_str().unwrap_or_default()).unwrap()
}

/// One `/v3` call as `token`: status, body.
async fn v3(proxy: &Proxy, token: &str, method: &str, body: Value) -> (u16, Value) {
    send(
        http()
            .post(format!("{}/v3/{method}", proxy.url))
            .bearer_auth(token)
            .json(&body),
    )
    .await
}

/// Every key the principal sees (range over everything), with its value.
async fn everything(proxy: &Proxy, token: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let (status, body) = v3(
        proxy,
        token,
        "kv/range",
        json!({"key": b64(b"\0"), "range_end": b64(b"\0")}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["kvs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|kv| (unb64(&kv["key"]), unb64(&kv["value"])))
        .collect()
}

async fn listed_leases(proxy: &Proxy, token: &str) -> BTreeSet<i64> {
    let (status, body) = v3(proxy, token, "lease/leases", json!({})).await;
    assert_eq!(status, 200, "{body}");
    body["leases"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|l| l["ID"].as_str().unwrap().parse().unwrap())
        .collect()
}

/// What a tenant made: its lease, and its lock's key.
struct Made {
    lease: i64,
    lock_key: Vec<u8>,
    lock_domain: String,
}

/// Grants a lease, puts `own` and `k` (value: the principal), a txn put of `t`, and locks `L`.
async fn populate(proxy: &Proxy, token: &str, name: &str) -> Made {
    let (status, grant) = v3(proxy, token, "lease/grant", json!({"TTL": "30"})).await;
    assert_eq!(status, 200, "{grant}");
    let lease: i64 = grant["ID"].as_str().unwrap().parse().unwrap();
    for key in ["k", &format!("{name}-only")] {
        let (status, body) = v3(
            proxy,
            token,
            "kv/put",
            json!({"key": b64(key.as_bytes()), "value": b64(name.as_bytes()), "lease": lease.to_string()}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = v3(
        proxy,
        token,
        "kv/txn",
        json!({"success": [{"request_put": {"key": b64(b"t"), "value": b64(name.as_bytes())}}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["succeeded"], true);
    let response = http()
        .post(format!("{}/v3/lock/lock", proxy.url))
        .bearer_auth(token)
        .json(&json!({"name": b64(b"L"), "lease": lease.to_string()}))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let lock_domain = response
        .headers()
        .get("fencing-resource")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let body: Value = response.json().await.unwrap();
    Made {
        lease,
        lock_key: unb64(&body["key"]),
        lock_domain,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_principal_sees_and_touches_only_its_own_v3() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(&dir);
    let proxy = Proxy::on(&etcd, |c| c.auth_tokens = Some(tokens.clone())).await;

    // Both lock the same name at once: separate namespaces, so neither waits for the other.
    let acme = populate(&proxy, ACME, "acme").await;
    let globex = populate(&proxy, GLOBEX, "globex").await;
    assert_ne!(
        acme.lock_domain, globex.lock_domain,
        "a tenant's lock token must not fence another tenant's lock of the same name"
    );

    // A range over everything shows each principal its own keys, with its own values.
    for (token, name, made) in [(ACME, "acme", &acme), (GLOBEX, "globex", &globex)] {
        let seen = everything(&proxy, token).await;
        let keys: BTreeSet<Vec<u8>> = seen.iter().map(|(k, _)| k.clone()).collect();
        let want: BTreeSet<Vec<u8>> = [
            b"k".to_vec(),
            format!("{name}-only").into_bytes(),
            b"t".to_vec(),
            made.lock_key.clone(),
        ]
        .into();
        assert_eq!(keys, want, "{name} sees exactly its own keys");
        for (k, v) in &seen {
            if k != &made.lock_key {
                assert_eq!(v, name.as_bytes(), "{name}: {}", String::from_utf8_lossy(k));
            }
        }
        assert_eq!(
            listed_leases(&proxy, token).await,
            BTreeSet::from([made.lease]),
            "{name} lists only its own /v3 lease"
        );
    }

    // The other's lease is unknown: revoke, keepalive, timetolive, put with it, lock with it.
    for (token, theirs) in [(ACME, globex.lease), (GLOBEX, acme.lease)] {
        let id = theirs.to_string();
        let (status, body) = v3(&proxy, token, "lease/revoke", json!({"ID": id})).await;
        assert_eq!(status, 404, "{body}");
        assert_eq!(body["message"], "etcdserver: requested lease not found");
        let (status, body) = v3(&proxy, token, "lease/timetolive", json!({"ID": id})).await;
        assert_eq!((status, &body["TTL"]), (200, &json!("-1")), "{body}");
        let (status, body) = v3(&proxy, token, "lease/keepalive", json!({"ID": id})).await;
        assert_eq!(status, 200, "{body}");
        assert!(body["result"].get("TTL").is_none(), "renewed: {body}");
        let (status, body) = v3(
            &proxy,
            token,
            "kv/put",
            json!({"key": b64(b"x"), "value": b64(b"x"), "lease": id}),
        )
        .await;
        assert_eq!(status, 404, "{body}");
        let (status, body) = v3(
            &proxy,
            token,
            "lock/lock",
            json!({"name": b64(b"M"), "lease": id}),
        )
        .await;
        assert_eq!(status, 500, "{body}");
        assert_eq!(body["message"], "etcdserver: requested lease not found");
    }

    // Unlocking the other's lock key, or deleting everything, touches only one's own keys.
    let (status, body) = v3(
        &proxy,
        ACME,
        "lock/unlock",
        json!({"key": b64(&globex.lock_key)}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = v3(
        &proxy,
        ACME,
        "kv/deleterange",
        json!({"key": b64(b"\0"), "range_end": b64(b"\0")}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["deleted"], "4", "{body}");
    assert!(everything(&proxy, ACME).await.is_empty());
    assert_eq!(
        everything(&proxy, GLOBEX).await.len(),
        4,
        "globex untouched"
    );

    // Both leases are alive still: each renews its own.
    for (token, made) in [(ACME, &acme), (GLOBEX, &globex)] {
        let (status, body) = v3(
            &proxy,
            token,
            "lease/keepalive",
            json!({"ID": made.lease.to_string()}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["TTL"], "30", "{body}");
    }

    // With authentication off, the shared namespace holds the tenants' namespaces (the
    // operator's view), as before tenancy existed.
    let open = proxy.replica(etcd.endpoints(), |_| {}).await;
    let (status, body) = send(
        http()
            .post(format!("{}/v3/kv/range", open.url))
            .json(&json!({"key": b64(b"globex/k")})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(unb64(&body["kvs"][0]["value"]), b"globex");
    assert_eq!(listed_leases_open(&open).await.len(), 2);
}

async fn listed_leases_open(proxy: &Proxy) -> Vec<Value> {
    let (status, body) = send(
        http()
            .post(format!("{}/v3/lease/leases", proxy.url))
            .json(&json!({})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["leases"].as_array().cloned().unwrap_or_default()
}

async fn acquire_as(proxy: &Proxy, token: &str, resource: &str) -> (u16, Value, Option<u64>) {
    acquire_keyed(proxy, token, resource, None).await
}

async fn acquire_keyed(
    proxy: &Proxy,
    token: &str,
    resource: &str,
    key: Option<&str>,
) -> (u16, Value, Option<u64>) {
    let mut request = http()
        .post(format!("{}/v1/leases/{resource}", proxy.url))
        .bearer_auth(token);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request
        .json(&json!({"holder": "worker", "ttl_seconds": 30}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body, retry_after)
}

async fn release_as(proxy: &Proxy, token: &str, resource: &str, secret: &str) -> u16 {
    http()
        .delete(format!("{}/v1/leases/{resource}", proxy.url))
        .bearer_auth(token)
        .header("lease-secret", secret)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn quota_refusals(metrics: &str, quota: &str) -> f64 {
    let line = format!("lease_proxy_quota_refusals_total{{quota=\"{quota}\"");
    metrics
        .lines()
        .find(|l| l.starts_with(&line))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no quota series {quota}"))
}

async fn metrics(proxy: &Proxy) -> String {
    metrics_text(&proxy.url).await
}

fn assert_quota_problem(body: &Value, quota: &str) {
    assert_eq!(
        body["type"], "https://lease-proxy.dev/problems/quota-exceeded",
        "{body}"
    );
    assert_eq!(body["status"], 429);
    assert_eq!(body["quota"], quota, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_held_quota_counts_grants_across_replicas() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(&dir);
    let audit = dir.path().join("audit.jsonl");
    let quota = |c: &mut lease_proxy::Config| {
        c.auth_tokens = Some(tokens.clone());
        c.quota_held = Some(2);
    };
    let proxy = Proxy::on(&etcd, |c| {
        quota(c);
        c.audit_log = Some(audit.clone());
    })
    .await;
    let other = proxy.replica(etcd.endpoints(), quota).await;

    // Two held (one through each replica); the third is refused on either replica.
    let (s1, first, _) = acquire_as(&proxy, ACME, "held-1").await;
    let (s2, _, _) = acquire_as(&other, ACME, "held-2").await;
    assert_eq!((s1, s2), (201, 201));
    for p in [&proxy, &other] {
        let (status, body, retry_after) = acquire_as(p, ACME, "held-3").await;
        assert_eq!(status, 429, "{body}");
        assert_quota_problem(&body, "held");
        assert!(retry_after.is_some_and(|s| s >= 1), "Retry-After");
    }
    // Another principal is not affected (it has a quota of 2 of its own).
    let (status, body, _) = acquire_as(&proxy, GLOBEX, "globex-0").await;
    assert_eq!(status, 201, "{body}");
    let (status, keyed, _) = acquire_keyed(&other, GLOBEX, "globex-1", Some("k-1")).await;
    assert_eq!(status, 201, "{keyed}");
    // At its quota, a retry of its own keyed acquire still gets its grant back; a new one not.
    let (status, again, _) = acquire_keyed(&proxy, GLOBEX, "globex-1", Some("k-1")).await;
    assert_eq!(status, 201, "{again}");
    assert_eq!(again["token"], keyed["token"]);
    let (status, body, _) = acquire_keyed(&proxy, GLOBEX, "globex-2", Some("k-2")).await;
    assert_eq!(status, 429, "{body}");
    // A release makes room at once.
    assert_eq!(
        release_as(&proxy, ACME, "held-1", &str_field(&first, "secret")).await,
        204
    );
    let (status, body, _) = acquire_as(&other, ACME, "held-3").await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(quota_refusals(&metrics(&proxy).await, "held"), 2.0);
    assert_eq!(quota_refusals(&metrics(&other).await, "held"), 1.0);

    // Racing for the last slot through both replicas: exactly one wins. acme holds held-2
    // and held-3; releasing held-3 leaves one slot.
    assert_eq!(
        release_as(&other, ACME, "held-3", &str_field(&body, "secret")).await,
        204
    );
    let names: Vec<String> = (0..8).map(|i| format!("race-{i}")).collect();
    let racers = names.iter().enumerate().map(|(i, name)| {
        let p = if i % 2 == 0 { &proxy } else { &other };
        acquire_as(p, ACME, name)
    });
    let outcomes: Vec<u16> = futures::future::join_all(racers)
        .await
        .into_iter()
        .map(|(s, _, _)| s)
        .collect();
    assert_eq!(
        outcomes.iter().filter(|s| **s == 201).count(),
        1,
        "{outcomes:?}"
    );
    assert!(
        outcomes.iter().all(|s| *s == 201 || *s == 429),
        "{outcomes:?}"
    );

    // The refusals are in the audit log, with the principal.
    eventually(
        Duration::from_secs(10),
        "acme's refusal audited",
        || async {
            let text = std::fs::read_to_string(&audit).unwrap_or_default();
            let refused = text
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .filter(|e| e["event"] == "quota" && e["outcome"] == "held")
                .any(|e| e["principal"] == "acme");
            if refused {
                Probe::Done(())
            } else {
                Probe::Not(text)
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acquire_rate_refuses_with_retry_after_per_principal() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(&dir);
    let proxy = Proxy::on(&etcd, |c| {
        c.auth_tokens = Some(tokens.clone());
        c.quota_acquire_rate = Some(0.2);
    })
    .await;
    let (status, body, _) = acquire_as(&proxy, ACME, "rate-1").await;
    assert_eq!(status, 201, "{body}");
    let (status, body, retry_after) = acquire_as(&proxy, ACME, "rate-2").await;
    assert_eq!(status, 429, "{body}");
    assert_quota_problem(&body, "rate");
    // One token every 5 s: the wait is a few seconds, never 0.
    assert!(
        retry_after.is_some_and(|s| (1..=5).contains(&s)),
        "{retry_after:?}"
    );
    // Another principal has its own bucket.
    let (status, body, _) = acquire_as(&proxy, GLOBEX, "rate-3").await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(quota_refusals(&metrics(&proxy).await, "rate"), 1.0);
    assert_eq!(quota_refusals(&metrics(&proxy).await, "held"), 0.0);
}
