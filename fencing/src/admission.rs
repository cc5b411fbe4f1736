//! The seam between the fencing layer and what decides admission: the in-process [`Gate`]
//! (one enforcer, any store) or the PostgreSQL-wide gate shared by several enforcers.
//!
//! [`Gate`]: crate::Gate

use futures::future::BoxFuture;

use crate::gate::GateError;
use crate::Token;

/// An admitted write. Hold it until the write has completed at the storage; dropping it lets
/// higher tokens waiting for this write proceed.
#[must_use = "the write counts as in flight until the permit is dropped"]
pub struct Permit {
    _guard: Box<dyn Send>,
}

impl Permit {
    pub(crate) fn new(guard: impl Send + 'static) -> Self {
        Self {
            _guard: Box::new(guard),
        }
    }
}

/// Admits writes in token order per resource (see [`crate::gate`] for the rules).
pub trait Admission: Send + Sync + 'static {
    /// Admits a write with `token` on `resource`, or refuses it.
    fn admit<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<Permit, GateError>>;

    /// Whether the mark store answers, for readiness probes.
    fn ready(&self) -> BoxFuture<'_, bool>;
}
