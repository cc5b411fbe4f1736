//! Helpers shared by the proxy's integration tests: an in-process proxy on a free port in front
//! of a real etcd (from `lease-proxy-testkit`), an HTTP client, and an etcd state snapshot.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

pub mod authed;
pub mod fleet;
pub mod h2grpc;
pub mod sse;

use std::time::Duration;

use serde_json::Value;

#[allow(unused_imports)] // each test file uses its part
pub use lease_proxy_testkit::{
    proxy::key_file, proxy::Proxy, recording::Storage, storage::start_gateway, Etcd,
};

/// Waits (up to 30 s) until `{url}/readyz` answers 200: a binary started by a test is serving.
pub async fn wait_ready(url: &str) {
    let readyz = format!("{url}/readyz");
    lease_proxy_testkit::poll::answers(&http(), &readyz, 200, Duration::from_secs(30)).await;
}

/// A plain HTTP client for the tests.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap()
}

/// The JSON answer of a request, with its status.
pub async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, body)
}

/// `POST /v1/leases/{resource}`.
pub async fn acquire(proxy: &Proxy, resource: &str, holder: &str, ttl: u64) -> (u16, Value) {
    send(
        http()
            .post(format!("{}/v1/leases/{resource}", proxy.url))
            .json(&serde_json::json!({"holder": holder, "ttl_seconds": ttl})),
    )
    .await
}

/// `POST /v1/leases/{resource}/renew`.
pub async fn renew(proxy: &Proxy, resource: &str, secret: &str) -> (u16, Value) {
    send(
        http()
            .post(format!("{}/v1/leases/{resource}/renew", proxy.url))
            .header("lease-secret", secret),
    )
    .await
}

/// `DELETE /v1/leases/{resource}`.
pub async fn release(proxy: &Proxy, resource: &str, secret: &str) -> (u16, Value) {
    send(
        http()
            .delete(format!("{}/v1/leases/{resource}", proxy.url))
            .header("lease-secret", secret),
    )
    .await
}

pub fn str_field(v: &Value, field: &str) -> String {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("no string `{field}` in {v}"))
        .to_owned()
}

pub fn token(v: &Value) -> u64 {
    str_field(v, "token").parse().unwrap()
}

pub fn lease_id(v: &Value) -> i64 {
    str_field(v, "lease_id").parse().unwrap()
}

/// Everything observable in etcd: every key with its revisions and value, and the live leases.
/// Two equal snapshots mean nothing changed in between.
/// One key: (key, create revision, mod revision, value, lease).
pub type KeyState = (Vec<u8>, i64, i64, Vec<u8>, i64);

#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub kvs: Vec<KeyState>,
    pub leases: Vec<i64>,
}

pub async fn snapshot(etcd: &Etcd) -> Snapshot {
    etcd.alone("every key and lease");
    let mut client = etcd.client().await;
    let resp = client
        .get(
            vec![0u8],
            Some(etcd_client::GetOptions::new().with_from_key()),
        )
        .await
        .unwrap();
    let kvs = resp
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.value().to_vec(),
                kv.lease(),
            )
        })
        .collect();
    let mut leases: Vec<i64> = client
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    leases.sort_unstable();
    Snapshot { kvs, leases }
}

/// For every etcd lease that carries keys, how many it carries.
pub async fn keys_per_lease(etcd: &Etcd) -> std::collections::BTreeMap<i64, usize> {
    let mut per_lease = std::collections::BTreeMap::new();
    for kv in snapshot(etcd).await.kvs {
        if kv.4 != 0 {
            *per_lease.entry(kv.4).or_default() += 1;
        }
    }
    per_lease
}

/// `POST {url}/v1/leases/{resource}` with a `wait_ms`.
pub async fn acquire_waiting(
    url: &str,
    resource: &str,
    holder: &str,
    ttl: u64,
    wait_ms: u64,
) -> (u16, Value) {
    send(
        http()
            .post(format!("{url}/v1/leases/{resource}"))
            .json(&serde_json::json!({"holder": holder, "ttl_seconds": ttl, "wait_ms": wait_ms})),
    )
    .await
}

/// The sum of etcd's own metric `name` (every label set) from `/metrics` on its first client
/// URL.
pub async fn etcd_metric(etcd: &Etcd, name: &str) -> f64 {
    etcd_metric_where(etcd, name, "").await
}

/// The Prometheus text of `{base}/metrics` (a proxy's or an etcd member's).
pub async fn metrics_text(base: &str) -> String {
    lease_proxy_testkit::metrics::scrape(&http(), base).await
}

/// [`etcd_metric`] over the label sets containing `labels` (e.g. `grpc_method="Watch"`).
pub async fn etcd_metric_where(etcd: &Etcd, name: &str, labels: &str) -> f64 {
    etcd.alone("an etcd metric");
    let text = metrics_text(&etcd.endpoint(0)).await;
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
                && l.contains(labels)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// etcd's own count of LeaseKeepAlive streams it has accepted.
pub async fn keepalive_streams_started(etcd: &Etcd) -> u64 {
    let labels = "grpc_method=\"LeaseKeepAlive\"";
    etcd_metric_where(etcd, "grpc_server_started_total", labels).await as u64
}

/// A gRPC keepalive stream through the proxy at `url` with `burst` renewals of lease `id` sent
/// at once (so several are under way) and each answered with TTL `ttl`.
pub async fn keepalive_burst(url: &str, id: i64, burst: usize, ttl: i64) -> h2grpc::Stream {
    use etcd_client::proto::{PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse};
    let ask = PbLeaseKeepAliveRequest { id };
    let path = "/etcdserverpb.Lease/LeaseKeepAlive";
    let mut stream = h2grpc::Stream::open(url, path, &ask, None).await;
    for _ in 1..burst {
        stream.send(&ask).await;
    }
    for _ in 0..burst {
        let answer: PbLeaseKeepAliveResponse = stream.next().await.expect("an answer");
        assert_eq!(answer.ttl, ttl);
    }
    stream
}

/// Raft proposals etcd has committed: every write (put, delete, txn with a write, lease grant
/// and revoke) is one; reads and lease renewals are none.
pub async fn etcd_proposals(etcd: &Etcd) -> u64 {
    etcd_metric(etcd, "etcd_server_proposals_committed_total").await as u64
}

/// `POST /v1/sessions`: (status, body).
pub async fn open_session(proxy: &Proxy, holder: &str, ttl: u64) -> (u16, Value) {
    send(
        http()
            .post(format!("{}/v1/sessions", proxy.url))
            .json(&serde_json::json!({"holder": holder, "ttl_seconds": ttl})),
    )
    .await
}

/// A session opened for the test: (session id, session secret).
pub async fn session(proxy: &Proxy, holder: &str, ttl: u64) -> (String, String) {
    let (status, body) = open_session(proxy, holder, ttl).await;
    assert_eq!(status, 201, "{body}");
    (str_field(&body, "session_id"), str_field(&body, "secret"))
}

/// `POST /v1/leases/{resource}` under a session.
pub async fn acquire_in(
    proxy: &Proxy,
    resource: &str,
    holder: &str,
    (id, secret): &(String, String),
) -> (u16, Value) {
    send(
        http()
            .post(format!("{}/v1/leases/{resource}", proxy.url))
            .header("lease-secret", secret)
            .json(&serde_json::json!({"holder": holder, "session": id})),
    )
    .await
}

/// `POST /v1/sessions/{id}/keepalive`.
pub async fn session_keepalive(proxy: &Proxy, (id, secret): &(String, String)) -> (u16, Value) {
    send(
        http()
            .post(format!("{}/v1/sessions/{id}/keepalive", proxy.url))
            .header("lease-secret", secret),
    )
    .await
}

/// `DELETE /v1/sessions/{id}`.
pub async fn close_session(proxy: &Proxy, (id, secret): &(String, String)) -> (u16, Value) {
    send(
        http()
            .delete(format!("{}/v1/sessions/{id}", proxy.url))
            .header("lease-secret", secret),
    )
    .await
}

/// `GET /v1/sessions/{id}`.
pub async fn get_session(proxy: &Proxy, id: &str) -> (u16, Value) {
    send(http().get(format!("{}/v1/sessions/{id}", proxy.url))).await
}

/// A token-file line: `name`, the SHA-256 of `token`, its `permissions` (`v3:*`, `acquire:*`…).
pub fn token_line(name: &str, token: &str, permissions: &str) -> String {
    use sha2::Digest;
    let digest = hex::encode(sha2::Sha256::digest(token.as_bytes()));
    format!("{name} {digest} {permissions}\n")
}

/// The sum of metric `name` over the label sets containing every one of `labels`.
pub fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
                && labels.iter().all(|label| l.contains(label))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
