//! PostgreSQL: marks shared by several enforcers, a database-wide ordering gate
//! ([`SharedGate`]), and the transactional mode ([`PostgresStore::fenced`]) where the fence check
//! and the caller's own statements commit together.
//!
//! # Tables
//!
//! - `fence_marks(resource text primary key, mark bytea)`: marks are 16-byte big-endian
//!   `era ‖ revision`, so `bytea` comparison is token order.
//! - `fence_inflight(id bigint primary key, resource text, token bytea, expires_at timestamptz)`:
//!   one row per write admitted by a [`SharedGate`] and not yet ended — a *registration*.
//!
//! Readiness probes write one reserved row of `fence_marks`, [`PROBE_RESOURCE`] (a name outside
//! every token domain, whose mark stays `0.0`), and a registration they delete before
//! committing: what a raise writes, so a lock on either table makes the gateway unready.
//!
//! # The in-flight protocol
//!
//! A write is in flight (docs/DESIGN.md §4) from admission until its exchange with the storage has
//! ended, plus the write grace if it ended uncertain. Across gateways that fact must outlive any
//! one database session (a session can be killed, time out or lose its network while the write
//! goes on at the storage), so it is a row, not a lock:
//!
//! 1. **Admission** is one short transaction. With `token == mark` it takes the mark row
//!    `FOR SHARE` (one pipelined round trip); with `token > mark` (or no mark yet) `FOR UPDATE`,
//!    and raises the mark, which cuts lower tokens off at once. Below the mark it is refused.
//!    It inserts a registration expiring at `clock_timestamp() + L`, `L = max_exchange +
//!    write_grace + deadline`, and, in a later statement of the same transaction (so after the
//!    row lock, on a fresh snapshot: every lower registration committed before the raise, so
//!    all are visible), counts the live registrations of lower tokens. If there are any, it
//!    lengthens its own registration by the longest wait `W = L + deadline` — still uncommitted,
//!    so nobody has seen the shorter one. It commits.
//! 2. If no lower registration is live, the write is admitted. Otherwise it **waits**, polling
//!    (read-only) until none is left: at once when a permit ends (see 3), otherwise with a
//!    backoff up to 25 ms that never sleeps past the first lower expiry. Lower registrations
//!    all predate the raise and expire within `L` of it, so the wait ends within `L`; it gives
//!    up (503) after `W` measured from before the registration, so an admitted write's
//!    registration still has `L` to run — a whole exchange, its grace and a deadline. A waiting
//!    write that sees the mark pass its token is refused (409), as a write below a raise under
//!    way is by the in-process gate: a higher token then waits only for writes really in
//!    flight, never for a chain of waiting ones. A write that is refused or gives up deletes
//!    its registration.
//! 3. **Ending a permit** deletes the registration ([`Outcome::Complete`]) or shortens it to
//!    `clock_timestamp() + write_grace` ([`Outcome::Uncertain`]), from a spawned task. If that
//!    fails — no runtime, database down — the registration's own expiry still covers the write.
//!    When the mark is above the ended write's token (someone may be waiting for it) the end
//!    also sends a notification, which every gate listens for on a connection of its own to
//!    wake its waiting writes at once; only latency depends on it.
//!
//! Once committed, a registration's expiry never moves later (ends delete or shorten it), so a
//! registration seen expired stays expired and a checker may ignore it. A dead session changes
//! nothing: registrations are rows. Expired rows are swept now and then.
//!
//! Only the database's clock is used (`clock_timestamp()`), never a gateway's: gateways only
//! measure durations with their own monotonic clocks (the exchange deadline, the wait).
//!
//! # Deadlines
//!
//! Every call is bounded by the store deadline ([`PostgresStore::connect_with_deadline`],
//! default 5 s): the pool's wait, create and recycle timeouts; `statement_timeout`,
//! `lock_timeout` and `idle_in_transaction_session_timeout` set on every session when it is
//! opened; and a tokio timeout around each whole database step. Past it the caller gets a
//! [`StoreError`] (the fencing layer answers 503) and nothing was admitted. A session whose step
//! failed or timed out, or whose caller went away mid-step, is closed, never returned to the
//! pool, so no pooled session carries a pending statement, transaction or lock. Admission runs
//! in a spawned task, so a caller that goes away cannot cut a database step in half; the task
//! deletes the registration it made.
//!
//! What breaks it, and what it costs: see [`SharedGate`] (public documentation, since this
//! module is not).
//!
//! [`Outcome::Complete`]: crate::admission::Outcome::Complete
//! [`Outcome::Uncertain`]: crate::admission::Outcome::Uncertain

mod fenced;
mod gate;
mod inflight;
mod listener;
pub(crate) mod marks;
mod session;

pub use fenced::FencedError;
pub use gate::SharedGate;

use std::time::Duration;

use deadpool_postgres::{
    GenericClient, Hook, HookError, Manager, ManagerConfig, Pool, PoolError, RecyclingMethod,
    Runtime, Timeouts,
};
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use tokio_postgres::NoTls;

use super::{decode, encode, HighWaterMarks, StoreError};
use crate::decide;
use crate::{Keyring, Token};
use session::{bounded, Session};

/// The store deadline unless configured (see [`PostgresStore::connect_with_deadline`]).
const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

fn err(e: impl std::fmt::Debug) -> StoreError {
    // tokio-postgres's Display says only "db error"; the Debug form carries the server's message.
    StoreError(format!("{e:?}"))
}

/// Marks in PostgreSQL, shared by every enforcer (and every transactional writer) pointed at
/// the same database. A raise is committed (and so durable) before it returns. Every call
/// answers within the store deadline or fails with [`StoreError`].
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// For connections outside the pool (the gate's listener).
    config: tokio_postgres::Config,
    deadline: Duration,
    max_exchange: Duration,
    write_grace: Duration,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("deadline", &self.deadline)
            .field("max_exchange", &self.max_exchange)
            .field("write_grace", &self.write_grace)
            .finish_non_exhaustive()
    }
}

/// The pool of sessions to `config`'s database: at most `max_connections` (at least 2), each
/// waited for, made and recycled within `deadline`, and set to give up within it on the
/// server's side too.
fn pool(
    config: &tokio_postgres::Config,
    max_connections: usize,
    deadline: Duration,
) -> Result<Pool, StoreError> {
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            // A closed connection is noticed by the pool; any other failure closes the
            // session on our side (see `Session`), so no check query per checkout.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let ms = deadline.as_millis();
    // Session settings, so the server gives up on its side too: a lock or statement wait
    // ends within the deadline even after we stopped listening, and a transaction whose
    // client vanished (network cut, paused process) releases its row locks.
    let settings = format!(
        "SET statement_timeout = {ms}; SET lock_timeout = {ms}; \
         SET idle_in_transaction_session_timeout = {ms}; \
         SET default_transaction_isolation = 'read committed'"
    );
    Pool::builder(manager)
        .max_size(max_connections.max(2))
        .runtime(Runtime::Tokio1)
        .timeouts(Timeouts {
            wait: Some(deadline),
            create: Some(deadline),
            recycle: Some(deadline),
        })
        .post_create(Hook::async_fn(move |client, _| {
            let settings = settings.clone();
            Box::pin(async move {
                client
                    .batch_execute(&settings)
                    .await
                    .map_err(HookError::Backend)
            })
        }))
        .build()
        .map_err(err)
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user:password@host:port/db`) with a pool of up to
    /// `max_connections`, creates the tables if needed, and uses the default store deadline
    /// (5 s), exchange bound ([`DEFAULT_EXCHANGE_DEADLINE`], 30 s) and write grace
    /// ([`DEFAULT_WRITE_GRACE`], 10 s).
    ///
    /// [`DEFAULT_EXCHANGE_DEADLINE`]: crate::admission::DEFAULT_EXCHANGE_DEADLINE
    /// [`DEFAULT_WRITE_GRACE`]: crate::admission::DEFAULT_WRITE_GRACE
    pub async fn connect(url: &str, max_connections: usize) -> Result<Self, StoreError> {
        Self::connect_with_deadline(url, max_connections, DEFAULT_DEADLINE).await
    }

    /// Like [`connect`](Self::connect), with `deadline` bounding every call to the database:
    /// waiting for a pooled connection, opening one, each lock wait and each statement (set as
    /// the sessions' `lock_timeout`, `statement_timeout` and
    /// `idle_in_transaction_session_timeout`). Connecting itself fails within a few deadlines
    /// when the database does not answer.
    ///
    /// Without a key file the store cannot tell its deployment's marks from another's: it
    /// refuses to start only beside the in-database package's marks and sets without a stamp
    /// (see [`connect_for`](Self::connect_for)), and stamps the tables it creates `(no keys)`.
    pub async fn connect_with_deadline(
        url: &str,
        max_connections: usize,
        deadline: Duration,
    ) -> Result<Self, StoreError> {
        Self::open(url, max_connections, deadline, None).await
    }

    /// Like [`connect_with_deadline`](Self::connect_with_deadline), for the deployment whose
    /// key file is `keys` (fence-gateway's): the store refuses to start if any other set of marks
    /// in the database could be this deployment's — one stamped with one of its keys' tags, the
    /// in-database package's unless stamped with other keys, or one without a stamp — and
    /// stamps the set it uses with its tags if its role owns it (`marks` module: why, and how).
    pub async fn connect_for(
        url: &str,
        max_connections: usize,
        deadline: Duration,
        keys: &Keyring,
    ) -> Result<Self, StoreError> {
        Self::open(url, max_connections, deadline, Some(keys.marks_tags())).await
    }

    async fn open(
        url: &str,
        max_connections: usize,
        deadline: Duration,
        tags: Option<Vec<String>>,
    ) -> Result<Self, StoreError> {
        // 0 would mean "no timeout" to PostgreSQL.
        let deadline = deadline.max(Duration::from_millis(1));
        let config: tokio_postgres::Config = url.parse().map_err(err)?;
        let store = Self {
            pool: pool(&config, max_connections, deadline)?,
            config,
            deadline,
            max_exchange: crate::admission::DEFAULT_EXCHANGE_DEADLINE,
            write_grace: crate::admission::DEFAULT_WRITE_GRACE,
        };
        bounded(deadline, "create the tables", async {
            let mut session = store.session().await?;
            // Concurrent `CREATE TABLE IF NOT EXISTS` can collide in PostgreSQL's catalog; a
            // transaction-scoped advisory lock makes enforcers starting together take turns
            // (and it cannot outlive the transaction).
            let tx = session.transaction().await.map_err(err)?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&schema_lock()])
                .await
                .map_err(err)?;
            // Which set of marks, and never a second one of this deployment (`marks`). Where the
            // tables already are (made by an earlier start, or by the in-database package's
            // install, whose schema is then this role's search_path), nothing is created:
            // `CREATE … IF NOT EXISTS` needs privileges a role that only uses the tables does not
            // have (CREATE on the schema, ownership for the index).
            marks::prepare(&tx, tags.as_deref()).await?;
            tx.commit().await.map_err(err)?;
            session.done();
            Ok(())
        })
        .await?;
        // Open the whole pool now: a database that cannot take that many connections should fail
        // the start, not the first burst of writes (a PostgreSQL connection is a process fork).
        let opened = bounded(
            deadline * 2,
            "open the pool",
            futures::future::try_join_all((0..max_connections).map(|_| store.session())),
        )
        .await?;
        opened.into_iter().for_each(Session::done);
        Ok(store)
    }

    /// How long an admitted write may take at the storage: the gateway's exchange deadline
    /// (`--upstream-timeout`). A registration lasts `max_exchange + write_grace + deadline` after
    /// admission unless its permit ends sooner; a write must not run longer than that.
    pub fn with_max_exchange(mut self, max_exchange: Duration) -> Self {
        self.max_exchange = max_exchange;
        self
    }

    /// How long an uncertain write keeps its resource closed to higher tokens (the gateway's
    /// `--write-grace`).
    pub fn with_write_grace(mut self, write_grace: Duration) -> Self {
        self.write_grace = write_grace;
        self
    }

    /// The deadline of every call to the database.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// How long a registration lasts after admission (`L`): the exchange, the grace after an
    /// uncertain end, and the time the admission's answer may take to reach the gateway.
    fn lifetime(&self) -> Duration {
        self.timing().lifetime()
    }

    /// The in-flight protocol's durations ([`decide::Timing`]). The permit's deadline counts
    /// from *before* its registration was sent; the registration, made later, lasts that and
    /// the write grace, so an exchange cut off by then, whose storage finishes within the grace,
    /// is over inside it — however long the gateway was paused between the registration and
    /// the exchange.
    fn timing(&self) -> decide::Timing {
        decide::Timing {
            max_exchange: self.max_exchange,
            write_grace: self.write_grace,
            deadline: self.deadline,
        }
    }

    /// How long a write waits for lower in-flight writes before giving up (`W`): every lower
    /// registration predates the raise, so it expires within one lifetime of it — unless its
    /// gateway died while it was itself waiting, which this bound turns into a retryable 503.
    fn max_wait(&self) -> Duration {
        self.timing().max_wait()
    }

    /// A pooled session, within the deadline.
    async fn session(&self) -> Result<Session, StoreError> {
        bounded(self.deadline, "get a database connection", async {
            self.pool
                .get()
                .await
                .map(Session::new)
                .map_err(|e| match e {
                    PoolError::Backend(e) => err(e),
                    other => StoreError(format!("PostgreSQL connection pool: {other}")),
                })
        })
        .await
    }
}

/// The advisory-lock key serialising schema creation (the same as earlier versions used, so
/// that mixed versions starting together also take turns).
fn schema_lock() -> i64 {
    let digest = Sha256::digest(b"lease-proxy/fence/schema");
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}

/// Locks the mark row of `resource` (creating it at `token` if absent), raises it to `token` if
/// below, and returns the mark as it was before (≤ the row's value now).
async fn check_and_raise(
    tx: &impl GenericClient,
    resource: &str,
    token: Token,
) -> Result<Token, StoreError> {
    let wanted: &[u8] = &encode(token);
    let create = tx
        .prepare_cached(
            "INSERT INTO fence_marks (resource, mark) VALUES ($1, $2) \
             ON CONFLICT (resource) DO NOTHING",
        )
        .await
        .map_err(err)?;
    tx.execute(&create, &[&resource, &wanted])
        .await
        .map_err(err)?;
    let lock = tx
        .prepare_cached("SELECT mark FROM fence_marks WHERE resource = $1 FOR UPDATE")
        .await
        .map_err(err)?;
    let row = tx.query_one(&lock, &[&resource]).await.map_err(err)?;
    let mark = decode(row.get::<_, &[u8]>(0))?;
    if token > mark {
        let raise = tx
            .prepare_cached("UPDATE fence_marks SET mark = $2 WHERE resource = $1")
            .await
            .map_err(err)?;
        tx.execute(&raise, &[&resource, &wanted])
            .await
            .map_err(err)?;
    }
    Ok(mark)
}

/// How a mark is read.
#[derive(Clone, Copy)]
enum Read {
    /// As the statement's snapshot has it.
    Plain,
    /// `FOR SHARE`: the row (if any) locked against raises until the transaction ends.
    Share,
}

/// The mark of `resource` as `client` sees it now (`None`: no mark yet).
async fn read_mark(
    client: &impl GenericClient,
    resource: &str,
    how: Read,
) -> Result<Option<Token>, StoreError> {
    let sql = match how {
        Read::Plain => "SELECT mark FROM fence_marks WHERE resource = $1",
        Read::Share => "SELECT mark FROM fence_marks WHERE resource = $1 FOR SHARE",
    };
    let read = client.prepare_cached(sql).await.map_err(err)?;
    let row = client.query_opt(&read, &[&resource]).await.map_err(err)?;
    row.map(|r| decode(r.get::<_, &[u8]>(0))).transpose()
}

impl HighWaterMarks for PostgresStore {
    fn get<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        Box::pin(bounded(self.deadline, "read the mark", async move {
            let session = self.session().await?;
            let mark = read_mark(&*session, resource, Read::Plain).await?;
            session.done();
            Ok(mark)
        }))
    }

    fn raise<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<Token, StoreError>> {
        Box::pin(bounded(self.deadline, "raise the mark", async move {
            let mut session = self.session().await?;
            let tx = session.transaction().await.map_err(err)?;
            let before = check_and_raise(&tx, resource, token).await?;
            tx.commit().await.map_err(err)?;
            session.done();
            Ok(before.max(token))
        }))
    }

    /// One transaction that writes what a raise writes, and commits synchronously like one:
    /// the reserved row `PROBE_RESOURCE` of `fence_marks` updated in place (created if
    /// absent, its mark never changed) and a registration inserted into `fence_inflight` and
    /// deleted again (never committed, so no checker, count or sweep sees it). It fails on a
    /// database that refuses writes (read-only, a standby after a failover, a full disk) or
    /// holds either table (or the row) locked past the deadline.
    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(bounded(self.deadline, "probe a write", async move {
            let mut session = self.session().await?;
            let tx = session.transaction().await.map_err(err)?;
            let mark = tx
                .prepare_cached(
                    "INSERT INTO fence_marks (resource, mark) VALUES ($1, $2) \
                     ON CONFLICT (resource) DO UPDATE SET mark = fence_marks.mark",
                )
                .await
                .map_err(err)?;
            let zero: &[u8] = &encode(Token::default());
            tx.execute(&mark, &[&PROBE_RESOURCE, &zero])
                .await
                .map_err(err)?;
            let register = tx
                .prepare_cached(
                    "INSERT INTO fence_inflight (id, resource, token, expires_at) \
                     VALUES ($1, $2, $3, clock_timestamp())",
                )
                .await
                .map_err(err)?;
            let id: i64 = rand::random();
            tx.execute(&register, &[&id, &PROBE_RESOURCE, &zero])
                .await
                .map_err(err)?;
            let unregister = tx
                .prepare_cached("DELETE FROM fence_inflight WHERE id = $1")
                .await
                .map_err(err)?;
            tx.execute(&unregister, &[&id]).await.map_err(err)?;
            tx.commit().await.map_err(err)?;
            session.done();
            Ok(())
        }))
    }
}

/// The `fence_marks` row readiness probes write: a name no resource has — outside the `/v1`
/// resource grammar (it holds a `/`) and not a `/v3` lock domain (those start `lock/`) — so the
/// gateway never admits, lists or raises by it.
pub(crate) const PROBE_RESOURCE: &str = "fence-gateway/readiness-probe";
