//! Imports in `fencing/src` flow one way (house rule 1a): a module may name its own layer and
//! the layers below it, never one above, and no two modules reach each other. The layers,
//! lowest first:
//!
//! | layer | modules | holds |
//! |---|---|---|
//! | leaves | `token`, `domain`, `error` | the token, the resource grammar, and the error types (the stores' and the gates' too) |
//! | keys | `keys` | signing keys, the signed wire form, the keyring in force and its file's rotation |
//! | admission | `admission` | the seam between the layer and a gate: `Permit`, `Outcome`, `Admission` |
//! | decisions | `decide` | the gates' and the layer's decisions as pure functions |
//! | stores | `store` | the high-water-mark stores, and PostgreSQL's shared gate beside its store |
//! | gate | `gate` | the in-process ordering gate over any store |
//! | layer | `layer` | the tower layer |
//! | command line | `command` | the key-file commands of fence-gateway's command line |
//! | package | `indb` | the in-database package: installing it, loading its keys, its `pg` subcommand |
//! | gateway | `gateway` | fence-gateway |
//! | root | `lib`, `main`, `bin` | the crate root and the binaries |
//!
//! What the binaries serve with (serving, TLS, reloading, telemetry, the command line's
//! layering) is the runtime crate's, below all of these (`runtime/tests/layers.rs`).
//!
//! How the sources are read: `lease_proxy_testkit::layers`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use lease_proxy_testkit::layers::{self, Table};

/// The layers, lowest first (see the table above).
const LAYERS: &Table = &[
    ("leaves", &["token", "domain", "error"]),
    ("keys", &["keys"]),
    ("admission", &["admission"]),
    ("decisions", &["decide"]),
    ("stores", &["store"]),
    ("gate", &["gate"]),
    ("layer", &["layer"]),
    ("command line", &["command"]),
    ("package", &["indb"]),
    ("gateway", &["gateway"]),
    ("root", &["lib", "main", "bin"]),
];

#[test]
fn imports_flow_from_the_gateway_down_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let problems = layers::problems(&src, "fencing/src", LAYERS);
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}
