//! Model 3, fleet hand-off, at the test bounds, with and without the fleet's end; six broken
//! variants the checker must catch with a readable counterexample (the stale decision's with a
//! third member and change), three of them the fleet's end as the server did it before.

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

/// With the fleet's end among the steps, one `DELETE` whose replica may die half-way: nothing
/// is held once the end is done, and no end is left unfinished.
#[test]
fn a_fleets_end_releases_every_grant() {
    let model = Fleet {
        deletes: 1,
        end_dies: true,
        ..Fleet::new()
    };
    run(model, false).assert_holds();
}

/// Two `DELETE`s racing: whichever answers first, nothing is held by then.
#[test]
fn two_deletes_answer_once_every_grant_is_released() {
    let model = Fleet {
        deletes: 2,
        ..Fleet::new()
    };
    run(model, false).assert_holds();
}

/// The end as the server made it until this was found: it released the grants as its snapshot
/// read them, so a replica's grant landing between that read and the delete outlived the fleet.
#[test]
fn an_end_that_releases_what_it_read_is_found() {
    let model = Fleet {
        deletes: 1,
        ..broken(Mutation::EndReleasesWhatItRead)
    };
    caught(model, "nothing held once the fleet's end is done");
}

/// The server before the fleet kept an index of its grants: a `DELETE` that found no fleet
/// answered at once, while the one that ended it was still releasing.
#[test]
fn a_delete_that_answers_a_fleet_gone_at_once_is_found() {
    let model = Fleet {
        deletes: 2,
        ..broken(Mutation::DeleteAnswersAFleetGone)
    };
    caught(model, "a DELETE answers once nothing is held");
}

/// The server before the fleet kept an index of its grants: when the replica ending a fleet
/// died after its delete, nothing said which grants were the fleet's, and they stayed until
/// their members' sessions ended. (Run to the end: the shortest violation, an end's key left
/// with nothing held, is found before the one that matters.)
#[test]
fn an_end_no_other_replica_finishes_is_found() {
    let model = Fleet {
        deletes: 1,
        end_dies: true,
        ..broken(Mutation::EndLeftToItsReplica)
    };
    let checked = run(model, false);
    println!(
        "{}",
        checked.counterexample("settled: nothing held once the fleet has ended")
    );
}
