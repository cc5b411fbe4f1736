//! Fleets on a real etcd, always through two proxy replicas: every resource owned again after a
//! death, balance at rest, stickiness on join and leave, drain and evict, a rejoin within the
//! TTL, a replica killed mid-rebalance, the churn budget (here); the end-to-end safety property
//! with a paused member writing through fence-gateway (`fleets/safety.rs`); hostile input
//! (`fleets/hostile.rs`); 10,000 resources over 200 members (`fleets/scale.rs`); tenants,
//! budgets and bounds (`fleets/tenancy.rs`).
//!
//! The tests share one etcd (each under a prefix of its own) and never sleep for a lease to
//! expire: a death is a session lease revoked in etcd or a heartbeat stopped, then polled for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "fleets/hostile.rs"]
mod hostile;
#[path = "fleets/safety.rs"]
mod safety;
#[path = "fleets/scale.rs"]
mod scale;
#[path = "fleets/tenancy.rs"]
mod tenancy;

use std::sync::Arc;
use std::time::Duration;

use common::fleet::*;
use common::*;
use lease_proxy::Config;
use serde_json::json;

/// Two replicas of the proxy on one shared etcd, under a prefix of the test's own.
pub struct Replicas {
    /// The shared etcd.
    pub etcd: Arc<Etcd>,
    /// One replica.
    pub r1: Proxy,
    /// The other.
    pub r2: Proxy,
    /// The key prefix of both, the test's own on the shared etcd.
    pub prefix: String,
}

/// Two replicas under a [`lease_proxy_testkit::prefix`] of `test`'s, both configured by `tweak`.
pub async fn replicas(test: &str, tweak: impl Fn(&mut Config)) -> Replicas {
    let etcd = Etcd::shared().await;
    let prefix = lease_proxy_testkit::prefix(test);
    let r1 = Proxy::start(etcd.endpoints(), |c| {
        c.etcd_prefix = prefix.clone();
        tweak(c);
    })
    .await;
    let r2 = r1
        .replica(etcd.endpoints(), |c| {
            c.etcd_prefix = prefix.clone();
            tweak(c);
        })
        .await;
    Replicas {
        etcd,
        r1,
        r2,
        prefix,
    }
}

/// Two replicas as [`replicas`] starts them, each auditing to a file of its own in the
/// directory returned (read with `audit_lines`).
pub async fn audited_replicas(test: &str) -> (Replicas, tempfile::TempDir) {
    let logs = tempfile::tempdir().unwrap();
    let replica = std::sync::atomic::AtomicUsize::new(0);
    let r = replicas(test, |c| {
        let n = replica.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        c.audit_log = Some(logs.path().join(format!("audit-{n}.jsonl")));
    })
    .await;
    (r, logs)
}

/// Ends a member's session in etcd, as its lapse would (no release, no close marker).
pub async fn die(etcd: &Etcd, member: &Member) {
    let mut client = etcd.client().await;
    client
        .lease_revoke(member.session.parse::<i64>().unwrap())
        .await
        .unwrap();
}

const SETTLE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_resource_is_owned_again_within_the_ttl_after_a_death() {
    let r = replicas("fleet-coverage", |_| {}).await;
    let resources = names("cov", 24);
    make_fleet(&r.r1.url, "cov", &resources, json!({"drain_ms": 1000})).await;
    let beat = Some(Duration::from_millis(500));
    let a = joined(&r.r1.url, "cov", "a", 2).await;
    let b = joined(&r.r2.url, "cov", "b", 2).await;
    let c = joined(&r.r1.url, "cov", "c", 2).await;
    let tasks = [a.cooperate(beat), b.cooperate(beat), c.cooperate(beat)];
    let (view, _) = rested(&r.r2.url, "cov", &[("a", 8), ("b", 8), ("c", 8)], SETTLE).await;
    let before = holders(&view);
    // c stops: no keepalive, no release. Its last keepalive was at most one beat ago.
    tasks[2].abort();
    let stopped = tokio::time::Instant::now();
    let (view, _) = rested(&r.r1.url, "cov", &[("a", 12), ("b", 12)], SETTLE).await;
    let took = stopped.elapsed();
    assert!(
        took <= Duration::from_secs(2 + 2),
        "owned again {took:?} after the death (TTL 2 s)"
    );
    assert!(!counts(&view).contains_key("c"), "{view}");
    // Stickiness on a death: exactly what c held moved.
    let moved = moved(&before, &holders(&view));
    assert_eq!(moved.len(), 8, "{moved:?}");
    assert!(moved.values().all(|(from, _)| from == "c"), "{moved:?}");
    // Each grant is an ordinary lease: the holder is the member, on its session.
    for (resource, member) in holders(&view) {
        let (status, holding) =
            send(http().get(format!("{}/v1/leases/{resource}", r.r2.url))).await;
        assert_eq!(status, 200);
        assert_eq!(holding["holder"], member.as_str());
        let session = if member == "a" {
            &a.session
        } else {
            &b.session
        };
        assert_eq!(holding["session"], session.as_str());
    }
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_moves_only_the_newcomers_share_and_a_leave_only_the_leavers() {
    let r = replicas("fleet-sticky", |_| {}).await;
    let resources = names("st", 20);
    make_fleet(&r.r1.url, "st", &resources, json!({"drain_ms": 2000})).await;
    let mut members = Vec::new();
    let mut tasks = Vec::new();
    for (i, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
        let url = if i % 2 == 0 { &r.r1.url } else { &r.r2.url };
        let m = joined(url, "st", name, 30).await;
        tasks.push(m.cooperate(None));
        members.push(m);
    }
    let (view, _) = rested(
        &r.r1.url,
        "st",
        &[("a", 5), ("b", 5), ("c", 5), ("d", 5)],
        SETTLE,
    )
    .await;
    let before = holders(&view);
    let mut tokens = std::collections::BTreeMap::new();
    for resource in &resources {
        tokens.insert(resource.clone(), token_of(&r.r1.url, resource).await);
    }
    // A fifth member: 20 / 5 = 4 move, all to it, nothing else.
    let e = joined(&r.r2.url, "st", "e", 30).await;
    tasks.push(e.cooperate(None));
    let (view, _) = rested(
        &r.r2.url,
        "st",
        &[("a", 4), ("b", 4), ("c", 4), ("d", 4), ("e", 4)],
        SETTLE,
    )
    .await;
    let after = holders(&view);
    let moved_by_join = moved(&before, &after);
    assert_eq!(moved_by_join.len(), 4, "{moved_by_join:?}");
    assert!(moved_by_join.values().all(|(_, to)| to == "e"));
    for resource in moved_by_join.keys() {
        assert!(
            token_of(&r.r1.url, resource).await > tokens[resource],
            "{resource}: a new holder gets a higher token"
        );
    }
    // b leaves (closes its session): exactly its 4 move.
    tasks[1].abort();
    members[1].leave().await;
    let (view, _) = rested(
        &r.r1.url,
        "st",
        &[("a", 5), ("c", 5), ("d", 5), ("e", 5)],
        SETTLE,
    )
    .await;
    let moved_by_leave = moved(&after, &holders(&view));
    assert_eq!(moved_by_leave.len(), 4, "{moved_by_leave:?}");
    assert!(moved_by_leave.values().all(|(from, _)| from == "b"));
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_at_rest_are_within_one_of_the_weights_share() {
    let r = replicas("fleet-balance", |_| {}).await;
    let resources = names("ba", 23);
    make_fleet(&r.r1.url, "ba", &resources, json!({"drain_ms": 2000})).await;
    let mut tasks = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let url = if i % 2 == 0 { &r.r1.url } else { &r.r2.url };
        tasks.push(joined(url, "ba", name, 30).await.cooperate(None));
    }
    // 23 over 3: 8, 8 and 7.
    let view = fairly_rested(&r.r2.url, "ba", &[("a", 1), ("b", 1), ("c", 1)], SETTLE).await;
    let before = holders(&view);
    // d weighs 2: 23 × 2/5 = 9.2, the others 4.6 each; only d gains.
    let d = joined_weighted(&r.r2.url, "ba", "d", 30, 2).await;
    tasks.push(d.cooperate(None));
    let weights = [("a", 1), ("b", 1), ("c", 1), ("d", 2)];
    let view = fairly_rested(&r.r1.url, "ba", &weights, SETTLE).await;
    let moved = moved(&before, &holders(&view));
    assert_eq!(moved.len(), counts(&view)["d"], "{moved:?}");
    assert!(moved.values().all(|(_, to)| to == "d"));
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_member_hands_everything_off_and_an_evicted_one_loses_it_at_once() {
    let r = replicas("fleet-drain", |_| {}).await;
    let resources = names("dr", 12);
    // Hand-offs of a hung member would take a minute: an eviction must not wait for them.
    make_fleet(&r.r1.url, "dr", &resources, json!({"drain_ms": 60_000})).await;
    let a = joined(&r.r1.url, "dr", "a", 30).await;
    let b = joined(&r.r2.url, "dr", "b", 30).await;
    let c = joined(&r.r1.url, "dr", "c", 30).await;
    let tasks = [a.cooperate(None), b.cooperate(None), c.cooperate(None)];
    rested(&r.r1.url, "dr", &[("a", 4), ("b", 4), ("c", 4)], SETTLE).await;
    // a drains itself: it gives up its 4, takes nothing.
    let (status, standing) = a.drain().await;
    assert_eq!(
        (status, standing["state"].as_str()),
        (202, Some("draining")),
        "{standing}"
    );
    let (view, _) = rested(&r.r2.url, "dr", &[("a", 0), ("b", 6), ("c", 6)], SETTLE).await;
    let (_, own) = a.view().await;
    assert_eq!(
        (own["state"].as_str(), own["held"].as_array().map(Vec::len)),
        (Some("draining"), Some(0))
    );
    let b_held: Vec<String> = holders(&view)
        .into_iter()
        .filter(|(_, m)| m == "b")
        .map(|(r, _)| r)
        .collect();
    // b hangs (never releases); an operator evicts it: its grants end at once, not after
    // drain_ms, and c (the one active member) gets everything.
    tasks[1].abort();
    let (status, body) = send(http().delete(format!("{}/v1/fleets/dr/members/b", r.r1.url))).await;
    assert_eq!(status, 204, "{body}");
    for resource in &b_held {
        let (status, holding) =
            send(http().get(format!("{}/v1/leases/{resource}", r.r2.url))).await;
        assert!(
            status == 404 || holding["holder"] != "b",
            "{resource} still b's after the eviction: {holding}"
        );
    }
    let (_, took) = rested(
        &r.r2.url,
        "dr",
        &[("a", 0), ("b", 0), ("c", 12)],
        Duration::from_secs(5),
    )
    .await;
    assert!(took < Duration::from_secs(5));
    let (_, own) = b.view().await;
    assert_eq!(own["state"], "evicted", "{own}");
    // Draining an evicted member leaves it evicted.
    let (status, standing) = b.drain().await;
    assert_eq!((status, standing["state"].as_str()), (202, Some("evicted")));
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_never_releases_is_revoked_at_its_deadline() {
    let (r, logs) = audited_replicas("fleet-deadline").await;
    let resources = names("dl", 10);
    make_fleet(&r.r1.url, "dl", &resources, json!({"drain_ms": 800})).await;
    let a = joined(&r.r1.url, "dl", "a", 30).await;
    rested(&r.r1.url, "dl", &[("a", 10)], SETTLE).await;
    // a never releases; b joins: 5 are listed in a's `releasing` with their deadline, then
    // revoked by the service, then granted to b.
    let mut events = sse::Sse::open(&format!("{}/v1/watch?prefix=dl-", r.r1.url), None).await;
    let b = joined(&r.r2.url, "dl", "b", 30).await;
    let (releasing, _) = lease_proxy_testkit::poll::eventually(
        Duration::from_secs(5),
        "a told to release",
        || async {
            let (_, own) = a.view().await;
            let releasing = own["releasing"].as_array().cloned().unwrap_or_default();
            if releasing.len() == 5 {
                lease_proxy_testkit::poll::Probe::Done(releasing)
            } else {
                lease_proxy_testkit::poll::Probe::Not(own.to_string())
            }
        },
    )
    .await;
    assert!(
        releasing
            .iter()
            .all(|r| r["deadline_ms"].as_u64().unwrap() <= 800),
        "{releasing:?}"
    );
    let (_, took) = rested(
        &r.r2.url,
        "dl",
        &[("a", 5), ("b", 5)],
        Duration::from_secs(4),
    )
    .await;
    assert!(took <= Duration::from_millis(800 + 2_000), "{took:?}");
    let (_, own) = b.view().await;
    assert_eq!(own["held"].as_array().map(Vec::len), Some(5), "{own}");
    // The event stream says what happened: a's grants released (by the service, for it), not
    // expired; then b's acquired.
    let (mut ended, mut acquired) = (Vec::new(), 0);
    while acquired < 5 {
        let message = events.event(Duration::from_secs(5)).await;
        let data = message.data.unwrap();
        match message.event.as_deref() {
            Some("acquired") if data["holder"] == "b" => acquired += 1,
            Some(kind) if data["holder"] == "a" => ended.push(kind.to_owned()),
            _ => {}
        }
    }
    assert_eq!(ended, vec!["released"; 5], "a's ends");
    // The service's own actions are audited and counted, once each across the replicas: a's
    // ten grants and b's five, and the five revocations at the deadline, each of a grant of a.
    let lines = lease_proxy_testkit::poll::eventually(
        Duration::from_secs(5),
        "the fleet's audit lines",
        || async {
            let lines = audit_lines(logs.path());
            let kind = |k: &str| lines.iter().filter(|l| l["event"] == k).count();
            match (kind("fleet-grant"), kind("fleet-revoke")) {
                (15, 5) => lease_proxy_testkit::poll::Probe::Done(lines),
                seen => lease_proxy_testkit::poll::Probe::Not(format!("{seen:?}")),
            }
        },
    )
    .await
    .0;
    let of = |event: &str, member: &str| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l["event"] == event && l["member"] == member && l["fleet"] == "dl")
            .map(|l| str_field(l, "token"))
            .collect()
    };
    let (a_grants, b_grants, a_revoked) = (
        of("fleet-grant", "a"),
        of("fleet-grant", "b"),
        of("fleet-revoke", "a"),
    );
    assert_eq!(
        (a_grants.len(), b_grants.len(), a_revoked.len()),
        (10, 5, 5)
    );
    assert!(
        a_revoked.iter().all(|t| a_grants.contains(t)),
        "revoked {a_revoked:?}, granted {a_grants:?}"
    );
    assert!(lines
        .iter()
        .filter(|l| l["event"] == "fleet-revoke")
        .all(|l| l["outcome"] == "deadline" && l["session"] == a.session.as_str()));
    let mut counted = [0.0; 3];
    for url in [&r.r1.url, &r.r2.url] {
        let text = metrics_text(url).await;
        counted[0] += metric(&text, "lease_proxy_fleet_grants_total", &[]);
        counted[1] += metric(
            &text,
            "lease_proxy_fleet_revocations_total",
            &["reason=\"deadline\""],
        );
        counted[2] += metric(&text, "lease_proxy_fleet_handoffs_total", &[]);
    }
    assert_eq!(
        counted,
        [15.0, 5.0, 5.0],
        "grants, deadline revocations, hand-offs"
    );
    // A member's own release of a fleet grant is labelled a release too (last: the service
    // grants the resource to b again, which the counts above would see).
    let resource = str_field(&own["held"][0], "resource");
    assert_eq!(b.release(&resource).await, 204);
    let kind = loop {
        let message = events.event(Duration::from_secs(5)).await;
        let data = message.data.unwrap();
        let (kind, mine) = (message.event, data["resource"] == resource.as_str());
        if mine && data["holder"] == "b" && kind.as_deref() != Some("acquired") {
            break kind;
        }
    };
    assert_eq!(kind.as_deref(), Some("released"), "b's own release");
}

/// Every line of the audit logs in `dir`.
fn audit_lines(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        lines.extend(text.lines().map(|l| serde_json::from_str(l).unwrap()));
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_rejoins_within_its_ttl_gets_back_what_it_held() {
    let r = replicas("fleet-rejoin", |_| {}).await;
    let resources = names("rj", 12);
    make_fleet(&r.r1.url, "rj", &resources, json!({})).await;
    let a = joined(&r.r1.url, "rj", "a", 30).await;
    let b = joined(&r.r2.url, "rj", "b", 30).await;
    let c = joined(&r.r1.url, "rj", "c", 30).await;
    let mut tasks = vec![a.cooperate(None), b.cooperate(None), c.cooperate(None)];
    let (view, _) = rested(&r.r1.url, "rj", &[("a", 4), ("b", 4), ("c", 4)], SETTLE).await;
    let before = holders(&view);
    let mut events = sse::Sse::open(&format!("{}/v1/watch?prefix=rj-", r.r2.url), None).await;
    // a restarts: the same name, a new session, while the old one lives.
    tasks[0].abort();
    let again = joined(&r.r2.url, "rj", "a", 30).await;
    assert_ne!(again.session, a.session);
    tasks.push(again.cooperate(None));
    let (view, _) = rested(&r.r1.url, "rj", &[("a", 4), ("b", 4), ("c", 4)], SETTLE).await;
    assert_eq!(holders(&view), before, "a got back exactly what it held");
    // The old session is gone; its secret proves nothing any more.
    assert_eq!(a.view().await.0, 403);
    // In between, nobody else was granted a's resources: the only grants are a's own again.
    let mine: Vec<&String> = before
        .iter()
        .filter(|(_, m)| *m == "a")
        .map(|(r, _)| r)
        .collect();
    let mut regranted = std::collections::BTreeSet::new();
    while regranted.len() < mine.len() {
        let message = events.event(Duration::from_secs(5)).await;
        let data = message.data.unwrap();
        if message.event.as_deref() == Some("acquired") {
            assert_eq!(data["holder"], "a", "{data}");
            assert_eq!(data["session"], again.session.as_str(), "{data}");
            regranted.insert(str_field(&data, "resource"));
        }
    }
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_replica_finishes_a_rebalance_when_one_is_killed() {
    let r = replicas("fleet-kill", |_| {}).await;
    let resources = names("kl", 30);
    make_fleet(&r.r2.url, "kl", &resources, json!({"max_moves": 2})).await;
    // The members talk to r2 only; r1 takes the join that starts the rebalance, then dies.
    let a = joined(&r.r2.url, "kl", "a", 30).await;
    let b = joined(&r.r2.url, "kl", "b", 30).await;
    let tasks = [a.cooperate(None), b.cooperate(None)];
    rested(&r.r2.url, "kl", &[("a", 15), ("b", 15)], SETTLE).await;
    let (status, body) = join(&r.r1.url, "kl", "c", 30).await;
    assert_eq!(status, 201, "{body}");
    let c = Member {
        fleet: "kl".into(),
        name: "c".into(),
        session: str_field(&body, "session_id"),
        secret: str_field(&body, "secret"),
        url: r.r2.url.clone(),
    };
    let c_task = c.cooperate(None);
    drop(r.r1);
    rested(&r.r2.url, "kl", &[("a", 10), ("b", 10), ("c", 10)], SETTLE).await;
    c_task.abort();
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_hand_offs_in_flight_than_the_budget() {
    let r = replicas("fleet-budget", |_| {}).await;
    let resources = names("bu", 20);
    make_fleet(
        &r.r1.url,
        "bu",
        &resources,
        json!({"max_moves": 3, "drain_ms": 300}),
    )
    .await;
    // a never releases: each hand-off lasts its whole drain_ms, so the budget shows.
    let a = joined(&r.r1.url, "bu", "a", 30).await;
    rested(&r.r1.url, "bu", &[("a", 20)], SETTLE).await;
    let _b = joined(&r.r2.url, "bu", "b", 30).await;
    let mut most = 0;
    let started = tokio::time::Instant::now();
    loop {
        let (_, view) = fleet_view(&r.r2.url, "bu").await;
        most = most.max(releasing(&view));
        let c = counts(&view);
        if c.get("a") == Some(&10) && c.get("b") == Some(&10) && releasing(&view) == 0 {
            break;
        }
        assert!(started.elapsed() < SETTLE, "no rest: {view}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(most <= 3, "{most} hand-offs in flight at once, budget 3");
    assert_eq!(most, 3, "the budget is used");
    // 10 moves, 3 at a time, each a drain_ms: at least 4 rounds.
    assert!(
        started.elapsed() >= Duration::from_millis(4 * 300),
        "{:?}",
        started.elapsed()
    );
    drop(a);
}

/// The resources a view lists as both held and to release, by member (`view` is a member's
/// own view, or the fleet's).
fn held_and_releasing(view: &serde_json::Value) -> Vec<String> {
    let own = [view.clone()];
    let members = view["members"].as_array().map_or(&own[..], Vec::as_slice);
    let name = |r: &serde_json::Value| r["resource"].as_str().or(r.as_str()).map(str::to_owned);
    let mut both = Vec::new();
    for m in members {
        let held: Vec<String> = m["held"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(name)
            .collect();
        for r in m["releasing"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(name)
        {
            if held.contains(&r) {
                both.push(format!("{} {r}", m["member"]));
            }
        }
    }
    both
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_and_decisions_read_one_state_of_etcd() {
    // A member joins and leaves again and again, through both replicas, while the views are
    // read without a pause. Each reading is one revision of etcd: a view never shows a grant
    // made after the assignment it shows (the resource would be listed as held and as to
    // release, and the member would release what it was just granted), and a decision never
    // takes a new member's grant for an orphan's (and revokes it).
    let (r, logs) = audited_replicas("fleet-onestate").await;
    let resources = names("os", 150);
    // Every hand-off of a join at once: one round, however loaded the machine.
    let spec = json!({"drain_ms": 2_000, "max_moves": 150});
    make_fleet(&r.r1.url, "os", &resources, spec).await;
    // Sessions that outlive the test however slow the machine: none may lapse.
    let a = joined(&r.r1.url, "os", "a", 600).await;
    let b = joined(&r.r2.url, "os", "b", 600).await;
    let mut tasks = vec![a.cooperate(None), b.cooperate(None)];
    rested(&r.r1.url, "os", &[("a", 75), ("b", 75)], 2 * SETTLE).await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watch = |url: String, member: Option<Member>| {
        let (seen, reads) = (seen.clone(), reads.clone());
        tokio::spawn(async move {
            loop {
                let (status, view) = match &member {
                    Some(m) => m.view().await,
                    None => fleet_view(&url, "os").await,
                };
                if status == 200 {
                    reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let both = held_and_releasing(&view);
                    if !both.is_empty() {
                        seen.lock().unwrap().push(format!("{both:?} in {view}"));
                    }
                }
            }
        })
    };
    tasks.push(watch(r.r1.url.clone(), None));
    tasks.push(watch(r.r2.url.clone(), None));
    for round in 0..4 {
        let url = [&r.r1.url, &r.r2.url][round % 2];
        let c = joined(url, "os", "c", 600).await;
        let mut helpers = vec![c.cooperate(None)];
        helpers.extend((0..6).map(|_| watch(String::new(), Some(c.clone()))));
        rested(url, "os", &[("a", 50), ("b", 50), ("c", 50)], 2 * SETTLE).await;
        c.leave().await;
        helpers.iter().for_each(tokio::task::JoinHandle::abort);
        rested(url, "os", &[("a", 75), ("b", 75)], 2 * SETTLE).await;
    }
    for t in tasks {
        t.abort();
    }
    assert!(reads.load(std::sync::atomic::Ordering::Relaxed) > 100);
    let seen = seen.lock().unwrap();
    assert!(
        seen.is_empty(),
        "{} views list a grant as held and to release: {}",
        seen.len(),
        seen[0]
    );
    let orphans: Vec<serde_json::Value> = audit_lines(logs.path())
        .into_iter()
        .filter(|l| l["event"] == "fleet-revoke" && l["outcome"] == "orphan")
        .collect();
    assert!(
        orphans.is_empty(),
        "grants revoked as an orphan's: {orphans:?}"
    );
}
