//! Against a real PostgreSQL (`FENCING_TEST_POSTGRES`; the README's test command starts one):
//! the store against the reference model, two enforcers sharing one database, two gateway
//! binaries sharing one database, the transactional mode, and the shared gate's failure modes:
//! cancelled admissions, killed sessions, a transactional writer next to a gateway's write in
//! flight, and a partitioned database.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::{keyring, postgres_url, recording_upstream, reorderings, unique, Log};
use fencing::layer::{ByHeader, Fence, FencingLayer};
use fencing::store::FencedError;
use fencing::{
    Admission, Gate, GateError, HighWaterMarks, Permit, PostgresStore, SharedGate, Token,
};
use lease_proxy_testkit::metrics;
use lease_proxy_testkit::recording::Storage;
use rand::Rng;
use tower::ServiceBuilder;

async fn store() -> PostgresStore {
    PostgresStore::connect(&postgres_url(), 4)
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
            let accepted = gate
                .admit(&resource, token)
                .await
                .map(Permit::complete)
                .is_ok();
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

/// The write grace for the recording storage: it applies a write before it answers, so nothing
/// of a write is left once its exchange has ended; and the scenario drops answers unread, which
/// ends every write as uncertain.
const STORAGE_GRACE: Duration = Duration::from_millis(1);

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
    // Rounds until at least 72 writes were applied in all (a loaded machine applies fewer per
    // round; a round is timed), at most 6: the order must hold in every one.
    let (mut total, mut rounds) = (0, 0);
    while total < 72 && rounds < 6 {
        let (applied, violations) =
            two_enforcers(|store| SharedGate::new(store.with_write_grace(STORAGE_GRACE))).await;
        eprintln!("shared gate: {applied} writes applied, {violations} out of order");
        assert_eq!(violations, 0);
        total += applied;
        rounds += 1;
    }
    assert!(
        total >= 72,
        "only {total} writes applied in {rounds} rounds: the scenario means little"
    );
}

/// The negative control: two in-process gates over the same PostgreSQL marks each order only
/// their own writes (each trusts its cached mark), and storage sees tokens out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_local_gates_on_one_database_reorder() {
    // A race, so rounds until the first reordering (usually the first round; a loaded machine
    // applies fewer writes per round and may need more), at most 20.
    for round in 1..=20 {
        let (applied, violations) =
            two_enforcers(|store| Gate::new(store).with_write_grace(STORAGE_GRACE)).await;
        eprintln!(
            "local gates, round {round}: {applied} writes applied, {violations} out of order"
        );
        if violations > 0 {
            return;
        }
    }
    panic!("the scenario did not catch per-process gates sharing a database in 20 rounds");
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
    // The storage: records every write it applies.
    let storage = Storage::builder().answer("ok").start().await;
    let upstream = storage.url.clone();

    let mut urls = Vec::new();
    let mut processes = Vec::new();
    for _ in 0..2 {
        let port = lease_proxy_testkit::free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_fence-gateway"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", &upstream])
            .args(["--store", &postgres_url()])
            .args(["--max-connections", "4"])
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
    let applied: Vec<u64> = storage
        .log
        .all()
        .iter()
        .map(|w| w.revision().unwrap())
        .collect();
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
        for op in ["get", "raise"] {
            let label = format!(r#"op="{op}""#);
            let name = "fence_mark_store_duration_seconds_count";
            let count = metrics::value(&client, url, name, &[&label]).await;
            assert!(count >= 1.0, "{op} at {url}: {count}");
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

fn t(revision: u64) -> Token {
    Token::new(0, revision)
}

/// Awaits `f`, failing the test if it does not answer within a generous bound: the shared
/// gate's failure modes show as hangs, and a hang must fail the test, not stall it.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("no answer within 20 s: something is wedged")
}

/// A store for one gateway: `max_connections`, store `deadline`, and registrations lasting
/// `max_exchange + grace + deadline`.
async fn gateway_store(
    url: &str,
    max_connections: usize,
    deadline: Duration,
    max_exchange: Duration,
    grace: Duration,
) -> PostgresStore {
    PostgresStore::connect_with_deadline(url, max_connections, deadline)
        .await
        .expect("PostgreSQL for the tests")
        .with_max_exchange(max_exchange)
        .with_write_grace(grace)
}

/// Writes waiting behind a write in flight are abandoned by their callers (a client gone, the
/// proxy's pre-fence deadline) — more often than the pool has connections. Nothing of theirs
/// stays behind: no lock request PostgreSQL later grants to a pooled session nobody owns, no
/// registration holding back higher tokens. Registrations here last over a minute, so one left
/// behind would make the later raise wait far longer than the test's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_admissions_leave_nothing_behind() {
    let gate = SharedGate::new(
        gateway_store(
            &postgres_url(),
            3,
            Duration::from_secs(2),
            Duration::from_secs(60),
            Duration::from_secs(10),
        )
        .await,
    );
    let resource = unique("cancelled");
    let busy = within(gate.admit(&resource, t(10))).await.unwrap();
    for _ in 0..8 {
        let waited =
            tokio::time::timeout(Duration::from_millis(150), gate.admit(&resource, t(11))).await;
        assert!(
            waited.is_err(),
            "11 was not waiting behind 10 in flight: {waited:?}"
        );
    }
    // And a future dropped after its first poll, without a timer.
    {
        let mut admit = gate.admit(&resource, t(11));
        assert!(futures::poll!(&mut admit).is_pending());
    }
    busy.complete();
    within(gate.admit(&resource, t(12)))
        .await
        .unwrap()
        .complete();
    for i in 0..4 {
        within(gate.admit(&unique(&format!("other-{i}")), t(1)))
            .await
            .unwrap()
            .complete();
    }
    assert!(within(gate.ready()).await);
    // A gateway on another pool sees the resource free too.
    let other = SharedGate::new(store().await);
    within(other.admit(&resource, t(13)))
        .await
        .unwrap()
        .complete();
    assert!(matches!(
        within(gate.admit(&resource, t(12))).await,
        Err(GateError::Stale { .. })
    ));
}

/// Callers that go away at random points of their admissions (while it registers, waits, or
/// just as it answers): once the gate's background work is done, none of their registrations
/// is left, and the ones that completed kept the mark in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_cancelled_anywhere_leave_no_registration() {
    let gate = SharedGate::new(
        gateway_store(
            &postgres_url(),
            3,
            Duration::from_secs(2),
            Duration::from_secs(60),
            Duration::from_secs(10),
        )
        .await,
    );
    let resource = unique("cancelled-anywhere");
    let mut rng = rand::rng();
    let mut admitted = 0;
    for revision in 1..=60u64 {
        let token = t(revision / 3 + 1);
        let patience = Duration::from_micros(rng.random_range(0..3000));
        if let Ok(Ok(permit)) = tokio::time::timeout(patience, gate.admit(&resource, token)).await {
            admitted += 1;
            permit.complete();
        }
    }
    within(gate.drain()).await;
    let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM fence_inflight WHERE resource = $1",
            &[&resource],
        )
        .await
        .unwrap()
        .get(0);
    eprintln!("{admitted} of 60 admitted before their callers gave up");
    assert_eq!(left, 0, "registrations left behind by cancelled admissions");
    within(gate.admit(&resource, t(100)))
        .await
        .unwrap()
        .complete();
}

/// `url` with the sessions named `name` in `pg_stat_activity`.
fn named(url: &str, name: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={name}")
}

/// Terminates every session named `name`; returns how many.
async fn kill_sessions(name: &str) -> usize {
    let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let rows = client
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await
        .unwrap();
    rows.len()
}

/// Gateway 1 has a write with token 10 in flight when its database sessions die (killed here;
/// equally a PostgreSQL restart, a network cut or `idle_session_timeout`). The write goes on at
/// the storage, so gateway 2 must not admit 11 until gateway 1 ends the permit — or, if gateway
/// 1 never does (it died too), until the write's registration expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_does_not_end_a_write_in_flight() {
    let name = unique("gw1").replace('-', "_");
    // A waiting admission gives up one deadline after the registration it waits on expires:
    // 2 s, not 1, so that a machine busy with the rest of the suite does not end the wait first.
    let (deadline, max_exchange, grace) = (
        Duration::from_secs(2),
        Duration::from_secs(3),
        Duration::from_secs(2),
    );
    let gateway1 = SharedGate::new(
        gateway_store(
            &named(&postgres_url(), &name),
            2,
            deadline,
            max_exchange,
            grace,
        )
        .await,
    );
    let gateway2 = Arc::new(SharedGate::new(
        gateway_store(&postgres_url(), 2, deadline, max_exchange, grace).await,
    ));
    let resource = unique("killed");

    let write10 = within(gateway1.admit(&resource, t(10))).await.unwrap();
    assert!(
        kill_sessions(&name).await >= 1,
        "no session of gateway 1 to kill"
    );
    let (g2, r) = (gateway2.clone(), resource.clone());
    let write11 = tokio::spawn(async move { g2.admit(&r, t(11)).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !write11.is_finished(),
        "gateway 2 admitted 11 while 10 was in flight on gateway 1 (its session died): {:?}",
        write11.await
    );
    write10.complete();
    let write11 = within(write11).await.unwrap().unwrap();
    write11.complete();

    // Gateway 1 dies with a write in flight: its permit is never ended.
    let write12 = within(gateway1.admit(&resource, t(12))).await.unwrap();
    std::mem::forget(write12);
    assert!(kill_sessions(&name).await >= 1);
    let (g2, r) = (gateway2.clone(), resource.clone());
    let started = tokio::time::Instant::now();
    let write13 = tokio::spawn(async move { g2.admit(&r, t(13)).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !write13.is_finished(),
        "gateway 2 admitted 13 while 12 was in flight on a dead gateway: {:?}",
        write13.await
    );
    within(write13).await.unwrap().unwrap().complete();
    eprintln!(
        "13 admitted {:?} after 12's gateway died (registration lifetime {:?})",
        started.elapsed(),
        max_exchange + grace + deadline
    );
}

/// The transactional mode next to a gateway: a fenced transaction with 11 must not commit while
/// a gateway's write with 10 is in flight; it cuts 10 off at once, and runs when 10 has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_waits_for_a_gateways_write_in_flight() {
    let store = gateway_store(
        &postgres_url(),
        3,
        Duration::from_secs(2),
        Duration::from_secs(30),
        Duration::from_secs(10),
    )
    .await;
    let gate = SharedGate::new(store.clone());
    let resource = unique("fenced-vs-gateway");
    let write10 = within(gate.admit(&resource, t(10))).await.unwrap();

    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s, r, flag) = (store.clone(), resource.clone(), ran.clone());
    let fenced = tokio::spawn(async move {
        s.fenced(&r, t(11), move |tx| {
            Box::pin(async move {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                tx.execute("SELECT 1", &[]).await
            })
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "fenced statements with 11 ran while a gateway's write with 10 was in flight"
    );
    assert!(
        matches!(
            within(gate.admit(&resource, t(10))).await,
            Err(GateError::Stale { .. })
        ),
        "10 not cut off while 11 waits"
    );
    write10.complete();
    within(fenced).await.unwrap().unwrap();
    assert!(ran.load(std::sync::atomic::Ordering::SeqCst));
    assert!(matches!(
        within(gate.admit(&resource, t(10))).await,
        Err(GateError::Stale { .. })
    ));
    assert_eq!(store.get(&resource).await.unwrap(), Some(t(11)));
}

/// A TCP relay in front of PostgreSQL whose forwarding can be stopped while its connections stay
/// open — a partition, as when the relay process is SIGSTOPped.
struct Relay {
    /// Connection string through the relay.
    url: String,
    paused: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let config: tokio_postgres::Config = postgres_url().parse().unwrap();
        let host = match &config.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            other => panic!("a TCP host please, not {other:?}"),
        };
        let target = format!(
            "{host}:{}",
            config.get_ports().first().copied().unwrap_or(5432)
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (paused, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let (in_read, in_write) = inbound.into_split();
                let (out_read, out_write) = outbound.into_split();
                for (mut from, mut to) in [(in_read, out_write), (out_read, in_write)] {
                    let mut paused = watch.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            if paused.wait_for(|p| !*p).await.is_err() {
                                return;
                            }
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            // Bytes read just before a pause are held too.
                            if paused.wait_for(|p| !*p).await.is_err() {
                                return;
                            }
                            if to.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        let mut url = format!("host=127.0.0.1 port={port}");
        if let Some(user) = config.get_user() {
            url += &format!(" user={user}");
        }
        if let Some(password) = config.get_password() {
            url += &format!(" password={}", String::from_utf8_lossy(password));
        }
        if let Some(db) = config.get_dbname() {
            url += &format!(" dbname={db}");
        }
        Self { url, paused }
    }

    fn pause(&self, paused: bool) {
        self.paused.send_replace(paused);
    }
}

/// The database stops answering (partition, paused relay, exhausted server): admissions, raises,
/// the transactional mode and readiness fail closed within a few store deadlines instead of
/// hanging; when the database answers again, the gate recovers by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_database_fails_closed_and_recovers() {
    let relay = Relay::start().await;
    let deadline = Duration::from_secs(1);
    let store = gateway_store(
        &relay.url,
        2,
        deadline,
        Duration::from_secs(5),
        Duration::from_secs(2),
    )
    .await;
    let gate = SharedGate::new(store.clone());
    let resource = unique("partition");
    within(gate.admit(&resource, t(1)))
        .await
        .unwrap()
        .complete();
    assert!(within(gate.ready()).await);

    relay.pause(true);
    let bound = deadline * 5;
    for token in [t(1), t(2)] {
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(bound, gate.admit(&resource, token)).await {
            Ok(Err(GateError::Store(e))) => {
                eprintln!(
                    "admit {token} failed closed after {:?}: {e}",
                    started.elapsed()
                )
            }
            Ok(other) => panic!("admit {token} during the partition: {other:?}"),
            Err(_) => panic!("admit {token} hung for {bound:?} during the partition"),
        }
    }
    let started = tokio::time::Instant::now();
    let fenced = tokio::time::timeout(
        bound,
        store.fenced(&resource, t(3), |tx| {
            Box::pin(async move { tx.execute("SELECT 1", &[]).await })
        }),
    )
    .await;
    match fenced {
        Ok(Err(FencedError::Store(e))) => {
            eprintln!("fenced failed closed after {:?}: {e}", started.elapsed())
        }
        Ok(other) => panic!("fenced during the partition: {other:?}"),
        Err(_) => panic!("fenced hung for {bound:?} during the partition"),
    }
    let started = tokio::time::Instant::now();
    assert_eq!(
        tokio::time::timeout(bound, gate.ready()).await.ok(),
        Some(false),
        "readiness during the partition"
    );
    eprintln!("ready() answered false after {:?}", started.elapsed());

    relay.pause(false);
    let recovered = within(async {
        loop {
            match gate.admit(&resource, t(2)).await {
                Ok(permit) => break permit,
                Err(e) => {
                    eprintln!("not yet: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    })
    .await;
    recovered.complete();
    assert!(within(gate.ready()).await);
}
