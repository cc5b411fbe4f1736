//! What a guard ([`crate::Lease`] or [`crate::Session`]) keeps of what it holds: whether it is
//! still held ([`Liveness`]), the stop signal of its background renewal and that renewal's
//! pause hook. The bookkeeping both guards share, written once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::liveness::{Liveness, LostReason};
use crate::renewal::{Renewer, Target};
use crate::Client;

/// The deadline a successful request gives: `sent`, the monotonic instant read just before the
/// request was sent, plus the `expires_in_ms` it answered. The proxy's lease cannot end before
/// it (the proxy measures `expires_in_ms` from when the request reached it, which is later).
pub(crate) fn deadline_after(sent: Instant, expires_in_ms: u64) -> Instant {
    sent + Duration::from_millis(expires_in_ms)
}

/// The state of one guard.
#[derive(Debug)]
pub(crate) struct Upkeep {
    liveness: Arc<Liveness>,
    /// Stops the renewal task, if any (cancelled before releasing or closing).
    stop: CancellationToken,
    /// Test hook: renewals are skipped while set.
    paused: Arc<AtomicBool>,
}

impl Upkeep {
    /// A guard whose state is `liveness`, renewed by nobody yet.
    pub(crate) fn new(liveness: Arc<Liveness>) -> Self {
        Self {
            liveness,
            stop: CancellationToken::new(),
            paused: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A guard held until `sent` (read just before sending the request that succeeded) plus
    /// the `expires_in_ms` it answered, unless renewed.
    pub(crate) fn granted(sent: Instant, expires_in_ms: u64) -> Self {
        Self::new(Liveness::new(deadline_after(sent, expires_in_ms)))
    }

    /// Starts the background renewal of `target` (at a third of `ttl`, ±10 %) and the deadline
    /// timer, until [`Upkeep::end`]. `sent` is the instant read before sending the request that
    /// made the grant (or opened the session).
    pub(crate) fn renew(&self, client: Client, target: Target, ttl: Duration, sent: Instant) {
        let renewer = Renewer {
            client,
            target,
            ttl,
            liveness: self.liveness.clone(),
            paused: self.paused.clone(),
        };
        tokio::spawn(renewer.run(self.stop.clone(), sent));
    }

    /// The shared state (for a lease under a session, and for the renewal).
    pub(crate) fn liveness(&self) -> &Arc<Liveness> {
        &self.liveness
    }

    /// The conservative deadline on the monotonic clock.
    pub(crate) fn deadline(&self) -> Instant {
        self.liveness.deadline()
    }

    /// Whether it is lost; reads the clock.
    pub(crate) fn is_lost(&self) -> bool {
        self.liveness.check()
    }

    /// The token cancelled when it is lost.
    pub(crate) fn lost(&self) -> CancellationToken {
        self.liveness.token()
    }

    /// Waits until it is lost and says why.
    pub(crate) async fn lost_reason(&self) -> LostReason {
        self.liveness.lost_reason().await
    }

    /// Stops the renewal and marks it lost ([`LostReason::Released`]): its guard releases (or
    /// closes) it next.
    pub(crate) fn end(&self) {
        self.stop.cancel();
        self.liveness.lose(LostReason::Released);
    }

    /// Test hook: skip (`true`) or send again (`false`) the renewals.
    pub(crate) fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn held_until_the_instant_before_sending_plus_expires_in_ms() {
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await; // the request's round trip
        let upkeep = Upkeep::granted(sent, 1500);
        assert_eq!(upkeep.deadline(), sent + Duration::from_millis(1500));
        tokio::time::advance(Duration::from_millis(1199)).await;
        assert!(!upkeep.is_lost());
        // No timer runs: `is_lost` reads the clock.
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(upkeep.is_lost());
        assert_eq!(upkeep.lost_reason().await, LostReason::Expired);
    }

    #[tokio::test(start_paused = true)]
    async fn ending_marks_it_released() {
        let upkeep = Upkeep::granted(Instant::now(), 10_000);
        let lost = upkeep.lost();
        upkeep.end();
        assert!(lost.is_cancelled() && upkeep.is_lost());
        assert_eq!(upkeep.lost_reason().await, LostReason::Released);
    }
}
