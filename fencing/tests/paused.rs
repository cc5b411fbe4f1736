//! A fence-gateway process paused between the commit of a write's registration and its reading
//! of that answer (a VM freeze, cgroup throttling, swap, SIGSTOP) must never deliver the write
//! once the registration may have expired: two gateways share one PostgreSQL, the old holder's
//! write is registered through the first, which is then stopped; the new holder's write goes
//! through the second; the storage's applied order must never go down.
//!
//! How the pause lands exactly between the two: the test holds the resource's mark row
//! `FOR UPDATE`, so the first gateway's registration (which takes it `FOR SHARE`) waits in the
//! database; the gateway is stopped while it waits, then the row is let go: PostgreSQL commits
//! the registration and its answer waits in the stopped gateway's socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use common::GatewayProcess as Gateway;
use fencing::layer::{ByHeader, Fence, FencingLayer};
use fencing::{Admission, GateError, Keyring, Permit, PostgresStore, SharedGate, Token};
use futures::future::BoxFuture;
use http::{Request, Response};
use http_body_util::BodyExt;
use lease_proxy_testkit::poll::{eventually, Probe};
use lease_proxy_testkit::recording::Storage;
use lease_proxy_testkit::signal_pid;
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};

/// The gateways' timing: a registration lasts `L = 400 ms + 2.5 s + 2 s = 4.9 s`. The store
/// timeout leaves a loaded machine time to open the pool and answer the readiness probe.
const FLAGS: [&str; 8] = [
    "--upstream-timeout",
    "400ms",
    "--write-grace",
    "2500ms",
    "--store-timeout",
    "2s",
    "--max-connections",
    "4",
];
/// How long the storage takes to apply a `slow` write (within its contract: below the
/// upstream timeout plus the write grace).
const APPLY: Duration = Duration::from_millis(1000);
/// How long the first gateway stays stopped: longer than the store timeout plus the upstream
/// timeout, shorter than a registration, and long enough that a write sent at the resume is
/// applied after the registration lapsed (`PAUSE + APPLY > L`) — so that, resumed, a gateway that
/// starts the exchange's clock then delivers the write late.
const PAUSE: Duration = Duration::from_millis(4400);

/// What the storage applied, in order: (resource, revision).
type Applied = Arc<Mutex<Vec<(String, u64)>>>;

async fn write(keys: &Keyring, gateway: &str, resource: &str, revision: u64, mode: &str) -> u16 {
    reqwest::Client::new()
        .put(format!("{gateway}/w/{resource}"))
        .header("fencing-resource", resource)
        .header(
            "fencing-token",
            keys.mint(resource, Token::new(0, revision)),
        )
        .header("x-mode", mode)
        .body("count")
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

async fn admin() -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(&common::postgres_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    client
}

/// Waits (at most 2 s) until some session waits for a lock on the marks table.
async fn until_a_registration_waits(db: &tokio_postgres::Client) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let waiting: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE NOT granted \
                 AND (relation = 'fence_marks'::regclass OR locktype = 'transactionid' \
                      OR locktype = 'tuple')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the registration never waited for the mark row"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The old holder's write registered through the first gateway, which is stopped for
/// [`PAUSE`] right there; the new holder writes through the second. The order the storage
/// applied, with the first gateway run as shipped or as the negative control.
async fn paused_gateway(control: bool) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    let (key_file, keys) = common::key_file(dir.path());
    let keys = Arc::new(keys);
    // Each write applied in a task of its own (`x-mode: slow` after APPLY), in order.
    let Storage {
        url: upstream,
        log: applied,
    } = Storage::builder().modes(APPLY).start().await;
    let url = common::postgres_url();
    let mut flags = FLAGS.to_vec();
    let mut program = env!("CARGO_BIN_EXE_fence-gateway");
    if control {
        program = env!("CARGO_BIN_EXE_fence-gateway-control");
        flags.extend(["--negative-control", "deadline-from-admission"]);
    }
    let old = Gateway::start_program(program, &upstream, &url, &key_file, &flags).await;
    let new = Gateway::start_with_store(&upstream, &url, &key_file, &FLAGS).await;
    let resource = common::unique("paused");
    assert_eq!(write(&keys, &old.url, &resource, 10, "fast").await, 200);

    // The mark row held, the old holder's next write is sent: its registration waits.
    let mut db = admin().await;
    let hold = db.transaction().await.unwrap();
    hold.execute(
        "SELECT mark FROM fence_marks WHERE resource = $1 FOR UPDATE",
        &[&resource],
    )
    .await
    .unwrap();
    let late = {
        let (keys, old_url, resource) = (keys.clone(), old.url.clone(), resource.clone());
        tokio::spawn(async move { write(&keys, &old_url, &resource, 10, "slow").await })
    };
    let watcher = admin().await;
    until_a_registration_waits(&watcher).await;
    // Stopped while it waits; the registration commits the moment the row is let go.
    let pid = old.child.id();
    signal_pid(pid, "STOP");
    hold.rollback().await.unwrap();
    let resumed_at = Instant::now() + PAUSE;
    let resume = tokio::spawn(async move {
        tokio::time::sleep_until(resumed_at).await;
        signal_pid(pid, "CONT");
    });

    // The new holder, through the other gateway: it waits for the registration to go.
    assert_eq!(write(&keys, &new.url, &resource, 11, "fast").await, 200);
    resume.await.unwrap();
    let late = late.await.unwrap();
    // Give a late old write every chance to be applied.
    tokio::time::sleep(APPLY * 2).await;
    eprintln!("control {control}: the paused gateway answered {late}");
    applied
        .all()
        .iter()
        .filter(|w| w.resource() == resource)
        .map(|w| w.revision().unwrap())
        .collect()
}

/// The control (`fence-gateway-control --negative-control deadline-from-admission`: the
/// exchange's clock starts when
/// the gateway reads its admission, and a late answer is taken) must deliver the write after
/// the newer one; the gateway as shipped never does. The control's race needs the stop to land
/// while the registration still waits, which a loaded machine can miss: it gets three tries
/// (seen once in CI: the stop came late, the paused gateway answered 409, nothing was late).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_paused_between_its_registration_and_the_answer_never_writes_late() {
    let mut tries = Vec::new();
    for _ in 0..3 {
        let control = paused_gateway(true).await;
        let caught = control.windows(2).any(|w| w[0] > w[1]);
        tries.push(control);
        if caught {
            break;
        }
    }
    assert!(
        tries
            .last()
            .is_some_and(|c| c.windows(2).any(|w| w[0] > w[1])),
        "the control was not caught in three tries: the storage applied {tries:?}"
    );
    let order = paused_gateway(false).await;
    assert!(
        order.windows(2).all(|w| w[0] <= w[1]) && order.ends_with(&[11]),
        "the storage applied {order:?}: a write registered before the pause was delivered \
         after its registration expired"
    );
}

/// An admission that, once armed, holds its answer back for a while after the gate gave it:
/// to the fencing layer, exactly what a process paused between the registration's commit and
/// its reading of the answer looks like.
struct PausedAfterAdmission {
    gate: SharedGate,
    pause: Mutex<Option<Duration>>,
    admitted: Arc<Notify>,
}

impl Admission for PausedAfterAdmission {
    fn admit<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<Permit, GateError>> {
        Box::pin(async move {
            let permit = self.gate.admit(resource, token).await;
            let pause = self.pause.lock().unwrap().take();
            if let Some(pause) = pause {
                self.admitted.notify_one();
                tokio::time::sleep(pause).await;
            }
            permit
        })
    }

    fn ready(&self) -> BoxFuture<'_, bool> {
        self.gate.ready()
    }
}

/// The storage as a service in this process: applies each write in a task of its own (`slow`
/// after [`APPLY`]) and records the order.
fn applying(applied: Applied) -> BoxCloneService<Request<Body>, Response<Body>, Infallible> {
    BoxCloneService::new(tower::service_fn(move |req: Request<Body>| {
        let log = applied.clone();
        async move {
            let resource = req.headers()["fencing-resource"]
                .to_str()
                .unwrap()
                .to_owned();
            let wire = req.headers()["fencing-token"].to_str().unwrap();
            let revision: u64 = wire.split('.').nth(3).unwrap().parse().unwrap();
            let slow = req.headers().get("x-mode").is_some_and(|m| m == "slow");
            let body = req.into_body();
            let _ = tokio::spawn(async move {
                let _ = body.collect().await;
                if slow {
                    tokio::time::sleep(APPLY).await;
                }
                log.lock().unwrap().push((resource, revision));
            })
            .await;
            Ok::<_, Infallible>(Response::new(Body::from("applied")))
        }
    }))
}

async fn gateway_store() -> PostgresStore {
    PostgresStore::connect_with_deadline(&common::postgres_url(), 4, Duration::from_secs(2))
        .await
        .unwrap()
        .with_max_exchange(Duration::from_millis(400))
        .with_write_grace(Duration::from_millis(2500))
}

/// The old holder's write is admitted through the first enforcer, which then pauses for
/// [`PAUSE`] before its layer sees the permit; the new holder writes through the second. The
/// order the storage applied, for the first enforcer built with `control` (the exchange
/// deadline counted from when the permit was read) or as shipped.
async fn paused_after_admission(control: bool) -> Vec<u64> {
    let keys = Arc::new(common::keyring("k1"));
    let applied: Applied = Arc::default();
    let admitted = Arc::new(Notify::new());
    let old_gate = Arc::new(PausedAfterAdmission {
        gate: SharedGate::new(gateway_store().await),
        pause: Mutex::new(None),
        admitted: admitted.clone(),
    });
    let layer = FencingLayer::new(Fence::new(keys.clone(), old_gate.clone()), ByHeader)
        .with_exchange_deadline(Duration::from_millis(400));
    let layer = if control {
        layer.negative_control_deadline_from_admission()
    } else {
        layer
    };
    let old = ServiceBuilder::new()
        .layer(layer)
        .service(applying(applied.clone()));
    let new = ServiceBuilder::new()
        .layer(
            FencingLayer::new(
                Fence::new(
                    keys.clone(),
                    Arc::new(SharedGate::new(gateway_store().await)),
                ),
                ByHeader,
            )
            .with_exchange_deadline(Duration::from_millis(400)),
        )
        .service(applying(applied.clone()));
    let resource = common::unique("paused-in-process");
    let write = |revision: u64, mode: &str| {
        Request::put("/w")
            .header("fencing-resource", &resource)
            .header(
                "fencing-token",
                keys.mint(&resource, Token::new(0, revision)),
            )
            .header("x-mode", mode)
            .body(Body::from("count"))
            .unwrap()
    };
    let first = old.clone().oneshot(write(10, "fast")).await.unwrap();
    assert_eq!(first.status(), 200);

    *old_gate.pause.lock().unwrap() = Some(PAUSE);
    let late = tokio::spawn(old.clone().oneshot(write(10, "slow")));
    admitted.notified().await;
    let newer = new.clone().oneshot(write(11, "fast")).await.unwrap();
    assert_eq!(newer.status(), 200);
    let late = late.await.unwrap().unwrap();
    // Give a late old write every chance to be applied.
    tokio::time::sleep(APPLY * 2).await;
    eprintln!(
        "control {control}: the paused write answered {}",
        late.status()
    );
    let order = applied.lock().unwrap();
    order
        .iter()
        .filter(|(r, _)| *r == resource)
        .map(|(_, rev)| *rev)
        .collect()
}

/// The same pause as above, made exact: the enforcer's answer is held back in-process. The
/// control (deadline counted from reading the admission, as it once was) must deliver the
/// write late; the real layer must not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_read_late_is_not_sent_after_its_registration_lapsed() {
    let control = paused_after_admission(true).await;
    assert!(
        control.windows(2).any(|w| w[0] > w[1]),
        "the control was not caught: the storage applied {control:?}"
    );
    let order = paused_after_admission(false).await;
    assert_eq!(
        order,
        [10, 11],
        "the paused enforcer delivered its write after its registration lapsed"
    );
}

/// A request body whose next frame is already there when the storage comes back for it past
/// the exchange deadline (a storage slow to read, or a gateway paused with the frame ready):
/// the frame is not handed over, so the storage never receives the whole write late.
#[tokio::test]
async fn a_request_frame_ready_after_the_deadline_is_not_handed_over() {
    let keys = Arc::new(common::keyring("k1"));
    let gate = Arc::new(fencing::Gate::new(fencing::MemoryStore::new()));
    let received: Arc<Mutex<Option<Result<usize, String>>>> = Arc::default();
    let seen = received.clone();
    let storage = tower::service_fn(move |req: Request<Body>| {
        let seen = seen.clone();
        async move {
            let mut body = req.into_body();
            // Applied by a task of its own, which the exchange deadline does not cancel.
            tokio::spawn(async move {
                let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
                tokio::time::sleep(Duration::from_millis(600)).await;
                let rest = body.collect().await.map(|b| b.to_bytes().len());
                *seen.lock().unwrap() =
                    Some(rest.map(|n| n + first.len()).map_err(|e| e.to_string()));
            });
            Ok::<_, Infallible>(Response::new(Body::from("applied")))
        }
    });
    let service = ServiceBuilder::new()
        .layer(
            FencingLayer::new(Fence::new(keys.clone(), gate), ByHeader)
                .with_exchange_deadline(Duration::from_millis(400)),
        )
        .service(storage);
    let resource = common::unique("frame");
    let frames = futures::stream::iter(
        ["half ", "the write"]
            .map(|s| Ok::<_, Infallible>(bytes::Bytes::from_static(s.as_bytes()))),
    );
    let req = Request::put("/w")
        .header("fencing-resource", &resource)
        .header("fencing-token", keys.mint(&resource, Token::new(0, 1)))
        .body(Body::from_stream(frames))
        .unwrap();
    let _ = service.oneshot(req).await.unwrap();
    let (outcome, _) = eventually(
        Duration::from_secs(5),
        "the storage done reading",
        || async {
            match received.lock().unwrap().clone() {
                Some(outcome) => Probe::Done(outcome),
                None => Probe::Not("still reading".into()),
            }
        },
    )
    .await;
    assert!(
        outcome.is_err(),
        "the storage received the whole write ({outcome:?} bytes) past its exchange deadline"
    );
}

/// A raise whose first look at the mark and whose raise both wait on row locks (other
/// transactions on the mark row: a vacuum, another gateway's raise) still leaves the exchange its
/// whole upstream timeout: the permit's deadline counts from the step that made the
/// registration, not from the first look (a 504 was once seen for a write the storage
/// applied, and `admitted-too-late` with no pause at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_slowed_by_row_locks_keeps_the_whole_exchange() {
    let keys = Arc::new(common::keyring("k1"));
    let applied: Applied = Arc::default();
    let store =
        PostgresStore::connect_with_deadline(&common::postgres_url(), 4, Duration::from_secs(2))
            .await
            .unwrap()
            .with_max_exchange(Duration::from_millis(1500))
            .with_write_grace(Duration::from_millis(2500));
    let gateway = ServiceBuilder::new()
        .layer(
            FencingLayer::new(
                Fence::new(keys.clone(), Arc::new(SharedGate::new(store))),
                ByHeader,
            )
            .with_exchange_deadline(Duration::from_millis(1500)),
        )
        .service(applying(applied.clone()));
    let resource = common::unique("slow-raise");
    let write = |revision: u64, mode: &str| {
        Request::put("/w")
            .header("fencing-resource", &resource)
            .header(
                "fencing-token",
                keys.mint(&resource, Token::new(0, revision)),
            )
            .header("x-mode", mode)
            .body(Body::from("count"))
            .unwrap()
    };
    assert_eq!(
        gateway
            .clone()
            .oneshot(write(10, "fast"))
            .await
            .unwrap()
            .status(),
        200
    );

    // X holds the row; Y queues for a share of it, which it holds for a while once X is done.
    let mut x = admin().await;
    let x_tx = x.transaction().await.unwrap();
    x_tx.execute(
        "SELECT 1 FROM fence_marks WHERE resource = $1 FOR UPDATE",
        &[&resource],
    )
    .await
    .unwrap();
    let y_resource = resource.clone();
    let y = tokio::spawn(async move {
        let mut y = admin().await;
        let tx = y.transaction().await.unwrap();
        tx.execute(
            "SELECT 1 FROM fence_marks WHERE resource = $1 FOR SHARE",
            &[&y_resource],
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        tx.commit().await.unwrap();
    });
    let watcher = admin().await;
    until_a_registration_waits(&watcher).await;
    // The write's first step (the look at the mark) waits behind X, its raise behind Y.
    let newer = tokio::spawn(gateway.clone().oneshot(write(11, "slow")));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    x_tx.commit().await.unwrap();
    y.await.unwrap();
    let answer = newer.await.unwrap().unwrap();
    assert_eq!(
        answer.status(),
        200,
        "a write whose storage answered within --upstream-timeout was cut short by its raise's \
         lock waits"
    );
    assert_eq!(
        applied
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| *r == resource)
            .count(),
        2
    );
}
