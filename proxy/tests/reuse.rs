//! Reuse of etcd leases across grants (spare leases): a lease carries at most one grant at a
//! time, every grant still expires on its own, and an earlier holder of a reused lease can
//! neither act on nor prolong the later grant.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_lease_serves_one_grant_and_expires_with_it() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;

    // A's lease goes back to the pool on release and carries B's grant next.
    let (_, a) = acquire(&proxy, "r1", "a", 4).await;
    let secret_a = str_field(&a, "secret");
    assert_eq!(release(&proxy, "r1", &secret_a).await.0, 204);
    let (status, b) = acquire(&proxy, "r2", "b", 4).await;
    assert_eq!(status, 201, "{b}");
    assert_eq!(
        lease_id(&b),
        lease_id(&a),
        "the released lease was not reused"
    );
    assert!(token(&b) > token(&a));
    assert_eq!(
        keys_per_lease(&etcd).await.into_iter().collect::<Vec<_>>(),
        vec![(lease_id(&b), 1)]
    );

    // A's old secret is an earlier grant's: lost (410) on both resources, never accepted, and
    // releasing with it changes nothing.
    let before = snapshot(&etcd).await;
    for resource in ["r1", "r2"] {
        let (status, body) = renew(&proxy, resource, &secret_a).await;
        assert_eq!(status, 410, "{resource}: {body}");
    }
    let forward = http()
        .post(format!("{}/v1/leases/r2/forward/x", proxy.url))
        .header("lease-secret", &secret_a)
        .send()
        .await
        .unwrap();
    assert!(
        forward.status() == 410 || forward.status() == 404,
        "forward with an earlier grant's secret: {}",
        forward.status()
    );
    assert_eq!(release(&proxy, "r2", &secret_a).await.0, 204);
    assert_eq!(snapshot(&etcd).await, before);
    // A forgery on the same lease id is still told apart from an earlier grant: 403.
    let mut forged = secret_a.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });
    assert_eq!(renew(&proxy, "r2", &forged).await.0, 403);
    assert_eq!(renew(&proxy, "r2", &str_field(&b, "secret")).await.0, 200);

    // B stops renewing. A keeps trying with its old secret; that must not keep B's grant (on
    // A's former lease) alive: a waiter gets r2 within B's TTL.
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
    assert!(grant["expires_in_ms"].as_u64().unwrap() >= 30_000);
    assert_eq!(
        renew(&proxy, "hot", &str_field(&holder, "secret")).await.0,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_spare_is_never_handed_out() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.min_ttl = 2).await;
    let (_, a) = acquire(&proxy, "short", "a", 2).await;
    assert_eq!(
        release(&proxy, "short", &str_field(&a, "secret")).await.0,
        204
    );
    // The spare's TTL runs out in the pool.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let (status, b) = acquire(&proxy, "short-2", "b", 2).await;
    assert_eq!(status, 201, "{b}");
    assert_ne!(lease_id(&b), lease_id(&a));
    assert_eq!(
        renew(&proxy, "short-2", &str_field(&b, "secret")).await.0,
        200
    );
    assert_eq!(keys_per_lease(&etcd).await.into_values().sum::<usize>(), 1);
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
    for i in 0..5 {
        let (_, g) = acquire(&proxy, &format!("r{i}"), "a", 30).await;
        assert_eq!(
            release(&proxy, &format!("r{i}"), &str_field(&g, "secret"))
                .await
                .0,
            204
        );
    }
    assert!(!snapshot(&etcd).await.leases.is_empty());
    proxy.stop().await;
    assert_eq!(snapshot(&etcd).await.leases, Vec::<i64>::new());
}
