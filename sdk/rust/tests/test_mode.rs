//! The test mode against a real proxy on a real etcd: an injected loss reaches an application's
//! on-lost path as a real one does (and ends the grant, or the session, on the proxy); failed
//! and late renewals run a guard out to its stop-by deadline; a token refusal is answered
//! without anything sent; the same seed gives the same faults.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{start_proxy_with, Etcd};
use lease_proxy_client::{
    AcquireOptions, Client, Error, Fault, Lease, LostReason, SessionAcquireOptions, TestMode,
};
use lease_proxy_testkit::poll::{eventually, Probe};
use reqwest::Method;

/// The shortest TTL the test proxy grants: the first renewal is due after about 670 ms.
const TTL: Duration = Duration::from_secs(2);

/// The faults a test mode told of, in order.
type Told = Arc<Mutex<Vec<(Fault, String)>>>;

/// `mode`, recording every fault it injects into the answer.
fn recorded(mode: TestMode) -> (TestMode, Told) {
    let told: Told = Arc::default();
    let seen = told.clone();
    let mode = mode.on_fault(move |fault, resource| {
        seen.lock().unwrap().push((fault, resource.to_owned()));
    });
    (mode, told)
}

/// A proxy on the binary's shared etcd, under a key prefix of its own.
async fn proxy(etcd: &Etcd, prefix: &str) -> common::Proxy {
    start_proxy_with(etcd, &reqwest::Client::new(), |config| {
        config.etcd_prefix = lease_proxy_testkit::prefix(&format!("test-mode-{prefix}"));
    })
    .await
}

/// Waits until `resource` is free at the proxy (asked by a client without a test mode).
async fn freed(proxy_url: &str, resource: &str, what: &str) {
    let plain = Client::new(proxy_url).unwrap();
    eventually(Duration::from_secs(1), what, || {
        let (plain, resource) = (plain.clone(), resource.to_owned());
        async move {
            match plain.get(&resource).await.unwrap() {
                None => Probe::Done(()),
                Some(h) => Probe::Not(format!("held by {} (token {})", h.holder, h.token)),
            }
        }
    })
    .await;
}

/// An application's protected work: one step every 100 ms while the lease is held; the reason
/// it stopped.
async fn count_until_lost(lease: &Lease, counts: &mut Vec<u32>) -> LostReason {
    let lost = lease.lost();
    for count in 0.. {
        tokio::select! {
            _ = lost.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        if lease.is_lost() {
            break;
        }
        counts.push(count);
    }
    lease.lost_reason().await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_injected_loss_reaches_the_applications_on_lost_path() {
    let etcd = Etcd::shared().await;
    let proxy = proxy(&etcd, "loss").await;
    let (mode, told) = recorded(TestMode::new().loss_rate(1.0).seed(7));
    let client = Client::builder(&proxy.url).test_mode(mode).build().unwrap();
    let lease = client
        .acquire("aisle-1", AcquireOptions::new("robot-1", TTL))
        .await
        .unwrap();
    let mut counts = Vec::new();
    let reason = tokio::time::timeout(
        Duration::from_secs(10),
        count_until_lost(&lease, &mut counts),
    )
    .await
    .expect("the injected loss never reached the on-lost path");
    assert_eq!(reason, LostReason::Revoked);
    assert!(lease.lost_injected());
    assert!(!counts.is_empty(), "it worked until the renewal was due");
    assert_eq!(*told.lock().unwrap(), [(Fault::Loss, "aisle-1".to_owned())]);
    assert!(matches!(
        lease.fence(reqwest::Client::new().get("http://127.0.0.1:1/")),
        Err(Error::Lost)
    ));
    // As if refused: the grant has ended on the proxy too (released), long before its TTL.
    freed(&proxy.url, "aisle-1", "the grant released").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_injected_session_loss_reaches_its_leases_and_closes_it() {
    let etcd = Etcd::shared().await;
    let proxy = proxy(&etcd, "session").await;
    let (mode, told) = recorded(TestMode::new().loss_rate(1.0).seed(8));
    let client = Client::builder(&proxy.url).test_mode(mode).build().unwrap();
    let session = client.open_session("robot-2", TTL).await.unwrap();
    let lease = session
        .acquire("aisle-2", SessionAcquireOptions::new())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), lease.lost().cancelled())
        .await
        .expect("the injected session loss never reached its lease");
    assert_eq!(session.lost_reason().await, LostReason::Revoked);
    assert_eq!(lease.lost_reason().await, LostReason::SessionLost);
    assert!(session.lost_injected() && lease.lost_injected());
    assert_eq!(told.lock().unwrap().len(), 1);
    assert_eq!(told.lock().unwrap()[0].0, Fault::Loss);
    freed(&proxy.url, "aisle-2", "the session closed").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_renewals_run_the_lease_out_to_its_deadline() {
    let etcd = Etcd::shared().await;
    let proxy = proxy(&etcd, "failed").await;
    let (mode, told) = recorded(TestMode::new().failed_renewal_rate(1.0).seed(9));
    // Lost a second before the proxy would let the grant go: it is still held there then.
    let client = Client::builder(&proxy.url)
        .test_mode(mode)
        .safety_margin(Duration::from_secs(1))
        .build()
        .unwrap();
    let lease = client
        .acquire("aisle-3", AcquireOptions::new("robot-3", TTL))
        .await
        .unwrap();
    let deadline = lease.deadline();
    tokio::time::timeout(Duration::from_secs(5), lease.lost().cancelled())
        .await
        .expect("renewals failing never lost the lease");
    assert_eq!(lease.lost_reason().await, LostReason::Expired);
    assert!(tokio::time::Instant::now() >= deadline, "not before it");
    assert!(
        !lease.lost_injected(),
        "an expiry, as with a proxy unreachable"
    );
    let told = told.lock().unwrap().clone();
    assert!(!told.is_empty());
    assert!(told
        .iter()
        .all(|(f, r)| *f == Fault::FailedRenewal && r == "aisle-3"));
    // Lost on the client's side only: the proxy still holds the grant (its TTL runs on).
    let held = Client::new(&proxy.url)
        .unwrap()
        .get("aisle-3")
        .await
        .unwrap();
    assert_eq!(held.map(|h| h.token), Some(lease.token()));
}

#[tokio::test(flavor = "multi_thread")]
async fn late_renewals_cross_the_deadline() {
    let etcd = Etcd::shared().await;
    let proxy = proxy(&etcd, "late").await;
    let (mode, told) = recorded(TestMode::new().late_renewal_rate(1.0).seed(10));
    // A deadline 1 s after each renewal is sent, due after ~670 ms: a renewal late by more
    // than ~330 ms (of up to 2 s) crosses it.
    let client = Client::builder(&proxy.url)
        .test_mode(mode)
        .safety_margin(Duration::from_secs(1))
        .build()
        .unwrap();
    let lease = client
        .acquire("aisle-4", AcquireOptions::new("robot-4", TTL))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), lease.lost().cancelled())
        .await
        .expect("late renewals never crossed the deadline");
    assert_eq!(lease.lost_reason().await, LostReason::Expired);
    let told = told.lock().unwrap().clone();
    assert!(!told.is_empty());
    assert!(told
        .iter()
        .all(|(f, r)| *f == Fault::LateRenewal && r == "aisle-4"));
}

/// What each of `n` `fencing_headers` calls of `lease` gives: refused (`true`) or not.
fn refusals(lease: &Lease, n: usize) -> Vec<bool> {
    (0..n)
        .map(|_| match lease.fencing_headers() {
            Ok(_) => false,
            Err(e) => {
                assert_eq!(e.slug(), Some("stale-fencing-token"), "{e:?}");
                true
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_refusal_is_answered_without_sending_and_the_seed_repeats_it() {
    let etcd = Etcd::shared().await;
    let proxy = proxy(&etcd, "refusal").await;
    let (mode, told) = recorded(TestMode::new().token_refusal_rate(1.0).seed(11));
    let client = Client::builder(&proxy.url).test_mode(mode).build().unwrap();
    let lease = client
        .acquire(
            "aisle-5",
            AcquireOptions::new("robot-5", Duration::from_secs(30)),
        )
        .await
        .unwrap();
    // Nothing listens there: a request sent would fail as a transport error, not a 409.
    let http = reqwest::Client::new();
    let refused = lease
        .fence(http.put("http://127.0.0.1:1/aisles/aisle-5"))
        .unwrap_err();
    assert!(
        matches!(refused, Error::Problem { status: 409, .. }),
        "{refused:?}"
    );
    assert_eq!(refused.slug(), Some("stale-fencing-token"));
    assert!(lease.fencing_headers().is_err());
    assert!(lease
        .forward_request(Method::PUT, "aisles/aisle-5")
        .is_err());
    // The proxy has no upstream: a forward sent would not be answered 409.
    let answer = lease
        .forward(Method::PUT, "aisles/aisle-5", None)
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 409);
    assert_eq!(answer.headers()["fencing-rejection"], "stale-fencing-token");
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(body["injected"], true);
    assert!(!lease.is_lost(), "a refused token is not a lost lease");
    assert_eq!(told.lock().unwrap().len(), 4, "one chance per call");

    // Half the chances, the same seed: the same refusals in the same order.
    let mode = TestMode::new().token_refusal_rate(0.5).seed(12);
    let a = Client::builder(&proxy.url)
        .test_mode(mode.clone())
        .build()
        .unwrap();
    let b = Client::builder(&proxy.url).test_mode(mode).build().unwrap();
    let held_a = a
        .acquire(
            "aisle-6",
            AcquireOptions::new("robot-6", Duration::from_secs(30)),
        )
        .await
        .unwrap();
    let held_b = b
        .acquire(
            "aisle-7",
            AcquireOptions::new("robot-7", Duration::from_secs(30)),
        )
        .await
        .unwrap();
    let first = refusals(&held_a, 32);
    assert_eq!(first, refusals(&held_b, 32));
    assert!(first.contains(&true) && first.contains(&false), "{first:?}");
}
