//! Micro-benchmarks of the enforcer's per-write work: token minting and verification, mark
//! reads and raises (memory and SQLite, the latter with its fsync), admission through the gate,
//! and the tower layer's overhead over the bare service it wraps.
//!
//! `cargo bench -p fencing --bench enforcement`

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;

use axum::body::Body;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use fencing::layer::ByHeader;
use fencing::{
    Fence, FencingLayer, Gate, HighWaterMarks, KeyId, Keyring, MemoryStore, SqliteStore, Token,
};
use http::{Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};

fn keyring() -> Keyring {
    let kid = KeyId::parse("bench").unwrap();
    Keyring::parse(&Keyring::generate_file(&kid)).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn tokens(c: &mut Criterion) {
    let keys = keyring();
    let wire = keys.mint("aisle-7", Token::new(1, 123_456));
    let mut forged = wire.clone();
    forged.pop();
    forged.push(if wire.ends_with('A') { 'B' } else { 'A' });
    let mut g = c.benchmark_group("token");
    g.bench_function("mint", |b| {
        b.iter(|| keys.mint(black_box("aisle-7"), Token::new(1, 123_456)))
    });
    g.bench_function("verify valid", |b| {
        b.iter(|| keys.verify(black_box("aisle-7"), black_box(&wire)).unwrap())
    });
    g.bench_function("verify forged", |b| {
        b.iter(|| {
            keys.verify(black_box("aisle-7"), black_box(&forged))
                .unwrap_err()
        })
    });
    g.bench_function("verify other resource", |b| {
        b.iter(|| {
            keys.verify(black_box("aisle-8"), black_box(&wire))
                .unwrap_err()
        })
    });
    g.finish();
}

fn marks(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let stores: Vec<(&str, Box<dyn HighWaterMarks>)> = vec![
        ("memory", Box::new(MemoryStore::new())),
        (
            "sqlite",
            Box::new(SqliteStore::open(&dir.path().join("marks.db")).unwrap()),
        ),
    ];
    let mut g = c.benchmark_group("marks");
    for (name, store) in &stores {
        rt.block_on(store.raise("aisle-7", Token::new(1, 1)))
            .unwrap();
        g.bench_function(format!("{name} get"), |b| {
            b.iter(|| rt.block_on(store.get(black_box("aisle-7"))).unwrap())
        });
        let mut revision = 1;
        g.bench_function(format!("{name} raise"), |b| {
            b.iter(|| {
                revision += 1;
                rt.block_on(store.raise("aisle-7", Token::new(1, revision)))
                    .unwrap()
            })
        });
    }
    g.finish();
}

fn gate(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let memory = Gate::new(MemoryStore::new());
    let sqlite = Gate::new(SqliteStore::open(&dir.path().join("marks.db")).unwrap());
    let mut g = c.benchmark_group("gate");
    // The steady state: the write presents the current mark (checked in memory, no store call).
    rt.block_on(memory.admit("aisle-7", Token::new(1, 5)))
        .unwrap()
        .complete();
    rt.block_on(sqlite.admit("aisle-7", Token::new(1, 5)))
        .unwrap()
        .complete();
    g.bench_function("memory admit at mark", |b| {
        b.iter(|| {
            rt.block_on(memory.admit("aisle-7", Token::new(1, 5)))
                .unwrap()
                .complete()
        })
    });
    g.bench_function("sqlite admit at mark", |b| {
        b.iter(|| {
            rt.block_on(sqlite.admit("aisle-7", Token::new(1, 5)))
                .unwrap()
                .complete()
        })
    });
    let mut revision = 5;
    g.bench_function("sqlite admit raising", |b| {
        b.iter(|| {
            revision += 1;
            rt.block_on(sqlite.admit("aisle-7", Token::new(1, revision)))
                .unwrap()
                .complete()
        })
    });
    g.bench_function("memory refuse stale", |b| {
        b.iter(|| {
            assert!(rt
                .block_on(memory.admit("aisle-7", Token::new(1, 4)))
                .is_err())
        })
    });
    g.finish();
}

fn layer(c: &mut Criterion) {
    let rt = runtime();
    let keys = Arc::new(keyring());
    let wire = keys.mint("aisle-7", Token::new(1, 5));
    let bare = tower::service_fn(|req: Request<Body>| async move {
        black_box(req);
        Ok::<_, Infallible>(
            Response::builder()
                .status(StatusCode::NO_CONTENT)
                .body(Body::empty())
                .unwrap(),
        )
    });
    let fence = Fence::new(keys, Arc::new(Gate::new(MemoryStore::new())));
    let fenced = FencingLayer::new(fence, ByHeader).layer(bare);
    let request = || {
        Request::put("/items/aisle-7")
            .header(fencing::TOKEN_HEADER, &wire)
            .header(fencing::RESOURCE_HEADER, "aisle-7")
            .body(Body::from("count=12"))
            .unwrap()
    };
    let mut g = c.benchmark_group("layer");
    g.bench_function("bare service", |b| {
        b.iter_batched(
            request,
            |req| rt.block_on(bare.oneshot(req)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("fenced service", |b| {
        b.iter_batched(
            request,
            |req| {
                let resp = rt.block_on(fenced.clone().oneshot(req)).unwrap();
                assert_eq!(resp.status(), StatusCode::NO_CONTENT);
                resp
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
    // The layer must really be enforcing: a stale token is refused.
    let stale = Request::put("/items/aisle-7")
        .header(fencing::TOKEN_HEADER, fenced_stale_token())
        .header(fencing::RESOURCE_HEADER, "aisle-7")
        .body(Body::empty())
        .unwrap();
    let mut svc = fenced.clone();
    let resp = rt
        .block_on(async {
            ServiceExt::<Request<Body>>::ready(&mut svc)
                .await
                .unwrap()
                .call(stale)
                .await
        })
        .unwrap();
    assert_ne!(resp.status(), StatusCode::NO_CONTENT);
}

fn fenced_stale_token() -> String {
    // Signed by another key: refused whatever the mark.
    keyring().mint("aisle-7", Token::new(1, 4))
}

criterion_group!(benches, tokens, marks, gate, layer);
criterion_main!(benches);
