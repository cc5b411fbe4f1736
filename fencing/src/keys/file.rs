//! Changing a key file as the rotation in docs/OPERATIONS.md does it, one step at a time:
//! [`add`] a fresh key as a verifying line, [`promote`] it to the signing (first) line, [`remove`]
//! the old one. Each step is a pure function of the file's text, checked by parsing its result,
//! and [`replace`] writes it by rename so that a reader never sees half a file.
//!
//! Why three steps and no one-shot "rotate": the first line signs, so a new key placed first on a
//! proxy before every gateway (and the database, `pg sync-keys`) knows it has its tokens refused
//! (401) and its pre-fences failed. Adding it as a verifying line first, everywhere, is what makes
//! the switch safe; only the operator knows when that has happened.

use std::io::Write;
use std::path::Path;

use super::{KeyId, Keyring};
use crate::Error;

/// `text` with a fresh random key appended as a verifying line (the signing key unchanged), and
/// its id: `kid`, or the first free `kN` after the file's highest.
pub(crate) fn add(text: &str, kid: Option<KeyId>) -> Result<(String, KeyId), Error> {
    let ring = Keyring::parse(text)?;
    let kid = match kid {
        Some(kid) => kid,
        None => next_id(&ring),
    };
    if ring.key_ids().any(|k| *k == kid) {
        return Err(Error::KeyChange(format!("the file already has key {kid}")));
    }
    let mut out = text.to_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&Keyring::key_line(&kid));
    Keyring::parse(&out)?;
    Ok((out, kid))
}

/// `text` with `kid`'s line moved before every other key line: it signs from then on.
pub(crate) fn promote(text: &str, kid: &KeyId) -> Result<String, Error> {
    let lines: Vec<&str> = text.lines().collect();
    let at = key_line(text, kid)?;
    let first = lines
        .iter()
        .position(|line| line_id(line).is_some())
        .unwrap_or(at);
    let mut out: Vec<&str> = Vec::with_capacity(lines.len());
    out.extend_from_slice(&lines[..first]);
    out.push(lines[at]);
    out.extend(
        lines[first..]
            .iter()
            .enumerate()
            .filter(|(i, _)| first + i != at)
            .map(|(_, l)| *l),
    );
    finish(out)
}

/// `text` without `kid`'s line. The signing key is never removed (promote another first).
pub(crate) fn remove(text: &str, kid: &KeyId) -> Result<String, Error> {
    let ring = Keyring::parse(text)?;
    if ring.signing_key_id() == kid {
        return Err(Error::KeyChange(format!(
            "{kid} is the signing key: promote another key first"
        )));
    }
    let at = key_line(text, kid)?;
    finish(
        text.lines()
            .enumerate()
            .filter(|(i, _)| *i != at)
            .map(|(_, l)| l)
            .collect(),
    )
}

/// Replaces the file at `path` with `text` by rename: a temporary file beside it, with the old
/// file's permissions and owner, synced, then renamed over it (and the directory synced).
pub(crate) fn replace(path: &Path, text: &str) -> Result<(), Error> {
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let old = std::fs::metadata(path).map_err(io)?;
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => dir.to_owned(),
        None => std::path::PathBuf::from("."),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        file.set_permissions(old.permissions())?;
        keep_owner(&file, &old)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(&dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(io)
}

/// Gives `file` the owner of `old` (a root operator editing a service's file must not make it
/// root's); an owner that cannot be kept is an error, never a silent change.
#[cfg(unix)]
fn keep_owner(file: &std::fs::File, old: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mine = file.metadata()?;
    if (mine.uid(), mine.gid()) == (old.uid(), old.gid()) {
        return Ok(());
    }
    std::os::unix::fs::fchown(file, Some(old.uid()), Some(old.gid()))
}

#[cfg(not(unix))]
fn keep_owner(_: &std::fs::File, _: &std::fs::Metadata) -> std::io::Result<()> {
    Ok(())
}

/// The index of `kid`'s line in `text`.
fn key_line(text: &str, kid: &KeyId) -> Result<usize, Error> {
    Keyring::parse(text)?;
    text.lines()
        .position(|line| line_id(line) == Some(kid.as_str()))
        .ok_or_else(|| Error::KeyChange(format!("the file has no key {kid}")))
}

/// The key id a line of a key file holds, if it holds a key.
fn line_id(line: &str) -> Option<&str> {
    line.split('#')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .next()
}

/// Lines joined back into a file (each ended by a newline), checked by parsing it.
fn finish(lines: Vec<&str>) -> Result<String, Error> {
    let mut out = String::new();
    for line in lines {
        out.push_str(line);
        out.push('\n');
    }
    Keyring::parse(&out)?;
    Ok(out)
}

/// The first `kN` above every `kN` id of the ring (`k1` when there is none).
fn next_id(ring: &Keyring) -> KeyId {
    let highest = ring
        .key_ids()
        .filter_map(|k| k.as_str().strip_prefix('k')?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    // `k` and at most 20 digits: always a valid id.
    KeyId(format!("k{}", highest.saturating_add(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(text: &str) -> Vec<String> {
        Keyring::parse(text)
            .unwrap()
            .key_ids()
            .map(|k| k.to_string())
            .collect()
    }

    fn kid(s: &str) -> KeyId {
        KeyId::parse(s).unwrap()
    }

    #[test]
    fn a_rotation_adds_promotes_and_removes_one_line_at_a_time() {
        let start = Keyring::generate_file(&kid("k1"));
        let (added, new) = add(&start, None).unwrap();
        assert_eq!(new.as_str(), "k2");
        assert_eq!(
            ids(&added),
            ["k1", "k2"],
            "a verifying line: k1 still signs"
        );
        assert!(
            added.starts_with(&start),
            "the old lines are kept as they were"
        );
        let promoted = promote(&added, &new).unwrap();
        assert_eq!(ids(&promoted), ["k2", "k1"]);
        assert!(promoted.starts_with('#'), "the leading comment stays first");
        let removed = remove(&promoted, &kid("k1")).unwrap();
        assert_eq!(ids(&removed), ["k2"]);
        // The next fresh id follows the highest, whatever the order.
        let (again, k3) = add(&removed, None).unwrap();
        assert_eq!(
            (k3.as_str(), ids(&again)),
            ("k3", vec!["k2".into(), "k3".into()])
        );
        let (named, _) = add(&again, Some(kid("2026-q3"))).unwrap();
        assert_eq!(ids(&named), ["k2", "k3", "2026-q3"]);
    }

    #[test]
    fn changes_that_would_break_the_file_are_refused() {
        let two = add(&Keyring::generate_file(&kid("k1")), None).unwrap().0;
        for err in [
            add(&two, Some(kid("k2"))).unwrap_err(),
            promote(&two, &kid("k9")).unwrap_err(),
            remove(&two, &kid("k1")).unwrap_err(),
            remove(&two, &kid("k9")).unwrap_err(),
            add("k1 short\n", None).unwrap_err(),
            add("# nothing\n", None).unwrap_err(),
        ] {
            assert!(
                matches!(
                    err,
                    Error::KeyChange(_) | Error::KeyLine { .. } | Error::NoKeys
                ),
                "{err}"
            );
        }
        assert!(remove(&two, &kid("k1"))
            .unwrap_err()
            .to_string()
            .contains("promote another key first"));
        // Promoting the signing key changes nothing.
        assert_eq!(promote(&two, &kid("k1")).unwrap(), two);
    }
}
