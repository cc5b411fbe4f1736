//! The whole chain on real processes and sockets: holder → lease-proxy (forward, pre-fence) →
//! fence-gateway → storage, with a zombie holder that wakes up after losing its lease.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use common::*;
use serde_json::json;

/// What the storage applied: (method, path and query, headers, body).
type Applied = Arc<Mutex<Vec<(String, String, HeaderMap, Bytes)>>>;

/// A storage service that records every request and answers with the status asked for in
/// `x-want-status`, echoing the body and a few request facts as response headers.
async fn storage() -> (String, Applied) {
    let applied: Applied = Arc::default();
    let log = applied.clone();
    let app = axum::Router::new()
        .fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let log = log.clone();
                async move {
                    let pq = uri
                        .path_and_query()
                        .map(|p| p.to_string())
                        .unwrap_or_default();
                    let status = headers
                        .get("x-want-status")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(200);
                    let custom = headers.get("x-custom").cloned();
                    log.lock().unwrap().push((
                        method.to_string(),
                        pq.clone(),
                        headers,
                        body.clone(),
                    ));
                    let mut resp = axum::response::Response::new(axum::body::Body::from(body));
                    *resp.status_mut() = StatusCode::from_u16(status).unwrap();
                    let h = resp.headers_mut();
                    h.insert("x-echo-method", method.as_str().parse().unwrap());
                    h.insert("x-echo-path", pq.parse().unwrap());
                    if let Some(c) = custom {
                        h.insert("x-custom", c);
                    }
                    h.insert("connection", "x-hop-response".parse().unwrap());
                    h.insert("x-hop-response", "1".parse().unwrap());
                    resp
                }
            },
        )
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, applied)
}

struct Stack {
    etcd: Etcd,
    proxy: Proxy,
    gateway: String,
    storage: String,
    applied: Applied,
    _dir: tempfile::TempDir,
}

/// etcd, storage, fence-gateway (SQLite) in front of it, and a proxy forwarding and pre-fencing
/// to the gateway.
async fn stack() -> Stack {
    let etcd = Etcd::single().await;
    let (storage, applied) = storage().await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("keys");
    fencing::Keyring::create_file(&key_file, &fencing::KeyId::parse("k1").unwrap()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = format!("http://{}", listener.local_addr().unwrap());
    let config = fencing::gateway::GatewayConfig::new(
        storage.clone(),
        format!("sqlite:{}", dir.path().join("marks.db").display()),
        key_file.clone(),
    );
    tokio::spawn(fencing::gateway::run(
        listener,
        config,
        std::future::pending(),
    ));
    let proxy = Proxy::start_with_keys(etcd.endpoints(), key_file, |c| {
        c.upstream = Some(gateway.clone());
        c.prefence_url = Some(gateway.clone());
    })
    .await;
    Stack {
        etcd,
        proxy,
        gateway,
        storage,
        applied,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombie_holder_is_fenced_off() {
    let s = stack().await;
    let grant_file = s._dir.path().join("a.json");
    // Holder A is a real process: it acquires, stops itself (a GC pause, a SIGSTOP, a partition),
    // and the moment it is continued sends its late writes — through the proxy and directly to
    // the enforcer with its old token.
    let script = format!(
        r#"set -e
curl -sS -X POST '{proxy}/v1/leases/aisle-9' -H 'content-type: application/json' \
     -d '{{"holder":"A","ttl_seconds":2}}' > '{grant}'
echo acquired
kill -STOP $$
secret=$(sed -E 's/.*"secret":"([^"]+)".*/\1/' '{grant}')
token=$(sed -E 's/.*"fencing_token":"([^"]+)".*/\1/' '{grant}')
curl -s -o /dev/null -w '%{{http_code}}\n' -X PUT '{proxy}/v1/leases/aisle-9/forward/inventory/aisle-9' \
     -H "lease-secret: $secret" --data 'count from A (late, via proxy)'
curl -s -o /dev/null -w '%{{http_code}}\n' -X PUT '{gateway}/inventory/aisle-9' \
     -H 'fencing-resource: aisle-9' -H "fencing-token: $token" --data 'count from A (late, direct)'
"#,
        proxy = s.proxy.url,
        gateway = s.gateway,
        grant = grant_file.display(),
    );
    let mut a = Command::new("bash")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = a.stdout.take().unwrap();
    let mut first = [0u8; 9];
    tokio::task::spawn_blocking(move || {
        std::io::Read::read_exact(&mut out, &mut first).unwrap();
        assert_eq!(&first, b"acquired\n");
        out
    })
    .await
    .map(|out| a.stdout = Some(out))
    .unwrap();
    let grant: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&grant_file).unwrap()).unwrap();
    let a_token = token(&grant);
    // A wrote once while it held the lease.
    let (status, _) = send(
        http()
            .put(format!(
                "{}/v1/leases/aisle-9/forward/inventory/aisle-9",
                s.proxy.url
            ))
            .header("lease-secret", str_field(&grant, "secret"))
            .body("count from A"),
    )
    .await;
    assert_eq!(status, 200);

    // A is paused beyond its TTL; B takes over (waiting for the lease to lapse) and writes.
    let (status, b) = send(
        http()
            .post(format!("{}/v1/leases/aisle-9", s.proxy.url))
            .json(&json!({"holder": "B", "ttl_seconds": 10, "wait_ms": 10000})),
    )
    .await;
    assert_eq!(status, 201, "{b}");
    assert!(token(&b) > a_token);
    let (status, _) = send(
        http()
            .put(format!(
                "{}/v1/leases/aisle-9/forward/inventory/aisle-9",
                s.proxy.url
            ))
            .header("lease-secret", str_field(&b, "secret"))
            .body("count from B"),
    )
    .await;
    assert_eq!(status, 200);

    // A wakes up and immediately writes both ways: both refused.
    Command::new("kill")
        .args(["-CONT", &a.id().to_string()])
        .status()
        .unwrap();
    let output = tokio::task::spawn_blocking(move || a.wait_with_output().unwrap())
        .await
        .unwrap();
    let statuses = String::from_utf8(output.stdout).unwrap();
    let statuses: Vec<&str> = statuses.lines().collect();
    assert!(
        matches!(statuses[0], "410" | "409"),
        "late write through the proxy: {statuses:?}"
    );
    assert_eq!(
        statuses[1], "409",
        "late direct write with the old token: {statuses:?}"
    );
    let bodies: Vec<Bytes> = s
        .applied
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.3.clone())
        .collect();
    assert_eq!(bodies, vec!["count from A", "count from B"]);
    drop(s.etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_is_transparent() {
    let s = stack().await;
    let (_, grant) = acquire(&s.proxy, "shelf-1", "robot", 30).await;
    let secret = str_field(&grant, "secret");
    let cases: Vec<(&str, &str, u16, Vec<u8>)> = vec![
        ("GET", "/items/1?fields=a,b&x=%20y", 200, vec![]),
        ("PUT", "/items/1", 201, b"{\"count\": 3}".to_vec()),
        ("POST", "/items/a%2Fb", 404, vec![]),
        ("DELETE", "/items/2", 204, vec![]),
        ("PUT", "/big", 200, vec![b'z'; 3 * 1024 * 1024]),
    ];
    for (method, path, want, body) in cases {
        let method: reqwest::Method = method.parse().unwrap();
        let build = |url: String, token: bool| {
            let mut req = http()
                .request(method.clone(), url)
                .header("x-want-status", want.to_string())
                .header("x-custom", "kept")
                .header(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )
                .header("connection", "x-hop-request")
                .header("x-hop-request", "1")
                .body(body.clone());
            if token {
                req = req.header("lease-secret", &secret);
            }
            req
        };
        // Direct: to the storage itself, carrying the token the proxy would attach (the gateway
        // is not in this path).
        let direct = build(format!("{}{path}", s.storage), false)
            .header("fencing-token", str_field(&grant, "fencing_token"))
            .header("fencing-resource", "shelf-1")
            .send()
            .await
            .unwrap();
        let forwarded = build(
            format!("{}/v1/leases/shelf-1/forward{path}", s.proxy.url),
            true,
        )
        .send()
        .await
        .unwrap();
        assert_eq!(direct.status(), forwarded.status(), "{method} {path}");
        assert_eq!(forwarded.status().as_u16(), want);
        for name in ["x-echo-method", "x-echo-path", "x-custom", "content-length"] {
            assert_eq!(
                direct.headers().get(name),
                forwarded.headers().get(name),
                "{name}"
            );
        }
        assert!(forwarded.headers().get("x-hop-response").is_none());
        let (d, f) = (
            direct.bytes().await.unwrap(),
            forwarded.bytes().await.unwrap(),
        );
        assert_eq!(d, f, "{method} {path}: bodies differ");
        // What the storage saw through the proxy: same method, path, query, body and
        // end-to-end headers; the token and resource set by the proxy; no secret, no hop headers.
        let applied = s.applied.lock().unwrap();
        let (dm, dp, dh, db) = &applied[applied.len() - 2];
        let (fm, fp, fh, fb) = &applied[applied.len() - 1];
        assert_eq!((dm, dp, db), (fm, fp, fb));
        for name in ["x-custom", "traceparent"] {
            assert_eq!(dh.get(name), fh.get(name), "{name}");
        }
        for name in ["fencing-token", "fencing-resource"] {
            if method == reqwest::Method::GET {
                // A read passes the enforcer, which lets no fencing header through to storage.
                assert!(fh.get(name).is_none(), "{name} on a read");
            } else {
                assert_eq!(dh.get(name), fh.get(name), "{name}");
            }
        }
        assert!(
            fh.get("lease-secret").is_none(),
            "the secret leaked upstream"
        );
        assert!(fh.get("x-hop-request").is_none());
    }
    // Request ids: a client's is kept, echoed and passed upstream; otherwise one is made up.
    for sent in [Some("req-42"), None] {
        let mut req = http()
            .put(format!("{}/v1/leases/shelf-1/forward/items/9", s.proxy.url))
            .header("lease-secret", &secret);
        if let Some(id) = sent {
            req = req.header("x-request-id", id);
        }
        let resp = req.send().await.unwrap();
        let echoed = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
        match sent {
            Some(id) => assert_eq!(echoed, id),
            None => assert_eq!(echoed.len(), 36, "{echoed}"),
        }
        let applied = s.applied.lock().unwrap();
        let (_, _, headers, _) = applied.last().unwrap();
        assert_eq!(
            headers.get("x-request-id").and_then(|v| v.to_str().ok()),
            Some(echoed.as_str())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_from_one_replica_forwards_and_renews_through_another() {
    let s = stack().await;
    let gateway = s.gateway.clone();
    let replica = s
        .proxy
        .replica(s.etcd.endpoints(), |c| c.upstream = Some(gateway))
        .await;
    for i in 0..20 {
        let resource = format!("bin-{i}");
        let (status, grant) = acquire(&s.proxy, &resource, "robot", 30).await;
        assert_eq!(status, 201);
        let secret = str_field(&grant, "secret");
        // Immediately, before the other replica's watch may have seen the grant.
        let (status, _) = send(
            http()
                .put(format!(
                    "{}/v1/leases/{resource}/forward/bins/{i}",
                    replica.url
                ))
                .header("lease-secret", &secret)
                .body(format!("write {i}")),
        )
        .await;
        assert_eq!(status, 200, "forward via the other replica");
        assert_eq!(renew(&replica, &resource, &secret).await.0, 200);
    }
    // Wrong secret, and no upstream configured: refused without reaching storage.
    let before = s.applied.lock().unwrap().len();
    let (_, grant) = acquire(&s.proxy, "bin-x", "robot", 30).await;
    let mut forged = str_field(&grant, "secret");
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });
    let (status, _) = send(
        http()
            .put(format!("{}/v1/leases/bin-x/forward/x", replica.url))
            .header("lease-secret", forged),
    )
    .await;
    assert_eq!(status, 403);
    let bare = s.proxy.replica(s.etcd.endpoints(), |_| {}).await;
    let (status, body) = send(
        http()
            .put(format!("{}/v1/leases/bin-x/forward/x", bare.url))
            .header("lease-secret", str_field(&grant, "secret")),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(s.applied.lock().unwrap().len(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_and_enforcer() {
    let etcd = Etcd::shared().await;
    let dead = format!("http://127.0.0.1:{}", lease_proxy_testkit::free_port());
    let forwarding = Proxy::on(&etcd, |c| c.upstream = Some(dead.clone())).await;
    let (_, grant) = acquire(&forwarding, "r-1", "h", 30).await;
    let (status, body) = send(
        http()
            .put(format!("{}/v1/leases/r-1/forward/x", forwarding.url))
            .header("lease-secret", str_field(&grant, "secret")),
    )
    .await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(
        body["type"],
        format!("{}upstream-unavailable", lease_proxy::PROBLEM_BASE)
    );
    // Pre-fencing an unreachable enforcer withdraws the grant: no holder remains.
    let fencing = Proxy::on(&etcd, |c| c.prefence_url = Some(dead.clone())).await;
    let (status, body) = acquire(&fencing, "r-2", "h", 30).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["type"],
        format!("{}prefence-failed", lease_proxy::PROBLEM_BASE)
    );
    assert_eq!(
        send(http().get(format!("{}/v1/leases/r-2", fencing.url)))
            .await
            .0,
        404
    );
}
