//! docs/CONFIGURATION.md's fence-gateway table lists exactly the flags `fence-gateway --help`
//! defines (lease-proxy's is checked in the proxy's tests, with the other document checks).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use lease_proxy_testkit::docs;

#[test]
fn the_configuration_table_lists_exactly_the_flags_of_fence_gateway() {
    let doc = docs::read("docs/CONFIGURATION.md");
    let table = docs::table_flags(&docs::section(&doc, "## fence-gateway"));
    let shared = docs::flags_in(&docs::section(&doc, "## Both binaries"));
    let help = docs::help_flags(Path::new(env!("CARGO_BIN_EXE_fence-gateway")));
    assert!(help.contains("--write-grace"), "{help:?}");
    let undocumented: Vec<_> = help
        .iter()
        .filter(|f| !table.contains(*f) && !shared.contains(*f))
        .filter(|f| !["--help", "--version"].contains(&f.as_str()))
        .collect();
    let unknown: Vec<_> = table.difference(&help).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/CONFIGURATION.md's fence-gateway table is out of date.\n\
         In --help, not in the table: {undocumented:?}\nIn the table, not in --help: {unknown:?}"
    );
}
