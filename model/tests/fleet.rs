//! Model 3, fleet hand-off, at the test bounds, with and without the fleet's end; and four
//! broken variants the checker must catch with a readable counterexample (the stale decision's
//! with a third member and change).

use lease_proxy_model::fleet::{describe, Fleet, Mutation};
use lease_proxy_model::{check, Checked};

/// The deepest state at the test bounds, with some room.
const DEPTH: usize = 32;

fn run(model: Fleet, stop_at_failure: bool) -> Checked {
    let label = format!("{:?}", model.mutation);
    let checked = check(model, describe, stop_at_failure);
    println!("fleet {label}: {}", checked.summary());
    checked
}

#[test]
fn fleet_hand_off_is_safe_stable_and_live() {
    let checked = run(Fleet::new(), false);
    if let Some((name, trace)) = checked.violations.first() {
        panic!("{name} violated:\n{trace}");
    }
    assert!(
        checked.unmet.is_empty(),
        "never reached: {:?}",
        checked.unmet
    );
    // Every state lies a few steps per tick and change from the start: one reached only after
    // hundreds of steps is told apart by a counter the protocol does not need (a replica
    // deciding again and again, each time counted, made 778).
    assert!(
        checked.depth <= DEPTH,
        "depth {} past {DEPTH}: a state counts something the protocol does not need",
        checked.depth
    );
}

fn caught(mutation: Mutation, property: &str) {
    let checked = run(
        Fleet {
            mutation: Some(mutation),
            ..Fleet::new()
        },
        true,
    );
    let trace = checked
        .trace(property)
        .unwrap_or_else(|| panic!("not caught; found {:?}", checked.violations));
    println!("{trace}");
}

#[test]
fn grants_that_trust_the_assignment_are_found() {
    caught(
        Mutation::GrantWithoutCreateIfAbsent,
        "never granted while another grant lives",
    );
}

#[test]
fn a_decision_that_is_not_sticky_is_found() {
    caught(
        Mutation::NotSticky,
        "no resource moves twice for one change",
    );
}

/// Found only past the test bounds: a third member and a third change (3.3 s here).
#[test]
fn grants_from_a_stale_decision_are_found() {
    let checked = run(
        Fleet {
            members: 3,
            changes: 3,
            mutation: Some(Mutation::UnguardedGrants),
            ..Fleet::new()
        },
        true,
    );
    let trace = checked
        .trace("no resource moves twice for one change")
        .unwrap_or_else(|| panic!("not caught; found {:?}", checked.violations));
    println!("{trace}");
}

/// With the fleet's end among the steps: nothing is held once it has ended.
#[test]
fn a_fleets_end_releases_every_grant() {
    let checked = run(
        Fleet {
            ends: true,
            ..Fleet::new()
        },
        false,
    );
    if let Some((name, trace)) = checked.violations.first() {
        panic!("{name} violated:\n{trace}");
    }
    assert!(
        checked.unmet.is_empty(),
        "never reached: {:?}",
        checked.unmet
    );
}

/// The end as the server made it until this was found: it released the grants as its snapshot
/// read them, so a replica's grant landing between that read and the delete outlived the fleet.
#[test]
fn an_end_that_releases_what_it_read_is_found() {
    let checked = run(
        Fleet {
            ends: true,
            mutation: Some(Mutation::EndReleasesWhatItRead),
            ..Fleet::new()
        },
        true,
    );
    let trace = checked
        .trace("nothing held once the fleet has ended")
        .unwrap_or_else(|| panic!("not caught; found {:?}", checked.violations));
    println!("{trace}");
}
