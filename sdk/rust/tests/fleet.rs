//! Fleet members against a real proxy on a real etcd (shared by the tests of this binary, each
//! under a prefix of its own): a member that receives, writes through the proxy's forward into
//! fence-gateway, and hands off when a second member joins — the moved guards lost with
//! `HandedOff`, the old token refused at the gateway once the new holder wrote —; a drain and
//! an eviction; a member whose session ends is told (or joins again); the operator's calls.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lease_proxy_client::{
    AssignmentChange, Assignments, Client, Error, FleetSpec, JoinOptions, Lease, LostReason,
    Member, MemberState,
};
use lease_proxy_testkit::poll::{eventually, Probe};
use lease_proxy_testkit::proxy::Proxy;
use lease_proxy_testkit::recording::Storage;
use lease_proxy_testkit::storage::start_gateway;
use lease_proxy_testkit::Etcd;

/// How long a change may take to arrive (a long poll is woken by the replica's watch).
const WITHIN: Duration = Duration::from_secs(10);

/// A proxy on the shared etcd under `/{test}/`, forwarding to `upstream` when given.
async fn proxy(etcd: &Etcd, test: &str, upstream: Option<String>) -> Proxy {
    Proxy::start(etcd.endpoints(), |c| {
        c.etcd_prefix = lease_proxy_testkit::prefix(test);
        c.min_ttl = 2;
        c.upstream = upstream;
    })
    .await
}

/// The next change of `changes`, within [`WITHIN`].
async fn next(changes: &mut Assignments) -> AssignmentChange {
    tokio::time::timeout(WITHIN, changes.next())
        .await
        .expect("no change within 10 s")
        .expect("the stream ended")
        .expect("the stream failed")
}

/// Changes of `changes` until `done` says the member got there; every guard added meanwhile.
async fn until(
    changes: &mut Assignments,
    mut done: impl FnMut(&AssignmentChange) -> bool,
) -> (AssignmentChange, Vec<Lease>) {
    let mut added = Vec::new();
    loop {
        let mut change = next(changes).await;
        eprintln!(
            "change {} {:?} held {:?} added {:?} releasing {:?} removed {:?} rejoined {}",
            change.revision,
            change.state,
            change.held,
            change
                .added
                .iter()
                .map(|l| (l.resource().to_owned(), l.token()))
                .collect::<Vec<_>>(),
            change
                .releasing
                .iter()
                .map(|r| r.resource().to_owned())
                .collect::<Vec<_>>(),
            change.removed,
            change.rejoined
        );
        added.append(&mut change.added);
        if done(&change) {
            return (change, added);
        }
    }
}

/// A join of `fleet` as `member` with a 10 s TTL and short polls.
async fn join(client: &Client, fleet: &str, member: &str) -> Member {
    client
        .join_fleet(
            fleet,
            JoinOptions::new(member, Duration::from_secs(10)).poll(Duration::from_secs(5)),
        )
        .await
        .unwrap()
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_receives_writes_and_hands_off_when_another_joins() {
    let etcd = Etcd::shared().await;
    let storage = Storage::start().await;
    let keys = tempfile::tempdir().unwrap();
    let key_file = lease_proxy_testkit::proxy::key_file(keys.path());
    let gateway = start_gateway(&storage.url, &key_file).await;
    let proxy = Proxy::start_with_keys(etcd.endpoints(), key_file.clone(), |c| {
        c.etcd_prefix = lease_proxy_testkit::prefix("fleet-handoff");
        c.min_ttl = 2;
        c.upstream = Some(gateway.clone());
    })
    .await;
    let client = Client::new(&proxy.url).unwrap();
    let resources = names("shelf", 4);
    let spec = FleetSpec::new(resources.clone()).drain(Duration::from_secs(5));
    let written = client.put_fleet("shelves", &spec).await.unwrap();
    assert_eq!(written.resources, resources);

    let a = join(&client, "shelves", "a").await;
    let mut a_changes = a.assignments();
    let (first, a_leases) = until(&mut a_changes, |c| c.held.len() == 4).await;
    assert_eq!(first.state, MemberState::Active);
    assert_eq!(a_leases.len(), 4);
    for lease in &a_leases {
        assert_eq!(lease.lease_id(), a.session_id().unwrap());
        let answer = lease
            .forward(
                reqwest::Method::PUT,
                &format!("/counts/{}", lease.resource()),
                Some("1".into()),
            )
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());
    }

    // b joins: two of a's resources are handed off, revoke-before-grant.
    let b = join(&client, "shelves", "b").await;
    let mut b_changes = b.assignments();
    let (moved, _) = until(&mut a_changes, |c| !c.releasing.is_empty()).await;
    assert_eq!(moved.releasing.len(), 2, "{moved:?}");
    let mut kept = Vec::new();
    let mut handed = Vec::new();
    for lease in a_leases {
        if moved
            .releasing
            .iter()
            .any(|r| r.resource() == lease.resource())
        {
            assert!(lease.is_lost(), "a moved resource's guard is not lost");
            assert_eq!(lease.lost_reason().await, LostReason::HandedOff);
            handed.push(lease);
        } else {
            assert!(!lease.is_lost());
            kept.push(lease);
        }
    }
    for r in &moved.releasing {
        assert!(r.deadline() > tokio::time::Instant::now());
        r.release().await.unwrap();
    }
    let (_, b_leases) = until(&mut b_changes, |c| c.held.len() == 2).await;
    for lease in &b_leases {
        let old = handed
            .iter()
            .find(|l| l.resource() == lease.resource())
            .unwrap();
        assert!(
            lease.token() > old.token(),
            "the new grant is not fenced past the old"
        );
        let answer = lease
            .forward(
                reqwest::Method::PUT,
                &format!("/counts/{}", lease.resource()),
                Some("2".into()),
            )
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        // The old holder's late write, straight to the gateway with its old token: refused.
        let late = reqwest::Client::new()
            .put(format!("{gateway}/counts/{}", lease.resource()))
            .header("fencing-token", old.fencing_token())
            .header("fencing-resource", old.resource())
            .body("late")
            .send()
            .await
            .unwrap();
        assert_eq!(late.status(), 409, "a stale token was admitted");
        // And the guard itself refuses to forward.
        assert!(matches!(
            old.forward(reqwest::Method::PUT, "/counts/x", None).await,
            Err(Error::Lost)
        ));
    }
    assert!(kept.iter().all(|l| !l.is_lost()));
    let bodies: Vec<String> = storage.log.all().iter().map(|w| w.text()).collect();
    assert_eq!(bodies, ["1", "1", "1", "1", "2", "2"]);
    let view = client.get_fleet("shelves").await.unwrap().unwrap();
    assert_eq!(view.members.len(), 2);
    assert!(view.unassigned.is_empty(), "{view:?}");
    a.leave().await.unwrap();
    for lease in &kept {
        assert_eq!(lease.lost_reason().await, LostReason::SessionLost);
    }
    b.leave().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drained_member_hands_everything_off_and_an_evicted_one_ends() {
    let etcd = Etcd::shared().await;
    let proxy = proxy(&etcd, "fleet-drain", None).await;
    let client = Client::new(&proxy.url).unwrap();
    client
        .put_fleet(
            "bins",
            &FleetSpec::new(names("bin", 4)).drain(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let a = join(&client, "bins", "a").await;
    let mut a_changes = a.assignments();
    let (_, mut a_leases) = until(&mut a_changes, |c| c.held.len() == 4).await;
    let b = join(&client, "bins", "b").await;
    // a serves its guards the usual way: dropped once lost, which releases a hand-off.
    let (_, _) = until(&mut a_changes, |c| {
        a_leases.retain(|l| !l.is_lost());
        c.held.len() == 2
    })
    .await;
    a_leases.retain(|l| !l.is_lost());
    let mut b_changes = b.assignments();
    let (_, mut taken) = until(&mut b_changes, |c| c.held.len() == 2).await;

    assert_eq!(a.drain().await.unwrap(), MemberState::Draining);
    let (draining, _) = until(&mut a_changes, |c| c.held.is_empty()).await;
    assert_eq!(draining.state, MemberState::Draining);
    for lease in &a_leases {
        assert_eq!(lease.lost_reason().await, LostReason::HandedOff);
    }
    drop(a_leases); // released on drop
    let (_, more) = until(&mut b_changes, |c| c.held.len() == 4).await;
    assert_eq!(more.len(), 2, "b's first two were given again");
    taken.extend(more);
    assert!(taken.iter().all(|l| !l.is_lost()));
    assert_eq!(a.state(), Some(MemberState::Draining));

    // An operator evicts b: its guards are lost at once, its stream ends with the eviction.
    client.evict_member("bins", "b").await.unwrap();
    let (evicted, _) = until(&mut b_changes, |c| c.state == MemberState::Evicted).await;
    assert_eq!(evicted.removed.len(), 4, "{evicted:?}");
    for lease in &taken {
        assert!(lease.is_lost());
    }
    assert!(tokio::time::timeout(WITHIN, b_changes.next())
        .await
        .unwrap()
        .is_none());
    assert!(b.ended().is_cancelled());
    a.leave().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_whose_session_ends_is_told_or_joins_again() {
    let etcd = Etcd::shared().await;
    let proxy = proxy(&etcd, "fleet-session", None).await;
    let client = Client::new(&proxy.url).unwrap();
    client
        .put_fleet("docks", &FleetSpec::new(names("dock", 2)))
        .await
        .unwrap();

    // Without rejoin: the session's etcd lease revoked, the member is told and ends.
    let a = join(&client, "docks", "a").await;
    let mut changes = a.assignments();
    let (_, leases) = until(&mut changes, |c| c.held.len() == 2).await;
    common::revoke_in_etcd(&etcd, &a.session_id().unwrap()).await;
    let told = tokio::time::timeout(WITHIN, changes.next())
        .await
        .expect("not told within 10 s");
    match told {
        Some(Err(e)) => assert!(
            matches!(e, Error::SessionLost) || e.slug() == Some("no-member"),
            "{e:?}"
        ),
        other => panic!("not told the session ended: {other:?}"),
    }
    for lease in &leases {
        assert_eq!(lease.lost_reason().await, LostReason::SessionLost);
    }
    assert!(changes.next().await.is_none());
    assert!(a.ended().is_cancelled());
    drop(a);

    // With rejoin: a new session, the resources granted to it again under new tokens.
    let b = client
        .join_fleet(
            "docks",
            JoinOptions::new("b", Duration::from_secs(10))
                .poll(Duration::from_secs(5))
                .rejoin(true),
        )
        .await
        .unwrap();
    let mut changes = b.assignments();
    let (_, before) = until(&mut changes, |c| c.held.len() == 2).await;
    let first_session = b.session_id().unwrap();
    common::revoke_in_etcd(&etcd, &first_session).await;
    let mut rejoined = false;
    let (_, after) = until(&mut changes, |c| {
        rejoined |= c.rejoined;
        rejoined && c.held.len() == 2
    })
    .await;
    assert_eq!(after.len(), 2);
    assert_ne!(b.session_id().unwrap(), first_session);
    for old in &before {
        assert_eq!(old.lost_reason().await, LostReason::SessionLost);
        let new = after
            .iter()
            .find(|l| l.resource() == old.resource())
            .unwrap();
        assert!(new.token() > old.token());
        assert!(!new.is_lost());
    }
    b.leave().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn operator_calls_and_a_deleted_fleet() {
    let etcd = Etcd::shared().await;
    let proxy = proxy(&etcd, "fleet-admin", None).await;
    let client = Client::new(&proxy.url).unwrap();
    assert!(client.get_fleet("racks").await.unwrap().is_none());
    let missing = client
        .join_fleet("racks", JoinOptions::new("a", Duration::from_secs(10)))
        .await
        .expect_err("joined a fleet that does not exist");
    assert_eq!(missing.slug(), Some("no-fleet"), "{missing:?}");

    let written = client
        .put_fleet(
            "racks",
            &FleetSpec::new(names("rack", 3))
                .drain(Duration::from_millis(1500))
                .max_moves(2),
        )
        .await
        .unwrap();
    assert_eq!((written.drain_ms, written.max_moves), (1500, 2));
    let a = Arc::new(join(&client, "racks", "a").await);
    let mut changes = a.assignments();
    until(&mut changes, |c| c.held.len() == 3).await;
    let (view, _) = eventually(WITHIN, "the fleet view shows a's holdings", || {
        let client = client.clone();
        async move {
            let view = client.get_fleet("racks").await.unwrap().unwrap();
            match view.members.first() {
                Some(m) if m.member == "a" && m.held == names("rack", 3) => Probe::Done(view),
                _ => Probe::Not(format!("{view:?}")),
            }
        }
    })
    .await;
    assert!(view.revision >= written.revision);
    assert!(view.unassigned.is_empty());

    // The fleet deleted: its grants are released, the member is told and ends.
    client.delete_fleet("racks").await.unwrap();
    let told = loop {
        match tokio::time::timeout(WITHIN, changes.next()).await.unwrap() {
            Some(Ok(change)) => assert!(change.added.is_empty()),
            other => break other,
        }
    };
    match told {
        Some(Err(e)) => assert_eq!(e.slug(), Some("no-fleet"), "{e:?}"),
        other => panic!("not told the fleet was deleted: {other:?}"),
    }
    eventually(WITHIN, "the member ended", || {
        let ended = a.ended().is_cancelled();
        async move {
            if ended {
                Probe::Done(())
            } else {
                Probe::Not("running".into())
            }
        }
    })
    .await;
    client.delete_fleet("racks").await.unwrap(); // idempotent
}
