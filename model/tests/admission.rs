//! Model 1, the enforcer's admission, at the test bounds; and the F1 mechanism and two broken
//! decisions, each of which the checker must catch with a readable counterexample.

use lease_proxy_model::admission::{describe, Admission, Enforcer, Mutation};
use lease_proxy_model::{check, Checked};

const ORDER: &str = "storage applies tokens in non-decreasing order";

fn run(model: Admission, stop_at_failure: bool) -> Checked {
    let label = format!("{:?} {:?}", model.enforcer, model.mutation);
    let checked = check(model, describe, stop_at_failure);
    println!("admission {label}: {}", checked.summary());
    checked
}

fn holds(model: Admission) {
    let checked = run(model, false);
    checked.assert_holds();
}

fn caught(model: Admission) -> String {
    let checked = run(model, true);
    let trace = checked.counterexample(ORDER).to_owned();
    println!("{trace}");
    trace
}

#[test]
fn one_gateway_keeps_token_order() {
    holds(Admission::new(Enforcer::Local, 3));
}

#[test]
fn two_gateways_sharing_postgres_keep_token_order() {
    holds(Admission::new(Enforcer::Shared(2), 2));
}

#[test]
fn the_deadline_counted_from_reading_the_admission_is_found() {
    let trace = caught(Admission {
        mutation: Some(Mutation::DeadlineFromAdmission),
        ..Admission::new(Enforcer::Shared(2), 2)
    });
    assert!(trace.contains("STORAGE APPLIES"), "{trace}");
}

#[test]
fn a_drain_that_ignores_the_grace_is_found() {
    caught(Admission {
        mutation: Some(Mutation::DrainIgnoresGrace),
        ..Admission::new(Enforcer::Local, 2)
    });
}

#[test]
fn a_poll_that_ignores_lower_registrations_is_found() {
    caught(Admission {
        mutation: Some(Mutation::PollIgnoresLower),
        ..Admission::new(Enforcer::Shared(2), 2)
    });
}
