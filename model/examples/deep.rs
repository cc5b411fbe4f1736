//! The models at deeper bounds than the test command's (not in CI): `cargo run -p
//! lease-proxy-model --example deep -- [admission|lease|fleet|all|fleet-wider|drift-margin]`. Prints each model's state
//! count, depth and time, and any counterexample; exits 1 if a property fails.

use lease_proxy_model::admission::{self, Admission, Enforcer};
use lease_proxy_model::fleet::{self, Fleet};
use lease_proxy_model::lease::{self, Kind, Lifecycle};
use lease_proxy_model::{check, Checked};

fn report(name: &str, checked: &Checked) -> bool {
    println!("{name}: {}", checked.summary());
    for (property, trace) in &checked.violations {
        println!("  VIOLATED {property}:\n{trace}");
    }
    if !checked.unmet.is_empty() {
        println!("  never reached: {:?}", checked.unmet);
    }
    checked.violations.is_empty() && checked.unmet.is_empty()
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    let mut ok = true;
    if which == "admission" || which == "all" {
        let local = Admission {
            crashes: 2,
            horizon: 10,
            ..Admission::new(Enforcer::Local, 3)
        };
        ok &= report(
            "admission, one gateway, 3 writers, 2 crashes",
            &check(local, admission::describe, false),
        );
        let shared = Admission {
            crashes: 2,
            horizon: 10,
            ..Admission::new(Enforcer::Shared(2), 2)
        };
        ok &= report(
            "admission, 2 gateways on PostgreSQL, 2 writers, 2 crashes, 10 ticks",
            &check(shared, admission::describe, false),
        );
        let drift = Admission {
            drift: 1,
            ..Admission::new(Enforcer::Shared(2), 2)
        };
        ok &= report(
            "admission, 2 gateways, clocks lagging up to 1 tick",
            &check(drift, admission::describe, false),
        );
    }
    if which == "lease" || which == "all" {
        let three = Lifecycle {
            clients: vec![
                Kind {
                    session: true,
                    keyed: false,
                },
                Kind {
                    session: false,
                    keyed: true,
                },
                Kind {
                    session: false,
                    keyed: false,
                },
            ],
            ops: 1,
            horizon: 5,
            ..Lifecycle::new()
        };
        ok &= report(
            "lease, 3 clients (session, keyed, plain), 1 request each, 5 s",
            &check(three, lease::describe, false),
        );
        let longer = Lifecycle {
            ops: 3,
            horizon: 4,
            ..Lifecycle::new()
        };
        ok &= report(
            "lease, 2 clients, 3 requests each, 4 s",
            &check(longer, lease::describe, false),
        );
    }
    if which == "fleet" || which == "all" {
        let model = Fleet {
            resources: 3,
            members: 3,
            ..Fleet::new()
        };
        ok &= report(
            "fleet, 3 resources, 3 members, 2 replicas, 2 changes",
            &check(model.clone(), fleet::describe, false),
        );
        let ending = Fleet {
            deletes: 2,
            end_dies: true,
            ..model
        };
        ok &= report(
            "fleet, 3 resources, 3 members, 2 replicas, 2 changes, then 2 DELETEs, one may die",
            &check(ending, fleet::describe, false),
        );
    }
    if which == "fleet-wider" {
        // Beyond the table's deeper row: from the test bounds a third replica deciding, a
        // longer drain, a third change among three members; then the deeper row with a third
        // change.
        let wider = [
            (
                "fleet, 2 resources, 2 members, 3 replicas, 2 changes",
                Fleet {
                    replicas: 3,
                    ..Fleet::new()
                },
            ),
            (
                "fleet, 2 resources, 2 members, 2 replicas, 2 changes, drain 2",
                Fleet {
                    drain: 2,
                    ..Fleet::new()
                },
            ),
            (
                "fleet, 2 resources, 3 members, 2 replicas, 3 changes",
                Fleet {
                    members: 3,
                    changes: 3,
                    ..Fleet::new()
                },
            ),
            (
                "fleet, 3 resources, 3 members, 2 replicas, 3 changes",
                Fleet {
                    resources: 3,
                    members: 3,
                    changes: 3,
                    ..Fleet::new()
                },
            ),
        ];
        for (name, model) in wider {
            ok &= report(name, &check(model, fleet::describe, false));
        }
    }
    if which == "drift-margin" {
        // Expected to fail: a gateway clock lagging two ticks, the storage taking one — more
        // lag than the grace leaves beyond the storage's processing.
        let drift = Admission {
            drift: 2,
            ..Admission::new(Enforcer::Shared(2), 2)
        };
        ok &= report(
            "admission, 2 gateways, clocks lagging up to 2 ticks, storage within 1",
            &check(drift, admission::describe, true),
        );
    }
    std::process::exit(if ok { 0 } else { 1 });
}
