//! The fencing layer in process: ordering under concurrency, and forged tokens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use common::{keyring, recording_upstream, reorderings, write, Log};
use fencing::layer::{ByHeader, Fence, FencingLayer};
use fencing::{Gate, HighWaterMarks, MemoryStore, SqliteStore, Token};
use http::Request;
use rand::Rng;
use tower::{Service, ServiceBuilder, ServiceExt};

/// The concurrent-holders scenario through one layer in front of `gate`.
async fn scenario<S: HighWaterMarks>(gate: Gate<S>) -> usize {
    let keys = Arc::new(keyring("k1"));
    let log: Log = Arc::default();
    let service = ServiceBuilder::new()
        .layer(FencingLayer::new(
            Fence::new(keys.clone(), Arc::new(gate)),
            ByHeader,
        ))
        .service(recording_upstream(log.clone()));
    let resources: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    reorderings(
        vec![service],
        keys,
        log,
        &resources,
        40,
        (Duration::from_micros(500), Duration::from_millis(2)),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storage_sees_tokens_in_order() {
    for _ in 0..3 {
        assert_eq!(scenario(Gate::new(MemoryStore::new())).await, 0);
    }
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("m.db")).unwrap();
    assert_eq!(scenario(Gate::new(store)).await, 0);
}

/// The negative control: without the ordering gate's wait, the same scenario reorders writes.
/// If this test ever passes with zero reorderings, the scenario no longer exercises the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_ordering_wait_writes_are_reordered() {
    // A race, so rounds until the first reordering, at most 20.
    for round in 1..=20 {
        let violations = scenario(Gate::new(MemoryStore::new()).without_ordering_for_tests()).await;
        eprintln!("round {round}: {violations} writes out of order");
        if violations > 0 {
            return;
        }
    }
    panic!("the concurrency scenario did not detect the missing ordering wait in 20 rounds");
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

/// A store that fails every call, or only raises: the enforcer must fail closed.
struct BrokenStore {
    reads_work: bool,
}

impl HighWaterMarks for BrokenStore {
    fn get<'a>(
        &'a self,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<Token>, fencing::StoreError>> {
        let ok = self.reads_work;
        Box::pin(async move {
            if ok {
                Ok(Some(Token::new(0, 5)))
            } else {
                Err(fencing::StoreError("disk on fire".into()))
            }
        })
    }

    fn raise<'a>(
        &'a self,
        _: &'a str,
        _: Token,
    ) -> futures::future::BoxFuture<'a, Result<Token, fencing::StoreError>> {
        Box::pin(async { Err(fencing::StoreError("disk on fire".into())) })
    }

    /// Writes fail, whether reads work or not.
    fn probe(&self) -> futures::future::BoxFuture<'_, Result<(), fencing::StoreError>> {
        Box::pin(async { Err(fencing::StoreError("disk on fire".into())) })
    }
}

#[tokio::test]
async fn a_failing_store_fails_closed() {
    let keys = Arc::new(keyring("k1"));
    for reads_work in [false, true] {
        let log: Log = Arc::default();
        let gate = Arc::new(Gate::new(BrokenStore { reads_work }));
        // No raise can be made: not ready, even when reads work.
        assert!(
            !fencing::Admission::ready(&*gate).await,
            "reads_work={reads_work}"
        );
        let mut service = ServiceBuilder::new()
            .layer(FencingLayer::new(Fence::new(keys.clone(), gate), ByHeader))
            .service(recording_upstream(log.clone()));
        // A write needing a raise (6 > 5, or any token when reads fail) gets 503 and goes nowhere.
        for revision in [6, 7] {
            let resp = service
                .ready()
                .await
                .unwrap()
                .call(write(&keys, "r", revision))
                .await
                .unwrap();
            assert_eq!(resp.status(), 503, "reads_work={reads_work}");
            assert_eq!(resp.headers()["retry-after"], "1");
        }
        assert!(
            log.lock().unwrap().is_empty(),
            "a write went through a failing store"
        );
        if reads_work {
            // The mark that *is* durable still admits its own holder.
            let resp = service
                .ready()
                .await
                .unwrap()
                .call(write(&keys, "r", 5))
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
        }
    }
}

/// An inner service that answers at once and reads the body afterwards (in a task of its own)
/// may still be applying the write when its answer has been read: the exchange is uncertain, so
/// a higher token waits out the write grace instead of going ahead when the body has been read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_before_the_body_was_read_leaves_the_write_uncertain() {
    let keys = Arc::new(keyring("k1"));
    let gate = Arc::new(Gate::new(MemoryStore::new()).with_write_grace(Duration::from_secs(30)));
    let early = tower::service_fn(|req: Request<Body>| async move {
        tokio::spawn(async move {
            let _ = http_body_util::BodyExt::collect(req.into_body()).await;
        });
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("accepted")))
    });
    let service = ServiceBuilder::new()
        .layer(FencingLayer::new(Fence::new(keys.clone(), gate), ByHeader))
        .service(early);
    let first = service.clone().oneshot(write(&keys, "r", 1)).await.unwrap();
    assert_eq!(first.status(), 200);
    let _ = http_body_util::BodyExt::collect(first.into_body()).await;

    // Token 2's body arrives in two parts; the storage answers after the first.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(2);
    let body = Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    }));
    let mut req = write(&keys, "r", 2);
    *req.body_mut() = body;
    tx.send(Ok("part 1".into())).await.unwrap();
    let answer = service.clone().oneshot(req).await.unwrap();
    assert_eq!(answer.status(), 200);
    let _ = http_body_util::BodyExt::collect(answer.into_body()).await;
    tx.send(Ok("part 2".into())).await.unwrap();
    drop(tx);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The body has now been read to its end and the answer too; but the answer came first.
    let third = tokio::time::timeout(
        Duration::from_millis(500),
        service.clone().oneshot(write(&keys, "r", 3)),
    )
    .await;
    assert!(
        third.is_err(),
        "a higher token went ahead of a write answered before its body was read"
    );
}
