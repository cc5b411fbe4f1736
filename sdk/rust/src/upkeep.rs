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

/// The most time one answer may grant (2^31 s): beyond any real TTL, keeps every timer finite.
pub(crate) const MAX_LIFETIME: Duration = Duration::from_secs(1 << 31);

/// How long an acquire, renewal or keepalive answer grants from the instant its request was
/// sent: its `expires_in_ms`, but never more than its `ttl_seconds` plus `slack` (the wait
/// allowance of a queued acquire: the proxy counts the TTL from the grant), nor
/// [`MAX_LIFETIME`]. Zero when `ttl_seconds` is 0: the answer grants nothing, the guard is lost.
pub(crate) fn lifetime(ttl_seconds: u64, expires_in_ms: u64, slack: Duration) -> Duration {
    if ttl_seconds == 0 {
        return Duration::ZERO;
    }
    let most = Duration::from_secs(ttl_seconds).saturating_add(slack);
    Duration::from_millis(expires_in_ms)
        .min(most)
        .min(MAX_LIFETIME)
}

/// The stop-by deadline a successful request gives: `sent`, the monotonic instant read just
/// before the request was sent, plus the `lifetime` its answer grants — which the proxy's lease
/// cannot end before (the proxy measures `expires_in_ms` from when the request reached it,
/// which is later) — less a safety margin: time for the work to notice and stop before anyone
/// else can be granted the resource. The margin is `safety_margin`, or by default a tenth of
/// the lifetime, at least 100 ms; never more than the lifetime.
pub(crate) fn deadline_after(
    sent: Instant,
    lifetime: Duration,
    safety_margin: Option<Duration>,
) -> Instant {
    let margin = safety_margin
        .unwrap_or_else(|| (lifetime / 10).max(MIN_SAFETY_MARGIN))
        .min(lifetime);
    sent.checked_add(lifetime - margin).unwrap_or(sent)
}

/// The stop-by deadline a guard ([`crate::Lease`], [`crate::Session`]) moves to when the
/// acquire, renewal or keepalive sent at `sent` (the monotonic instant read just before
/// sending) is answered with `ttl_seconds` and `expires_in_ms`: `sent` plus what the answer
/// grants ([`lifetime`]; `wait` is the wait the acquire allowed, zero for a renewal) less the
/// safety margin (`None`: the default, as [`crate::ClientBuilder::safety_margin`] unset).
/// For programs that call the API without the guard and for tools that judge what a guard
/// would have believed: the same instant, computed once.
pub fn stop_by(
    sent: Instant,
    ttl_seconds: u64,
    expires_in_ms: u64,
    wait: Duration,
    safety_margin: Option<Duration>,
) -> Instant {
    deadline_after(
        sent,
        lifetime(ttl_seconds, expires_in_ms, wait),
        safety_margin,
    )
}

/// The least default safety margin.
const MIN_SAFETY_MARGIN: Duration = Duration::from_millis(100);

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
    /// the `lifetime` its answer grants less the safety margin ([`deadline_after`]), unless
    /// renewed. A zero lifetime is lost at once ([`LostReason::Expired`]).
    pub(crate) fn granted(
        sent: Instant,
        lifetime: Duration,
        safety_margin: Option<Duration>,
    ) -> Self {
        let upkeep = Self::new(Liveness::new(deadline_after(sent, lifetime, safety_margin)));
        if lifetime.is_zero() {
            upkeep.liveness.lose(LostReason::Expired);
        }
        upkeep
    }

    /// Starts the background renewal of `target` (at a third of `lifetime`, ±10 %, at least
    /// 100 ms) and the deadline timer, until [`Upkeep::end`]. `sent` is the instant read before
    /// sending the request that made the grant (or opened the session). Nothing is started for
    /// a guard already lost.
    pub(crate) fn renew(&self, client: Client, target: Target, lifetime: Duration, sent: Instant) {
        if self.liveness.check() {
            return;
        }
        let renewer = Renewer {
            client,
            target,
            lifetime,
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
    async fn held_until_the_instant_before_sending_plus_expires_in_ms_less_the_margin() {
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await; // the request's round trip
        let upkeep = Upkeep::granted(sent, Duration::from_millis(1500), None);
        // Less the default margin: a tenth of the lifetime.
        assert_eq!(upkeep.deadline(), sent + Duration::from_millis(1350));
        tokio::time::advance(Duration::from_millis(1049)).await;
        assert!(!upkeep.is_lost());
        // No timer runs: `is_lost` reads the clock.
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(upkeep.is_lost());
        assert_eq!(upkeep.lost_reason().await, LostReason::Expired);
    }

    #[test]
    fn stop_by_is_the_deadline_a_guard_moves_to() {
        let ms = Duration::from_millis;
        let sent = Instant::now();
        for (ttl, expires, wait, margin) in [
            (3, 2900, Duration::ZERO, None),
            (3, 7000, ms(5000), None),
            (3, 2900, Duration::ZERO, Some(ms(1000))),
            (0, 2900, Duration::ZERO, None),
        ] {
            let guard = Upkeep::granted(sent, lifetime(ttl, expires, wait), margin);
            assert_eq!(stop_by(sent, ttl, expires, wait, margin), guard.deadline());
        }
        assert_eq!(
            stop_by(sent, 3, 2900, Duration::ZERO, None),
            sent + ms(2610)
        );
    }

    #[test]
    fn a_lifetime_is_capped_by_the_ttl_and_zero_without_one() {
        let ms = Duration::from_millis;
        assert_eq!(lifetime(3, 2900, Duration::ZERO), ms(2900));
        assert_eq!(lifetime(3, 1_000_000_000_000_000, Duration::ZERO), ms(3000));
        assert_eq!(lifetime(3, u64::MAX, Duration::ZERO), ms(3000));
        // A queued acquire: the TTL counts from the grant, up to the wait after sending.
        assert_eq!(lifetime(3, 7000, ms(5000)), ms(7000));
        assert_eq!(lifetime(3, u64::MAX, ms(5000)), ms(8000));
        assert_eq!(lifetime(u64::MAX, u64::MAX, Duration::MAX), MAX_LIFETIME);
        assert_eq!(lifetime(0, 5000, ms(5000)), Duration::ZERO);
        let now = Instant::now();
        assert_eq!(deadline_after(now, ms(5000), None), now + ms(4500));
        assert_eq!(deadline_after(now, ms(500), None), now + ms(400)); // at least 100 ms
        assert_eq!(deadline_after(now, ms(5), None), now); // never more than the lifetime
        assert_eq!(
            deadline_after(now, ms(5000), Some(ms(2000))),
            now + ms(3000)
        );
        assert_eq!(deadline_after(now, ms(5000), Some(ms(0))), now + ms(5000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_lifetime_is_lost_at_once() {
        let upkeep = Upkeep::granted(Instant::now(), Duration::ZERO, None);
        assert!(upkeep.is_lost());
        assert_eq!(upkeep.lost_reason().await, LostReason::Expired);
    }

    #[tokio::test(start_paused = true)]
    async fn ending_marks_it_released() {
        let upkeep = Upkeep::granted(Instant::now(), Duration::from_secs(10), None);
        let lost = upkeep.lost();
        upkeep.end();
        assert!(lost.is_cancelled() && upkeep.is_lost());
        assert_eq!(upkeep.lost_reason().await, LostReason::Released);
    }
}
