//! A decision carried out after what it read has changed, against a real etcd: every grant it
//! makes is refused. The window between a replica's decision and its grants is a few etcd
//! round trips in a running server, too short for a test to hold open from outside; here the
//! test decides, changes the fleet, and only then carries the decision out.

use std::collections::BTreeMap;

use std::time::Duration;

use clap::Parser as _;
use lease_proxy_testkit::poll::until;
use lease_proxy_testkit::Etcd as TestEtcd;
use tokio::time::Instant;

use super::assign::Holder;
use super::members::{Drainer, Join};
use super::reconcile::{Decided, Decision};
use super::spec::SpecChange;
use super::Fleets;
use crate::Config;

/// A fleet `f` of `resources` on a fresh etcd, with no driver: nothing decides but the test.
struct Fixture {
    fleets: Fleets,
    _stop: tokio_util::sync::DropGuard,
    _etcd: std::sync::Arc<TestEtcd>,
    _dir: tempfile::TempDir,
}

const FLEET: &str = "f";

fn anyone(_: &[String]) -> crate::Result<()> {
    Ok(())
}

impl Fixture {
    async fn new(resources: &[&str]) -> Self {
        let etcd = TestEtcd::shared().await;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let endpoints = etcd.endpoints().join(",");
        let data_dir = dir.path().display().to_string();
        let prefix = lease_proxy_testkit::prefix("fleet");
        let config = Config::parse_from([
            "lease-proxy",
            "--etcd-endpoints",
            &endpoints,
            "--etcd-prefix",
            &prefix,
            "--data-dir",
            &data_dir,
        ]);
        let (parts, stop) = crate::server::fleet_parts_for_tests(&config).await;
        let tracker = tokio_util::task::TaskTracker::new();
        let fleets = Fleets::undriven(parts, &tracker, tokio_util::sync::CancellationToken::new());
        let spec = SpecChange {
            resources: resources.iter().map(|r| (*r).to_owned()).collect(),
            drain_ms: None,
            max_moves: None,
        };
        fleets
            .put(FLEET, &spec, None)
            .await
            .expect("the fleet is made");
        Self {
            fleets,
            _stop: stop,
            _etcd: etcd,
            _dir: dir,
        }
    }

    async fn join(&self, member: &str) {
        let join = Join {
            member: member.to_owned(),
            ttl_seconds: 60,
            weight: None,
            principal: None,
            received: Instant::now(),
        };
        (self.fleets.join(FLEET, join, &anyone).await).expect("the member joins");
    }

    /// Decides, the assignment written.
    async fn decide(&self) -> Box<Decided> {
        match self.fleets.decide(FLEET).await.expect("the fleet is read") {
            Decision::Made(decided) => decided,
            Decision::Gone => panic!("the fleet is gone"),
            Decision::Raced => panic!("raced with nobody"),
        }
    }

    /// Whether `resource`'s ownership key exists now (whoever's it is).
    async fn held(&self, resource: &str) -> bool {
        let key = self.fleets.inner.parts.layout.holder(resource);
        let found = (self.fleets.inner.parts.etcd.get(&key).await).expect("the key is read");
        found.is_some()
    }

    /// Whether the fleet exists now.
    async fn exists(&self) -> bool {
        let snap = self.fleets.snapshot(FLEET).await;
        snap.expect("the fleet is read").is_some()
    }

    /// How many ownership keys there are now.
    async fn holders_left(&self) -> usize {
        let parts = &self.fleets.inner.parts;
        let listed = (parts.etcd.list(parts.layout.holders(), 1_000).await).expect("listed");
        listed.kvs.len()
    }

    /// The keys of the fleet's index of its grants, and whether its end's key is there.
    async fn index_left(&self) -> (usize, bool) {
        let (etcd, layout) = (
            &self.fleets.inner.parts.etcd,
            &self.fleets.inner.parts.layout,
        );
        let index = (etcd.list(&layout.fleet_grants(FLEET), 1_000).await).expect("listed");
        let ending = (etcd.get(&layout.fleet_ending(FLEET)).await).expect("read");
        (index.kvs.len(), ending.is_some())
    }

    /// The fleet as it is now.
    async fn snapshot(&self) -> super::records::Snapshot {
        (self.fleets.snapshot(FLEET).await)
            .expect("the fleet is read")
            .expect("the fleet exists")
    }

    /// Makes (or changes) the fleet to `resources`.
    async fn put(&self, resources: &[&str]) {
        let spec = SpecChange {
            resources: resources.iter().map(|r| (*r).to_owned()).collect(),
            drain_ms: None,
            max_moves: None,
        };
        (self.fleets.put(FLEET, &spec, None).await).expect("the fleet is written");
    }

    /// Joins `members`, then decides and carries the decision out.
    async fn granted(&self, members: &[&str]) {
        for m in members {
            self.join(m).await;
        }
        let decided = self.decide().await;
        self.fleets.act(decided).await;
    }

    /// Who holds each held resource now.
    async fn holders(&self) -> BTreeMap<String, Holder> {
        let snap = (self.fleets.snapshot(FLEET).await)
            .expect("the fleet is read")
            .expect("the fleet exists");
        let owned = (self.fleets.owned(&snap, snap.watched()).await).expect("the grants are read");
        owned.into_iter().map(|(r, o)| (r, o.held.holder)).collect()
    }
}

fn planned(decided: &Decided) -> Vec<(String, String)> {
    (decided.plan.grants.iter())
        .map(|g| (g.resource.clone(), g.member.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_decided_before_its_member_drained_is_refused() {
    let fixture = Fixture::new(&["r"]).await;
    fixture.join("a").await;
    let stale = fixture.decide().await;
    assert_eq!(planned(&stale), [("r".to_owned(), "a".to_owned())]);
    let drained = fixture.fleets.drain(FLEET, "a", Drainer::Operator(&anyone));
    drained.await.expect("the member drains");
    fixture.fleets.act(stale).await;
    assert_eq!(
        fixture.holders().await,
        BTreeMap::new(),
        "a grant decided before its member drained was made after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_decided_before_the_assignment_moved_is_refused() {
    let fixture = Fixture::new(&["r1", "r2"]).await;
    fixture.join("a").await;
    let stale = fixture.decide().await;
    assert_eq!(planned(&stale).len(), 2, "both to the only member");
    // Another replica decides with the second member in: one resource moves to it.
    fixture.join("b").await;
    let current = fixture.decide().await;
    assert_ne!(current.assignment_revision, stale.assignment_revision);
    fixture.fleets.act(stale).await;
    assert_eq!(
        fixture.holders().await,
        BTreeMap::new(),
        "grants of an assignment since rewritten were made"
    );
    // The current decision's grants are made: one resource each.
    fixture.fleets.act(current).await;
    let holders = fixture.holders().await;
    let mut members: Vec<_> = holders.values().cloned().collect();
    members.sort_by_key(|h| format!("{h:?}"));
    assert_eq!(
        members,
        [Holder::Member("a".into()), Holder::Member("b".into())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_made_while_the_fleet_ends_is_released_with_it() {
    let fixture = Fixture::new(&["r"]).await;
    fixture.join("a").await;
    let decided = fixture.decide().await;
    // The end reads the fleet; a replica's grant lands before its delete (every guard of the
    // grant still holds then).
    let snap = (fixture.fleets.snapshot(FLEET).await)
        .expect("the fleet is read")
        .expect("the fleet exists");
    fixture.fleets.act(decided).await;
    assert!(fixture.held("r").await, "granted before the end");
    assert!(fixture.fleets.end(&snap).await.expect("the fleet ends"));
    assert!(
        !fixture.held("r").await,
        "a grant made while the fleet ended outlived it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleets_end_goes_on_when_its_caller_goes_away() {
    let names: Vec<String> = (0..2_000).map(|i| format!("r{i}")).collect();
    let resources: Vec<&str> = names.iter().map(String::as_str).collect();
    let fixture = Fixture::new(&resources).await;
    fixture.join("a").await;
    let decided = fixture.decide().await;
    fixture.fleets.act(decided).await;
    assert_eq!(fixture.holders_left().await, 2_000);
    // The caller gives up a moment later each time, until the fleet is gone. After each cut,
    // either the fleet is still there (the cut came before its delete) or no grant is left
    // once what was under way has finished: never a fleet gone with grants left behind.
    let mut patience = Duration::from_millis(1);
    loop {
        let ending = fixture.fleets.delete(FLEET, None, &anyone);
        let cut = tokio::time::timeout(patience, ending).await.is_err();
        let settled = until(
            Duration::from_secs(10),
            "the fleet there, or nothing held",
            || async { fixture.exists().await || fixture.holders_left().await == 0 },
        );
        settled.await;
        if !cut || !fixture.exists().await {
            break;
        }
        patience += Duration::from_millis(1);
    }
    until(Duration::from_secs(10), "every grant released", || async {
        fixture.holders_left().await == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_whose_replica_stopped_after_the_delete_is_finished() {
    let fixture = Fixture::new(&["r1", "r2", "r3"]).await;
    fixture.granted(&["a"]).await;
    assert_eq!(fixture.index_left().await, (3, false));
    // The replica ending it stops right after the delete: the keys are gone, the grants not.
    let snap = fixture.snapshot().await;
    let ended = fixture.fleets.end_keys(&snap).await.expect("deleted");
    assert!(ended.is_some(), "the spec changed");
    assert_eq!(fixture.holders_left().await, 3);
    assert_eq!(fixture.index_left().await, (3, true));
    // Another replica leaves an end that began a moment ago to its own replica…
    let patient = fixture.fleets.finish_ends(Duration::from_secs(3_600));
    patient.await.expect("the ends are read");
    assert_eq!(
        fixture.holders_left().await,
        3,
        "a young end was taken over"
    );
    // …and finishes one older than its grace.
    let finished = fixture.fleets.finish_ends(Duration::ZERO);
    finished.await.expect("the end is finished");
    assert_eq!(
        fixture.holders_left().await,
        0,
        "grants outlived a half-done end"
    );
    assert_eq!(fixture.index_left().await, (0, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_that_finds_the_fleet_gone_answers_once_its_grants_are() {
    let fixture = Fixture::new(&["r1", "r2"]).await;
    fixture.granted(&["a"]).await;
    // A first DELETE (or a replica that stopped) deleted the keys and has not released yet.
    let snap = fixture.snapshot().await;
    let ended = fixture.fleets.end_keys(&snap).await.expect("deleted");
    assert!(ended.is_some(), "the spec changed");
    // A second DELETE, or the first retried: its answer means the grants are gone.
    (fixture.fleets.delete(FLEET, None, &anyone).await).expect("the fleet ends");
    assert_eq!(
        fixture.holders_left().await,
        0,
        "a DELETE answered with grants still held"
    );
    assert_eq!(fixture.index_left().await, (0, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deletes_at_once_answer_once_every_grant_is_released() {
    let names: Vec<String> = (0..1_000).map(|i| format!("r{i}")).collect();
    let resources: Vec<&str> = names.iter().map(String::as_str).collect();
    let fixture = Fixture::new(&resources).await;
    fixture.granted(&["a", "b"]).await;
    assert_eq!(fixture.holders_left().await, 1_000);
    let first = fixture.fleets.delete(FLEET, None, &anyone);
    let second = fixture.fleets.delete(FLEET, None, &anyone);
    tokio::pin!(first, second);
    // Whichever answers first (the one that lost the delete, most often): nothing is held
    // by then.
    let answered = tokio::select! {
        a = &mut first => a,
        b = &mut second => b,
    };
    answered.expect("the fleet ends");
    assert_eq!(
        fixture.holders_left().await,
        0,
        "a DELETE answered while the other was still releasing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_shrunk_just_before_the_end_leaves_no_grant() {
    let fixture = Fixture::new(&["r1", "r2", "r3", "r4"]).await;
    fixture.granted(&["a"]).await;
    // The spec loses three resources; no replica has revoked their grants yet.
    fixture.put(&["r1"]).await;
    (fixture.fleets.delete(FLEET, None, &anyone).await).expect("the fleet ends");
    assert_eq!(
        fixture.holders_left().await,
        0,
        "grants of resources the spec no longer named outlived the fleet"
    );
    assert_eq!(fixture.index_left().await, (0, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finishing_an_end_leaves_a_fleet_made_since_under_the_same_name() {
    let fixture = Fixture::new(&["r1"]).await;
    fixture.granted(&["a"]).await;
    let snap = fixture.snapshot().await;
    let ended = fixture.fleets.end_keys(&snap).await.expect("deleted");
    assert!(ended.is_some(), "the spec changed");
    // Made again, with a grant of its own, before the first end is finished.
    fixture.put(&["r2"]).await;
    fixture.granted(&["b"]).await;
    assert!(fixture.held("r1").await && fixture.held("r2").await);
    (fixture.fleets.release_ended(FLEET).await).expect("the first end finishes");
    assert!(!fixture.held("r1").await, "the ended fleet's grant is left");
    assert!(
        fixture.held("r2").await,
        "finishing an end released a grant of the fleet made since"
    );
    assert_eq!(fixture.index_left().await, (1, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_revoked_leaves_the_fleets_index_with_it() {
    let fixture = Fixture::new(&["r1", "r2"]).await;
    fixture.granted(&["a"]).await;
    assert_eq!(fixture.index_left().await, (2, false));
    (fixture.fleets.evict(FLEET, "a", &anyone).await).expect("evicted");
    assert_eq!(fixture.holders_left().await, 0);
    assert_eq!(
        fixture.index_left().await,
        (0, false),
        "a revoked grant's index key outlived it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_key_left_by_a_withdrawn_grant_still_names_the_next() {
    let fixture = Fixture::new(&["r"]).await;
    fixture.granted(&["a"]).await;
    // The grant is withdrawn as a failed pre-fence withdraws it: its ownership key goes, its
    // index key stays (its create revision now an ended grant's).
    let holder = fixture.fleets.inner.parts.layout.holder("r");
    let mut client = fixture._etcd.client().await;
    client.delete(holder, None).await.expect("withdrawn");
    let decided = fixture.decide().await;
    fixture.fleets.act(decided).await;
    assert!(fixture.held("r").await, "granted again");
    // The end as a retried DELETE or another replica's driver runs it: the index alone.
    let snap = fixture.snapshot().await;
    let ended = fixture.fleets.end_keys(&snap).await.expect("deleted");
    assert!(ended.is_some(), "the spec changed");
    (fixture.fleets.release_ended(FLEET).await).expect("released");
    assert!(
        !fixture.held("r").await,
        "a grant whose index key an earlier grant created outlived the fleet"
    );
    assert_eq!(fixture.index_left().await, (0, false));
}
