//! The registrations of in-flight writes in `fence_inflight` (see the module docs of
//! [`super`] for the protocol and why each step is safe).

use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use super::listener::CHANNEL;
use super::session::Session;
use super::{check_and_raise, decode, encode, err};
use crate::admission::Outcome;
use crate::decide::{self, AtMark};
use crate::store::StoreError;
use crate::Token;

/// Takes the mark row `FOR SHARE` (so no raise commits meanwhile) and registers the write iff
/// its token equals the mark. Returns no row if the resource has no mark yet.
const REGISTER_AT_MARK: &str = "
WITH m AS (
    SELECT mark FROM fence_marks WHERE resource = $1 FOR SHARE
), registered AS (
    INSERT INTO fence_inflight (id, resource, token, expires_at)
    SELECT $3, $1, $2, clock_timestamp() + $4::float8 * interval '1 second' FROM m WHERE m.mark = $2
    RETURNING id
)
SELECT m.mark, EXISTS (SELECT 1 FROM registered) FROM m";

/// Registers a write (its mark row already locked by the transaction).
const REGISTER: &str = "
INSERT INTO fence_inflight (id, resource, token, expires_at)
VALUES ($3, $1, $2, clock_timestamp() + $4::float8 * interval '1 second')";

/// The live registrations below `$2`: how many, and in how many seconds the first one expires.
/// A registration's expiry never moves later once it is committed (ends only delete or shorten
/// it), so one seen expired stays expired. Must run after the mark row was locked (in a later
/// statement, on a fresh snapshot), so that every lower registration — all committed before
/// the raise — is visible.
const LOWER_LIVE: &str = "
SELECT count(*), extract(epoch FROM min(expires_at) - clock_timestamp())::float8
FROM fence_inflight
WHERE resource = $1 AND token < $2 AND expires_at > clock_timestamp()";

/// [`LOWER_LIVE`] at registration, in the registering transaction: if the write will have to
/// wait, its own registration (`$3`, not yet committed, so nobody has seen it) is lengthened by
/// the longest wait (`$4` seconds), so that it still covers the whole exchange when the write
/// goes ahead at the end of the wait.
const LOWER_LIVE_AT_REGISTRATION: &str = "
WITH lower AS (
    SELECT expires_at FROM fence_inflight
    WHERE resource = $1 AND token < $2 AND expires_at > clock_timestamp()
), lengthened AS (
    UPDATE fence_inflight SET expires_at = expires_at + $4::float8 * interval '1 second'
    WHERE id = $3 AND EXISTS (SELECT 1 FROM lower)
)
SELECT count(*), extract(epoch FROM min(expires_at) - clock_timestamp())::float8 FROM lower";

/// A waiting write's look: [`LOWER_LIVE`] and the mark.
const POLL: &str = "
SELECT count(*), extract(epoch FROM min(expires_at) - clock_timestamp())::float8,
    (SELECT mark FROM fence_marks WHERE resource = $1)
FROM fence_inflight
WHERE resource = $1 AND token < $2 AND expires_at > clock_timestamp()";

pub(super) use crate::decide::{Lower, Polled, Registered};

/// No lower registration (what [`decide::raised`] is told when it only decides staleness).
const NO_LOWER: Lower = Lower {
    live: 0,
    next_expiry: None,
};

/// The live registrations of lower tokens a statement counted (its first two columns).
fn lower_from_row(row: &tokio_postgres::Row) -> Lower {
    Lower {
        live: row.get(0),
        next_expiry: row
            .get::<_, Option<f64>>(1)
            .map(|s| Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)),
    }
}

/// One write's registration: its row id and what it is for.
#[derive(Debug, Clone)]
pub(super) struct Entry<'a> {
    pub(super) id: i64,
    pub(super) resource: &'a str,
    pub(super) token: Token,
    /// How long the registration lasts from its commit if the write goes ahead at once.
    pub(super) lifetime: Duration,
    /// How much longer if it has to wait first: the longest wait.
    pub(super) max_wait: Duration,
}

/// Registers a write whose token is the mark: one pipelined transaction (BEGIN, lock and
/// insert, count, COMMIT), so the common case costs one round trip. The count runs even when
/// nothing was registered (and then changes nothing).
pub(super) async fn register_at_mark(
    session: &Session,
    entry: &Entry<'_>,
) -> Result<Registered, StoreError> {
    let register = session
        .prepare_cached(REGISTER_AT_MARK)
        .await
        .map_err(err)?;
    let lower_live = session
        .prepare_cached(LOWER_LIVE_AT_REGISTRATION)
        .await
        .map_err(err)?;
    let token: &[u8] = &encode(entry.token);
    let (lifetime, max_wait) = (entry.lifetime.as_secs_f64(), entry.max_wait.as_secs_f64());
    let client: &tokio_postgres::Client = session;
    let register_params: [&(dyn ToSql + Sync); 4] = [&entry.resource, &token, &entry.id, &lifetime];
    let lower_params: [&(dyn ToSql + Sync); 4] = [&entry.resource, &token, &entry.id, &max_wait];
    // Each request is sent when its future is first polled, in this order.
    let (_, at_mark, lower, _) = futures::try_join!(
        client.batch_execute("BEGIN"),
        client.query_opt(&register, &register_params),
        client.query_one(&lower_live, &lower_params),
        client.batch_execute("COMMIT"),
    )
    .map_err(err)?;
    let answer = match at_mark {
        Some(row) => Some(AtMark {
            mark: decode(row.get::<_, &[u8]>(0))?,
            registered: row.get::<_, bool>(1),
        }),
        None => None,
    };
    Ok(decide::at_mark(answer, entry.token, lower_from_row(&lower)))
}

/// Raises the mark to the write's token (`FOR UPDATE`: waits for registrations at the old mark
/// to commit, and from its commit on lower tokens are refused), registers the write and counts
/// the lower live registrations, in one transaction.
pub(super) async fn raise_and_register(
    session: &mut Session,
    entry: &Entry<'_>,
) -> Result<Registered, StoreError> {
    let tx = session.transaction().await.map_err(err)?;
    let before = check_and_raise(&tx, entry.resource, entry.token).await?;
    if let stale @ Registered::Stale(_) = decide::raised(before, entry.token, NO_LOWER) {
        tx.rollback().await.map_err(err)?;
        return Ok(stale);
    }
    let token: &[u8] = &encode(entry.token);
    let (lifetime, max_wait) = (entry.lifetime.as_secs_f64(), entry.max_wait.as_secs_f64());
    let register = tx.prepare_cached(REGISTER).await.map_err(err)?;
    tx.execute(&register, &[&entry.resource, &token, &entry.id, &lifetime])
        .await
        .map_err(err)?;
    let lower_live = tx
        .prepare_cached(LOWER_LIVE_AT_REGISTRATION)
        .await
        .map_err(err)?;
    let lower = tx
        .query_one(
            &lower_live,
            &[&entry.resource, &token, &entry.id, &max_wait],
        )
        .await
        .map_err(err)?;
    tx.commit().await.map_err(err)?;
    Ok(Registered::Yes {
        lower: lower_from_row(&lower),
    })
}

/// The live registrations below `token`; see [`LOWER_LIVE`].
pub(super) async fn lower_live(
    client: &impl GenericClient,
    resource: &str,
    token: Token,
) -> Result<Lower, StoreError> {
    let statement = client.prepare_cached(LOWER_LIVE).await.map_err(err)?;
    let token: &[u8] = &encode(token);
    let row = client
        .query_one(&statement, &[&resource, &token])
        .await
        .map_err(err)?;
    Ok(lower_from_row(&row))
}

/// Looks at the lower registrations and the mark for a waiting write (reads only).
pub(super) async fn poll(session: &Session, entry: &Entry<'_>) -> Result<Polled, StoreError> {
    let statement = session.prepare_cached(POLL).await.map_err(err)?;
    let token: &[u8] = &encode(entry.token);
    let row = session
        .query_one(&statement, &[&entry.resource, &token])
        .await
        .map_err(err)?;
    let lower = lower_from_row(&row);
    let mark = row
        .get::<_, Option<&[u8]>>(2)
        .map(decode)
        .transpose()?
        .unwrap_or_default();
    Ok(decide::polled(mark, entry.token, lower))
}

/// Ends a registration: deleted when its write completed, shortened to `grace` from now (never
/// lengthened) when it ended uncertain, with a notification if a higher token may be waiting.
/// Committed asynchronously: if a crash loses it, the registration only lasts until its own
/// expiry.
pub(super) async fn end(
    session: &Session,
    id: i64,
    outcome: Outcome,
    grace: Duration,
) -> Result<(), StoreError> {
    // Integers only are formatted into the text: a simple query carries the whole transaction in
    // one round trip.
    let change = match outcome {
        Outcome::Complete => format!("DELETE FROM fence_inflight WHERE id = {id}"),
        Outcome::Uncertain => format!(
            "UPDATE fence_inflight SET expires_at = \
             least(expires_at, clock_timestamp() + interval '{} microseconds') WHERE id = {id}",
            grace.as_micros()
        ),
    };
    // Wake the waiters on every gateway, if a higher token may be waiting for this write.
    session
        .batch_execute(&format!(
            "BEGIN; SET LOCAL synchronous_commit = off; \
             WITH ended AS ({change} RETURNING resource, token) \
             SELECT pg_notify('{CHANNEL}', '') FROM ended JOIN fence_marks m USING (resource) \
             WHERE m.mark > ended.token; \
             COMMIT"
        ))
        .await
        .map_err(err)
}

/// Deletes expired registrations (they count for nothing any more), a bounded batch at a time.
pub(super) async fn sweep(session: &Session) -> Result<u64, StoreError> {
    let deleted = session
        .execute(
            "DELETE FROM fence_inflight WHERE id IN (
                SELECT id FROM fence_inflight WHERE expires_at <= clock_timestamp()
                LIMIT 1000 FOR UPDATE SKIP LOCKED)",
            &[],
        )
        .await
        .map_err(err)?;
    Ok(deleted)
}
