//! The bounded campaign CI runs, with fixed seeds (printed, and in each report): one 30-second
//! run of the real deployment (two gateways sharing PostgreSQL, every fault class) must show no
//! violation (and at least 400 acknowledged writes, a liveness smoke check on a debug build),
//! and each negative control must be caught, trying its seeds in turn until one run catches it
//! (at most three): no enforcer; marks in memory across gateway restarts; in-flight writes
//! forgotten early; permits ended with the caller; in-flight writes not shared between gateways;
//! no pre-fence; locks taken with etcd's Mutex recipe over gRPC never exchanged for a token (their
//! writes unfenced). Then the gateways paused mid-admission, in their own fault mix: one real
//! run, and its control until caught. Runs are sequential: they share the machine's two cores.
//! The catch rates over many seeds are the published campaign's (`scripts/campaign.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lease_proxy_campaign::cluster::{Control, Faults, Marks};
use lease_proxy_campaign::run::{run_once, Settings};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bounded_campaign_and_negative_controls() {
    let seed = 1;
    let r = run_once(&settings(Control::None, 30, seed)).await.unwrap();
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
    let controls: [(Control, &[u64]); 7] = [
        (Control::NoFencing, &[11, 12, 13]),
        (Control::MemoryMarks, &[21, 22, 23]),
        (Control::ForgetInFlight, &[31, 32, 33]),
        (Control::ReleaseWithCaller, &[41, 42, 43]),
        (Control::LocalGate, &[51, 52, 53]),
        (Control::NoPrefence, &[61, 62, 63]),
        (Control::UnexchangedLocks, &[91, 92, 93]),
    ];
    for (control, seeds) in controls {
        caught(control, seeds, |c, seed| settings(c, 25, seed)).await;
    }
    paused_admissions().await;
}

/// Gateways paused mid-admission, in their own fault mix on gateways whose registrations last
/// 4 s: the real gateways show no violation with pauses that landed; the control (the
/// exchange's clock started at reading the admission) is caught.
async fn paused_admissions() {
    let paused = |control, seed| Settings {
        faults: Faults::PausedAdmissions,
        ..settings(control, 25, seed)
    };
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
    assert!(
        landed >= 2,
        "seed 71: only {landed} pauses landed mid-admission"
    );
    caught(Control::DeadlineFromAdmission, &[81, 82, 83], paused).await;
}
