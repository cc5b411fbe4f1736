//! The seam between the fencing layer and what decides admission: the in-process [`Gate`]
//! (one enforcer, any store) or the PostgreSQL-wide gate shared by several enforcers.
//!
//! An admitted write holds a [`Permit`] for as long as it is *in flight at the storage*
//! (docs/DESIGN.md §4): from admission until its exchange with the storage has completely ended.
//! The holder then says how it ended: [`Permit::complete`] when the request was fully sent and the
//! answer fully read, [`Permit::uncertain`] otherwise (timeout, reset, an early answer, the client
//! gone). An uncertain write keeps the resource closed to higher tokens for the gate's *write
//! grace*, since the storage may still be applying it. Dropping a permit is the same as
//! [`Permit::uncertain`]: a permit lost on a path nobody thought of errs on the safe side.
//!
//! [`Gate`]: crate::Gate

use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::error::GateError;
use crate::Token;

/// How long an uncertain write keeps a resource closed to higher tokens unless configured: the
/// storage must finish (or abandon) any write within this time of its exchange ending.
pub const DEFAULT_WRITE_GRACE: Duration = Duration::from_secs(10);

/// How long a write's whole exchange may take unless configured (see
/// [`FencingLayer::with_exchange_deadline`]); a shared gate's registration lasts this plus the
/// write grace.
///
/// [`FencingLayer::with_exchange_deadline`]: crate::FencingLayer::with_exchange_deadline
pub const DEFAULT_EXCHANGE_DEADLINE: Duration = Duration::from_secs(30);

/// How an admitted write's exchange with the storage ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The request was fully sent and the answer fully read: the storage is done with it.
    Complete,
    /// The exchange ended without a complete answer: the storage may still apply the write, so
    /// the resource stays closed to higher tokens for the write grace.
    Uncertain,
}

/// What an admission implementation does when a permit ends. Implemented by each gate's guard.
pub trait Release: Send + 'static {
    /// Ends the admitted write with `outcome`. Called exactly once, possibly outside any async
    /// context (so it must not block; spawn if it needs to talk to a database).
    fn release(self: Box<Self>, outcome: Outcome);
}

/// An admitted write. Hold it until the exchange with the storage has ended, then call
/// [`Permit::complete`] or [`Permit::uncertain`]; dropping it counts as uncertain.
#[must_use = "the write counts as in flight until the permit is ended"]
pub struct Permit {
    guard: Option<Box<dyn Release>>,
    deadline: Option<Instant>,
}

impl Permit {
    /// A permit ended through `guard`, with no deadline of its own.
    pub fn new(guard: impl Release) -> Self {
        Self {
            guard: Some(Box::new(guard)),
            deadline: None,
        }
    }

    /// The same permit, whose write must be over at the storage by `deadline`: nothing of the
    /// write may be sent after it. A gate whose record of the write lapses on a clock that the
    /// gateway's process does not stop (a registration in a shared database) sets it, measured
    /// from *before* that record was made, so that a pause of the process anywhere between the
    /// record and the exchange eats into the exchange, never past the record.
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// When the write's exchange must have ended, if the gate says so.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The write's exchange ended completely: higher tokens may proceed now.
    pub fn complete(mut self) {
        self.end(Outcome::Complete);
    }

    /// The write's exchange ended without a complete answer: higher tokens wait out the grace.
    pub fn uncertain(mut self) {
        self.end(Outcome::Uncertain);
    }

    /// Ends the write with `outcome`.
    pub fn end(&mut self, outcome: Outcome) {
        if let Some(guard) = self.guard.take() {
            guard.release(outcome);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.end(Outcome::Uncertain);
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("ended", &self.guard.is_none())
            .field("deadline", &self.deadline)
            .finish()
    }
}

/// Admits writes in token order per resource (see [`crate::gate`] for the rules).
///
/// Implementations must be cancellation-safe: a caller may drop the future returned by
/// [`Admission::admit`] at any await point (its client went away), and that must never leave a
/// lock, a registration or a permit behind that nobody will end.
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Records how each permit ended.
    #[derive(Clone, Default)]
    struct Ends(Arc<Mutex<Vec<Outcome>>>);

    impl Release for Ends {
        fn release(self: Box<Self>, outcome: Outcome) {
            self.0.lock().unwrap().push(outcome);
        }
    }

    impl Ends {
        fn take(&self) -> Vec<Outcome> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    #[test]
    fn a_permit_ends_once_and_dropping_it_is_uncertain() {
        let ends = Ends::default();
        Permit::new(ends.clone()).complete();
        assert_eq!(ends.take(), [Outcome::Complete]);
        Permit::new(ends.clone()).uncertain();
        assert_eq!(ends.take(), [Outcome::Uncertain]);
        // A permit lost on an unforeseen path errs on the safe side.
        drop(Permit::new(ends.clone()));
        assert_eq!(ends.take(), [Outcome::Uncertain]);
        // Ended explicitly, then dropped: released exactly once.
        let mut permit = Permit::new(ends.clone());
        assert_eq!(
            format!("{permit:?}"),
            "Permit { ended: false, deadline: None }"
        );
        permit.end(Outcome::Complete);
        assert_eq!(
            format!("{permit:?}"),
            "Permit { ended: true, deadline: None }"
        );
        drop(permit);
        assert_eq!(ends.take(), [Outcome::Complete]);
    }
}
