//! Fair waiting (docs/DESIGN.md §2): waiters are served first come, first served across replicas, a
//! release wakes one waiter (a constant number of etcd writes, not one per waiter), and a
//! waiter whose client leaves does not hold up the line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use lease_proxy_testkit::poll::until;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

/// How long a waiter may take to stand in line.
const IN_LINE_WITHIN: Duration = Duration::from_secs(20);

/// How many waiters stand in `resource`'s line, as etcd has it.
async fn in_line(etcd: &Etcd, resource: &str) -> i64 {
    etcd.client()
        .await
        .get(
            format!("/lease-proxy/waiters/{resource}/"),
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only(),
            ),
        )
        .await
        .unwrap()
        .count()
}

/// Sends `n` waiting acquires for `resource`, alternating between `urls`, each once the one
/// before it stands in line in etcd (so their arrival order is the order they were sent, however
/// slowly a loaded machine serves them); each grant is reported on the channel with the
/// waiter's number and the URL it came through.
async fn line_up(
    etcd: &Etcd,
    urls: &[String],
    resource: &str,
    n: usize,
    first: usize,
) -> mpsc::UnboundedReceiver<(usize, String, u16, Value)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let before = in_line(etcd, resource).await;
    for (k, i) in (first..first + n).enumerate() {
        let url = urls[i % urls.len()].clone();
        let tx = tx.clone();
        let wanted = resource.to_owned();
        tokio::spawn(async move {
            let (status, body) =
                acquire_waiting(&url, &wanted, &format!("waiter-{i}"), 30, 60_000).await;
            let _ = tx.send((i, url, status, body));
        });
        let want = before + k as i64 + 1;
        until(IN_LINE_WITHIN, &format!("waiter {i} in line"), || async {
            in_line(etcd, resource).await >= want
        })
        .await;
    }
    rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_waiters_across_two_replicas_are_served_in_arrival_order() {
    let etcd = Etcd::single().await;
    let a = Proxy::start(etcd.endpoints(), |_| {}).await;
    let b = a.replica(etcd.endpoints(), |_| {}).await;
    let (status, holder) = acquire(&a, "printer", "first", 30).await;
    assert_eq!(status, 201);
    let mut granted = line_up(&etcd, &[a.url.clone(), b.url.clone()], "printer", 50, 0).await;
    assert_eq!(
        release(&a, "printer", &str_field(&holder, "secret"))
            .await
            .0,
        204
    );
    let mut order = Vec::new();
    let mut last_token = token(&holder);
    for _ in 0..50 {
        let (i, url, status, grant) = timeout(Duration::from_secs(20), granted.recv())
            .await
            .expect("a waiter was not served within 20 s of the release before it")
            .unwrap();
        assert_eq!(status, 201, "waiter {i}: {grant}");
        assert!(token(&grant) > last_token);
        last_token = token(&grant);
        order.push(i);
        let secret = str_field(&grant, "secret");
        let status = send(
            http()
                .delete(format!("{url}/v1/leases/printer"))
                .header("lease-secret", secret),
        )
        .await
        .0;
        assert_eq!(status, 204);
    }
    assert_eq!(
        order,
        (0..50).collect::<Vec<_>>(),
        "waiters served out of arrival order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter() {
    let etcd = Etcd::single().await;
    // No spare leases: their refill ahead of demand (16 grants at a time) would be counted as
    // writes of a release.
    let a = Proxy::start(etcd.endpoints(), |c| c.lease_spares = 0).await;
    let b = a.replica(etcd.endpoints(), |c| c.lease_spares = 0).await;
    let (_, holder) = acquire(&a, "scanner", "first", 30).await;
    let mut granted = line_up(&etcd, &[a.url.clone(), b.url.clone()], "scanner", 40, 0).await;
    let mut secret = str_field(&holder, "secret");
    let mut through = a.url.clone();
    let mut writes = Vec::new();
    for _ in 0..5 {
        let before = etcd_proposals(&etcd).await;
        let status = send(
            http()
                .delete(format!("{through}/v1/leases/scanner"))
                .header("lease-secret", &secret),
        )
        .await
        .0;
        assert_eq!(status, 204);
        let (_, url, status, grant) = timeout(Duration::from_secs(20), granted.recv())
            .await
            .expect("no waiter served after a release")
            .unwrap();
        assert_eq!(status, 201, "{grant}");
        // Whatever the release set off (the next waiter moving up, stragglers) has settled.
        tokio::time::sleep(Duration::from_millis(500)).await;
        writes.push(etcd_proposals(&etcd).await - before);
        secret = str_field(&grant, "secret");
        through = url;
    }
    eprintln!("etcd writes per release: {writes:?}");
    // Revoke the released lease, grant the winner's lease, its create txn, its queue entry's
    // deletion: a handful, whatever the number of waiters (today's stampede: ~one per waiter).
    assert!(
        writes.iter().all(|w| *w <= 6),
        "etcd writes per release with 40 waiters: {writes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_leaves_does_not_hold_up_the_line() {
    let etcd = Etcd::single().await;
    let a = Proxy::start(etcd.endpoints(), |_| {}).await;
    let b = a.replica(etcd.endpoints(), |_| {}).await;
    let (_, holder) = acquire(&a, "kiln", "first", 30).await;
    // The first in line gives up: its client disconnects (the request future is dropped).
    let leaving = {
        let url = b.url.clone();
        tokio::spawn(async move { acquire_waiting(&url, "kiln", "leaver", 30, 60_000).await })
    };
    until(IN_LINE_WITHIN, "the leaver in line", || async {
        in_line(&etcd, "kiln").await >= 1
    })
    .await;
    let mut granted = line_up(&etcd, &[a.url.clone(), b.url.clone()], "kiln", 8, 1).await;
    leaving.abort();
    let _ = leaving.await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    assert_eq!(
        release(&a, "kiln", &str_field(&holder, "secret")).await.0,
        204
    );
    let mut order = Vec::new();
    for k in 0..8 {
        let (i, url, status, grant) = timeout(Duration::from_secs(10), granted.recv())
            .await
            .expect("the line is stuck behind a waiter that left")
            .unwrap();
        assert_eq!(status, 201, "{grant}");
        if k == 0 {
            assert!(
                released.elapsed() < Duration::from_secs(2),
                "the waiter behind one that left was served {:?} after the release",
                released.elapsed()
            );
        }
        order.push(i);
        let status = send(
            http()
                .delete(format!("{url}/v1/leases/kiln"))
                .header("lease-secret", str_field(&grant, "secret")),
        )
        .await
        .0;
        assert_eq!(status, 204);
    }
    assert_eq!(order, (1..9).collect::<Vec<_>>(), "served out of order");
    // The leaver never held the resource, and its place in line is gone.
    let holders: Vec<_> = snapshot(&etcd)
        .await
        .kvs
        .into_iter()
        .filter(|kv| kv.0.starts_with(b"/lease-proxy/holders/kiln"))
        .collect();
    assert!(holders.is_empty(), "{holders:?}");
    until(Duration::from_secs(2), "no queue entries left", || async {
        let waiting = snapshot(&etcd).await.kvs.into_iter();
        !waiting
            .map(|kv| kv.0)
            .any(|key| key.starts_with(b"/lease-proxy/waiters/kiln/"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_waiters_lapse() {
    // A replica that died with a waiter leaves its queue entry behind, on the replica's queue
    // lease that nobody renews: the line moves on within that lease's TTL (6 s).
    let etcd = Etcd::single().await;
    let a = Proxy::start(etcd.endpoints(), |_| {}).await;
    let (_, holder) = acquire(&a, "lathe", "first", 30).await;
    let mut client = etcd.client().await;
    let dead = client.lease_grant(6, None).await.unwrap().id();
    client
        .put(
            "/lease-proxy/waiters/lathe/dead-replica",
            "",
            Some(etcd_client::PutOptions::new().with_lease(dead)),
        )
        .await
        .unwrap();
    let mut granted = line_up(&etcd, std::slice::from_ref(&a.url), "lathe", 1, 0).await;
    let released = Instant::now();
    assert_eq!(
        release(&a, "lathe", &str_field(&holder, "secret")).await.0,
        204
    );
    let (_, _, status, grant) = timeout(Duration::from_secs(10), granted.recv())
        .await
        .expect("stuck behind a dead replica's waiter")
        .unwrap();
    assert_eq!(status, 201, "{grant}");
    assert!(released.elapsed() < Duration::from_secs(8));
}
