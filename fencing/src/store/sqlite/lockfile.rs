//! The lock file beside a SQLite marks file (`PATH.lock`): held with an exclusive OS lock
//! (`flock`) for the process's life, so a second gateway on the same file cannot start, and
//! holding the store's *record* — the store id and the last generation this store reached — so
//! that a marks file replaced, removed or restored from an older copy is noticed at the next
//! start.
//!
//! The record is one fixed-width line rewritten in place (never by rename, which would leave
//! the lock on a file no longer at the path); it is fsynced at start and written without fsync
//! after each raise, after the raise's own commit, so it never runs ahead of the marks file.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Read as _;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use crate::store::StoreError;

/// Bytes of the record line, padding included: one small write, within one disk sector.
const RECORD_LEN: usize = 160;

/// What a store last wrote to its lock file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    /// The random id of the marks file the record belongs to.
    pub(super) store_id: String,
    /// The marks file's generation when last seen: it rises at every open and every raise.
    pub(super) generation: u64,
    /// The highest era of any mark or floor the store ever held.
    pub(super) max_era: u64,
}

impl Record {
    fn line(&self) -> Vec<u8> {
        let mut line = format!(
            "fence-store v1 id={} generation={} era={} pid={}",
            self.store_id,
            self.generation,
            self.max_era,
            std::process::id()
        )
        .into_bytes();
        line.resize(RECORD_LEN - 1, b' ');
        line.push(b'\n');
        line
    }

    fn parse(text: &str) -> Option<Self> {
        let mut words = text.split_whitespace();
        if (words.next(), words.next()) != (Some("fence-store"), Some("v1")) {
            return None;
        }
        let mut field = |name: &str| {
            words
                .next()
                .and_then(|w| w.strip_prefix(name))
                .and_then(|w| w.strip_prefix('='))
                .map(str::to_owned)
        };
        let store_id = field("id").filter(|id| !id.is_empty())?;
        let generation = field("generation")?.parse().ok()?;
        let max_era = field("era")?.parse().ok()?;
        Some(Self {
            store_id,
            generation,
            max_era,
        })
    }
}

/// The lock file, held exclusively while this value lives.
#[derive(Debug)]
pub(super) struct LockFile {
    file: File,
    path: PathBuf,
    /// Device and inode of the file locked.
    identity: (u64, u64),
    /// Whether this value created the file (so a failed start may remove it again).
    created: bool,
}

/// The lock file's path for marks file `db`.
pub(super) fn path_for(db: &Path) -> PathBuf {
    let mut path = db.as_os_str().to_owned();
    path.push(".lock");
    PathBuf::from(path)
}

/// Device and inode of what `path` names now.
pub(super) fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

impl LockFile {
    /// Creates (if needed) and locks the lock file of marks file `db` (a canonical path: the
    /// lock file is named from it, so every name of the file through symbolic links finds the
    /// same lock), refusing if another process (or another store in this one) holds it.
    pub(super) fn acquire(db: &Path) -> Result<Self, StoreError> {
        // A lock file removed (by a failed start that had created it) between our open and our
        // lock leaves us holding a file no longer at the path: open again.
        for _ in 0..3 {
            if let Some(lock) = Self::try_acquire(db)? {
                return Ok(lock);
            }
        }
        Err(StoreError(format!(
            "{}: the lock file kept changing while being locked",
            path_for(db).display()
        )))
    }

    /// One attempt of [`acquire`](Self::acquire): `None` if the file locked is no longer the
    /// one at the path.
    fn try_acquire(db: &Path) -> Result<Option<Self>, StoreError> {
        let path = path_for(db);
        let at = |e: &dyn std::fmt::Display| StoreError(format!("{}: {e}", path.display()));
        let open = |create_new: bool| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(create_new)
                .open(&path)
        };
        let (file, created) = match open(true) {
            Ok(file) => (file, true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                (open(false).map_err(|e| at(&e))?, false)
            }
            Err(e) => return Err(at(&e)),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|t| {
                        t.split_whitespace()
                            .find_map(|w| w.strip_prefix("pid=").map(str::to_owned))
                    })
                    .map_or_else(String::new, |pid| format!(" (last recorded by pid {pid})"));
                return Err(StoreError(format!(
                    "marks file {} is in use by another process: {} is locked{holder}. One \
                     SQLite store serves one gateway; to run several, share a PostgreSQL store \
                     (--store postgres://…)",
                    db.display(),
                    path.display()
                )));
            }
            Err(TryLockError::Error(e)) => return Err(at(&e)),
        }
        let identity = file
            .metadata()
            .map(|m| (m.dev(), m.ino()))
            .map_err(|e| at(&e))?;
        let lock = Self {
            file,
            path,
            identity,
            created,
        };
        Ok(lock.still_at_its_path().is_ok().then_some(lock))
    }

    /// Gives the lock up after a failed start, removing the lock file if this value created it
    /// and nothing was written to it: a failed start leaves no empty lock file behind.
    pub(super) fn discard(self) {
        let empty = self.file.metadata().is_ok_and(|m| m.len() == 0);
        if self.created && empty && self.still_at_its_path().is_ok() {
            // Removed while still locked: whoever opened it meanwhile finds it gone once it
            // holds the lock (see `acquire`), and opens a new one.
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::debug!(path = %self.path.display(), error = %e, "empty lock file left");
            }
        }
    }

    /// The lock file's path.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The record, `None` if the file is new (empty). A file that holds something else is an
    /// error: it is not ours to overwrite.
    pub(super) fn read(&self) -> Result<Option<Record>, StoreError> {
        let mut text = String::new();
        (&self.file)
            .take(4 * RECORD_LEN as u64)
            .read_to_string(&mut text)
            .map_err(|e| StoreError(format!("{}: {e}", self.path.display())))?;
        if text.trim().is_empty() {
            return Ok(None);
        }
        Record::parse(&text).map(Some).ok_or_else(|| {
            StoreError(format!(
                "{} does not hold a fence-store record; move it away only if no marks file \
                 belongs with it",
                self.path.display()
            ))
        })
    }

    /// Writes `record` in place, fsynced when `durable`.
    pub(super) fn write(&self, record: &Record, durable: bool) -> Result<(), StoreError> {
        let at = |e: std::io::Error| StoreError(format!("{}: {e}", self.path.display()));
        self.file.write_all_at(&record.line(), 0).map_err(at)?;
        if durable {
            self.file.sync_data().map_err(at)?;
        }
        Ok(())
    }

    /// `Err` with the reason if the path no longer names the file locked (removed or replaced):
    /// another process could then lock what is there now.
    pub(super) fn still_at_its_path(&self) -> Result<(), String> {
        match identity(&self.path) {
            Ok(id) if id == self.identity => Ok(()),
            Ok(_) => Err(format!("{} was replaced", self.path.display())),
            Err(e) => Err(format!("{}: {e}", self.path.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_strangers_are_refused() {
        let record = Record {
            store_id: "0123abcd".into(),
            generation: u64::MAX,
            max_era: 7,
        };
        let line = record.line();
        assert_eq!(line.len(), RECORD_LEN);
        assert_eq!(
            Record::parse(std::str::from_utf8(&line).unwrap()),
            Some(record)
        );
        for bad in [
            "",
            "fence-store v2 id=a generation=1 era=0",
            "fence-store v1 id= generation=1 era=0",
            "fence-store v1 id=a generation=x era=0",
            "fence-store v1 id=a era=0 generation=1",
            "hello",
        ] {
            assert_eq!(Record::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("m.db");
        let held = LockFile::acquire(&db).unwrap();
        let err = LockFile::acquire(&db).unwrap_err().to_string();
        assert!(err.contains("in use by another process"), "{err}");
        assert!(held.still_at_its_path().is_ok());
        drop(held);
        let again = LockFile::acquire(&db).unwrap();
        std::fs::remove_file(path_for(&db)).unwrap();
        assert!(again.still_at_its_path().is_err());
    }
}
