//! Marks in a SQLite file: the durable default for a single enforcer.
//!
//! One file serves one process: it is held through its lock file (see [`lockfile`], named from
//! the file's real path) for the store's life, and opened only if it is the file this store last
//! used ([`open`]). While running, every read, raise and probe first checks that the path still
//! names the file (and the lock file) opened and that nothing else wrote the file (its mtime and
//! size are what the store's own last commit left), and reads or raises the generation it expects
//! (generation continuity: an older copy written into the file through SQLite shows an older
//! generation). Once a check fails the store refuses everything until restarted, writing nothing
//! more — not even the lock file's record, so the restart is refused too — since its marks are no
//! longer the ones it admitted by.

mod lockfile;
mod open;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use futures::future::BoxFuture;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use super::{decode, encode, HighWaterMarks, StoreError};
use crate::Token;
use lockfile::{LockFile, Record};

/// Marks in a SQLite file: the durable default for a single enforcer.
///
/// WAL journal with `synchronous = FULL`: a raise is fsynced before it returns. Reads never
/// touch the disk once the enforcer has cached a mark; writes happen once per new holder.
///
/// The file is held exclusively (a second store on it, in this process or another, fails to
/// open), checked at open against the record in its lock file `PATH.lock` (a removed, replaced
/// or older file is refused), and checked again on every call (a file removed, replaced or
/// written by something else while running makes every call fail until restart). Marks never
/// read below the store's era floor.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Mutex<Inner>>,
    /// Set once the file is found replaced, removed or written by something else: why every
    /// call now fails.
    failed: Arc<OnceLock<String>>,
}

/// The open store.
struct Inner {
    conn: Connection,
    lock: LockFile,
    /// What the lock file says (kept current after every raise).
    record: Record,
    /// No mark reads below it: the era floor (`--era-floor`).
    floor: Token,
    path: PathBuf,
    /// The marks file as `stat` last saw it after this store's own writes.
    file: FileState,
}

/// What `stat` says of a marks file: which file it is, and — since in WAL mode only this
/// store's own checkpoints (run inside its commits) write it — whether anything else wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileState {
    /// Device and inode.
    identity: (u64, u64),
    /// Modification time (seconds, nanoseconds).
    modified: (i64, i64),
    size: u64,
}

impl FileState {
    /// What `path` names now (a `stat`: no descriptor of the file is opened, so none is closed
    /// under SQLite's POSIX locks).
    fn of(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(path)?;
        Ok(Self {
            identity: (meta.dev(), meta.ino()),
            modified: (meta.mtime(), meta.mtime_nsec()),
            size: meta.size(),
        })
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

/// Raises the store's generation within `tx` from `expected` to the next and returns it, or
/// `None` if the file does not hold generation `expected` of store `store_id`: something other
/// than this store wrote it (a backup restored into it), and nothing may be written.
fn next_generation(
    tx: &Connection,
    expected: u64,
    store_id: &str,
) -> Result<Option<u64>, StoreError> {
    let expected = i64::try_from(expected).map_err(err)?;
    let generation: Option<i64> = tx
        .query_row(
            "UPDATE fence_store SET generation = generation + 1
             WHERE id = 1 AND generation = ?1 AND store_id = ?2 RETURNING generation",
            params![expected, store_id],
            |row| row.get(0),
        )
        .optional()
        .map_err(err)?;
    generation.map(u64::try_from).transpose().map_err(err)
}

/// What the file says of itself: its store id and generation (`None` if it has no such row).
type Stamp = Option<(String, i64)>;

/// The file's [`Stamp`] as `conn` sees it.
fn stamp(conn: &Connection) -> Result<Stamp, StoreError> {
    conn.query_row(
        "SELECT store_id, generation FROM fence_store WHERE id = 1",
        [],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .optional()
    .map_err(err)
}

/// Latches the store failed with `what` (the first reason stays) and returns the failure.
fn latch(failed: &OnceLock<String>, what: String) -> StoreError {
    let why = failed.get_or_init(|| {
        format!(
            "{what} while the gateway ran: its marks are no longer the ones it admitted by, so \
             every write is refused until restarted (and the restart is refused until the \
             operator decides, see --era-floor)"
        )
    });
    tracing::error!(reason = %why, "marks file lost");
    StoreError(why.clone())
}

impl Inner {
    /// `Err` once the marks file or its lock file is no longer at its path, or the marks file
    /// was written by another program since this store's last commit (its modification time
    /// or size changed: a copy put over it); latched in `failed`, so the store refuses
    /// everything from then on.
    fn verify(&self, failed: &OnceLock<String>) -> Result<(), StoreError> {
        if let Some(why) = failed.get() {
            return Err(StoreError(why.clone()));
        }
        let moved = match FileState::of(&self.path) {
            Ok(now) if now.identity != self.file.identity => {
                Err(format!("{} was replaced", self.path.display()))
            }
            Ok(now) if now != self.file => Err(format!(
                "{} was written by another program (its modification time or size changed, and \
                 only this gateway's own commits write it): a copy put over it?",
                self.path.display()
            )),
            Ok(_) => self.lock.still_at_its_path(),
            Err(e) => Err(format!("{}: {e}", self.path.display())),
        };
        moved.map_err(|what| latch(failed, what))
    }

    /// After a commit of this store's own (which may have checkpointed into the marks file):
    /// takes the file's new modification time and size as its own, once it is still the file
    /// opened and the lock file is still at its path.
    fn adopt(&mut self, failed: &OnceLock<String>) -> Result<(), StoreError> {
        let adopted = match FileState::of(&self.path) {
            Ok(now) if now.identity == self.file.identity => {
                self.file = now;
                self.lock.still_at_its_path()
            }
            Ok(_) => Err(format!("{} was replaced", self.path.display())),
            Err(e) => Err(format!("{}: {e}", self.path.display())),
        };
        adopted.map_err(|what| latch(failed, what))
    }
}

/// `Err` (latched) unless `stamp`, read from the file at `path`, is the store id and generation
/// `record` says this store left there: nothing else wrote the file since.
fn continuous(
    record: &Record,
    path: &Path,
    failed: &OnceLock<String>,
    stamp: Stamp,
) -> Result<(), StoreError> {
    let expected = i64::try_from(record.generation).map_err(err)?;
    match stamp {
        Some((id, generation)) if id == record.store_id && generation == expected => Ok(()),
        found => {
            let found = found.map_or_else(
                || "no store id".to_owned(),
                |(id, generation)| format!("store {id} generation {generation}"),
            );
            Err(latch(
                failed,
                format!(
                    "{} holds {found}, not store {} generation {} as this gateway left it: it \
                     was written by something else (an older copy restored into it?)",
                    path.display(),
                    record.store_id,
                    record.generation
                ),
            ))
        }
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`: fails if another store holds it, or if it
    /// is not the file this store last used (see [`SqliteStore::open_with_era_floor`]).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with_era_floor(path, 0)
    }

    /// [`open`](Self::open), and from now on no mark reads below `(era_floor, 0)`: every token of
    /// an older era is refused, on every resource. The floor is kept in the file (it never goes
    /// down). A file that is missing, replaced or older than its lock file records is accepted
    /// only with an `era_floor` above every era the store ever used: the way forward after a
    /// restore, once every lease-proxy's `--era` is at least `era_floor`.
    pub fn open_with_era_floor(path: &Path, era_floor: u64) -> Result<Self, StoreError> {
        Ok(Self {
            inner: Arc::new(Mutex::new(open::open(path, era_floor)?)),
            failed: Arc::default(),
        })
    }

    /// The mark of `resource` in the file at `path`, read without opening the store (no lock
    /// taken, nothing written): for inspecting the marks of a store a gateway is running on.
    pub fn read_mark(path: &Path, resource: &str) -> Result<Option<Token>, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(err)?;
        let floor: Option<Vec<u8>> = conn
            .query_row("SELECT floor FROM fence_store WHERE id = 1", [], |row| {
                row.get(0)
            })
            .optional()
            .map_err(err)?;
        let floor = floor.map(|f| decode(&f)).transpose()?.unwrap_or_default();
        read(&conn, resource, floor)
    }

    async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Inner, &OnceLock<String>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        let failed = self.failed.clone();
        tokio::task::spawn_blocking(move || {
            let mut inner = inner.lock().map_err(|_| StoreError("poisoned".into()))?;
            inner.verify(&failed)?;
            f(&mut inner, &failed)
        })
        .await
        .map_err(err)?
    }
}

/// The mark of `resource` in `conn`, never below `floor` (`None`: no mark and no floor).
fn read(conn: &Connection, resource: &str, floor: Token) -> Result<Option<Token>, StoreError> {
    let mark: Option<Vec<u8>> = conn
        .query_row(
            "SELECT mark FROM fence WHERE resource = ?1",
            params![resource],
            |row| row.get(0),
        )
        .optional()
        .map_err(err)?;
    above_floor(mark, floor)
}

/// A stored mark (encoded) never below `floor` (`None`: no mark and no floor).
fn above_floor(mark: Option<Vec<u8>>, floor: Token) -> Result<Option<Token>, StoreError> {
    let mark = mark.map(|m| decode(&m)).transpose()?;
    Ok(match mark {
        Some(mark) => Some(mark.max(floor)),
        None => Some(floor).filter(|f| *f != Token::default()),
    })
}

impl HighWaterMarks for SqliteStore {
    fn get<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        let resource = resource.to_owned();
        Box::pin(self.with_conn(move |inner, failed| {
            // One statement, so one snapshot: the mark as of the generation read with it.
            let (stamp, mark) = inner
                .conn
                .query_row(
                    "SELECT (SELECT store_id FROM fence_store WHERE id = 1),
                            (SELECT generation FROM fence_store WHERE id = 1),
                            (SELECT mark FROM fence WHERE resource = ?1)",
                    params![resource],
                    |row| {
                        let id: Option<String> = row.get(0)?;
                        let generation: Option<i64> = row.get(1)?;
                        let mark: Option<Vec<u8>> = row.get(2)?;
                        Ok((id.zip(generation), mark))
                    },
                )
                .map_err(err)?;
            continuous(&inner.record, &inner.path, failed, stamp)?;
            above_floor(mark, inner.floor)
        }))
    }

    /// Raises the mark and the store's generation in one transaction, checks that the file
    /// committed to is still the one at the path, then records the generation in the lock file.
    fn raise<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<Token, StoreError>> {
        let resource = resource.to_owned();
        Box::pin(self.with_conn(move |inner, failed| {
            let tx = inner
                .conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(err)?;
            // First, so nothing is written to a file this store did not leave as it is.
            let expected = inner.record.generation;
            let Some(generation) = next_generation(&tx, expected, &inner.record.store_id)? else {
                let stamp = stamp(&tx)?;
                return Err(continuous(&inner.record, &inner.path, failed, stamp)
                    .err()
                    .unwrap_or_else(|| {
                        latch(failed, format!("{} changed", inner.path.display()))
                    }));
            };
            tx.execute(
                "INSERT INTO fence (resource, mark) VALUES (?1, ?2)
                 ON CONFLICT (resource) DO UPDATE SET mark = excluded.mark
                 WHERE excluded.mark > fence.mark",
                params![resource, encode(token).to_vec()],
            )
            .map_err(err)?;
            let mark: Vec<u8> = tx
                .query_row(
                    "SELECT mark FROM fence WHERE resource = ?1",
                    params![resource],
                    |row| row.get(0),
                )
                .map_err(err)?;
            tx.commit().map_err(err)?;
            // Committed to the file at the path, or to one nobody will read again.
            inner.adopt(failed)?;
            inner.record.generation = generation;
            inner.record.max_era = inner.record.max_era.max(token.era);
            inner.lock.write(&inner.record, false)?;
            Ok(decode(&mark)?.max(inner.floor))
        }))
    }

    /// A transaction that allocates [`PROBE_PAGES`] pages (a row that needs them, deleted again
    /// before the commit) and commits, fsynced: it fails when the file may not grow by that much
    /// and its free pages are used up (`SQLITE_FULL`), when the journal cannot grow (a full
    /// disk), or when the write lock is held elsewhere — as a raise would. The pages it frees go
    /// to the file's free list, so probes do not grow the file. It also reads the generation,
    /// so a file written by something else makes the store unready without waiting for a write.
    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.with_conn(|inner, failed| {
            let tx = inner
                .conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(err)?;
            continuous(&inner.record, &inner.path, failed, stamp(&tx)?)?;
            let page_size: i64 = tx
                .query_row("PRAGMA page_size", [], |row| row.get(0))
                .map_err(err)?;
            tx.execute(
                "INSERT OR REPLACE INTO fence_probe (id, pad) VALUES (1, zeroblob(?1))",
                params![PROBE_PAGES * page_size],
            )
            .map_err(err)?;
            tx.execute("DELETE FROM fence_probe", []).map_err(err)?;
            tx.commit().map_err(err)?;
            inner.adopt(failed)
        }))
    }

    fn failed(&self) -> Option<StoreError> {
        self.failed.get().map(|why| StoreError(why.clone()))
    }
}

/// How many pages a readiness probe allocates: more than a raise needs (a new row, at worst a
/// leaf and an interior page split), so a store with room for a probe has room for a raise.
const PROBE_PAGES: i64 = 3;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn marks_only_rise_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.db");
        let store = SqliteStore::open(&path).unwrap();
        crate::store::assert_marks_only_rise(&store).await;
        drop(store);
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.get("r").await.unwrap(), Some(Token::new(1, 0)));
        assert_eq!(store.get("other").await.unwrap(), None);
    }

    /// Polls `gate`'s readiness until it is `want`, for at most `within`.
    async fn readiness_becomes(gate: &crate::Gate<SqliteStore>, want: bool, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while crate::Admission::ready(gate).await != want {
            assert!(
                tokio::time::Instant::now() < deadline,
                "readiness still {} after {within:?}",
                !want
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A full disk, as SQLite sees one (`SQLITE_FULL` once the file may not grow): readiness
    /// follows whether a raise can be made, and comes back when it can again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readiness_follows_whether_a_raise_can_be_made() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("marks.db")).unwrap();
        let gate = crate::Gate::new(store.clone()).with_write_grace(Duration::ZERO);
        readiness_becomes(&gate, true, Duration::from_secs(5)).await;
        let pragma = |sql: &'static str| {
            let inner = store.inner.lock().unwrap();
            let conn = &inner.conn;
            conn.execute_batch(sql).unwrap();
        };
        {
            let inner = store.inner.lock().unwrap();
            let conn = &inner.conn;
            let pages: i64 = conn
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .unwrap();
            conn.execute_batch(&format!("PRAGMA max_page_count = {pages}"))
                .unwrap();
        }
        let mut raised = 0;
        let full = loop {
            assert!(raised < 20_000, "the store never filled up");
            match gate.admit(&format!("r-{raised}"), Token::new(0, 1)).await {
                Ok(permit) => permit.complete(),
                Err(e) => break e,
            }
            raised += 1;
        };
        assert!(full.to_string().contains("full"), "{full}");
        readiness_becomes(&gate, false, Duration::from_secs(5)).await;
        pragma("PRAGMA max_page_count = 1000000");
        readiness_becomes(&gate, true, Duration::from_secs(5)).await;
        gate.admit(&format!("r-{raised}"), Token::new(0, 1))
            .await
            .unwrap()
            .complete();
    }

    #[tokio::test]
    async fn one_store_per_file_and_marks_never_below_the_era_floor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.db");
        let store = SqliteStore::open(&path).unwrap();
        let second = SqliteStore::open(&path).unwrap_err().to_string();
        assert!(second.contains("in use by another process"), "{second}");
        store.raise("r", Token::new(0, 9)).await.unwrap();
        // Readable beside the store that holds it.
        assert_eq!(
            SqliteStore::read_mark(&path, "r").unwrap(),
            Some(Token::new(0, 9))
        );
        drop(store);
        let store = SqliteStore::open_with_era_floor(&path, 2).unwrap();
        assert_eq!(store.get("r").await.unwrap(), Some(Token::new(2, 0)));
        assert_eq!(store.get("never").await.unwrap(), Some(Token::new(2, 0)));
        assert_eq!(
            store.raise("r", Token::new(1, 50)).await.unwrap(),
            Token::new(2, 0)
        );
        assert_eq!(
            store.raise("r", Token::new(2, 3)).await.unwrap(),
            Token::new(2, 3)
        );
        drop(store);
        // Kept in the file; a lower floor later changes nothing.
        let store = SqliteStore::open_with_era_floor(&path, 1).unwrap();
        assert_eq!(store.get("never").await.unwrap(), Some(Token::new(2, 0)));
        assert_eq!(
            SqliteStore::read_mark(&path, "never").unwrap(),
            Some(Token::new(2, 0))
        );
    }

    #[tokio::test]
    async fn a_file_replaced_while_open_fails_every_call_until_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.db");
        let store = SqliteStore::open(&path).unwrap();
        let gate = crate::Gate::new(store.clone()).with_write_grace(Duration::ZERO);
        gate.admit("r", Token::new(0, 5)).await.unwrap().complete();
        assert!(store.failed().is_none());
        let copy = dir.path().join("copy.db");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::rename(&copy, &path).unwrap();
        let raised = store.raise("r", Token::new(0, 6)).await.unwrap_err();
        assert!(raised.to_string().contains("was replaced"), "{raised}");
        assert!(store.get("r").await.is_err());
        assert!(store.probe().await.is_err());
        assert!(store.failed().is_some());
        // At the mark too: the gate asks the store first.
        assert!(matches!(
            gate.admit("r", Token::new(0, 5)).await,
            Err(crate::GateError::Store(_))
        ));
    }

    /// Copies the database at `from` into the one at `to` with SQLite's online backup API:
    /// page by page, into the same file (its device and inode do not change).
    fn online_backup(from: &Path, to: &Path) {
        let src = Connection::open(from).unwrap();
        let mut dst = Connection::open(to).unwrap();
        rusqlite::backup::Backup::new(&src, &mut dst)
            .unwrap()
            .run_to_completion(100, Duration::ZERO, None)
            .unwrap();
    }

    /// An older copy written into the open file: the next read of a mark finds a generation
    /// other than the one the store left there, and every call fails from then on; the lock
    /// file keeps the generation reached, so reopening is refused as an older copy.
    #[tokio::test]
    async fn an_older_copy_restored_into_the_open_file_fails_reads_and_raises() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.db");
        let backup = dir.path().join("backup.db");
        let store = SqliteStore::open(&path).unwrap();
        store.raise("r", Token::new(0, 10)).await.unwrap();
        online_backup(&path, &backup);
        store.raise("r", Token::new(0, 20)).await.unwrap();
        online_backup(&backup, &path);
        let read = store.get("r").await;
        assert!(read.is_err(), "read {read:?} from a restored older copy");
        let read = read.unwrap_err().to_string();
        assert!(read.contains("generation"), "{read}");
        assert!(store.raise("r", Token::new(0, 21)).await.is_err());
        assert!(store.probe().await.is_err());
        assert!(store.failed().is_some());
        drop(store);
        let reopened = SqliteStore::open(&path).unwrap_err().to_string();
        assert!(reopened.contains("older copy"), "{reopened}");
    }

    /// The same restore, then a raise before any read: its transaction does not find the
    /// generation it expects, so it changes nothing and the restored file is not adopted.
    #[tokio::test]
    async fn a_raise_into_a_restored_older_copy_is_refused_and_not_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.db");
        let backup = dir.path().join("backup.db");
        let store = SqliteStore::open(&path).unwrap();
        store.raise("r", Token::new(0, 10)).await.unwrap();
        online_backup(&path, &backup);
        store.raise("r", Token::new(0, 20)).await.unwrap();
        online_backup(&backup, &path);
        let raised = store.raise("other", Token::new(0, 1)).await;
        assert!(
            raised.is_err(),
            "raised {raised:?} in a restored older copy"
        );
        assert!(store.get("r").await.is_err());
        assert_eq!(
            SqliteStore::read_mark(&path, "other").unwrap(),
            None,
            "the refused raise was committed"
        );
        drop(store);
        let reopened = SqliteStore::open(&path).unwrap_err().to_string();
        assert!(reopened.contains("older copy"), "{reopened}");
    }

    /// An older copy put over the open file by a plain `cp` (same inode): the generation the
    /// store reads may come from its WAL, newer than the copy, while a mark's page comes from
    /// the copy. The file's modification time and size, which only the store's own commits
    /// change, give it away: every call fails from the next one on.
    #[tokio::test]
    async fn an_older_copy_copied_over_the_open_file_fails_every_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.db");
        let backup = dir.path().join("backup.db");
        let store = SqliteStore::open(&path).unwrap();
        let pragma = |sql: &str| {
            let inner = store.inner.lock().unwrap();
            inner.conn.execute_batch(sql).unwrap();
        };
        // Every commit checkpoints, so the file itself holds every mark.
        pragma("PRAGMA wal_autocheckpoint = 1");
        store.raise("a-first", Token::new(0, 10)).await.unwrap();
        for n in 0..300 {
            let filler = format!("m-{n:0>120}");
            store.raise(&filler, Token::new(0, 1)).await.unwrap();
        }
        std::fs::copy(&path, &backup).unwrap();
        store.raise("a-first", Token::new(0, 20)).await.unwrap();
        // From now on the WAL keeps what is written: the generation's page, not a-first's.
        pragma("PRAGMA wal_autocheckpoint = 0");
        store.raise("z-last", Token::new(0, 1)).await.unwrap();
        std::fs::copy(&backup, &path).unwrap();
        // Nothing cached: a-first's page is read from the file.
        pragma("PRAGMA shrink_memory");
        let read = store.get("a-first").await;
        assert!(
            read.is_err(),
            "read {read:?} from an older copy put over the file"
        );
        assert!(store.raise("a-first", Token::new(0, 21)).await.is_err());
        assert!(store.probe().await.is_err());
    }

    /// A store reached through a symbolic link is the store of the file it names: one lock
    /// file, so the second open is refused as in use, before anything else is said.
    #[tokio::test]
    async fn a_symlink_names_the_same_store_and_a_hard_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let store = SqliteStore::open(&path).unwrap();
        store.raise("r", Token::new(0, 3)).await.unwrap();
        let symlink = dir.path().join("b.db");
        std::os::unix::fs::symlink(&path, &symlink).unwrap();
        for floor in [0, 1] {
            let second = SqliteStore::open_with_era_floor(&symlink, floor)
                .unwrap_err()
                .to_string();
            assert!(second.contains("in use by another process"), "{second}");
        }
        assert!(!dir.path().join("b.db.lock").exists());
        let hard_link = dir.path().join("c.db");
        std::fs::hard_link(&path, &hard_link).unwrap();
        for floor in [0, 1] {
            let second = SqliteStore::open_with_era_floor(&hard_link, floor)
                .unwrap_err()
                .to_string();
            assert!(second.contains("hard link"), "{second}");
        }
        assert!(!dir.path().join("c.db.lock").exists());
        drop(store);
        // Through the symbolic link alone, the same store, its marks and its lock file.
        let store = SqliteStore::open(&symlink);
        assert!(store.is_err(), "a file with two names opened");
        std::fs::remove_file(&hard_link).unwrap();
        let store = SqliteStore::open(&symlink).unwrap();
        assert_eq!(store.get("r").await.unwrap(), Some(Token::new(0, 3)));
        assert!(!dir.path().join("b.db.lock").exists());
    }

    /// After a lost file at the highest era there is no era to suggest; failed opens leave no
    /// lock file they created behind, and none is made for what is not a regular file.
    #[tokio::test]
    async fn failed_opens_leave_no_lock_file_and_suggest_no_era_past_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.db");
        drop(SqliteStore::open_with_era_floor(&path, u64::MAX).unwrap());
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        let lost = SqliteStore::open_with_era_floor(&path, u64::MAX)
            .unwrap_err()
            .to_string();
        assert!(lost.contains("no higher era"), "{lost}");
        assert!(
            !lost.contains(&format!("--era-floor {}", u64::MAX)),
            "{lost}"
        );

        // A copy without its lock file: refused, and the new lock file is not left behind.
        let store = SqliteStore::open(&dir.path().join("a.db")).unwrap();
        drop(store);
        std::fs::copy(dir.path().join("a.db"), dir.path().join("b.db")).unwrap();
        let copied = SqliteStore::open(&dir.path().join("b.db"))
            .unwrap_err()
            .to_string();
        assert!(copied.contains("lock file is new"), "{copied}");
        assert!(!dir.path().join("b.db.lock").exists());

        // Not a regular file: no lock file at all.
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let not_a_file = SqliteStore::open(&sub).unwrap_err().to_string();
        assert!(not_a_file.contains("not a regular file"), "{not_a_file}");
        assert!(!dir.path().join("sub.lock").exists());
        let memory = SqliteStore::open(Path::new(":memory:"));
        let left = Path::new(":memory:.lock").exists();
        let _ = std::fs::remove_file(":memory:.lock");
        assert!(memory.is_err(), "an in-memory marks store opened");
        assert!(!left, ":memory:.lock left behind");
    }

    #[tokio::test]
    async fn opens_in_a_directory_not_yet_created() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("a/b/marks.db")).unwrap();
        assert_eq!(
            store.raise("r", Token::new(0, 1)).await.unwrap(),
            Token::new(0, 1)
        );
        assert_eq!(format!("{store:?}"), "SqliteStore { .. }");
    }
}
