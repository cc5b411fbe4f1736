//! The README's set-up commands on a machine that lacks things: `scripts/deps.sh` (sourced by
//! `run.sh`, `test.sh` and `bench.sh`) in its dry-run mode, against a simulated bare machine — a
//! `PATH` holding only what the test puts there — and against tools that exist but cannot do
//! their job (a `protoc` without the well-known `.proto` files, a `cc` that cannot build C).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A directory to serve as the whole `PATH`, starting with the few coreutils the script needs
/// to run at all (every Debian machine has them: they are Essential) and a stand-in `cargo`.
fn bare_path() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for tool in ["mktemp", "rm", "id"] {
        let real = which(tool).unwrap_or_else(|| panic!("{tool} not found"));
        symlink(real, dir.path().join(tool)).unwrap();
    }
    script(dir.path(), "cargo", "exit 0");
    dir
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

fn script(dir: &Path, name: &str, body: &str) {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Runs `ensure_deps`, `ensure_postgres` and `ensure_node` in dry-run mode with `path` as the
/// whole `PATH`; returns the packages each would install. (`ensure_node` checks
/// `/usr/bin/node` and `/usr/bin/npm`, the files the tests run, whatever `PATH` says: a bare
/// `PATH` cannot hide them, so only the last test below speaks for it.)
fn dry_run(path: &str) -> Vec<String> {
    let out = Command::new("/bin/bash")
        .arg("-c")
        .arg("source scripts/deps.sh && ensure_deps && ensure_postgres && ensure_node")
        .current_dir(repo())
        .env_clear()
        .env("PATH", path)
        .env("DEPS_DRY_RUN", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "deps.sh failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("would install: "))
        .flat_map(|l| l.split(' ').map(String::from))
        .collect()
}

#[test]
fn a_bare_machine_gets_every_package_the_build_and_tests_use() {
    let bin = bare_path();
    let wanted = dry_run(bin.path().to_str().unwrap());
    for package in [
        "etcd-server",
        "protobuf-compiler",
        "libprotobuf-dev",
        "build-essential",
        "curl",
        "procps",
        "postgresql",
    ] {
        assert!(
            wanted.iter().any(|w| w == package),
            "{package} not requested: {wanted:?}"
        );
    }
}

#[test]
fn tools_that_exist_but_cannot_do_their_job_are_completed() {
    let bin = bare_path();
    // Debian's protobuf-compiler without its recommended libprotobuf-dev: protoc runs, the
    // import of a well-known type fails exactly as etcd-client's build did.
    script(
        bin.path(),
        "protoc",
        "echo 'google/protobuf/descriptor.proto: File not found.' >&2; exit 1",
    );
    // A cc without libc headers.
    script(
        bin.path(),
        "cc",
        "echo 'fatal error: stdio.h: No such file or directory' >&2; exit 1",
    );
    for tool in ["etcd", "curl", "kill"] {
        script(bin.path(), tool, "exit 0");
    }
    let wanted = dry_run(bin.path().to_str().unwrap());
    assert!(
        wanted.iter().any(|w| w == "libprotobuf-dev"),
        "libprotobuf-dev not requested for a protoc without the well-known types: {wanted:?}"
    );
    assert!(
        wanted.iter().any(|w| w == "build-essential"),
        "build-essential not requested for a cc that cannot build C: {wanted:?}"
    );
    for present in ["protobuf-compiler", "etcd-server", "curl", "procps"] {
        assert!(
            !wanted.iter().any(|w| w == present),
            "{present} requested though present: {wanted:?}"
        );
    }
}

/// The suite runs after `scripts/test.sh` installed everything: the checks must agree that
/// nothing is missing (a check that always fails would reinstall on every run and hide nothing).
#[test]
fn this_machine_after_the_test_command_needs_nothing() {
    let path = std::env::var("PATH").unwrap();
    let wanted = dry_run(&path);
    assert!(wanted.is_empty(), "still wanted: {wanted:?}");
}
