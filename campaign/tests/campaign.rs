//! The bounded campaign CI runs, with fixed seeds (printed, and in each report): three 30-second
//! runs of the real deployment (two gateways sharing PostgreSQL, every fault class) must show no
//! violation (and at least 400 acknowledged writes each, a liveness smoke check on a debug
//! build), and each negative control must be caught in at least 2 of 3 runs: no enforcer; marks
//! in memory across gateway restarts; in-flight writes forgotten early; permits ended with the
//! caller; in-flight writes not shared between gateways; no pre-fence; locks taken with etcd's
//! Mutex recipe over gRPC never exchanged for a token (their writes unfenced). Then the gateways paused
//! mid-admission, in their own fault mix: one real run, three of its control. Runs are
//! sequential: they share the machine's two cores.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bounded_campaign_and_negative_controls() {
    for seed in [1, 2, 3] {
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
        // release build on a quiet machine by scripts/campaign-data.sh).
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
    }
    // A control run can miss by chance (a paused holder's resource nobody took over in time).
    // Every control is caught in ≥ 9 of 10 published runs (docs/RELIABILITY.md): here each
    // must be caught in 2 of 3 (a control caught 90 % of the time fails this 2.8 % of the time;
    // one never caught always fails).
    let controls: [(Control, &[u64], usize); 7] = [
        (Control::NoFencing, &[11, 12, 13], 2),
        (Control::MemoryMarks, &[21, 22, 23], 2),
        (Control::ForgetInFlight, &[31, 32, 33], 2),
        (Control::ReleaseWithCaller, &[41, 42, 43], 2),
        (Control::LocalGate, &[51, 52, 53], 2),
        (Control::NoPrefence, &[61, 62, 63], 2),
        (Control::UnexchangedLocks, &[91, 92, 93], 2),
    ];
    for (control, seeds, needed) in controls {
        let mut caught = 0;
        for &seed in seeds {
            let r = run_once(&settings(control, 25, seed)).await.unwrap();
            eprintln!(
                "{control:?} seed {seed}: {} violations, first: {:?}",
                r.violations.len(),
                r.violations.first()
            );
            caught += usize::from(!r.violations.is_empty());
        }
        assert!(
            caught >= needed,
            "{control:?} caught in only {caught} of {} runs",
            seeds.len()
        );
    }
    paused_admissions().await;
}

/// Gateways paused mid-admission (issue 27 F1), in their own fault mix on gateways whose
/// registrations last 4 s: the real gateways show no violation with pauses that landed; the
/// control (the exchange's clock started at reading the admission) is caught in 2 of 3 runs.
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
    let mut caught = 0;
    for seed in [81, 82, 83] {
        let r = run_once(&paused(Control::DeadlineFromAdmission, seed))
            .await
            .unwrap();
        eprintln!(
            "DeadlineFromAdmission seed {seed}: {} violations, first: {:?}",
            r.violations.len(),
            r.violations.first()
        );
        caught += usize::from(!r.violations.is_empty());
    }
    assert!(
        caught >= 2,
        "DeadlineFromAdmission caught in only {caught} of 3 runs"
    );
}
