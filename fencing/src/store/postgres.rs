//! PostgreSQL: marks shared by several enforcers, a database-wide ordering gate, and the
//! transactional mode where the fence check and the caller's own statements commit together.
//!
//! Table `fence_marks(resource text primary key, mark bytea)`; marks are 16-byte big-endian
//! `era ‖ revision`, so `bytea` comparison is token order.

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use tokio_postgres::{NoTls, Transaction};

use super::{decode, encode, HighWaterMarks, StoreError, StoreLatency};
use crate::admission::{Admission, Permit};
use crate::gate::GateError;
use crate::Token;

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS fence_marks (
    resource text PRIMARY KEY,
    mark bytea NOT NULL CHECK (length(mark) = 16)
)";

fn err(e: impl std::fmt::Debug) -> StoreError {
    // tokio-postgres's Display says only "db error"; the Debug form carries the server's message.
    StoreError(format!("{e:?}"))
}

/// Marks in PostgreSQL, shared by every enforcer (and every transactional writer) pointed at
/// the same database. A raise is committed (and so durable) before it returns.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user:password@host:port/db`) with a pool of up to
    /// `max_connections`, and creates the table if needed.
    pub async fn connect(url: &str, max_connections: usize) -> Result<Self, StoreError> {
        let config: tokio_postgres::Config = url.parse().map_err(err)?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(max_connections.max(2))
            .build()
            .map_err(err)?;
        let store = Self { pool };
        // Concurrent `CREATE TABLE IF NOT EXISTS` can collide in PostgreSQL's catalog; a
        // transaction-scoped advisory lock makes enforcers starting together take turns.
        let mut client = store.client().await?;
        let tx = client.transaction().await.map_err(err)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key("schema")])
            .await
            .map_err(err)?;
        tx.batch_execute(SCHEMA).await.map_err(err)?;
        tx.commit().await.map_err(err)?;
        drop(client);
        // Open the whole pool now: a database that cannot take that many connections should fail
        // the start, not the first burst of writes (a PostgreSQL connection is a process fork).
        let opened = futures::future::join_all((0..max_connections).map(|_| store.client())).await;
        opened.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(store)
    }

    async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(err)
    }

    /// The transactional mode: in one transaction, lock the resource's mark, refuse `token` if
    /// it is below it, raise it, and run `statements`; everything commits together or not at
    /// all. Writers of one resource are serialised by the row lock, so their effects commit in
    /// non-decreasing token order; a stale writer changes nothing.
    pub async fn fenced<T, E, F>(
        &self,
        resource: &str,
        token: Token,
        statements: F,
    ) -> Result<T, FencedError<E>>
    where
        F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
    {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(err)?;
        let mark = check_and_raise(&tx, resource, token).await?;
        if token < mark {
            tx.rollback().await.map_err(err)?;
            return Err(FencedError::Stale { token, mark });
        }
        let value = statements(&tx).await.map_err(FencedError::Statements)?;
        tx.commit().await.map_err(err)?;
        Ok(value)
    }
}

/// Locks the mark row of `resource` (creating it at `token` if absent), raises it to `token` if
/// below, and returns the mark as it was before (≤ the row's value now).
async fn check_and_raise(
    tx: &Transaction<'_>,
    resource: &str,
    token: Token,
) -> Result<Token, StoreError> {
    let wanted = encode(token).to_vec();
    tx.execute(
        "INSERT INTO fence_marks (resource, mark) VALUES ($1, $2) ON CONFLICT (resource) DO NOTHING",
        &[&resource, &wanted],
    )
    .await
    .map_err(err)?;
    let row = tx
        .query_one(
            "SELECT mark FROM fence_marks WHERE resource = $1 FOR UPDATE",
            &[&resource],
        )
        .await
        .map_err(err)?;
    let mark = decode(row.get::<_, &[u8]>(0))?;
    if token > mark {
        tx.execute(
            "UPDATE fence_marks SET mark = $2 WHERE resource = $1",
            &[&resource, &wanted],
        )
        .await
        .map_err(err)?;
    }
    Ok(mark)
}

/// Why a fenced transaction did not commit.
#[derive(Debug, thiserror::Error)]
pub enum FencedError<E> {
    /// The token is below the mark: nothing was written.
    #[error("fencing token {token} is below the high-water mark {mark}")]
    Stale {
        /// The refused token.
        token: Token,
        /// The mark.
        mark: Token,
    },
    /// The caller's statements failed: the transaction was rolled back.
    #[error("statements failed: {0}")]
    Statements(E),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl HighWaterMarks for PostgresStore {
    fn get<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        Box::pin(async move {
            let client = self.client().await?;
            read_mark(&client, resource).await
        })
    }

    fn raise<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<Token, StoreError>> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(err)?;
            let before = check_and_raise(&tx, resource, token).await?;
            tx.commit().await.map_err(err)?;
            Ok(before.max(token))
        })
    }
}

/// The ordering gate across every enforcer sharing one PostgreSQL database.
///
/// Each admitted write holds a *shared* advisory lock on its resource for as long as it is in
/// flight (on a pooled connection). A write with a higher token takes the *exclusive* lock, which
/// PostgreSQL grants only when no write — on any enforcer — holds the shared one, and which makes
/// later shared requests queue behind it (so lower tokens are cut off at once); it raises the mark
/// and releases, then proceeds like any write. The current mark is read under the shared lock on
/// every write, so no enforcer acts on a stale cached mark. Cost per write: a pooled connection
/// and three short statements.
#[derive(Clone, Debug)]
pub struct SharedGate {
    store: PostgresStore,
    latency: StoreLatency,
}

impl SharedGate {
    /// A gate over `store`, timing its database calls on the process-wide meter provider.
    pub fn new(store: PostgresStore) -> Self {
        Self {
            store,
            latency: StoreLatency::global(),
        }
    }

    /// Times the database calls into `latency` instead.
    pub fn with_latency(mut self, latency: StoreLatency) -> Self {
        self.latency = latency;
        self
    }

    /// The store behind the gate.
    pub fn store(&self) -> &PostgresStore {
        &self.store
    }

    async fn admit_inner(&self, resource: &str, token: Token) -> Result<Permit, GateError> {
        let key = lock_key(resource);
        loop {
            // Shared lock, then the mark under it: what the store costs every write.
            let (held, mark) = self
                .latency
                .time("get", async {
                    let client = self.store.client().await?;
                    client
                        .execute("SELECT pg_advisory_lock_shared($1)", &[&key])
                        .await
                        .map_err(err)?;
                    let held = SharedLock {
                        client: Some(client),
                        key,
                    };
                    let mark = read_mark(held.client(), resource).await?;
                    Ok::<_, StoreError>((held, mark.unwrap_or_default()))
                })
                .await?;
            if token == mark {
                return Ok(Permit::new(held));
            }
            drop(held);
            if token < mark {
                return Err(GateError::Stale { token, mark });
            }
            // Above the mark: wait for every in-flight write on every enforcer, raise, go again.
            self.latency
                .time("raise", async {
                    run_exclusive(self.store.client().await?, key, resource, token).await
                })
                .await?;
        }
    }
}

/// Takes the exclusive lock of `key` (waiting for every shared holder), raises the mark, and
/// releases the lock.
async fn run_exclusive(
    mut client: Object,
    key: i64,
    resource: &str,
    token: Token,
) -> Result<(), StoreError> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&key])
        .await
        .map_err(err)?;
    let raised = async {
        let tx = client.transaction().await.map_err(err)?;
        check_and_raise(&tx, resource, token).await?;
        tx.commit().await.map_err(err)
    }
    .await;
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&key])
        .await
        .map_err(err);
    if unlocked.is_err() {
        // A session that may still hold the lock must not go back to the pool: closing it
        // releases the lock.
        drop(Object::take(client));
    }
    raised.and(unlocked.map(|_| ()))
}

/// The mark of `resource` as `client` sees it now.
async fn read_mark(
    client: &tokio_postgres::Client,
    resource: &str,
) -> Result<Option<Token>, StoreError> {
    let row = client
        .query_opt(
            "SELECT mark FROM fence_marks WHERE resource = $1",
            &[&resource],
        )
        .await
        .map_err(err)?;
    row.map(|r| decode(r.get::<_, &[u8]>(0))).transpose()
}

/// A shared advisory lock held on a pooled connection; released when dropped.
struct SharedLock {
    client: Option<Object>,
    key: i64,
}

impl SharedLock {
    fn client(&self) -> &tokio_postgres::Client {
        match &self.client {
            Some(c) => c,
            None => unreachable!("present until drop"),
        }
    }
}

impl Drop for SharedLock {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let key = self.key;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if client
                        .execute("SELECT pg_advisory_unlock_shared($1)", &[&key])
                        .await
                        .is_err()
                    {
                        // Closing the session is the other way to release its locks.
                        drop(Object::take(client));
                    }
                });
            }
            Err(_) => drop(Object::take(client)),
        }
    }
}

/// The advisory-lock key of a resource: 64 bits of its SHA-256. A collision only makes two
/// resources share a lock (serialising them), never lets a write through.
fn lock_key(resource: &str) -> i64 {
    let digest = Sha256::digest(format!("lease-proxy/fence/{resource}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}

impl Admission for SharedGate {
    fn admit<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<Permit, GateError>> {
        Box::pin(self.admit_inner(resource, token))
    }

    fn ready(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move { self.store.get("readyz").await.is_ok() })
    }
}
