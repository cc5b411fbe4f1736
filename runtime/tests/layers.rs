//! Imports in `runtime/src` flow one way (house rule 1a), as in the crates built on it. The
//! layers, lowest first:
//!
//! | layer | modules | holds |
//! |---|---|---|
//! | leaves | `error`, `backoff`, `files`, `problem` | the crate's error, and what the fencing library uses too: the backoff, bounded file reads, problem+json |
//! | reload | `reload` | reloading files on SIGHUP or a settled change |
//! | telemetry | `telemetry` | logs, traces and metrics |
//! | tls | `tls` | server and client TLS, the server's certificate reloaded |
//! | serving | `serve`, `openapi`, `cli` | serving and draining, the OpenAPI document, layered command lines |
//! | root | `lib` | the crate root |
//!
//! How the sources are read: `lease_proxy_testkit::layers`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use lease_proxy_testkit::layers::{self, Table};

/// The layers, lowest first (see the table above).
const LAYERS: &Table = &[
    ("leaves", &["error", "backoff", "files", "problem"]),
    ("reload", &["reload"]),
    ("telemetry", &["telemetry"]),
    ("tls", &["tls"]),
    ("serving", &["serve", "openapi", "cli"]),
    ("root", &["lib"]),
];

#[test]
fn imports_flow_from_serving_down_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let problems = layers::problems(&src, "runtime/src", LAYERS);
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}
