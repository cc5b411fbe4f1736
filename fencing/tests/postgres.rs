//! Against a real PostgreSQL (`FENCING_TEST_POSTGRES`; the README's test command starts one):
//! the store against the reference model, two enforcers sharing one database, two gateway
//! binaries sharing one database, and the transactional mode.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{keyring, postgres_url, recording_upstream, reorderings, unique, Log};
use fencing::layer::{ByHeader, Fence, FencingLayer};
use fencing::store::FencedError;
use fencing::{Admission, Gate, GateError, HighWaterMarks, PostgresStore, SharedGate, Token};
use rand::Rng;
use tower::ServiceBuilder;

async fn store() -> PostgresStore {
    PostgresStore::connect(&postgres_url(), 8)
        .await
        .expect("PostgreSQL for the tests (run ./scripts/test.sh, or set FENCING_TEST_POSTGRES)")
}

/// Random (resource, token) sequences against a reference model: accepted iff token ≥ mark;
/// the stored mark never goes down — for the local gate on PostgreSQL and for the shared gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_against_postgres() {
    let local = Gate::new(store().await);
    let shared = SharedGate::new(store().await);
    let gates: [(&str, &dyn Admission); 2] = [("local", &local), ("shared", &shared)];
    for (name, gate) in gates {
        let prefix = unique(name);
        let mut model: HashMap<String, Token> = HashMap::new();
        let mut rng = rand::rng();
        for _ in 0..300 {
            let resource = format!("{prefix}-{}", rng.random_range(0..3));
            let token = Token::new(rng.random_range(0..2), rng.random_range(0..20));
            let mark = model.get(&resource).copied().unwrap_or_default();
            let accepted = gate.admit(&resource, token).await.is_ok();
            assert_eq!(
                accepted,
                token >= mark,
                "{name}: {resource} {token} against {mark}"
            );
            if accepted {
                model.insert(resource.clone(), mark.max(token));
            }
            let stored = local
                .store()
                .get(&resource)
                .await
                .unwrap()
                .unwrap_or_default();
            assert_eq!(
                stored,
                model.get(&resource).copied().unwrap_or_default(),
                "{name}"
            );
        }
    }
}

/// Two enforcers side by side on one database and one storage, clients picking either at random;
/// returns (writes applied, reorderings seen by the storage).
async fn two_enforcers<A: Admission>(make: impl Fn(PostgresStore) -> A) -> (usize, usize) {
    let keys = Arc::new(keyring("k1"));
    let log: Log = Arc::default();
    let mut services = Vec::new();
    for _ in 0..2 {
        // Separate pools, as two gateway processes would have.
        let gate = Arc::new(make(store().await));

        services.push(
            ServiceBuilder::new()
                .layer(FencingLayer::new(Fence::new(keys.clone(), gate), ByHeader))
                .service(recording_upstream(log.clone())),
        );
    }
    let resources: Vec<String> = (0..3).map(|i| unique(&format!("two-{i}"))).collect();
    let timing = (Duration::from_millis(25), Duration::from_millis(50));
    let violations = reorderings(services, keys, log.clone(), &resources, 10, timing).await;
    let applied = log.lock().unwrap().len();
    (applied, violations)
}

/// Two enforcers sharing PostgreSQL through the database-wide gate: storage sees tokens in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_enforcers_sharing_postgres_keep_order() {
    for _ in 0..2 {
        let (applied, violations) = two_enforcers(SharedGate::new).await;
        eprintln!("shared gate: {applied} writes applied, {violations} out of order");
        assert_eq!(violations, 0);
        assert!(
            applied >= 36,
            "only {applied} writes applied: the scenario means little"
        );
    }
}

/// The negative control: two in-process gates over the same PostgreSQL marks each order only
/// their own writes (each trusts its cached mark), and storage sees tokens out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_local_gates_on_one_database_reorder() {
    let mut total = 0;
    for _ in 0..3 {
        let (applied, violations) = two_enforcers(Gate::new).await;
        eprintln!("local gates: {applied} writes applied, {violations} out of order");
        total += violations;
    }
    assert!(
        total > 0,
        "the scenario did not catch per-process gates sharing a database"
    );
}

struct GatewayProcess(Child);

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two fence-gateway processes on one PostgreSQL database in front of one storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_binaries_share_marks() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("keys");
    std::fs::write(
        &key_file,
        fencing::Keyring::generate_file(&fencing::KeyId::parse("k1").unwrap()),
    )
    .unwrap();
    let keys = fencing::Keyring::load(&key_file).unwrap();
    // The storage: records the token revision of every write it applies.
    let applied: Arc<Mutex<Vec<u64>>> = Arc::default();
    let log = applied.clone();
    let app = axum::Router::new().fallback(move |headers: http::HeaderMap| {
        let log = log.clone();
        async move {
            let wire = headers["fencing-token"].to_str().unwrap().to_owned();
            log.lock()
                .unwrap()
                .push(wire.split('.').nth(3).unwrap().parse().unwrap());
            "ok"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut urls = Vec::new();
    let mut processes = Vec::new();
    for _ in 0..2 {
        let port = lease_proxy_testkit::free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_fence-gateway"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", &upstream])
            .args(["--store", &postgres_url()])
            .args(["--max-connections", "8"])
            .arg("--key-file")
            .arg(&key_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        processes.push(GatewayProcess(child));
        urls.push(format!("http://127.0.0.1:{port}"));
    }
    let client = reqwest::Client::new();
    for url in &urls {
        let mut ready = false;
        for _ in 0..200 {
            if client
                .get(format!("{url}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(ready, "gateway {url} not ready");
    }
    let resource = unique("shared-aisle");
    let put = |url: &str, revision: u64| {
        client
            .put(format!("{url}/inventory"))
            .header("fencing-resource", &resource)
            .header(
                "fencing-token",
                keys.mint(&resource, Token::new(0, revision)),
            )
            .send()
    };
    // A writes with 10; B must refuse 9 and accept 10 and 11; then A must refuse 10.
    assert_eq!(put(&urls[0], 10).await.unwrap().status(), 200);
    assert_eq!(put(&urls[1], 9).await.unwrap().status(), 409);
    assert_eq!(put(&urls[1], 10).await.unwrap().status(), 200);
    assert_eq!(put(&urls[1], 11).await.unwrap().status(), 200);
    assert_eq!(put(&urls[0], 10).await.unwrap().status(), 409);
    // Concurrent writes with rising tokens through both gateways.
    let writes = (12..60u64)
        .flat_map(|rev| [(rev, 0usize), (rev, 1)])
        .map(|(rev, g)| {
            let put = &put;
            let url = urls[g].clone();
            async move {
                tokio::time::sleep(Duration::from_millis(rev)).await;
                put(&url, rev).await.unwrap().status().as_u16()
            }
        });
    let statuses = futures::future::join_all(writes).await;
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 409),
        "{statuses:?}"
    );
    let applied = applied.lock().unwrap().clone();
    assert!(
        applied.windows(2).all(|w| w[0] <= w[1]),
        "storage saw {applied:?}"
    );
    assert_eq!(
        applied.len(),
        3 + statuses.iter().filter(|s| **s == 200).count()
    );
    // Each gateway timed its calls to the shared store: reads of the mark and raises.
    for url in &urls {
        let text = client
            .get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for op in ["get", "raise"] {
            let count = text
                .lines()
                .find_map(|l| {
                    l.strip_prefix(&format!(
                        "fence_mark_store_duration_seconds_count{{op=\"{op}\"}} "
                    ))
                })
                .unwrap_or_else(|| panic!("no {op} timings at {url}:\n{text}"));
            assert!(count.parse::<u64>().unwrap() >= 1, "{op}: {count}");
        }
    }
}

/// The transactional mode: the fence check and the caller's statements commit together.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactional_mode_commits_in_token_order() {
    let store = store().await;
    let table = unique("inventory_log").replace('-', "_");
    let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (id bigserial PRIMARY KEY, resource text, revision bigint)"
        ))
        .await
        .unwrap();
    let resource = unique("aisle");
    let tasks = (1..=30i64).flat_map(|rev| [rev, rev]).map(|rev| {
        let store = store.clone();
        let table = table.clone();
        let resource = resource.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(rev as u64 * 300)).await;
            let insert = format!("INSERT INTO {table} (resource, revision) VALUES ($1, $2)");
            let row_resource = resource.clone();
            store
                .fenced(&resource, Token::new(0, rev as u64), |tx| {
                    let resource = row_resource;
                    Box::pin(async move {
                        // Some time inside the transaction, as real work would take.
                        tokio::time::sleep(Duration::from_micros(200)).await;
                        tx.execute(insert.as_str(), &[&resource, &rev]).await
                    })
                })
                .await
        })
    });
    let mut committed = 0;
    for t in futures::future::join_all(tasks).await {
        match t.unwrap() {
            Ok(_) => committed += 1,
            Err(FencedError::Stale { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let rows = client
        .query(&format!("SELECT revision FROM {table} ORDER BY id"), &[])
        .await
        .unwrap();
    let revisions: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(revisions.len(), committed, "a stale transaction wrote");
    assert!(revisions.windows(2).all(|w| w[0] <= w[1]), "{revisions:?}");
    // A stale writer changes nothing; failing statements roll the raise back too.
    let stale = store
        .fenced(&resource, Token::new(0, 1), |tx| {
            Box::pin(async move { tx.execute("SELECT 1", &[]).await })
        })
        .await;
    assert!(matches!(stale, Err(FencedError::Stale { .. })));
    let failed = store
        .fenced(&resource, Token::new(0, 1000), |tx| {
            Box::pin(async move { tx.execute("SELECT * FROM no_such_table", &[]).await })
        })
        .await;
    assert!(matches!(failed, Err(FencedError::Statements(_))));
    assert_eq!(
        store.get(&resource).await.unwrap(),
        Some(Token::new(0, 30)),
        "a rolled-back transaction raised the mark"
    );
    client
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
    // And a gate error type is what the enforcer sees for the same mark.
    let gate = SharedGate::new(store);
    assert!(matches!(
        gate.admit(&resource, Token::new(0, 29)).await,
        Err(GateError::Stale { .. })
    ));
}
