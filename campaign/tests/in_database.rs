//! The in-database deployment CI runs: PostgreSQL fenced inside itself — a table
//! protected by fencing's trigger, written by SQL clients in their own transactions, the proxies
//! pre-fencing into the same database — under holder pauses (before a write and with its
//! transaction open), client kills mid-transaction, session kills, PostgreSQL crashes and proxy
//! kills. The real deployment: one 25-second run, no violation, stale writes refused in the
//! database, every fault class met. The control (the table left unprotected) must be caught: its
//! seeds are tried in turn until one run catches it (at most three).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lease_proxy_campaign::cluster::{Control, Faults, Marks};
use lease_proxy_campaign::nemesis::Fault;
use lease_proxy_campaign::run::{run_once, Settings};

fn settings(control: Control, seconds: u64, seed: u64) -> Settings {
    Settings {
        duration: Duration::from_secs(seconds),
        final_phase: Duration::from_secs(6),
        clients: 40,
        resources: 20,
        control,
        seed,
        processing: (Duration::ZERO, Duration::ZERO),
        marks: Marks::InDatabase,
        faults: Faults::All,
        history_file: None,
        fleet: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sql_clients_fenced_in_the_database_and_the_unprotected_control() {
    let r = run_once(&settings(Control::None, 25, 1)).await.unwrap();
    assert!(r.violations.is_empty(), "seed 1: {:?}", r.violations);
    assert!(
        r.writes_acknowledged >= 400,
        "seed 1: {} writes",
        r.writes_acknowledged
    );
    assert!(
        r.stale_rejected_by_enforcer > 0,
        "seed 1: no stale write refused by the database"
    );
    for fault in [
        Fault::ClientPause,
        Fault::ClientPauseInTransaction,
        Fault::PgRestart,
        Fault::PgTerminateSessions,
    ] {
        assert!(
            r.faults.contains_key(&fault),
            "seed 1: no {fault:?}: {:?}",
            r.faults
        );
    }

    for seed in 1..=3 {
        let r = run_once(&settings(Control::TriggerRemoved, 20, seed))
            .await
            .unwrap();
        eprintln!(
            "trigger-removed seed {seed}: {} violations",
            r.violations.len()
        );
        if !r.violations.is_empty() {
            return;
        }
    }
    panic!("the unprotected table was not caught in any of seeds 1-3");
}
