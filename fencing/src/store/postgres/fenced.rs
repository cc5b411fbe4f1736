//! The transactional mode: the fence check and the caller's statements commit together, in
//! order with the writes that [`SharedGate`](super::SharedGate)s have in flight.

use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_postgres::Transaction;

use super::gate::{poll_pause, POLL};
use super::inflight::{lower_live, Lower};
use super::session::bounded;
use super::{check_and_raise, err, read_mark, PostgresStore, Read};
use crate::store::StoreError;
use crate::Token;

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
    /// The database failed or did not answer in time, or lower-token writes stayed in flight
    /// for too long: nothing of the caller's was committed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How the mark row is locked in an attempt.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lock {
    /// `FOR SHARE`: the token is expected to be the mark; transactions with the same token run
    /// side by side.
    AtMark,
    /// `FOR UPDATE`, raising the mark to the token.
    Raise,
}

impl PostgresStore {
    /// The transactional mode: runs `statements` in a transaction that commits only if `token`
    /// is not below the resource's mark, with the mark raised to `token` — and only once no
    /// write with a lower token is in flight through a [`SharedGate`](super::SharedGate).
    ///
    /// Writers of a resource are ordered by its mark row's lock, so their effects commit in
    /// non-decreasing token order, and in order with the gateways' writes; a stale writer
    /// changes nothing. Normally the raise commits together with the statements (failing
    /// statements leave the mark as it was). If a gateway has a lower-token write in flight, the
    /// raise commits first — lower tokens are refused from then on, as after a pre-fence — and
    /// the statements run once those writes have ended, in a transaction that checks the mark
    /// again; the raise then stays even if the statements fail.
    ///
    /// The transaction is `READ COMMITTED` (the gate's reasoning about which rows a statement
    /// sees depends on it, so the store's sessions are set to it).
    ///
    /// Each of the mode's own database steps answers within the store deadline, and waiting
    /// for lower writes gives up after one registration lifetime plus one deadline
    /// ([`FencedError::Store`]). The statements run under the session's `statement_timeout`
    /// (the store deadline) unless they `SET LOCAL statement_timeout`, and must not leave the
    /// transaction idle for longer than the deadline (`idle_in_transaction_session_timeout`
    /// ends the session); while they run, raises of this resource wait (up to their own
    /// deadline). If the returned future is dropped before it finishes, its session is closed,
    /// which rolls the transaction back (unless the commit had already been sent).
    pub async fn fenced<T, E, F>(
        &self,
        resource: &str,
        token: Token,
        statements: F,
    ) -> Result<T, FencedError<E>>
    where
        F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
    {
        let deadline = self.deadline;
        let mut statements = Some(statements);
        let mut lock = Lock::AtMark;
        let mut give_up: Option<Instant> = None;
        let mut backoff = POLL;
        loop {
            let mut session = self.session().await?;
            let tx = bounded(deadline, "begin", async {
                session.transaction().await.map_err(err)
            })
            .await?;
            let mark = locked_mark(deadline, &tx, lock, resource, token).await?;
            match locked(lock, token, mark) {
                Locked::Go => {}
                Locked::Stale(mark) => {
                    roll_back(deadline, tx).await?;
                    session.done();
                    return Err(FencedError::Stale { token, mark });
                }
                Locked::RaiseFirst => {
                    roll_back(deadline, tx).await?;
                    session.done();
                    lock = Lock::Raise;
                    continue;
                }
            }
            // After the lock, on a fresh snapshot: every lower registration is visible.
            let lower = bounded(deadline, "look for lower in-flight writes", async {
                lower_live(&tx, resource, token).await
            })
            .await?;
            if lower.live > 0 {
                // Keep a raise (lower tokens are refused from now on) and wait the writes out.
                commit(deadline, tx).await?;
                session.done();
                self.pause_for_lower(resource, token, &lower, &mut give_up, &mut backoff)
                    .await?;
                lock = Lock::AtMark;
                continue;
            }
            // The statements are taken only here, and this iteration returns.
            let statements = statements
                .take()
                .ok_or_else(|| StoreError("fenced statements already consumed".into()))?;
            return match statements(&tx).await {
                Ok(value) => {
                    commit(deadline, tx).await?;
                    session.done();
                    Ok(value)
                }
                Err(e) => {
                    roll_back(deadline, tx).await?;
                    session.done();
                    Err(FencedError::Statements(e))
                }
            };
        }
    }
}

impl PostgresStore {
    /// Sleeps until the `lower` writes in flight may have ended, or fails once they have been
    /// waited for longer than the longest wait (counted in `give_up` from the first pause).
    async fn pause_for_lower(
        &self,
        resource: &str,
        token: Token,
        lower: &Lower,
        give_up: &mut Option<Instant>,
        backoff: &mut runtime::backoff::Backoff,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        let give_up = *give_up.get_or_insert(now + self.max_wait());
        if now >= give_up {
            return Err(StoreError(format!(
                "lower-token writes still in flight after {:?}",
                self.max_wait()
            )));
        }
        tracing::debug!(
            resource,
            %token,
            lower = lower.live,
            "fenced: waiting for lower in-flight writes"
        );
        tokio::time::sleep(poll_pause(backoff, lower.next_expiry)).await;
        Ok(())
    }
}

/// What an attempt does once the mark row is locked.
#[derive(Debug, PartialEq, Eq)]
enum Locked {
    /// Run the statements (after any lower writes in flight end).
    Go,
    /// The token is below the mark: refused.
    Stale(Token),
    /// Above the mark, or no mark yet, under a shared lock: again, raising.
    RaiseFirst,
}

/// What an attempt holding `lock` does with `token` when the mark is `mark` (`None`: none yet;
/// under [`Lock::Raise`], the mark it was raised from or to).
fn locked(lock: Lock, token: Token, mark: Option<Token>) -> Locked {
    match mark {
        Some(mark) if token < mark => Locked::Stale(mark),
        Some(mark) if lock == Lock::AtMark && token == mark => Locked::Go,
        _ if lock == Lock::AtMark => Locked::RaiseFirst,
        _ => Locked::Go,
    }
}

/// Locks `resource`'s mark in `tx` as `lock` says, within `deadline`: shared, to read it
/// (`None`: no mark yet), or checked and raised to `token`.
async fn locked_mark(
    deadline: Duration,
    tx: &deadpool_postgres::Transaction<'_>,
    lock: Lock,
    resource: &str,
    token: Token,
) -> Result<Option<Token>, StoreError> {
    bounded(deadline, "lock the mark", async {
        match lock {
            Lock::AtMark => read_mark(tx, resource, Read::Share).await,
            Lock::Raise => check_and_raise(tx, resource, token).await.map(Some),
        }
    })
    .await
}

/// Rolls `tx` back within `deadline`.
async fn roll_back(
    deadline: Duration,
    tx: deadpool_postgres::Transaction<'_>,
) -> Result<(), StoreError> {
    bounded(deadline, "roll back", async {
        tx.rollback().await.map_err(err)
    })
    .await
}

/// Commits `tx` within `deadline`.
async fn commit(
    deadline: Duration,
    tx: deadpool_postgres::Transaction<'_>,
) -> Result<(), StoreError> {
    bounded(deadline, "commit", async { tx.commit().await.map_err(err) }).await
}

#[cfg(test)]
mod tests {
    use super::{locked, Lock, Locked};
    use crate::Token;

    #[test]
    fn an_attempt_runs_only_at_the_mark_or_after_raising_to_it() {
        let (five, six) = (Token::new(1, 5), Token::new(1, 6));
        for lock in [Lock::AtMark, Lock::Raise] {
            assert_eq!(locked(lock, five, Some(six)), Locked::Stale(six));
            assert_eq!(locked(lock, five, Some(five)), Locked::Go);
        }
        for mark in [None, Some(five)] {
            assert_eq!(locked(Lock::AtMark, six, mark), Locked::RaiseFirst);
            assert_eq!(locked(Lock::Raise, six, mark), Locked::Go);
        }
    }
}
