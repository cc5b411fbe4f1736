//! Opening a SQLite marks file: the exclusive lock, the schema, and the check that the file is
//! the one this store last used — not removed, replaced, or put back from an older copy.
//!
//! The file holds a random store id and a generation that rises at every open and every raise
//! (in the raise's own transaction, so it costs no extra fsync); the lock file records the last
//! (store id, generation) reached and the highest era used. At start a missing file, another
//! store's file, a file without an id, or a lower generation than recorded is refused: its marks
//! may be below marks already admitted. The way forward is an era floor above every era the
//! store used (`--era-floor`), kept in the file: every token of an older era is refused, and
//! tokens of the proxies' bumped era outrank everything the lost marks held.
//!
//! The path is made real first, so every symbolic link to the file finds the same lock file; a
//! file with hard links (a name whose lock file would be another) is refused.
//!
//! Undetectable: the lock file restored together with its marks file (or deleted together with
//! it), and a restore (while stopped) of a backup taken after the last raise the lock file
//! recorded — after a power loss (not a process crash) the record may lag the last few raises,
//! since it is fsynced only at start. Restores into the running file: see the checks in
//! [`super`].

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use super::lockfile::{LockFile, Record};
use super::{err, next_generation, FileState, Inner};
use crate::store::{decode, encode, StoreError};
use crate::Token;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fence (
    resource TEXT PRIMARY KEY NOT NULL,
    mark BLOB NOT NULL CHECK (length(mark) = 16)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fence_probe (id INTEGER PRIMARY KEY, pad BLOB);
CREATE TABLE IF NOT EXISTS fence_store (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    store_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    floor BLOB NOT NULL CHECK (length(floor) = 16)
);
";

/// What the marks file says of itself.
struct Held {
    store_id: String,
    generation: u64,
    floor: Token,
}

/// Opens the store at `path` (see the module docs), raising its era floor to `era_floor`.
///
/// The path is made canonical first (symbolic links resolved), so the lock file is the same
/// whatever name the file is reached by, and the "in use" refusal comes before any other. A
/// path that is not a regular file gets no lock file, and a lock file this call created is
/// removed again if the open fails.
pub(super) fn open(path: &Path, era_floor: u64) -> Result<Inner, StoreError> {
    let path = canonical(path)?;
    let lock = LockFile::acquire(&path)?;
    match open_locked(&path, &lock, era_floor) {
        Ok((conn, record, floor, file)) => Ok(Inner {
            conn,
            lock,
            record,
            floor,
            path,
            file,
        }),
        Err(e) => {
            lock.discard();
            Err(e)
        }
    }
}

/// The real path of marks file `path`: symbolic links resolved, the file itself if it exists
/// (it must be a regular file), else its directory's real path and its name. Only `stat`s the
/// file, never opens it: closing any descriptor of a SQLite file would drop the POSIX locks
/// SQLite holds on it in this process.
fn canonical(path: &Path) -> Result<PathBuf, StoreError> {
    let name = path.file_name().filter(|_| path != Path::new(":memory:"));
    let Some(name) = name else {
        return Err(StoreError(format!(
            "marks file `{}` is not a file path (an in-memory store forgets its marks: \
             --store memory is for tests)",
            path.display()
        )));
    };
    let at = |e: &dyn std::fmt::Display| StoreError(format!("marks file {}: {e}", path.display()));
    let real = match std::fs::canonicalize(path) {
        Ok(real) => real,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                return Err(at(
                    &"a symbolic link to a missing file: give the file's own path",
                ));
            }
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            let dir = dir.unwrap_or_else(|| Path::new("."));
            std::fs::create_dir_all(dir).map_err(|e| at(&e))?;
            std::fs::canonicalize(dir).map_err(|e| at(&e))?.join(name)
        }
        Err(e) => return Err(at(&e)),
    };
    match std::fs::metadata(&real) {
        Ok(meta) if !meta.is_file() => Err(StoreError(format!(
            "marks file {} is not a regular file",
            real.display()
        ))),
        Ok(_) => Ok(real),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(real),
        Err(e) => Err(at(&e)),
    }
}

/// [`open`] once the lock is held: the connection, the record written, the floor and the
/// marks file's state.
fn open_locked(
    path: &Path,
    lock: &LockFile,
    era_floor: u64,
) -> Result<(Connection, Record, Token, FileState), StoreError> {
    let record = lock.read()?;
    let exists = exists_alone(path)?;
    if let (Some(record), false) = (&record, exists) {
        if era_floor <= record.max_era {
            return Err(refusal(path, lock, "is missing", record.max_era));
        }
    }
    let mut conn = connect(path, exists)?;
    let held = held(&conn)?;
    let known_era = file_era(&conn, held.as_ref())?.max(record.as_ref().map_or(0, |r| r.max_era));
    if let Some(what) = mismatch(record.as_ref(), held.as_ref(), exists) {
        if era_floor <= known_era {
            return Err(refusal(path, lock, &what, known_era));
        }
        tracing::warn!(
            path = %path.display(),
            era_floor,
            "the marks file {what}: accepted with --era-floor, every token of an older era is refused"
        );
    }
    let store_id = held
        .as_ref()
        .map_or_else(new_store_id, |h| h.store_id.clone());
    let floor = held
        .as_ref()
        .map_or_else(Token::default, |h| h.floor)
        .max(Token::new(era_floor, 0));
    let tx = conn.transaction().map_err(err)?;
    tx.execute(
        "INSERT INTO fence_store (id, store_id, generation, floor) VALUES (1, ?1, 0, ?2)
         ON CONFLICT (id) DO UPDATE SET floor = excluded.floor",
        params![store_id, encode(floor).to_vec()],
    )
    .map_err(err)?;
    let expected = held.as_ref().map_or(0, |h| h.generation);
    let generation = next_generation(&tx, expected, &store_id)?.ok_or_else(|| {
        StoreError(format!(
            "marks file {} changed while being opened",
            path.display()
        ))
    })?;
    tx.commit().map_err(err)?;
    let record = Record {
        store_id,
        generation,
        max_era: known_era.max(era_floor),
    };
    lock.write(&record, true)?;
    let file = FileState::of(path).map_err(err)?;
    Ok((conn, record, floor, file))
}

/// Whether the marks file at `path` exists; an error if it has other names (hard links).
fn exists_alone(path: &Path) -> Result<bool, StoreError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(StoreError(format!("{}: {e}", path.display()))),
    };
    let links = meta.nlink();
    if links > 1 {
        return Err(StoreError(format!(
            "marks file {} has {links} hard links (other names for the same file; see `find / \
             -samefile {}`): a gateway started on another name would not see this one's lock \
             file, and two gateways on one file can admit a stale write. Remove the other names \
             (keep backups as copies, not links)",
            path.display(),
            path.display()
        )));
    }
    Ok(true)
}

/// The marks file opened (created if it does not `exist`), in WAL mode with full syncs, its
/// schema in place.
fn connect(path: &Path, exists: bool) -> Result<Connection, StoreError> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if !exists {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(path, flags).map_err(err)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(err)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(err)?;
    conn.execute_batch(SCHEMA).map_err(err)?;
    Ok(conn)
}

/// The highest era the marks file knows of: its highest mark's, or its floor's.
fn file_era(conn: &Connection, held: Option<&Held>) -> Result<u64, StoreError> {
    let highest: Option<Vec<u8>> = conn
        .query_row("SELECT max(mark) FROM fence", [], |row| row.get(0))
        .map_err(err)?;
    Ok(highest
        .map(|m| decode(&m))
        .transpose()?
        .into_iter()
        .chain(held.map(|h| h.floor))
        .map(|t| t.era)
        .max()
        .unwrap_or(0))
}

/// The marks file's own id, generation and floor, if it has them.
fn held(conn: &Connection) -> Result<Option<Held>, StoreError> {
    conn.query_row(
        "SELECT store_id, generation, floor FROM fence_store WHERE id = 1",
        [],
        |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, Vec<u8>>(2)?,
            ))
        },
    )
    .optional()
    .map_err(err)?
    .map(|(store_id, generation, floor)| {
        Ok(Held {
            store_id,
            generation: u64::try_from(generation).map_err(err)?,
            floor: decode(&floor)?,
        })
    })
    .transpose()
}

/// Why the marks file is not the one the lock file records, if it is not.
fn mismatch(record: Option<&Record>, held: Option<&Held>, exists: bool) -> Option<String> {
    match (record, held) {
        (None, None) => None,
        (None, Some(_)) => Some(
            "has a store id but its lock file is new: the marks file was copied or restored \
             without its lock file, or the lock file was removed"
                .into(),
        ),
        (Some(_), None) if !exists => Some("is missing".into()),
        (Some(r), None) => Some(format!(
            "is not the store its lock file records (store {}): it has no store id",
            r.store_id
        )),
        (Some(r), Some(h)) if h.store_id != r.store_id => Some(format!(
            "is another store's file (store {}, not {})",
            h.store_id, r.store_id
        )),
        (Some(r), Some(h)) if h.generation < r.generation => Some(format!(
            "is an older copy of store {} (generation {}; the store had reached {})",
            r.store_id, h.generation, r.generation
        )),
        (Some(_), Some(_)) => None,
    }
}

/// The refusal to start on a marks file that may have lost marks, saying what to do.
fn refusal(path: &Path, lock: &LockFile, what: &str, known_era: u64) -> StoreError {
    let way_forward = match known_era.checked_add(1) {
        Some(era) => format!(
            "If this is the file to run on (a backup restored on purpose, a lost file): bump \
             every lease-proxy's --era to {era} or above, then start fence-gateway with \
             --era-floor {era} (every token of an older era is then refused). Otherwise put \
             back"
        ),
        None => format!(
            "The store has used era {known_era}, and there is no higher era: no era floor can \
             refuse every token it admitted, so this file cannot be run on safely. Put back"
        ),
    };
    StoreError(format!(
        "marks file {} {what}. Its marks may be below marks already admitted, so a stale write \
         could get through: refusing to start. {way_forward} the marks file that belongs with \
         {}.",
        path.display(),
        lock.path().display()
    ))
}

/// A fresh random store id (128 bits, hex).
fn new_store_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}
