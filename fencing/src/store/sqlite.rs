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
            ) WITHOUT ROWID;",
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
