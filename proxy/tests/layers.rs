//! Imports in `proxy/src` flow one way (house rule 1a): a module may name its own layer and the
//! layers below it, never one above — and a front never names another front: each is a thin
//! shell over the domain, so one can change (or go) without the others. The layers, lowest
//! first:
//!
//! | layer | modules | holds |
//! |---|---|---|
//! | leaves | `error`, `headers`, `keys`, `metrics`, `audit`, `negative_control` | names and writers every layer shares: the error type, header names, the etcd key layout, the metrics, the audit log, and the campaign's deliberately broken behaviours (compiled only with the `negative-controls` feature) |
//! | calls | `etcd`, `upstream`, `forward`, `prefence` | calls to etcd (bounded calls, batches, keepalive and watch streams), to the upstream (forwarding's client, and the holder's write forwarded with its token) and the pre-fence (at the enforcer, in PostgreSQL) |
//! | domain | `lease`, `fleet`, `etcdapi` | leases, sessions, the event feed and the local view: what a grant is and how it changes; fleets: who should hold what, and the grants that follow; the etcd-compatible core every etcd front calls |
//! | callers | `auth` | who calls: bearer tokens and client certificates to principals, and their permissions |
//! | fronts | `api`, `v3`, `grpc` | the `/v1` HTTP API (its forward route included), etcd's JSON gateway and etcd's gRPC API over the etcd-compatible core |
//! | wiring | `config`, `server`, `lib`, `main`, `bin` | the configuration, and assembling, serving and stopping the parts |
//!
//! `forward` serves no route of its own: it is the call that carries a holder's write to the
//! upstream, which the `/v1` forward route makes — so it sits with the calls, not the fronts.
//! What the fronts share sits below them: the judgement of who calls in `auth`
//! (`auth::Judge`), the core in `etcdapi`; `server` wires each front to them.
//!
//! How the sources are read (and what counts as a loop): `lease_proxy_testkit::layers`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use lease_proxy_testkit::layers::{self, Table};

/// The layers, lowest first (see the table above).
const LAYERS: &Table = &[
    (
        "leaves",
        &[
            "error",
            "headers",
            "keys",
            "metrics",
            "audit",
            "negative_control",
        ],
    ),
    ("calls", &["etcd", "upstream", "forward", "prefence"]),
    ("domain", &["lease", "fleet", "etcdapi"]),
    ("callers", &["auth"]),
    ("fronts", &["api", "v3", "grpc"]),
    ("wiring", &["config", "server", "lib", "main", "bin"]),
];

#[test]
fn imports_flow_from_the_fronts_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let problems = layers::problems_apart(&src, "proxy/src", LAYERS, &["fronts"]);
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}
