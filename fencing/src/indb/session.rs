//! A `pg` command's transaction: its `search_path` fixed, the package's lock taken within the
//! command's deadline (and whoever holds it named when it is not), and every later lock wait in
//! short slices, so that the command neither waits for ever nor makes other sessions queue
//! behind it for long.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::{Client, NoTls, Transaction};

use super::{db, PackageError};

/// The advisory lock every `pg` command takes while the package does not exist yet (its key,
/// through `hashtextextended`, is the one earlier versions used).
const PACKAGE_LOCK: &str = "lease-proxy/fencing/package";

/// How long one attempt of a command's work may wait for a lock: sessions that want a lock the
/// attempt is waiting for (an admit wanting the keys, a write wanting a protected table) queue
/// behind it at most this long before the attempt gives way and retries.
const SLICE: Duration = Duration::from_millis(200);

pub(super) async fn connect(url: &str) -> Result<Client, PackageError> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(db)?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "pg command: connection ended");
        }
    });
    Ok(client)
}

/// Starts a command's transaction: its `search_path` fixed to `pg_catalog, pg_temp` (so that
/// nothing a tenant planted in a schema of the installing role's path — `public`, `"$user"` —
/// is ever resolved by the command's own statements, run as that role), then serialised with
/// every other install, upgrade, removal and key load of the database, waiting at most `wait`.
///
/// Where the package exists the lock is its version table's (`SHARE UPDATE EXCLUSIVE`, which
/// only the package's roles may take); before the first install, an advisory lock (which any
/// role that can connect may hold). Either way, past the deadline the command fails naming the
/// sessions that hold it. Returns the command's deadline.
pub(super) async fn begin(
    tx: &Transaction<'_>,
    schema: &str,
    wait: Duration,
) -> Result<Instant, PackageError> {
    let deadline = Instant::now() + wait;
    tx.batch_execute("SET LOCAL search_path = pg_catalog, pg_temp")
        .await
        .map_err(db)?;
    let table = format!("{schema}.package_version");
    let exists: bool = tx
        .query_one("SELECT pg_catalog.to_regclass($1) IS NOT NULL", &[&table])
        .await
        .map_err(db)?
        .get(0);
    if exists {
        set_lock_timeout(tx, deadline.saturating_duration_since(Instant::now())).await?;
        let locked = tx
            .batch_execute(&format!(
                "LOCK TABLE {table} IN SHARE UPDATE EXCLUSIVE MODE"
            ))
            .await
            .map_err(db);
        return match locked {
            Ok(()) => Ok(deadline),
            Err(PackageError::Busy(_)) => Err(PackageError::Busy(format!(
                "another session held the fencing package's lock ({table}) for {wait:?}: {}",
                holders(tx, HELD_TABLE, &table).await
            ))),
            Err(e) => Err(e),
        };
    }
    let mut pause = Duration::from_millis(5);
    loop {
        let taken: bool = tx
            .query_one(
                "SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended($1, 0::int8))",
                &[&PACKAGE_LOCK],
            )
            .await
            .map_err(db)?
            .get(0);
        if taken {
            return Ok(deadline);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(PackageError::Busy(format!(
                "another session held the fencing package's advisory lock for {wait:?}: {}",
                holders(tx, HELD_ADVISORY, PACKAGE_LOCK).await
            )));
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

async fn set_lock_timeout(tx: &Transaction<'_>, wait: Duration) -> Result<(), PackageError> {
    // 0 would mean no timeout at all.
    let ms = wait.as_millis().max(1);
    tx.batch_execute(&format!("SET LOCAL lock_timeout = {ms}"))
        .await
        .map_err(db)
}

/// Runs `step` (the command's work after its lock) in a savepoint, each attempt allowed to wait
/// for a lock at most [`SLICE`]: an attempt that waits longer is rolled back — letting go of
/// every lock it took, so that the sessions queued behind it go ahead — and tried again, until
/// the deadline. Past the deadline the command fails naming the sessions holding locks on the
/// package's tables and on `tables` (protected tables, whose triggers the step may drop).
pub(super) async fn in_slices<T, F, Fut>(
    tx: &Transaction<'_>,
    deadline: Instant,
    schema: &str,
    mut step: F,
) -> Result<T, PackageError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, PackageError>>,
{
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        tx.batch_execute("SAVEPOINT pg_command").await.map_err(db)?;
        set_lock_timeout(tx, left.min(SLICE)).await?;
        match step().await {
            Ok(done) => {
                tx.batch_execute("RELEASE SAVEPOINT pg_command")
                    .await
                    .map_err(db)?;
                return Ok(done);
            }
            Err(PackageError::Busy(why)) => {
                tx.batch_execute("ROLLBACK TO SAVEPOINT pg_command")
                    .await
                    .map_err(db)?;
                if Instant::now() + Duration::from_millis(20) >= deadline {
                    return Err(PackageError::Busy(format!(
                        "{why}: other sessions held locks the command needs until its deadline: {}",
                        holders(tx, HELD_PACKAGE_TABLES, schema).await
                    )));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Who holds the package's table lock (`$1` the table).
const HELD_TABLE: &str = "l.locktype = 'relation' AND l.relation = pg_catalog.to_regclass($1)";
/// Who holds the advisory lock (`$1` its name): a bigint key shows as classid (high 32 bits),
/// objid (low 32 bits), objsubid 1.
const HELD_ADVISORY: &str = "l.locktype = 'advisory' AND l.objsubid = 1 \
    AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d \
                      WHERE d.datname = pg_catalog.current_database()) \
    AND (l.classid::int8 << 32) | l.objid::int8 \
        = pg_catalog.hashtextextended($1, 0::int8)";
/// Who holds a lock on a table of the package's schema (`$1`) or on a table the package's
/// triggers protect.
const HELD_PACKAGE_TABLES: &str = "l.locktype = 'relation' AND l.relation IN ( \
    SELECT c.oid FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n \
        ON n.oid = c.relnamespace WHERE n.nspname = $1 \
    UNION SELECT t.tgrelid FROM pg_catalog.pg_trigger AS t \
        JOIN pg_catalog.pg_proc AS p ON p.oid = t.tgfoid \
        JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace \
        WHERE n.nspname = $1)";

/// The sessions (other than this one) holding a granted lock that `condition` selects: pid,
/// user, application and what they are doing, for the command's error message.
async fn holders(tx: &Transaction<'_>, condition: &str, arg: &str) -> String {
    let query = format!(
        "SELECT DISTINCT a.pid, coalesce(a.usename::text, '?'), coalesce(a.application_name, ''),
                a.state,
                extract(epoch FROM pg_catalog.now() - coalesce(a.xact_start, a.backend_start))::float8
         FROM pg_catalog.pg_locks AS l JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
         WHERE l.granted AND l.pid <> pg_catalog.pg_backend_pid() AND {condition}
         ORDER BY 1"
    );
    let rows = match tx.query(&query, &[&arg]).await {
        Ok(rows) => rows,
        Err(e) => return format!("(who holds it could not be read: {})", db(e)),
    };
    if rows.is_empty() {
        return "no session holds it any more: retry".to_owned();
    }
    // What the session is doing is hidden from a role without pg_read_all_stats (NULL); its
    // pid, user and application name are not.
    let sessions: Vec<String> = rows
        .iter()
        .map(|r| {
            let pid: i32 = r.try_get(0).unwrap_or_default();
            let user: String = r.try_get(1).unwrap_or_default();
            let application: String = r.try_get(2).unwrap_or_default();
            let doing = match (
                r.try_get::<_, Option<String>>(3).ok().flatten(),
                r.try_get::<_, Option<f64>>(4).ok().flatten(),
            ) {
                (Some(state), Some(seconds)) => format!(", {state} for {seconds:.0} s"),
                (Some(state), None) => format!(", {state}"),
                _ => String::new(),
            };
            format!("pid {pid} (user {user}, application_name {application:?}{doing})")
        })
        .collect();
    format!(
        "{}; end it with pg_terminate_backend(pid) if it should not be there",
        sessions.join(", ")
    )
}
