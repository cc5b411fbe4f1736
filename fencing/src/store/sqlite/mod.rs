//! Marks in a SQLite file: the durable default for a single enforcer.
//!
//! One file serves one process: it is held through its lock file (see [`lockfile`]) for the
//! store's life, and opened only if it is the file this store last used ([`open`]). While
//! running, every read, raise and probe first checks that the path still names the file (and the
//! lock file) opened; once it does not — removed, or replaced — the store refuses everything
//! until restarted, since its raises would land in a file nobody will open again.

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
/// or older file is refused), and checked again on every call (a file removed or replaced while
/// running makes every call fail until restart). Marks never read below the store's era floor.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Mutex<Inner>>,
    /// Set once the file is found replaced or removed: why every call now fails.
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
    /// Device and inode of the marks file opened.
    identity: (u64, u64),
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

/// Raises the store's generation within `tx` and returns it.
fn generation(tx: &Connection) -> Result<u64, StoreError> {
    let generation: i64 = tx
        .query_row(
            "UPDATE fence_store SET generation = generation + 1 WHERE id = 1 RETURNING generation",
            [],
            |row| row.get(0),
        )
        .map_err(err)?;
    u64::try_from(generation).map_err(err)
}

impl Inner {
    /// `Err` once the marks file or its lock file is no longer at its path; latched in
    /// `failed`, so the store refuses everything from then on.
    fn verify(&self, failed: &OnceLock<String>) -> Result<(), StoreError> {
        if let Some(why) = failed.get() {
            return Err(StoreError(why.clone()));
        }
        let moved = match lockfile::identity(&self.path) {
            Ok(id) if id == self.identity => self.lock.still_at_its_path(),
            Ok(_) => Err(format!("{} was replaced", self.path.display())),
            Err(e) => Err(format!("{}: {e}", self.path.display())),
        };
        match moved {
            Ok(()) => Ok(()),
            Err(what) => {
                let why = failed.get_or_init(|| {
                    format!(
                        "{what} while the gateway ran: its marks are no longer where a restart \
                         reads them, so every write is refused until restarted (and the restart \
                         is refused until the operator decides, see --era-floor)"
                    )
                });
                tracing::error!(reason = %why, "marks file lost");
                Err(StoreError(why.clone()))
            }
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
    let mark = mark.map(|m| decode(&m)).transpose()?;
    Ok(match mark {
        Some(mark) => Some(mark.max(floor)),
        None => Some(floor).filter(|f| *f != Token::default()),
    })
}

impl HighWaterMarks for SqliteStore {
    fn get<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        let resource = resource.to_owned();
        Box::pin(self.with_conn(move |inner, _| read(&inner.conn, &resource, inner.floor)))
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
            let tx = inner.conn.transaction().map_err(err)?;
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
            let generation = generation(&tx)?;
            tx.commit().map_err(err)?;
            // Committed to the file at the path, or to one nobody will read again.
            inner.verify(failed)?;
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
    /// to the file's free list, so probes do not grow the file.
    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.with_conn(|inner, _| {
            let tx = inner
                .conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(err)?;
            let page_size: i64 = tx
                .query_row("PRAGMA page_size", [], |row| row.get(0))
                .map_err(err)?;
            tx.execute(
                "INSERT OR REPLACE INTO fence_probe (id, pad) VALUES (1, zeroblob(?1))",
                params![PROBE_PAGES * page_size],
            )
            .map_err(err)?;
            tx.execute("DELETE FROM fence_probe", []).map_err(err)?;
            tx.commit().map_err(err)
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
