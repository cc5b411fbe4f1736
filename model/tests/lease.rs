//! Model 2, the lease lifecycle, at the test bounds; and two broken variants the checker must
//! catch with a readable counterexample.

use lease_proxy_model::lease::{describe, Kind, Lifecycle, Mutation};
use lease_proxy_model::{check, Checked};

fn run(model: Lifecycle, stop_at_failure: bool) -> Checked {
    let label = format!("{:?}", model.mutation);
    let checked = check(model, describe, stop_at_failure);
    println!("lease {label}: {}", checked.summary());
    checked
}

#[test]
fn the_lease_lifecycle_keeps_its_invariants() {
    let checked = run(Lifecycle::new(), false);
    checked.assert_holds();
}

fn caught(mutation: Mutation, client: Kind, property: &str) {
    let checked = run(
        Lifecycle {
            mutation: Some(mutation),
            clients: vec![client],
            ops: 3,
            ..Lifecycle::new()
        },
        true,
    );
    let trace = checked.counterexample(property);
    println!("{trace}");
}

#[test]
fn a_view_trusted_to_renew_a_session_grant_is_found() {
    let session = Kind {
        session: true,
        keyed: false,
    };
    caught(
        Mutation::ViewRenewsSessionGrants,
        session,
        "nothing renews after a release",
    );
}

#[test]
fn released_leases_pooled_as_spares_are_found() {
    let own_lease = Kind {
        session: false,
        keyed: false,
    };
    caught(
        Mutation::PoolReleasedLeases,
        own_lease,
        "nothing renews after a release",
    );
}
