use std::path::Path;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use rusqlite::{params, Connection, OptionalExtension};

use super::{decode, encode, HighWaterMarks, StoreError};
use crate::Token;

/// Marks in a SQLite file: the durable default for a single enforcer.
///
/// WAL journal with `synchronous = FULL`: a raise is fsynced before it returns. Reads never
/// touch the disk once the enforcer has cached a mark; writes happen once per new holder.
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let conn = Connection::open(path).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS fence (
                resource TEXT PRIMARY KEY NOT NULL,
                mark BLOB NOT NULL CHECK (length(mark) = 16)
            ) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS fence_probe (id INTEGER PRIMARY KEY, pad BLOB);",
        )
        .map_err(err)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().map_err(|_| StoreError("poisoned".into()))?;
            f(&mut conn)
        })
        .await
        .map_err(err)?
    }
}

impl HighWaterMarks for SqliteStore {
    fn get<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        let resource = resource.to_owned();
        Box::pin(self.with_conn(move |conn| {
            let mark: Option<Vec<u8>> = conn
                .query_row(
                    "SELECT mark FROM fence WHERE resource = ?1",
                    params![resource],
                    |row| row.get(0),
                )
                .optional()
                .map_err(err)?;
            mark.map(|m| decode(&m)).transpose()
        }))
    }

    fn raise<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<Token, StoreError>> {
        let resource = resource.to_owned();
        Box::pin(self.with_conn(move |conn| {
            let tx = conn.transaction().map_err(err)?;
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
            decode(&mark)
        }))
    }

    /// A transaction that allocates [`PROBE_PAGES`] pages (a row that needs them, deleted again
    /// before the commit) and commits, fsynced: it fails when the file may not grow by that much
    /// and its free pages are used up (`SQLITE_FULL`), when the journal cannot grow (a full
    /// disk), or when the write lock is held elsewhere — as a raise would. The pages it frees go
    /// to the file's free list, so probes do not grow the file.
    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.with_conn(|conn| {
            let tx = conn
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
            let conn = store.conn.lock().unwrap();
            conn.execute_batch(sql).unwrap();
        };
        {
            let conn = store.conn.lock().unwrap();
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
