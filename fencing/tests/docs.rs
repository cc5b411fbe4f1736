//! docs/CONFIGURATION.md's fence-gateway table lists exactly the flags `fence-gateway --help`
//! defines (lease-proxy's is checked in the proxy's tests, with the other document checks), and
//! every build of fence-gateway — the scripts', the Dockerfile's, the documents', the test
//! harness's — asks for the features the binary requires: fencing's default features are the
//! library alone, and cargo silently skips a binary whose features are missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use lease_proxy_testkit::docs;
use serde_json::Value;

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

/// Every binary target of the workspace: its name, its package and its `required-features`,
/// as cargo reads them.
fn binary_targets() -> Vec<(String, String, BTreeSet<String>)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(docs::repo())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let mut bins = Vec::new();
    for package in metadata["packages"].as_array().expect("packages") {
        for target in package["targets"].as_array().expect("targets") {
            if !target["kind"]
                .as_array()
                .expect("kind")
                .contains(&"bin".into())
            {
                continue;
            }
            let required = target["required-features"]
                .as_array()
                .map(|f| f.iter().map(|f| f.as_str().unwrap().to_owned()).collect())
                .unwrap_or_default();
            bins.push((
                target["name"].as_str().unwrap().to_owned(),
                package["name"].as_str().unwrap().to_owned(),
                required,
            ));
        }
    }
    bins
}

#[test]
fn the_test_harness_builds_each_binary_with_the_features_it_requires() {
    let bins = binary_targets();
    let mut checked = Vec::new();
    for (name, package, required) in &bins {
        let Some((built_from, features)) = lease_proxy_testkit::binary_package(name) else {
            continue;
        };
        let features: BTreeSet<String> = features
            .split(',')
            .filter(|f| !f.is_empty())
            .map(str::to_owned)
            .collect();
        assert_eq!(built_from, package, "{name}'s package");
        assert_eq!(
            &features, required,
            "the features workspace_binary builds {name} with"
        );
        checked.push(name.as_str());
    }
    checked.sort_unstable();
    assert_eq!(
        checked,
        ["fence-gateway", "fence-gateway-control", "lease-proxy"]
    );
}

/// One shell command of a script: `cargo build|run|install … -p fencing …` → the fencing
/// binaries it asks for (`None`: all of them, `--bins` or no target named) and the features it
/// turns on, or nothing when the command builds no fencing binary.
fn fencing_build(command: &str) -> Option<(Option<Vec<String>>, BTreeSet<String>)> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let cargo = words.iter().position(|w| *w == "cargo")?;
    if !["build", "run", "install"].contains(words.get(cargo + 1)?) {
        return None;
    }
    let args = &words[cargo + 2..];
    let value = |flag: &str| -> Vec<&str> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].trim_matches(['"', '\'']))
            .collect()
    };
    if ![value("-p"), value("--package")]
        .concat()
        .contains(&"fencing")
    {
        return None;
    }
    let features: BTreeSet<String> = [value("--features"), value("-F")]
        .concat()
        .iter()
        .flat_map(|f| f.split(','))
        .map(|f| f.strip_prefix("fencing/").unwrap_or(f).to_owned())
        .collect();
    let named: Vec<String> = value("--bin").into_iter().map(str::to_owned).collect();
    if !named.is_empty() {
        return Some((Some(named), features));
    }
    let other_targets = [
        "--lib",
        "--bench",
        "--benches",
        "--test",
        "--tests",
        "--example",
    ];
    if args.iter().any(|a| other_targets.contains(a)) && !args.contains(&"--bins") {
        return None;
    }
    Some((None, features))
}

/// The shell commands of the scripts, the Dockerfile and the documents (their code blocks and
/// code spans): continued lines joined, then split at `&&`, `||`, `;`, `|` and backticks.
fn shell_commands(text: &str) -> Vec<String> {
    text.replace("\\\n", " ")
        .lines()
        .flat_map(|line| line.split(['&', ';', '|', '`']).map(str::to_owned))
        .collect()
}

#[test]
fn every_script_builds_fence_gateway_with_the_features_it_requires() {
    let bins = binary_targets();
    // `None`: not fencing's (a command may build several packages' binaries at once).
    let required = |bin: &str| {
        bins.iter()
            .find(|(name, package, _)| name == bin && package == "fencing")
            .map(|(_, _, features)| features.clone())
    };
    let repo = docs::repo();
    let mut files = vec!["Dockerfile".to_owned(), "README.md".to_owned()];
    for dir in ["scripts", "docs"] {
        for entry in std::fs::read_dir(repo.join(dir)).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".sh") || name.ends_with(".md") {
                files.push(format!("{dir}/{name}"));
            }
        }
    }
    let mut wrong = Vec::new();
    let mut builds = 0;
    for file in &files {
        for command in shell_commands(&docs::read(file)) {
            let Some((named, features)) = fencing_build(&command) else {
                continue;
            };
            builds += 1;
            // A build of "fencing's binaries" that lacks `server` builds none: cargo skips a
            // binary whose features are missing, and refuses one named with `--bin`.
            let named = named.unwrap_or_else(|| vec!["fence-gateway".to_owned()]);
            for bin in named {
                let Some(required) = required(&bin) else {
                    continue;
                };
                if !required.is_subset(&features) {
                    wrong.push(format!("{file}: {} ({bin})", command.trim()));
                }
            }
        }
    }
    // The scripts that start the binaries build them through one function
    // (scripts/deps.sh `ensure_binaries`): seven builds in all today.
    assert!(builds >= 7, "only {builds} builds of fencing found");
    assert!(
        wrong.is_empty(),
        "builds without the features their binary requires:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_build_is_read_with_its_binaries_and_features() {
    let read = |c: &str| fencing_build(c);
    assert_eq!(read("cargo test -p fencing"), None);
    assert_eq!(read("cargo build -p lease-proxy --bins"), None);
    assert_eq!(read("cargo bench -p fencing --bench enforcement"), None);
    assert_eq!(read("cargo build -p fencing --lib"), None);
    let (bins, features) = read("cargo build --locked -q -p fencing --bin fence-gateway").unwrap();
    assert_eq!(bins, Some(vec!["fence-gateway".to_owned()]));
    assert!(features.is_empty());
    let (bins, features) = read(
        "RUN cargo build --release -p lease-proxy -p fencing --features fencing/server --bins",
    )
    .unwrap();
    assert_eq!(bins, None);
    assert_eq!(features, BTreeSet::from(["server".to_owned()]));
    let (bins, features) = read(
        "cargo build -p lease-proxy -p fencing --features fencing/server --bin lease-proxy --bin fence-gateway",
    )
    .unwrap();
    assert_eq!(
        bins,
        Some(vec!["lease-proxy".to_owned(), "fence-gateway".to_owned()])
    );
    assert_eq!(features, BTreeSet::from(["server".to_owned()]));
    let (_, features) = read("cargo build -p fencing -F \"server,negative-controls\"").unwrap();
    assert_eq!(features.len(), 2);
    assert_eq!(
        shell_commands("a \\\n  b && cargo build\nc"),
        ["a    b ", "", " cargo build", "c"]
    );
}
