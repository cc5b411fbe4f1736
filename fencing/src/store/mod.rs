//! High-water-mark stores: where the enforcer remembers, per resource, the highest token it has
//! admitted, so that no lower token is ever admitted again — across restarts.
//!
//! One trait, several backends: [`MemoryStore`] (tests only: forgets on restart),
//! [`SqliteStore`] (the durable default for one enforcer: the raise is fsynced before it
//! returns) and [`PostgresStore`] (shared by several enforcers, with [`SharedGate`], and by
//! transactional writers through [`PostgresStore::fenced`]).

mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod readiness;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "metrics")]
mod timed;

pub use memory::MemoryStore;
// For the in-database package's commands (`indb`), which only `server` builds.
#[cfg(all(feature = "postgres", feature = "server"))]
pub(crate) use postgres::marks::{stamp_statement, Stamp};
#[cfg(all(test, feature = "postgres"))]
pub(crate) use postgres::PROBE_RESOURCE;
#[cfg(feature = "postgres")]
pub use postgres::{FencedError, PostgresStore, SharedGate};
pub(crate) use readiness::Readiness;
pub use readiness::PROBE_TTL;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
#[cfg(feature = "metrics")]
pub use timed::{StoreLatency, Timed};

use futures::future::BoxFuture;

use crate::Token;

pub use crate::error::StoreError;

/// Durable per-resource high-water marks.
///
/// Implementations guarantee: the mark of a resource never goes down, and once
/// [`raise`](HighWaterMarks::raise) has returned, the raised mark survives a crash of the process.
pub trait HighWaterMarks: Send + Sync + 'static {
    /// The mark of `resource`, or `None` if no token was ever admitted for it.
    fn get<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>>;

    /// Raises the mark of `resource` to `token` unless it is already at or above it, durably,
    /// and returns the mark after the call (≥ `token`).
    fn raise<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<Token, StoreError>>;

    /// Whether a raise can be made now, for readiness: a small write of the store's own, made
    /// durable the way a raise is (SQLite: fsynced; PostgreSQL: committed), touching no mark.
    /// `Err` when a raise would fail — a full disk, a read-only database, a lock held elsewhere.
    /// Gates call it at most once per [`PROBE_TTL`].
    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>>;

    /// A failure after which the store refuses every call until the process restarts (SQLite:
    /// its file was removed or replaced while running), once one was seen; `None` otherwise.
    /// Gates check it before admitting any write, so it must be cheap (no I/O).
    fn failed(&self) -> Option<StoreError> {
        None
    }
}

/// A store chosen at run time (e.g. from `--store`).
impl HighWaterMarks for Box<dyn HighWaterMarks> {
    fn get<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        (**self).get(resource)
    }

    fn raise<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<Token, StoreError>> {
        (**self).raise(resource, token)
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        (**self).probe()
    }

    fn failed(&self) -> Option<StoreError> {
        (**self).failed()
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
/// Big-endian `era ‖ revision`: byte order equals token order, so stores compare marks as blobs.
pub(crate) fn encode(token: Token) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&token.era.to_be_bytes());
    out[8..].copy_from_slice(&token.revision.to_be_bytes());
    out
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
/// Inverse of [`encode`].
pub(crate) fn decode(bytes: &[u8]) -> Result<Token, StoreError> {
    let bytes: [u8; 16] = bytes
        .try_into()
        .map_err(|_| StoreError(format!("stored mark has {} bytes, not 16", bytes.len())))?;
    let mut era = [0u8; 8];
    let mut revision = [0u8; 8];
    era.copy_from_slice(&bytes[..8]);
    revision.copy_from_slice(&bytes[8..]);
    Ok(Token::new(
        u64::from_be_bytes(era),
        u64::from_be_bytes(revision),
    ))
}

#[cfg(all(test, any(feature = "sqlite", feature = "postgres")))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn encoding_preserves_order(a in any::<(u64, u64)>(), b in any::<(u64, u64)>()) {
            let (ta, tb) = (Token::new(a.0, a.1), Token::new(b.0, b.1));
            prop_assert_eq!(ta.cmp(&tb), encode(ta).cmp(&encode(tb)));
            prop_assert_eq!(decode(&encode(ta)).unwrap(), ta);
        }
    }
}

/// The contract every store's tests check: no mark until a raise, a raise never lowers a mark,
/// a higher era beats any revision, resources are independent.
#[cfg(test)]
pub(crate) async fn assert_marks_only_rise(store: &impl HighWaterMarks) {
    assert_eq!(store.get("r").await.ok(), Some(None));
    assert_eq!(
        store.raise("r", Token::new(0, 5)).await.ok(),
        Some(Token::new(0, 5))
    );
    assert_eq!(
        store.raise("r", Token::new(0, 3)).await.ok(),
        Some(Token::new(0, 5))
    );
    assert_eq!(
        store.raise("r", Token::new(1, 0)).await.ok(),
        Some(Token::new(1, 0))
    );
    assert_eq!(store.get("r").await.ok(), Some(Some(Token::new(1, 0))));
    assert_eq!(store.get("other").await.ok(), Some(None));
}
