//! The bounded campaign CI runs, with fixed seeds (printed, and in each report): one 30-second
//! run of the real deployment (two gateways sharing PostgreSQL, every fault class, and a fleet's
//! members beside the clients: joins, leaves, deaths, pauses, drains, evictions) must show no
//! violation (and at least 400 acknowledged writes, a liveness smoke check on a debug build),
//! and each negative control must be caught, trying its seeds in turn until one run catches it
//! (at most three): no enforcer; marks in memory across gateway restarts; in-flight writes
//! forgotten early; permits ended with the caller; in-flight writes not shared between gateways;
//! no pre-fence; locks taken with etcd's Mutex recipe over gRPC never exchanged for a token (their
//! writes unfenced); a fleet granting what another member still holds (no revoke before grant,
//! the proxy built with its `negative-controls` feature). Then the gateways paused
//! mid-admission, in their own fault mix: one real run, and its control until caught. Each is a
//! test of its own, so the test runner runs them beside the rest of the suite (two at a time at
//! most: they share the one PostgreSQL, `.config/nextest.toml`). The catch rates over many seeds
//! are the published campaign's (`scripts/campaign.sh`), run on a quiet machine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use lease_proxy_campaign::cluster::{Control, Faults, Marks};
use lease_proxy_campaign::fleet::Shape;
use lease_proxy_campaign::plan::FLEET as FLEET_EVENTS;
use lease_proxy_campaign::run::{run_once, Report, Settings};
use lease_proxy_testkit::{feature_binary, workspace_binary};

fn settings(control: Control, seconds: u64, seed: u64) -> Settings {
    Settings {
        duration: Duration::from_secs(seconds),
        final_phase: Duration::from_secs(6),
        clients: 40,
        resources: 20,
        control,
        seed,
        processing: (Duration::from_millis(10), Duration::from_millis(60)),
        marks: Marks::Postgres,
        faults: Faults::All,
        history_file: None,
        fleet: None,
    }
}

/// Runs `control` with each of `seeds` in turn until a run reports a violation; panics if none
/// does. A control's catch rate is the published campaign's business: here it must be caught
/// at all (one caught 90 % of the time misses three runs in a row 0.1 % of the time; one never
/// caught always fails).
async fn caught(control: Control, seeds: &[u64], settings: impl Fn(Control, u64) -> Settings) {
    for &seed in seeds {
        let r = run_once(&settings(control, seed)).await.unwrap();
        eprintln!(
            "{control:?} seed {seed}: {} violations, first: {:?}",
            r.violations.len(),
            r.violations.first()
        );
        if !r.violations.is_empty() {
            return;
        }
    }
    panic!("{control:?} was not caught in any of seeds {seeds:?}");
}

/// The fleet beside the clients: six members at the start on twelve resources of their own.
const FLEET: Shape = Shape {
    members: 6,
    resources: 12,
};

/// `settings` with the fleet.
fn with_fleet(control: Control, seconds: u64, seed: u64) -> Settings {
    Settings {
        fleet: Some(FLEET),
        ..settings(control, seconds, seed)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_deployment_shows_no_violation_under_every_fault() {
    let seed = 1;
    let r = run_once(&with_fleet(Control::None, 30, seed))
        .await
        .unwrap();
    eprintln!(
        "seed {seed}: {} acknowledged, {} applied ({} unanswered), {} stale refused, faults {:?}, takeover p50 {:.0} ms",
        r.writes_acknowledged,
        r.writes_applied,
        r.applied_unanswered,
        r.stale_rejected_by_enforcer + r.stale_rejected_by_proxy,
        r.faults,
        r.takeover.p50_ms
    );
    assert!(r.violations.is_empty(), "seed {seed}: {:#?}", r.violations);
    // A liveness smoke check, not the published figure (≥ 1,000 per run, measured with a
    // release build on a quiet machine by scripts/campaign.sh).
    assert!(
        r.writes_acknowledged >= 400,
        "seed {seed}: only {} writes acknowledged",
        r.writes_acknowledged
    );
    assert!(
        r.idle
            .as_ref()
            .is_some_and(|i| i.first_acquire_ms.is_some()),
        "seed {seed}: the idle replica was not used: {:?}",
        r.idle
    );
    assert!(
        r.fault_log.len() >= 10,
        "seed {seed}: {} faults",
        r.fault_log.len()
    );
    assert!(r.write_success_after_heal > 0.5, "seed {seed}: {r:?}");
    // The clients locking with etcd's Mutex recipe over gRPC took locks and wrote.
    assert!(
        r.locks_exchanged > 0 && r.lock_writes_acknowledged > 0,
        "seed {seed}: {} locks exchanged, {} lock writes acknowledged",
        r.locks_exchanged,
        r.lock_writes_acknowledged
    );
    fleet_ran(&r);
    belief_measured(&r);
}

/// The belief verdict is there, with its controls (a deadline past the lease's end, none)
/// judged on the same holds. Measured, not bounded: no figure is asserted. (Not even that a
/// control overlaps at least as much: a belief the stop-by deadline ends can be stretched by a
/// write decided before it and answered after a loss the controls end at.)
fn belief_measured(r: &Report) {
    let b = r.belief.as_ref().expect("the run has a belief verdict");
    let s = &b.stop_by;
    eprintln!(
        "seed {}: belief: {} intervals, {} overlaps, sum {:.0} ms, max {:.0} ms, p99 {:.0} ms, \
         acted until refused {:?}, older writes {:?}, ended {:?}, longest {:?}; \
         controls: late deadline {} overlaps {:.0} ms, none {} overlaps {:.0} ms",
        r.seed,
        s.intervals,
        s.overlaps,
        s.sum_ms,
        s.overlap_ms.max_ms,
        s.overlap_ms.p99_ms,
        s.acted_until_refused_ms,
        s.older_writes,
        s.ended,
        s.longest,
        b.late_deadline.overlaps,
        b.late_deadline.sum_ms,
        b.no_deadline.overlaps,
        b.no_deadline.sum_ms,
    );
    assert!(s.intervals > 0, "no belief interval: {b:?}");
    assert!(
        b.late_deadline.intervals == s.intervals && b.no_deadline.intervals == s.intervals,
        "the controls judged other holds: {b:?}"
    );
}

/// A negative control's test: its 25 s runs, seeds tried in turn until one catches it.
async fn control(control: Control, seeds: &[u64]) {
    caught(control, seeds, |c, seed| settings(c, 25, seed)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_no_fencing_is_caught() {
    control(Control::NoFencing, &[11, 12, 13]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_memory_marks_is_caught() {
    control(Control::MemoryMarks, &[21, 22, 23]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_forget_in_flight_is_caught() {
    control(Control::ForgetInFlight, &[31, 32, 33]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_release_with_caller_is_caught() {
    control(Control::ReleaseWithCaller, &[41, 42, 43]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_local_gate_is_caught() {
    control(Control::LocalGate, &[51, 52, 53]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_no_prefence_is_caught() {
    control(Control::NoPrefence, &[61, 62, 63]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_unexchanged_locks_is_caught() {
    control(Control::UnexchangedLocks, &[91, 92, 93]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_no_revoke_before_grant_is_caught() {
    caught(Control::NoRevokeBeforeGrant, &[101, 102, 103], |c, seed| {
        with_fleet(c, 15, seed)
    })
    .await;
    // The check below sees the controls where they are.
    assert!(carries_controls(&feature_binary(
        "lease-proxy",
        "lease-proxy-controls",
        "negative-controls"
    )));
}

/// The fleet's members were given resources, wrote them, met every kind of member event, and
/// kept most of the resource-seconds owned.
fn fleet_ran(r: &Report) {
    let fleet = r.fleet.as_ref().expect("the run had a fleet");
    eprintln!(
        "seed {}: fleet {} grants, {} writes acknowledged, late writes {:?}, coverage {:?}",
        r.seed, fleet.grants, fleet.writes_acknowledged, fleet.late_writes, fleet.coverage
    );
    assert!(
        fleet.grants >= FLEET.resources && fleet.writes_acknowledged > 0,
        "{fleet:?}"
    );
    for (kind, _) in FLEET_EVENTS {
        assert!(
            r.faults.contains_key(&kind),
            "{kind:?} never met: {:?}",
            r.faults
        );
    }
    // A liveness smoke check: every pause, death and drain leaves resources unowned for a
    // while (a member's TTL, a hand-off), the rest of the time they are owned.
    assert!(
        fleet.coverage.settled_s.is_some() && fleet.coverage.owned > 0.5,
        "{:?}",
        fleet.coverage
    );
}

/// Gateways paused mid-admission, in their own fault mix on gateways whose registrations last
/// 4 s.
fn paused(control: Control, seed: u64) -> Settings {
    Settings {
        faults: Faults::PausedAdmissions,
        ..settings(control, 25, seed)
    }
}

/// The real gateways show no violation with pauses that landed mid-admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateways_paused_mid_admission_show_no_violation() {
    let r = run_once(&paused(Control::None, 71)).await.unwrap();
    let landed = r
        .fault_log
        .iter()
        .filter(|f| f.target.ends_with("mid-admission"))
        .count();
    eprintln!(
        "paused admissions seed 71: {landed} pauses landed, {:?}",
        r.fault_log
    );
    assert!(r.violations.is_empty(), "seed 71: {:#?}", r.violations);
    // A pause lands only if the holder's write reaches the held mark row within 700 ms; on a
    // loaded machine some miss (1 of 3 landed once), so one is what is asked: the fault ran.
    assert!(landed >= 1, "seed 71: no pause landed mid-admission");
}

/// The control (the exchange's clock started at reading the admission) is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_deadline_from_admission_is_caught() {
    caught(Control::DeadlineFromAdmission, &[81, 82, 83], paused).await;
}

/// What only a proxy built with its negative controls carries: the warning it logs when one
/// is switched on.
const CONTROL_MARK: &[u8] = b"NEGATIVE CONTROL ON";

fn carries_controls(binary: &Path) -> bool {
    let bytes = std::fs::read(binary).unwrap();
    let first = CONTROL_MARK[0];
    bytes
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == first)
        .any(|(i, _)| bytes[i..].starts_with(CONTROL_MARK))
}

/// The proxy everyone runs is built without the `negative-controls` feature: none of the
/// campaign's broken behaviours is in it, switched off or not.
#[test]
fn the_ordinary_proxy_carries_no_negative_control() {
    assert!(!carries_controls(&workspace_binary("lease-proxy")));
}
