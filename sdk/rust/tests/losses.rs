//! The loss watch against a real proxy on a real etcd: a guard learns of its loss when the proxy
//! sees it (its etcd lease revoked, a takeover, its session's lease revoked), within a second and
//! long before its next renewal; an older grant's event never ends a newer grant; and without
//! `read` permission the renewals still tell; and with no server at all, the stop-by deadline.
//! The times measured are printed (docs: the SDK READMEs' "Learning of a loss").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{revoke_in_etcd, start_proxy, start_proxy_with, Etcd};
use lease_proxy_client::{AcquireOptions, Client, LostReason, SessionAcquireOptions};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The loss must be told within this of the change at the proxy (the renewal comes at TTL/3).
const WITHIN: Duration = Duration::from_secs(1);
/// A TTL whose renewal (at a third) comes long after `WITHIN`.
const TTL: Duration = Duration::from_secs(30);

/// When `lost` fires, waiting at most `limit`.
async fn lost_within(lost: CancellationToken, limit: Duration) -> Option<Instant> {
    tokio::time::timeout(limit, lost.cancelled()).await.ok()?;
    Some(Instant::now())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_loss_is_told_when_the_proxy_sees_it_not_at_the_next_renewal() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let client = Client::new(&proxy.url).unwrap();

    // An etcd lease revoked directly.
    let lease = client
        .acquire("loss-1", AcquireOptions::new("robot-a", TTL))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // the stream is open
    let revoked = Instant::now();
    revoke_in_etcd(&etcd, lease.lease_id()).await;
    let lost = lost_within(lease.lost(), WITHIN).await;
    let lost = lost.expect("not told within 1 s of the revoke (the renewal is 10 s away)");
    assert_eq!(lease.lost_reason().await, LostReason::Revoked);
    println!("revoke in etcd -> lost: {:?}", lost - revoked);

    // A takeover: the holder's lease revoked, another client acquiring at once.
    let held = client
        .acquire("loss-2", AcquireOptions::new("robot-a", TTL))
        .await
        .unwrap();
    let taker = Client::builder(&proxy.url)
        .loss_watch(false)
        .build()
        .unwrap();
    let watching = tokio::spawn(lost_within(held.lost(), Duration::from_secs(5)));
    let revoked = Instant::now();
    revoke_in_etcd(&etcd, held.lease_id()).await;
    let taken = taker
        .grant(
            "loss-2",
            &AcquireOptions::new("robot-b", TTL).wait(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let taken_at = Instant::now();
    let lost = watching.await.unwrap().expect("the takeover was not told");
    assert!(taken.token > held.token());
    assert!(
        lost - revoked < WITHIN,
        "told {:?} after the revoke",
        lost - revoked
    );
    println!(
        "revoke + takeover -> lost: {:?} after the revoke, {:?} after the taker's grant",
        lost - revoked,
        lost.checked_duration_since(taken_at).unwrap_or_default()
    );

    // A session's lease revoked: the session is lost, its leases with it.
    let session = client.open_session("robot-a", TTL).await.unwrap();
    let a = session
        .acquire("loss-3", SessionAcquireOptions::new())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let revoked = Instant::now();
    revoke_in_etcd(&etcd, session.id()).await;
    let lost = lost_within(a.lost(), WITHIN)
        .await
        .expect("session loss not told");
    assert_eq!(session.lost_reason().await, LostReason::Revoked);
    assert_eq!(a.lost_reason().await, LostReason::SessionLost);
    println!("session revoke in etcd -> lost: {:?}", lost - revoked);

    // An older grant's end never ends a newer grant of the same resource: released and
    // acquired again at once, the release's event arrives while the new grant is held.
    for _ in 0..5 {
        let first = client
            .acquire("loss-4", AcquireOptions::new("robot-a", TTL))
            .await
            .unwrap();
        first.release().await.unwrap();
        let second = client
            .acquire("loss-4", AcquireOptions::new("robot-a", TTL))
            .await
            .unwrap();
        assert!(
            lost_within(second.lost(), Duration::from_millis(500))
                .await
                .is_none(),
            "the first grant's release ended the second"
        );
        second.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_read_permission_the_renewals_still_tell() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!(
            "writer {} acquire:*\n",
            hex::encode(Sha256::digest(b"writer-token-7c1d"))
        ),
    )
    .unwrap();
    let proxy = start_proxy_with(&etcd, &reqwest::Client::new(), |c| {
        c.auth_tokens = Some(tokens.clone());
    })
    .await;
    let client = Client::builder(&proxy.url)
        .bearer_token("writer-token-7c1d")
        .build()
        .unwrap();
    let ttl = Duration::from_secs(3);
    let lease = client
        .acquire("quiet-1", AcquireOptions::new("robot-a", ttl))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // the stream is refused (403)
    revoke_in_etcd(&etcd, lease.lease_id()).await;
    let deadline = lease.deadline();
    lost_within(lease.lost(), Duration::from_secs(5))
        .await
        .expect("never lost");
    assert_eq!(
        lease.lost_reason().await,
        LostReason::Revoked,
        "a 410 at the renewal"
    );
    assert!(Instant::now() < deadline);
}

/// The third way to learn of a loss, with no server: the stop-by deadline, the lifetime less a
/// safety margin. Renewals paused (as when the proxy cannot be reached), the guard is lost
/// (`Expired`) at that deadline while the proxy still holds the lease.
#[tokio::test(flavor = "multi_thread")]
async fn the_stop_by_deadline_ends_the_lease_a_safety_margin_before_the_server_would() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let ttl = Duration::from_secs(3);
    let plain = Client::new(&proxy.url).unwrap();
    let wide = Client::builder(&proxy.url)
        .safety_margin(Duration::from_secs(1))
        .build()
        .unwrap();
    for (client, margin, resource) in [
        (&plain, Duration::from_millis(300), "stop-by-1"), // the default: a tenth
        (&wide, Duration::from_secs(1), "stop-by-2"),
    ] {
        let before = Instant::now();
        let lease = client
            .acquire(resource, AcquireOptions::new("robot-a", ttl))
            .await
            .unwrap();
        let after = Instant::now();
        lease.pause_renewals(true);
        let life = Duration::from_millis(lease.grant().expires_in_ms).min(ttl);
        let deadline = lease.deadline();
        assert!(
            before + life - margin <= deadline && deadline <= after + life - margin,
            "{resource}: the deadline is not the lifetime less {margin:?}"
        );
        let lost = lost_within(lease.lost(), ttl).await.expect("never lost");
        assert!(lost >= deadline);
        assert_eq!(lease.lost_reason().await, LostReason::Expired);
        if margin == Duration::from_secs(1) {
            let held = plain.get(resource).await.unwrap();
            assert!(held.is_some(), "lost after the proxy let the lease go");
        }
        lease.release().await.unwrap();
    }
}
