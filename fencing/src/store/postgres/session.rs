//! Pooled sessions that go back to the pool only in a known state, and the deadline around
//! each database step.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use deadpool_postgres::Object;

use crate::store::StoreError;

/// A pooled session. It returns to the pool only through [`Session::done`], called once its
/// work has completed cleanly (no transaction open, no statement pending). Dropped any other
/// way — an error, a timeout, the caller's future dropped mid-statement — it is closed instead:
/// the server then rolls back whatever was open, and no later user of the pool inherits a
/// pending statement, an open transaction, or a lock request that PostgreSQL might grant to a
/// session nobody owns.
pub(super) struct Session(Option<Object>);

impl Session {
    pub(super) fn new(object: Object) -> Self {
        Self(Some(object))
    }

    /// Returns the session to the pool.
    pub(super) fn done(mut self) {
        drop(self.0.take());
    }
}

impl Deref for Session {
    type Target = Object;

    fn deref(&self) -> &Object {
        match &self.0 {
            Some(object) => object,
            None => unreachable!("a session is only emptied when it is consumed"),
        }
    }
}

impl DerefMut for Session {
    fn deref_mut(&mut self) -> &mut Object {
        match &mut self.0 {
            Some(object) => object,
            None => unreachable!("a session is only emptied when it is consumed"),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(object) = self.0.take() {
            // Detached from the pool (its slot is freed for a fresh connection); dropping the
            // client aborts its connection task, which closes the socket.
            drop(Object::take(object));
        }
    }
}

/// Runs one database step within `deadline`, failing closed with a [`StoreError`] naming `what`
/// when it does not finish in time. Whatever the step held (a [`Session`]) is dropped, hence
/// closed, on the way out.
pub(super) async fn bounded<T>(
    deadline: Duration,
    what: &'static str,
    step: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(deadline, step).await {
        Ok(result) => result,
        Err(_) => Err(StoreError(format!(
            "{what}: no answer from PostgreSQL within {deadline:?}"
        ))),
    }
}
