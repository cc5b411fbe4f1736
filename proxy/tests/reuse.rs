//! Reuse of etcd leases (spare leases): only leases that never carried a key are reused, so a
//! lease carries at most one grant in its life; every grant still expires on its own, and an
//! earlier holder can neither act on nor prolong a later grant.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use lease_proxy_testkit::poll::{eventually, until, Probe};
use serde_json::json;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_is_never_reused_and_its_secret_stays_dead() {
    let etcd = Etcd::single().await;
    let Storage {
        url: storage,
        log: received,
    } = Storage::start().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.upstream = Some(storage)).await;

    // A's lease is revoked on release, never pooled: the next grant gets another lease.
    let (_, a) = acquire(&proxy, "r1", "a", 4).await;
    let secret_a = str_field(&a, "secret");
    assert_eq!(release(&proxy, "r1", &secret_a).await.0, 204);
    assert!(
        !snapshot(&etcd).await.leases.contains(&lease_id(&a)),
        "a released grant's lease outlived its release"
    );
    let (status, b) = acquire(&proxy, "r2", "b", 4).await;
    assert_eq!(status, 201, "{b}");
    assert_ne!(lease_id(&b), lease_id(&a));
    assert!(token(&b) > token(&a));
    assert_eq!(
        keys_per_lease(&etcd).await.into_iter().collect::<Vec<_>>(),
        vec![(lease_id(&b), 1)]
    );

    // A's old secret is an ended grant's: lost (410) on both resources, for renewals and
    // forwards alike (nothing reaches the storage), and releasing with it changes nothing.
    let before = snapshot(&etcd).await;
    for resource in ["r1", "r2"] {
        let (status, body) = renew(&proxy, resource, &secret_a).await;
        assert_eq!(status, 410, "{resource}: {body}");
        let (status, body) = send(
            http()
                .post(format!("{}/v1/leases/{resource}/forward/x", proxy.url))
                .header("lease-secret", &secret_a),
        )
        .await;
        assert_eq!(
            status, 410,
            "forward to {resource} with an ended grant's secret: {body}"
        );
    }
    assert!(received.is_empty());
    assert_eq!(release(&proxy, "r2", &secret_a).await.0, 204);
    assert_eq!(snapshot(&etcd).await, before);
    // A forgery on B's lease id is refused (403), never taken for an ended grant.
    let mut forged = str_field(&b, "secret");
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });
    assert_eq!(renew(&proxy, "r2", &forged).await.0, 403);
    assert_eq!(renew(&proxy, "r2", &str_field(&b, "secret")).await.0, 200);

    // B stops renewing. A keeps trying with its old secret; that must not keep B's grant
    // alive: a waiter gets r2 within B's TTL.
    let stop = tokio::sync::watch::channel(false);
    let hammer = {
        let url = proxy.url.clone();
        let secret = secret_a.clone();
        let mut stopped = stop.1.clone();
        tokio::spawn(async move {
            let client = http();
            let mut refused = 0;
            while !*stopped.borrow() {
                for r in ["r1", "r2"] {
                    let s = client
                        .post(format!("{url}/v1/leases/{r}/renew"))
                        .header("lease-secret", &secret)
                        .send()
                        .await
                        .unwrap()
                        .status();
                    assert_ne!(s, 200, "an earlier grant's secret renewed {r}");
                    refused += 1;
                }
                let _ = tokio::time::timeout(Duration::from_millis(100), stopped.changed()).await;
            }
            refused
        })
    };
    let last_renewal = Instant::now();
    let (status, c) = send(
        http()
            .post(format!("{}/v1/leases/r2", proxy.url))
            .json(&json!({"holder": "c", "ttl_seconds": 4, "wait_ms": 15000})),
    )
    .await;
    let waited = last_renewal.elapsed();
    assert_eq!(status, 201, "{c}");
    assert!(
        waited < Duration::from_millis(4000 + 1500),
        "B's grant outlived its TTL: {waited:?}"
    );
    stop.0.send(true).unwrap();
    assert!(hammer.await.unwrap() > 0);
    assert!(token(&c) > token(&b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_acquires_reuse_their_leases() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let (_, holder) = acquire(&proxy, "hot", "owner", 30).await;
    assert_eq!(acquire(&proxy, "hot", "x", 30).await.0, 409);
    let leases = snapshot(&etcd).await.leases.len();
    for i in 0..30 {
        let (status, conflict) = acquire(&proxy, "hot", &format!("c{i}"), 30).await;
        assert_eq!(status, 409, "{conflict}");
        assert_eq!(conflict["holder"], "owner");
    }
    assert_eq!(
        snapshot(&etcd).await.leases.len(),
        leases,
        "refusals granted new leases"
    );
    // The refused acquires' spare is then used by a successful one, with the full TTL.
    let (status, grant) = acquire(&proxy, "cold", "y", 30).await;
    assert_eq!(status, 201);
    assert_eq!(snapshot(&etcd).await.leases.len(), leases);
    let ttl = etcd
        .client()
        .await
        .lease_time_to_live(lease_id(&grant), None)
        .await
        .unwrap()
        .ttl();
    assert!(ttl >= 29, "a reused lease was handed out with {ttl} s left");
    // Handed out as it is when granted (or renewed) under a second ago, else renewed first.
    let expires = grant["expires_in_ms"].as_u64().unwrap();
    assert!((29_000..=30_000).contains(&expires), "{expires}");
    assert_eq!(
        renew(&proxy, "hot", &str_field(&holder, "secret")).await.0,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_spare_is_never_handed_out() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.min_ttl = 2).await;
    let (_, _owner) = acquire(&proxy, "busy", "owner", 30).await;
    let before = snapshot(&etcd).await.leases;
    // A refused acquire's lease becomes a spare, whose TTL then runs out in the pool.
    // (With it, leases of that TTL are granted ahead of demand: they lapse in the pool too.)
    assert_eq!(acquire(&proxy, "busy", "a", 2).await.0, 409);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spares: Vec<i64> = snapshot(&etcd)
        .await
        .leases
        .into_iter()
        .filter(|l| !before.contains(l))
        .collect();
    assert!(!spares.is_empty(), "the refused acquire's lease is kept");
    // Their TTL (2 s) runs out in etcd while the pool still lists them.
    until(
        Duration::from_secs(10),
        "the spares lapsed in etcd",
        || async {
            let live = snapshot(&etcd).await.leases;
            spares.iter().all(|spare| !live.contains(spare))
        },
    )
    .await;
    let (status, b) = acquire(&proxy, "short-2", "b", 2).await;
    assert_eq!(status, 201, "{b}");
    assert!(
        !spares.contains(&lease_id(&b)),
        "a lapsed spare was handed out"
    );
    assert_eq!(
        renew(&proxy, "short-2", &str_field(&b, "secret")).await.0,
        200
    );
    assert!(keys_per_lease(&etcd).await.values().all(|&n| n == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_releases_keep_a_lease_at_most_once() {
    // Two replicas release the same grant at once; each keeps its own pool. If both kept the
    // lease, the next acquires on the two replicas would put two grants on one lease — so every
    // lease must carry at most one key, always.
    let etcd = Etcd::single().await;
    let one = Proxy::start(etcd.endpoints(), |_| {}).await;
    let two = one.replica(etcd.endpoints(), |_| {}).await;
    for i in 0..25 {
        let (job, next_a, next_b) = (
            format!("job-{i}"),
            format!("next-a-{i}"),
            format!("next-b-{i}"),
        );
        let (_, g) = acquire(&one, &job, "w", 20).await;
        let secret = str_field(&g, "secret");
        let (r1, r2) = tokio::join!(release(&one, &job, &secret), release(&two, &job, &secret));
        assert_eq!((r1.0, r2.0), (204, 204));
        let (a, b) = tokio::join!(
            acquire(&one, &next_a, "x", 20),
            acquire(&two, &next_b, "y", 20)
        );
        assert_eq!((a.0, b.0), (201, 201));
        assert_ne!(
            lease_id(&a.1),
            lease_id(&b.1),
            "round {i}: two grants on one lease"
        );
        let per_lease = keys_per_lease(&etcd).await;
        assert!(
            per_lease.values().all(|&n| n == 1),
            "round {i}: {per_lease:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_revokes_the_spares() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let (_, owner) = acquire(&proxy, "hot", "owner", 60).await;
    // Refused acquires with five TTLs leave five spares.
    for ttl in 30..35 {
        assert_eq!(acquire(&proxy, "hot", "a", ttl).await.0, 409);
    }
    assert_eq!(
        release(&proxy, "hot", &str_field(&owner, "secret")).await.0,
        204
    );
    // Five refused acquires' leases, and those granted ahead of demand for each TTL.
    assert!(snapshot(&etcd).await.leases.len() >= 5);
    proxy.stop().await;
    // A refill still granting at shutdown revokes what it gets, in the background.
    eventually(Duration::from_secs(5), "no lease left in etcd", || async {
        match snapshot(&etcd).await.leases {
            left if left.is_empty() => Probe::Done(()),
            left => Probe::Not(format!("{left:?}")),
        }
    })
    .await;
}
