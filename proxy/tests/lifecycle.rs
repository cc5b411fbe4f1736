//! The lease lifecycle against hostile clients and races: idempotent retries that
//! cannot be replayed by others, secrets never shared between grants, no renewal or forward
//! after a completed release, acquires that a disconnecting client cannot leave half done, and
//! checks that fail when the pre-fence or renew logic is weakened.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::*;
use lease_proxy_testkit::poll::{eventually, until, Probe};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// The raw record `proxy` stored for `resource`.
async fn stored_record(etcd: &Etcd, proxy: &Proxy, resource: &str) -> Option<Value> {
    let mut client = etcd.client().await;
    let resp = client
        .get(format!("{}holders/{resource}", proxy.prefix), None)
        .await
        .unwrap();
    resp.kvs()
        .first()
        .map(|kv| serde_json::from_slice(kv.value()).unwrap())
}

fn acquire_with_key(
    proxy: &Proxy,
    resource: &str,
    holder: &str,
    key: &str,
) -> reqwest::RequestBuilder {
    http()
        .post(format!("{}/v1/leases/{resource}", proxy.url))
        .header("idempotency-key", key)
        .json(&json!({"holder": holder, "ttl_seconds": 60}))
}

/// The holder name is public and the marker in etcd was a bare SHA-256 of
/// holder and key, so "order-4711" fell to 4,712 offline guesses. The marker is now keyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stored_idempotency_marker_cannot_be_brute_forced_offline() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let (status, _) = send(acquire_with_key(&proxy, "orders", "alice", "order-4711")).await;
    assert_eq!(status, 201);
    let record = stored_record(&etcd, &proxy, "orders").await.unwrap();
    let marker = record["idempotency"].as_str().unwrap().to_owned();
    let holder = "alice";
    for n in 0..10_000 {
        let guess = format!("order-{n}");
        // The earlier, unkeyed form: SHA-256(len(holder) ‖ holder ‖ key).
        let mut h = Sha256::new();
        h.update((holder.len() as u64).to_be_bytes());
        h.update(holder.as_bytes());
        h.update(guess.as_bytes());
        let unkeyed = URL_SAFE_NO_PAD.encode(h.finalize());
        assert!(
            !marker.contains(&unkeyed),
            "the stored marker gives the Idempotency-Key away offline: {guess}"
        );
        assert!(!marker.contains(&guess));
    }
}

/// Replaying a public holder name with a guessed key handed out the victim's
/// secret, at any time. Now a retry is honoured only within the replay window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_after_the_window_gets_no_secret() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |c| {
        c.idempotency_window = Duration::from_secs(2);
    })
    .await;
    let granted = Instant::now();
    let (status, victim) = send(acquire_with_key(&proxy, "orders", "alice", "k")).await;
    assert_eq!(status, 201);
    // Another holder with the same key never gets it.
    assert_eq!(
        send(acquire_with_key(&proxy, "orders", "mallory", "k"))
            .await
            .0,
        409
    );
    // After the window (2 s by etcd's clock, plus its expiry sweep), holder + key get nothing.
    let within = Duration::from_millis(4000).saturating_sub(granted.elapsed());
    eventually(within, "a replay after the window refused", || async {
        let (status, body) = send(acquire_with_key(&proxy, "orders", "alice", "k")).await;
        if status == 409 {
            assert!(body.get("secret").is_none());
            return Probe::Done(());
        }
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["secret"], victim["secret"]);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = granted.elapsed();
        Probe::Not(format!(
            "a replay {after:?} after the grant returned its secret"
        ))
    })
    .await;
    // ...and never again; the victim's grant is untouched.
    for _ in 0..3 {
        let (status, body) = send(acquire_with_key(&proxy, "orders", "alice", "k")).await;
        assert_eq!(status, 409, "{body}");
    }
    assert_eq!(
        renew(&proxy, "orders", &str_field(&victim, "secret"))
            .await
            .0,
        200
    );
}

/// Acquire with key "boot", release, acquire again with "boot" gave the same
/// spare lease and the same secret, so a leftover process renewed the second grant. Now the
/// key, once its grant has ended, is refused for the rest of its window (a late duplicate of
/// the acquire must not create a grant nobody holds), and after the
/// window the same key makes a new grant with a new secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_grants_never_share_a_secret() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |c| {
        c.idempotency_window = Duration::from_secs(2);
    })
    .await;
    let mut secrets = std::collections::HashSet::new();
    let mut previous: Option<String> = None;
    for round in 0..3 {
        let (status, g) = send(acquire_with_key(&proxy, "boot-r", "node", "boot")).await;
        assert_eq!(status, 201, "round {round}: {g}");
        let secret = str_field(&g, "secret");
        assert!(
            secrets.insert(secret.clone()),
            "round {round}: a secret came back"
        );
        if let Some(old) = previous.take() {
            let (status, body) = renew(&proxy, "boot-r", &old).await;
            assert_eq!(
                status, 410,
                "round {round}: an earlier grant's secret renewed: {body}"
            );
        }
        assert_eq!(release(&proxy, "boot-r", &secret).await.0, 204);
        // A late duplicate of this very acquire, after the release, inside the window.
        let (status, body) = send(acquire_with_key(&proxy, "boot-r", "node", "boot")).await;
        assert_eq!(
            status, 409,
            "round {round}: a used key was granted again: {body}"
        );
        assert!(
            body["type"]
                .as_str()
                .unwrap()
                .ends_with("/idempotency-key-used"),
            "{body}"
        );
        assert!(
            stored_record(&etcd, &proxy, "boot-r").await.is_none(),
            "round {round}: a grant nobody holds"
        );
        previous = Some(secret);
        tokio::time::sleep(Duration::from_millis(2600)).await;
    }
    // The same with a refused acquire's spare lease carrying the idempotent grant.
    let (_, owner) = acquire(&proxy, "spare-r", "owner", 60).await;
    assert_eq!(
        send(acquire_with_key(&proxy, "spare-r", "node", "boot"))
            .await
            .0,
        409
    );
    assert_eq!(
        release(&proxy, "spare-r", &str_field(&owner, "secret"))
            .await
            .0,
        204
    );
    let (status, g) = send(acquire_with_key(&proxy, "spare-r", "node", "boot")).await;
    assert_eq!(status, 201);
    assert!(secrets.insert(str_field(&g, "secret")));
}

/// After DELETE answered 204, no replica may renew the grant or forward for it. Many release →
/// renew/forward races, through the releasing replica and another one, with and without spare
/// leases: 1,000 of each in the suite, more as a soak (`LIFECYCLE_RACES=5000`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_succeeds_after_a_release() {
    let races: usize = std::env::var("LIFECYCLE_RACES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000);
    const IN_FLIGHT: usize = 32;
    let etcd = Etcd::shared().await;
    for spares in [0, 256] {
        let Storage {
            url: storage,
            log: received,
        } = Storage::start().await;
        let one = Proxy::on(&etcd, |c| {
            c.lease_spares = spares;
            c.upstream = Some(storage.clone());
        })
        .await;
        let two = one
            .replica(etcd.endpoints(), |c| {
                c.lease_spares = spares;
                c.upstream = Some(storage.clone());
            })
            .await;
        let (one, two) = (Arc::new(one), Arc::new(two));
        let started = Instant::now();
        let late = Arc::new(AtomicU64::new(0));
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers = (0..IN_FLIGHT).map(|w| {
            let (one, two, late, next) = (one.clone(), two.clone(), late.clone(), next.clone());
            tokio::spawn(async move {
                let client = http();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= races {
                        return;
                    }
                    let resource = format!("race-{w}-{}", i % 4);
                    let (status, g) = acquire(&one, &resource, "h", 30).await;
                    assert_eq!(status, 201, "{g}");
                    let secret = str_field(&g, "secret");
                    assert_eq!(release(&one, &resource, &secret).await.0, 204);
                    let attempts = [&one, &two, &one, &two].map(|p| {
                        let renew = i % 2 == 0;
                        let url = if renew {
                            format!("{}/v1/leases/{resource}/renew", p.url)
                        } else {
                            format!("{}/v1/leases/{resource}/forward/w", p.url)
                        };
                        client.post(url).header("lease-secret", &secret).send()
                    });
                    for answer in futures::future::join_all(attempts).await {
                        let status = answer.unwrap().status();
                        if status.is_success() {
                            late.fetch_add(1, Ordering::Relaxed);
                        } else {
                            assert_eq!(status, 410);
                        }
                    }
                }
            })
        });
        for w in futures::future::join_all(workers).await {
            w.unwrap();
        }
        let late = late.load(Ordering::Relaxed);
        let delivered = received.len();
        println!(
            "--lease-spares {spares}: {races} races in {:?}, {late} successes after a 204, \
             {delivered} forwards delivered",
            started.elapsed()
        );
        assert_eq!((late, delivered), (0, 0), "--lease-spares {spares}");
    }
}

/// An enforcer double: `POST /fence/{resource}` answers `status` after `delay`, and logs the
/// token of every call once it has answered.
struct Enforcer {
    url: String,
    status: Arc<AtomicU16>,
    fenced: Arc<Mutex<Vec<String>>>,
    /// How long each pre-fence takes, in ms, read when it arrives.
    delay_ms: Arc<AtomicU64>,
}

async fn enforcer(delay: Duration) -> Enforcer {
    let status = Arc::new(AtomicU16::new(200));
    let fenced: Arc<Mutex<Vec<String>>> = Arc::default();
    let delay_ms = Arc::new(AtomicU64::new(delay.as_millis() as u64));
    let (s, f, d) = (status.clone(), fenced.clone(), delay_ms.clone());
    let app = axum::Router::new().route(
        "/fence/{resource}",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let (s, f) = (s.clone(), f.clone());
            let delay = Duration::from_millis(d.load(Ordering::Relaxed));
            async move {
                tokio::time::sleep(delay).await;
                let token = headers
                    .get("fencing-token")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let status = s.load(Ordering::Relaxed);
                if status == 200 {
                    f.lock().unwrap().push(token);
                }
                axum::http::StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Enforcer {
        url,
        status,
        fenced,
        delay_ms,
    }
}

/// Waits up to 5 s for `resource` to be free in etcd; fails the test saying `why` otherwise.
async fn freed(etcd: &Etcd, proxy: &Proxy, resource: &str, why: &str) {
    let what = format!("{resource} free in etcd ({why})");
    until(Duration::from_secs(5), &what, || async {
        stored_record(etcd, proxy, resource).await.is_none()
    })
    .await;
}

/// A client that disconnects while its grant is being pre-fenced left a grant
/// nobody holds for its whole TTL; with an Idempotency-Key, the retry got that grant before
/// (or without) its pre-fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_acquire_leaves_no_grant_and_a_retry_only_fenced_ones() {
    let etcd = Etcd::shared().await;
    let fence = enforcer(Duration::from_millis(1500)).await;
    let proxy = Proxy::on(&etcd, |c| {
        c.prefence_url = Some(fence.url.clone());
    })
    .await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();

    // Gone during the pre-fence, no key: the grant is withdrawn once the pre-fence is over.
    let gone = impatient
        .post(format!("{}/v1/leases/orphan", proxy.url))
        .json(&json!({"holder": "h", "ttl_seconds": 600}))
        .send()
        .await;
    assert!(gone.is_err(), "the client should have given up");
    assert!(
        stored_record(&etcd, &proxy, "orphan").await.is_some(),
        "committed, pre-fencing"
    );
    freed(
        &etcd,
        &proxy,
        "orphan",
        "a grant nobody heard of outlived its acquire",
    )
    .await;

    // Gone during the pre-fence, with a key, and retried at once: the retry's grant must have
    // been pre-fenced before it is answered, and must be alive. The first pre-fence is the slow
    // one, so the retry is answered before the first attempt learns its client is gone.
    fence.delay_ms.store(2000, Ordering::Relaxed);
    let gone = impatient
        .post(format!("{}/v1/leases/job", proxy.url))
        .header("idempotency-key", "attempt-1")
        .json(&json!({"holder": "h", "ttl_seconds": 600}))
        .send()
        .await;
    assert!(gone.is_err());
    fence.delay_ms.store(50, Ordering::Relaxed);
    let (status, grant) = send(acquire_with_key(&proxy, "job", "h", "attempt-1")).await;
    assert_eq!(status, 201, "{grant}");
    let fenced = fence.fenced.lock().unwrap().clone();
    assert!(
        fenced.contains(&str_field(&grant, "fencing_token")),
        "a retry was answered with a grant the enforcer did not know yet"
    );
    assert_eq!(
        renew(&proxy, "job", &str_field(&grant, "secret")).await.0,
        200
    );
    // Once the first attempt's own pre-fence is over it finds its client gone — but the grant
    // was handed out by the retry, so it must not be withdrawn (the retry's 201 grant was once
    // revoked a moment later, renew then 410).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        renew(&proxy, "job", &str_field(&grant, "secret")).await.0,
        200,
        "the retried grant was withdrawn after it was answered"
    );
    // One grant for the resource, on one lease carrying one ownership key.
    let record = stored_record(&etcd, &proxy, "job").await.unwrap();
    assert_eq!(
        record["lease_id"].as_str().unwrap(),
        str_field(&grant, "lease_id")
    );
}

/// An enforcer that refuses the pre-fence (4xx) must withdraw the grant; a
/// pre-fence that took a 4xx for success fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_prefence_withdraws_the_grant() {
    let etcd = Etcd::shared().await;
    let fence = enforcer(Duration::ZERO).await;
    let proxy = Proxy::on(&etcd, |c| {
        c.prefence_url = Some(fence.url.clone());
    })
    .await;
    for status in [409u16, 403, 400, 500] {
        fence.status.store(status, Ordering::Relaxed);
        let (answer, body) = acquire(&proxy, "guarded", "h", 60).await;
        assert_eq!(answer, 503, "enforcer answered {status}: {body}");
        assert_eq!(
            body["type"].as_str().unwrap_or_default().rsplit('/').next(),
            Some("prefence-failed"),
            "{body}"
        );
        freed(
            &etcd,
            &proxy,
            "guarded",
            &format!("enforcer answered {status}"),
        )
        .await;
    }
    fence.status.store(200, Ordering::Relaxed);
    assert_eq!(acquire(&proxy, "guarded", "h", 60).await.0, 201);
}

/// A view that still confirms a grant whose lease is gone must end in 410 —
/// etcd answering the keepalive with TTL 0 is the last word. The record here names a lease
/// that does not exist (as a stale view would after the release on another replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answered_with_ttl_0_is_lost() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let mut client = etcd.client().await;
    let dead = client.lease_grant(30, None).await.unwrap().id();
    client.lease_revoke(dead).await.unwrap();
    let mut bytes = dead.to_be_bytes().to_vec();
    bytes.extend_from_slice(&[7u8; 32]);
    let secret = URL_SAFE_NO_PAD.encode(&bytes);
    let record = json!({
        "holder": "ghost",
        "lease_id": dead.to_string(),
        "secret_hash": URL_SAFE_NO_PAD.encode(Sha256::digest(secret.as_bytes())),
        "acquired_at": 0,
        "ttl_seconds": 30,
    });
    client
        .put(
            format!("{}holders/ghost", proxy.prefix),
            record.to_string(),
            None,
        )
        .await
        .unwrap();
    // Let the watch-fed view see it, then renew with the matching secret.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = renew(&proxy, "ghost", &secret).await;
    assert_eq!(status, 410, "{body}");
}
