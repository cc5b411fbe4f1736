//! Model 3, fleet hand-off, at the test bounds, with and without the fleet's end; four broken
//! variants the checker must catch with a readable counterexample (the stale decision's with a
//! third member and change); and the one known defect of today's server it finds.

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
    checked.assert_holds();
    // Every state lies a few steps per tick and change from the start: one reached only after
    // hundreds of steps is told apart by a counter the protocol does not need (a replica
    // deciding again and again, each time counted, made 778).
    assert!(
        checked.depth <= DEPTH,
        "depth {} past {DEPTH}: a state counts something the protocol does not need",
        checked.depth
    );
}

/// `mutation` at the test bounds.
fn broken(mutation: Mutation) -> Fleet {
    Fleet {
        mutation: Some(mutation),
        ..Fleet::new()
    }
}

fn caught(model: Fleet, property: &str) {
    let checked = run(model, true);
    println!("{}", checked.counterexample(property));
}

#[test]
fn grants_that_trust_the_assignment_are_found() {
    caught(
        broken(Mutation::GrantWithoutCreateIfAbsent),
        "never granted while another grant lives",
    );
}

#[test]
fn a_decision_that_is_not_sticky_is_found() {
    caught(
        broken(Mutation::NotSticky),
        "no resource moves twice for one change",
    );
}

/// Found only past the test bounds: a third member and a third change (3.3 s here).
#[test]
fn grants_from_a_stale_decision_are_found() {
    let model = Fleet {
        members: 3,
        changes: 3,
        ..broken(Mutation::UnguardedGrants)
    };
    caught(model, "no resource moves twice for one change");
}

/// With the fleet's end among the steps: nothing is held once it has ended.
#[test]
fn a_fleets_end_releases_every_grant() {
    let model = Fleet {
        ends: true,
        ..Fleet::new()
    };
    run(model, false).assert_holds();
}

/// The end as the server made it until this was found: it released the grants as its snapshot
/// read them, so a replica's grant landing between that read and the delete outlived the fleet.
#[test]
fn an_end_that_releases_what_it_read_is_found() {
    let model = Fleet {
        ends: true,
        ..broken(Mutation::EndReleasesWhatItRead)
    };
    caught(model, "nothing held once the fleet has ended");
}

/// What today's server does when the replica ending a fleet dies between its delete and its
/// releases: no replica releases them afterwards (a DELETE finds no fleet), so the grants stay
/// until their members' sessions end. Known and not fixed yet; this test flips when the fleet
/// keeps an index of its grants that outlives its keys.
#[test]
fn a_replica_that_dies_ending_a_fleet_leaves_its_grants() {
    let model = Fleet {
        ends: true,
        end_dies: true,
        ..Fleet::new()
    };
    caught(model, "nothing held once the fleet has ended");
}
