//! The fencing layer in process: ordering under concurrency, and forged tokens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use fencing::layer::{ByHeader, Fence, FencingLayer};
use fencing::{Gate, HighWaterMarks, KeyId, Keyring, MemoryStore, SqliteStore, Token};
use http::{Request, Response};
use rand::Rng;
use tower::{Service, ServiceBuilder, ServiceExt};

fn keyring(kid: &str) -> Keyring {
    Keyring::parse(&Keyring::generate_file(&KeyId::parse(kid).unwrap())).unwrap()
}

/// What reached the storage: (resource, token revision) in arrival order.
type Log = Arc<Mutex<Vec<(String, u64)>>>;

/// A storage service that takes a random short time per write and records what it applied.
fn recording_upstream(
    log: Log,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(move |req: Request<Body>| {
        let log = log.clone();
        async move {
            let resource = req.headers()["fencing-resource"]
                .to_str()
                .unwrap()
                .to_owned();
            let wire = req.headers()["fencing-token"].to_str().unwrap().to_owned();
            let revision: u64 = wire.split('.').nth(3).unwrap().parse().unwrap();
            let delay = rand::rng().random_range(0..3000);
            tokio::time::sleep(Duration::from_micros(delay)).await;
            log.lock().unwrap().push((resource, revision));
            Ok::<_, Infallible>(Response::new(Body::from("ok")))
        }
    })
}

fn write(keys: &Keyring, resource: &str, revision: u64) -> Request<Body> {
    Request::post("/w")
        .header("fencing-resource", resource)
        .header(
            "fencing-token",
            keys.mint(resource, Token::new(0, revision)),
        )
        .body(Body::empty())
        .unwrap()
}

/// Holders with rising tokens hammer 3 resources concurrently; returns the number of times a
/// resource's storage saw a token lower than one it had already applied.
async fn reorderings<S: HighWaterMarks>(gate: Gate<S>) -> usize {
    let keys = Arc::new(keyring("k1"));
    let log: Log = Arc::default();
    let fence = Fence::new(keys.clone(), Arc::new(gate));
    let service = ServiceBuilder::new()
        .layer(FencingLayer::new(fence, ByHeader))
        .service(recording_upstream(log.clone()));
    let mut tasks = Vec::new();
    for resource in ["a", "b", "c"] {
        for revision in 1..=40u64 {
            for _ in 0..4 {
                let svc = service.clone();
                let keys = keys.clone();
                tasks.push(tokio::spawn(async move {
                    // Holders overlap in time: each starts a little after the previous one.
                    let start = revision * 500 + rand::rng().random_range(0..2000);
                    tokio::time::sleep(Duration::from_micros(start)).await;
                    let resp = svc.oneshot(write(&keys, resource, revision)).await.unwrap();
                    (resource, revision, resp.status().as_u16())
                }));
            }
        }
    }
    let mut statuses: HashMap<u16, usize> = HashMap::new();
    for t in tasks {
        let (_, _, status) = t.await.unwrap();
        *statuses.entry(status).or_default() += 1;
    }
    assert!(
        statuses.keys().all(|s| *s == 200 || *s == 409),
        "{statuses:?}"
    );
    let log = log.lock().unwrap();
    assert_eq!(
        log.len(),
        statuses.get(&200).copied().unwrap_or(0),
        "a refused write reached storage"
    );
    let mut highest: HashMap<&str, u64> = HashMap::new();
    let mut violations = 0;
    for (resource, revision) in log.iter() {
        let h = highest.entry(resource.as_str()).or_default();
        if *revision < *h {
            violations += 1;
        }
        *h = (*h).max(*revision);
    }
    violations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storage_sees_tokens_in_order() {
    for _ in 0..3 {
        assert_eq!(reorderings(Gate::new(MemoryStore::new())).await, 0);
    }
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("m.db")).unwrap();
    assert_eq!(reorderings(Gate::new(store)).await, 0);
}

/// The negative control: without the ordering gate's wait, the same scenario reorders writes.
/// If this test ever passes with zero reorderings, the scenario no longer exercises the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_ordering_wait_writes_are_reordered() {
    let mut total = 0;
    for _ in 0..3 {
        total += reorderings(Gate::new(MemoryStore::new()).without_ordering_for_tests()).await;
    }
    assert!(
        total > 0,
        "the concurrency scenario did not detect the missing ordering wait"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_forgeries_are_all_refused() {
    let keys = Arc::new(keyring("k1"));
    let other_key = keyring("k1");
    let unknown_kid = keyring("k9");
    let log: Log = Arc::default();
    let store = Arc::new(Gate::new(MemoryStore::new()));
    let fence = Fence::new(keys.clone(), store.clone());
    let mut service = ServiceBuilder::new()
        .layer(FencingLayer::new(fence, ByHeader))
        .service(recording_upstream(log.clone()));
    // A genuine write sets the mark at 100.
    let resp = service
        .ready()
        .await
        .unwrap()
        .call(write(&keys, "vault", 100))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    log.lock().unwrap().clear();

    let mut rng = rand::rng();
    let mut by_status: HashMap<u16, usize> = HashMap::new();
    for i in 0..10_000u64 {
        let revision = 100 + rng.random_range(1..1_000_000);
        let wire = match i % 6 {
            0 => (0..rng.random_range(0..120))
                .map(|_| rng.random_range(b'!'..=b'~') as char)
                .collect::<String>(),
            1 => {
                // Well-formed, unsigned: random tag and MAC.
                let genuine = keys.mint("vault", Token::new(0, revision));
                let mut parts: Vec<String> = genuine.split('.').map(str::to_owned).collect();
                parts[5] = "A".repeat(43);
                parts.join(".")
            }
            2 => keys.mint("vault", Token::new(0, 101)).replacen(
                ".101.",
                &format!(".{}.", u64::MAX),
                1,
            ),
            3 => unknown_kid.mint("vault", Token::new(0, revision)),
            4 => keys.mint("other-vault", Token::new(0, revision)),
            _ => other_key.mint("vault", Token::new(0, revision)),
        };
        let mut req = Request::post("/w").header("fencing-resource", "vault");
        if let Ok(v) = http::HeaderValue::from_str(&wire) {
            req = req.header("fencing-token", v);
        }
        let resp = service
            .ready()
            .await
            .unwrap()
            .call(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        *by_status.entry(resp.status().as_u16()).or_default() += 1;
    }
    assert!(
        log.lock().unwrap().is_empty(),
        "a forged write reached storage"
    );
    assert!(
        by_status.keys().all(|s| [400, 401, 403, 428].contains(s)),
        "{by_status:?}"
    );
    assert!(
        by_status.get(&403).copied().unwrap_or(0) > 1000,
        "{by_status:?}"
    );
    assert_eq!(
        store.store().get("vault").await.unwrap(),
        Some(Token::new(0, 100))
    );
    assert_eq!(store.store().get("other-vault").await.unwrap(), None);
}
