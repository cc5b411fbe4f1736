//! Sessions against a real proxy on a real etcd: their leases are lost with them (session
//! revoked in etcd, keepalives stopped), closing or dropping one frees its resources.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{revoke_in_etcd, start_proxy, Etcd};
use lease_proxy_client::{AcquireOptions, Client, Error, LostReason, SessionAcquireOptions};
use tokio::time::Instant;

/// How late a tokio timer and the task waiting on it may run on a busy machine.
const TIMER_SLACK: Duration = Duration::from_millis(250);

async fn lost_within(token: tokio_util::sync::CancellationToken, limit: Duration) -> Instant {
    tokio::time::timeout(limit, token.cancelled())
        .await
        .expect("never lost");
    Instant::now()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_revoked_in_etcd_loses_its_leases_at_the_next_heartbeat() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    // The keepalive's 410, not the loss watch (tests/losses.rs), tells here.
    let client = Client::builder(&proxy.url)
        .loss_watch(false)
        .build()
        .unwrap();
    let session = client
        .open_session("robot-a", Duration::from_secs(6))
        .await
        .unwrap();
    let a = session
        .acquire("aisle-1", SessionAcquireOptions::new())
        .await
        .unwrap();
    let b = session
        .acquire("aisle-2", SessionAcquireOptions::new().holder("arm-2"))
        .await
        .unwrap();
    assert_eq!((a.holder(), b.holder()), ("robot-a", "arm-2"));
    assert_eq!(a.lease_id(), session.id());
    assert_eq!(a.deadline(), session.deadline());
    revoke_in_etcd(&etcd, session.id()).await;
    let deadline = session.deadline();
    let (lost_a, lost_b) = tokio::join!(
        lost_within(a.lost(), Duration::from_secs(10)),
        lost_within(b.lost(), Duration::from_secs(10))
    );
    for lost in [lost_a, lost_b] {
        assert!(
            lost + Duration::from_secs(2) < deadline,
            "lost only {:?} before the deadline",
            deadline - lost
        );
    }
    assert_eq!(session.lost_reason().await, LostReason::Revoked);
    assert_eq!(a.lost_reason().await, LostReason::SessionLost);
    assert_eq!(b.lost_reason().await, LostReason::SessionLost);
    assert!(matches!(
        session
            .acquire("aisle-3", SessionAcquireOptions::new())
            .await,
        Err(Error::SessionLost)
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_without_heartbeats_loses_its_leases_at_its_deadline() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let client = Client::new(&proxy.url).unwrap();
    let session = client
        .open_session("robot-a", Duration::from_secs(3))
        .await
        .unwrap();
    let lease = session
        .acquire("dock-1", SessionAcquireOptions::new())
        .await
        .unwrap();
    let first_deadline = session.deadline();
    tokio::time::sleep_until(first_deadline + Duration::from_millis(500)).await;
    assert!(!lease.is_lost(), "the heartbeat did not keep the session");
    assert!(lease.deadline() > first_deadline);

    session.pause_keepalives(true);
    let lost = tokio::spawn(lost_within(lease.lost(), Duration::from_secs(10)));
    let taken = client
        .grant(
            "dock-1",
            &AcquireOptions::new("robot-b", Duration::from_secs(3)).wait(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    let taken_at = Instant::now();
    assert!(
        lease.is_lost(),
        "someone else holds it and the guard does not know"
    );
    let lost_at = lost.await.unwrap();
    let deadline = session.deadline();
    assert!(
        deadline <= taken_at,
        "taken over {:?} before the deadline",
        deadline - taken_at
    );
    assert!(lost_at <= deadline + TIMER_SLACK);
    assert_eq!(lease.lost_reason().await, LostReason::SessionLost);
    assert_eq!(session.lost_reason().await, LostReason::Expired);
    assert!(lease.token() < taken.token);
}

#[tokio::test(flavor = "multi_thread")]
async fn closing_or_dropping_a_session_frees_its_resources() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let client = Client::new(&proxy.url).unwrap();

    let session = client
        .open_session("robot-a", Duration::from_secs(30))
        .await
        .unwrap();
    let a = session
        .acquire("bay-1", SessionAcquireOptions::new())
        .await
        .unwrap();
    let b = session
        .acquire("bay-2", SessionAcquireOptions::new())
        .await
        .unwrap();
    // Releasing one lease leaves the session and its other lease.
    b.release().await.unwrap();
    assert_eq!(client.get("bay-2").await.unwrap(), None);
    assert!(!a.is_lost() && !session.is_lost());
    assert_eq!(
        client
            .get("bay-1")
            .await
            .unwrap()
            .unwrap()
            .session
            .as_deref(),
        Some(session.id())
    );
    session.close().await.unwrap();
    assert!(a.is_lost());
    assert_eq!(a.lost_reason().await, LostReason::SessionLost);
    assert_eq!(client.get("bay-1").await.unwrap(), None);

    let session = client
        .open_session("robot-a", Duration::from_secs(30))
        .await
        .unwrap();
    let c = session
        .acquire("bay-3", SessionAcquireOptions::new())
        .await
        .unwrap();
    drop(session);
    assert!(c.is_lost());
    let start = Instant::now();
    while client.get("bay-3").await.unwrap().is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "a dropped session was not closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
