//! `fence-gateway keys …`: the key file it makes is private, loads, and is never overwritten;
//! the rotation steps change one line each and keep the file's mode. (That lease-proxy and
//! fence-gateway load and rotate such a file live is `proxy/tests/reload.rs`'s.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use fencing::Keyring;

const BIN: &str = env!("CARGO_BIN_EXE_fence-gateway");

fn keys(args: &[&str], file: &Path) -> Output {
    Command::new(BIN)
        .arg("keys")
        .arg(args[0])
        .arg(file)
        .args(&args[1..])
        .output()
        .unwrap()
}

fn ids(file: &Path) -> Vec<String> {
    Keyring::load(file)
        .unwrap()
        .key_ids()
        .map(|k| k.to_string())
        .collect()
}

fn mode(file: &Path) -> u32 {
    std::fs::metadata(file).unwrap().permissions().mode() & 0o777
}

#[test]
fn generate_makes_a_private_loadable_file_and_never_overwrites_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("etc/fencing.key");
    let out = keys(&["generate"], &file);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(mode(&file), 0o600);
    assert_eq!(ids(&file), ["k1"]);
    let text = std::fs::read_to_string(&file).unwrap();

    // Again, and with another id: refused, the file untouched.
    for args in [&["generate"][..], &["generate", "--kid", "k9"]] {
        let out = keys(args, &file);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("not overwritten"), "{said}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    }
    // An unusable id: nothing written.
    let other = dir.path().join("other.key");
    let out = keys(&["generate", "--kid", "no spaces"], &other);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(!other.exists());
    let out = keys(&["generate", "--kid", "2026-q3"], &other);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(ids(&other), ["2026-q3"]);
}

#[test]
fn a_rotation_is_three_commands_each_keeping_the_file_private() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fencing.key");
    assert!(keys(&["generate"], &file).status.success());
    let out = keys(&["add"], &file);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "k2");
    assert_eq!(ids(&file), ["k1", "k2"], "k1 still signs");
    assert!(keys(&["promote", "k2"], &file).status.success());
    assert_eq!(ids(&file), ["k2", "k1"]);
    // The signing key is never removed; an unknown one is an error; neither changes the file.
    let before = std::fs::read_to_string(&file).unwrap();
    for args in [&["remove", "k2"][..], &["remove", "k7"], &["promote", "k7"]] {
        let out = keys(args, &file);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
    }
    assert!(keys(&["remove", "k1"], &file).status.success());
    assert_eq!(ids(&file), ["k2"]);
    assert_eq!(mode(&file), 0o600);
    // A mode the operator chose is kept too, and no temporary file is left behind.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert!(keys(&["add", "--kid", "next"], &file).status.success());
    assert_eq!(
        (ids(&file), mode(&file)),
        (vec!["k2".into(), "next".into()], 0o640)
    );
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "{names:?}");
    // A file that does not load is not changed.
    std::fs::write(&file, "k1 short\n").unwrap();
    assert_eq!(keys(&["add"], &file).status.code(), Some(64));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "k1 short\n");
}
