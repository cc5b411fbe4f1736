//! The bounded campaign CI runs: two 30-second runs of the real deployment must show at least
//! 1,000 acknowledged writes each and no violation, and each negative control (no enforcer;
//! marks in memory across gateway restarts) must be caught in at least 2 of 3 runs. Runs are
//! sequential: they share the machine's two cores.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lease_proxy_campaign::cluster::Control;
use lease_proxy_campaign::run::{run_once, Settings};

fn settings(control: Control, seconds: u64) -> Settings {
    Settings {
        duration: Duration::from_secs(seconds),
        final_phase: Duration::from_secs(6),
        clients: 16,
        resources: 8,
        control,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bounded_campaign_and_negative_controls() {
    for run in 0..2 {
        let r = run_once(&settings(Control::None, 30)).await.unwrap();
        eprintln!(
            "run {run}: {} acknowledged, {} applied, {} stale refused, faults {:?}, takeover p50 {:.0} ms",
            r.writes_acknowledged,
            r.writes_applied,
            r.stale_rejected_by_enforcer + r.stale_rejected_by_proxy,
            r.faults,
            r.takeover.p50_ms
        );
        assert!(r.violations.is_empty(), "run {run}: {:#?}", r.violations);
        assert!(
            r.writes_acknowledged >= 1000,
            "run {run}: only {} writes acknowledged",
            r.writes_acknowledged
        );
        assert!(
            r.fault_log.len() >= 10,
            "run {run}: {} faults",
            r.fault_log.len()
        );
        assert!(r.write_success_after_heal > 0.5, "run {run}: {r:?}");
    }
    // A control run can miss by chance (a paused holder's resource nobody took over in time);
    // the acceptance is "caught in at least 90 % of runs", so CI wants 2 of 3 (a control caught
    // 90 % of the time fails this 2.8 % of the time; one that is never caught always fails).
    for control in [Control::NoFencing, Control::MemoryMarks] {
        let mut caught = 0;
        for run in 0..3 {
            let r = run_once(&settings(control, 20)).await.unwrap();
            eprintln!(
                "{control:?} run {run}: {} violations, first: {:?}",
                r.violations.len(),
                r.violations.first()
            );
            caught += usize::from(!r.violations.is_empty());
        }
        assert!(caught >= 2, "{control:?} caught in only {caught} of 3 runs");
    }
}
