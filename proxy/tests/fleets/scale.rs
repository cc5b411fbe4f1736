//! 10,000 resources over 200 members on one etcd: the first assignment, a join and a death
//! each converge, moving only what they must, and what each costs etcd is measured (on an etcd
//! of the test's own, so no other test's writes are counted); the fleet's end releases all.

use std::collections::BTreeMap;
use std::time::Duration;

use lease_proxy_testkit::poll::{eventually, Probe};
use serde_json::{json, Value};

use super::common::fleet::*;
use super::common::*;
use super::die;

const RESOURCES: usize = 10_000;
const MEMBERS: usize = 200;

/// Waits until every resource is held, nothing is handed off and counts differ by at most
/// one; the view then and how long it took.
async fn balanced(url: &str, within: Duration) -> (Value, Duration) {
    eventually(within, "10,000 resources balanced", || async {
        let (status, view) = fleet_view(url, "sc").await;
        let counts: Vec<usize> = counts(&view).into_values().collect();
        let spread = counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0);
        let held = holders(&view).len();
        if status == 200 && held == RESOURCES && releasing(&view) == 0 && spread <= 1 {
            Probe::Done(view)
        } else {
            // A view of 10,000 resources is 79 reads: asked a few times a second, not forty.
            tokio::time::sleep(Duration::from_millis(200)).await;
            Probe::Not(format!(
                "{status}: {held} held, spread {spread}, {} releasing",
                releasing(&view)
            ))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_resources_over_two_hundred_members() {
    let etcd = Etcd::single().await;
    let r1 = Proxy::start(etcd.endpoints(), |_| {}).await;
    let r2 = r1.replica(etcd.endpoints(), |_| {}).await;
    make_fleet(&r1.url, "sc", &[], json!({"drain_ms": 300})).await;
    // Members first (TTL long enough for the test: no heartbeats), half on each replica.
    let mut members = Vec::new();
    for chunk in (0..MEMBERS).collect::<Vec<_>>().chunks(20) {
        let joins = chunk.iter().map(|i| {
            let url = if i % 2 == 0 { &r1.url } else { &r2.url };
            let name = format!("m{i:03}");
            async move { joined(url, "sc", &name, 300).await }
        });
        members.extend(futures::future::join_all(joins).await);
    }
    // Then the resources: every one free, granted at once.
    let proposals = etcd_proposals(&etcd).await;
    let resources = names("sc", RESOURCES);
    make_fleet(&r1.url, "sc", &resources, json!({"drain_ms": 300})).await;
    let (view, first) = balanced(&r2.url, Duration::from_secs(120)).await;
    let writes = etcd_proposals(&etcd).await - proposals;
    eprintln!("first assignment: {first:?}, {writes} etcd writes for {RESOURCES} grants");
    let before = holders(&view);

    // A join: about 10,000 / 201 move, all to the newcomer, revoked at drain_ms from members
    // that never release.
    let proposals = etcd_proposals(&etcd).await;
    let newcomer = joined(&r2.url, "sc", "new", 300).await;
    let (view, took) = balanced(&r1.url, Duration::from_secs(60)).await;
    let writes = etcd_proposals(&etcd).await - proposals;
    let after = holders(&view);
    let moved_by_join = moved(&before, &after);
    eprintln!(
        "a join: {took:?}, {} moves, {writes} etcd writes ({:.1} a move)",
        moved_by_join.len(),
        writes as f64 / moved_by_join.len() as f64
    );
    assert!(
        (49..=50).contains(&moved_by_join.len()),
        "{}",
        moved_by_join.len()
    );
    assert!(moved_by_join.values().all(|(_, to)| to == &newcomer.name));

    // A death: exactly what the dead member held moves.
    let dead = &members[7];
    let held_by_dead = after.values().filter(|m| **m == dead.name).count();
    let proposals = etcd_proposals(&etcd).await;
    die(&etcd, dead).await;
    let (view, took) = balanced(&r2.url, Duration::from_secs(60)).await;
    let writes = etcd_proposals(&etcd).await - proposals;
    let moved_by_death = moved(&after, &holders(&view));
    eprintln!(
        "a death: {took:?}, {} moves, {writes} etcd writes ({:.1} a move)",
        moved_by_death.len(),
        writes as f64 / moved_by_death.len() as f64
    );
    assert_eq!(moved_by_death.len(), held_by_dead);
    assert!(moved_by_death.values().all(|(from, _)| from == &dead.name));
    let per_member: BTreeMap<String, usize> = counts(&view);
    assert_eq!(per_member.len(), MEMBERS);

    // The fleet ends: every grant is released before the answer.
    let started = tokio::time::Instant::now();
    let (status, body) = send(http().delete(format!("{}/v1/fleets/sc", r2.url))).await;
    assert_eq!(status, 204, "{body}");
    eprintln!("the end: {:?} for {RESOURCES} grants", started.elapsed());
    let left = (snapshot(&etcd).await.kvs.iter())
        .filter(|kv| kv.0.starts_with(b"/lease-proxy/holders/"))
        .count();
    assert_eq!(left, 0, "grants outlived their fleet");
}
