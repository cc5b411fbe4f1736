//! Whether a lease (or a session) is still held: its conservative deadline on the monotonic
//! clock, the `lost` signal and why it was lost. Shared by a guard and its background task.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why a lease or a session stopped being held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// Its deadline passed without a successful renewal.
    Expired,
    /// The grant (or session) ended on the server: the proxy answered 410, or its event stream
    /// told of the end (released or expired other than by this guard, or a later grant made).
    Revoked,
    /// The session it lives under was lost.
    SessionLost,
    /// It was released (or closed) by its guard.
    Released,
    /// A fleet moved the resource to another member: finish, then release it (the service
    /// revokes it at the hand-off's deadline otherwise).
    HandedOff,
}

/// The state of one lease or session.
#[derive(Debug)]
pub(crate) struct Liveness {
    lost: CancellationToken,
    state: Mutex<State>,
    /// The session a lease lives under: its deadline is the session's, and its `lost` is a
    /// child of the session's.
    parent: Option<Arc<Liveness>>,
}

#[derive(Debug)]
struct State {
    deadline: Instant,
    reason: Option<LostReason>,
    /// The client's test mode caused the loss.
    injected: bool,
}

impl Liveness {
    /// Held until `deadline` unless renewed.
    pub(crate) fn new(deadline: Instant) -> Arc<Self> {
        Arc::new(Self {
            lost: CancellationToken::new(),
            state: Mutex::new(State {
                deadline,
                reason: None,
                injected: false,
            }),
            parent: None,
        })
    }

    /// Held as long as `session` is (and until lost on its own).
    pub(crate) fn under(session: &Arc<Liveness>) -> Arc<Self> {
        Arc::new(Self {
            lost: session.lost.child_token(),
            state: Mutex::new(State {
                deadline: session.deadline(),
                reason: None,
                injected: false,
            }),
            parent: Some(session.clone()),
        })
    }

    /// The session's state, for a lease under one.
    pub(crate) fn session(&self) -> Option<&Arc<Liveness>> {
        self.parent.as_ref()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The conservative deadline: held at least until then unless lost earlier.
    pub(crate) fn deadline(&self) -> Instant {
        match &self.parent {
            Some(session) => session.deadline(),
            None => self.state().deadline,
        }
    }

    /// Moves the deadline to `deadline` when that is later (a renewal never shortens a lease)
    /// and it is not lost (a loss, once seen, stays).
    pub(crate) fn extend(&self, deadline: Instant) {
        let mut state = self.state();
        if deadline > state.deadline && !self.lost.is_cancelled() {
            state.deadline = deadline;
        }
    }

    /// Marks it lost for `reason`, unless it already was (the first reason stays).
    pub(crate) fn lose(&self, reason: LostReason) {
        self.lose_as(reason, false);
    }

    /// Marks it lost for `reason` by the client's test mode, unless it already was.
    pub(crate) fn lose_injected(&self, reason: LostReason) {
        self.lose_as(reason, true);
    }

    fn lose_as(&self, reason: LostReason, injected: bool) {
        let mut state = self.state();
        if state.reason.is_none() && !self.lost.is_cancelled() {
            state.reason = Some(reason);
            state.injected = injected;
        }
        self.lost.cancel();
    }

    /// Whether it is lost and the client's test mode caused it (for a lease lost with its
    /// session, the session's loss).
    pub(crate) fn injected(&self) -> bool {
        if !self.check() {
            return false;
        }
        let (reason, injected) = {
            let state = self.state();
            (state.reason, state.injected)
        };
        match (reason, &self.parent) {
            (None, Some(session)) => session.injected(),
            _ => injected,
        }
    }

    /// Whether it is lost, reading the clock: past the deadline it is lost now, even if the
    /// deadline timer has not run yet (a process resumed after being stopped).
    pub(crate) fn check(&self) -> bool {
        if let Some(session) = &self.parent {
            session.check();
        } else if Instant::now() >= self.deadline() {
            self.lose(LostReason::Expired);
        }
        self.lost.is_cancelled()
    }

    /// The `lost` token, cancelled first if the deadline has passed.
    pub(crate) fn token(&self) -> CancellationToken {
        self.check();
        self.lost.clone()
    }

    /// Why it was lost, once it is.
    pub(crate) fn reason(&self) -> Option<LostReason> {
        if !self.check() {
            return None;
        }
        self.state().reason.or(Some(LostReason::SessionLost))
    }

    /// Waits until it is lost and says why.
    pub(crate) async fn lost_reason(&self) -> LostReason {
        loop {
            if let Some(reason) = self.reason() {
                return reason;
            }
            tokio::select! {
                _ = self.lost.cancelled() => {}
                _ = tokio::time::sleep_until(self.deadline()) => {}
            }
        }
    }

    /// The deadline timer: returns once the deadline passed without being extended, having
    /// marked it lost ([`LostReason::Expired`]), or once it was lost for another reason.
    pub(crate) async fn expire_at_deadline(&self) {
        loop {
            let deadline = self.deadline();
            tokio::select! {
                _ = self.lost.cancelled() => return,
                _ = tokio::time::sleep_until(deadline) => {}
            }
            if self.check() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_deadline_timer_fires_at_the_deadline_and_follows_extensions() {
        let start = Instant::now();
        let l = Liveness::new(start + Duration::from_secs(3));
        let timer = tokio::spawn({
            let l = l.clone();
            async move { l.expire_at_deadline().await }
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        l.extend(start + Duration::from_secs(5));
        l.extend(start + Duration::from_secs(4)); // never shortens
        tokio::time::sleep(Duration::from_millis(2999)).await;
        assert!(!l.check());
        timer.await.unwrap();
        assert_eq!(Instant::now(), start + Duration::from_secs(5));
        assert_eq!(l.reason(), Some(LostReason::Expired));
        l.extend(start + Duration::from_secs(9));
        assert_eq!(l.deadline(), start + Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_reason_stays_and_a_session_loss_reaches_its_leases() {
        let session = Liveness::new(Instant::now() + Duration::from_secs(10));
        let a = Liveness::under(&session);
        let b = Liveness::under(&session);
        b.lose(LostReason::Released);
        assert_eq!(b.reason(), Some(LostReason::Released));
        assert_eq!(a.reason(), None);
        session.lose(LostReason::Revoked);
        session.lose(LostReason::Expired);
        assert_eq!(session.reason(), Some(LostReason::Revoked));
        assert!(a.token().is_cancelled());
        assert_eq!(a.lost_reason().await, LostReason::SessionLost);
        a.lose(LostReason::Released);
        assert_eq!(a.reason(), Some(LostReason::SessionLost));
        assert_eq!(b.reason(), Some(LostReason::Released));
        assert!(!session.injected() && !a.injected() && !b.injected());
    }

    #[tokio::test(start_paused = true)]
    async fn an_injected_loss_is_told_apart_and_reaches_the_sessions_leases() {
        let session = Liveness::new(Instant::now() + Duration::from_secs(10));
        let a = Liveness::under(&session);
        let b = Liveness::under(&session);
        b.lose(LostReason::Released);
        assert!(!session.injected(), "held: nothing injected");
        session.lose_injected(LostReason::Revoked);
        session.lose(LostReason::Expired);
        assert_eq!(session.reason(), Some(LostReason::Revoked));
        assert!(session.injected());
        assert_eq!(a.reason(), Some(LostReason::SessionLost));
        assert!(a.injected(), "lost with its session");
        assert!(!b.injected(), "released before");
        let lease = Liveness::new(Instant::now() + Duration::from_secs(10));
        lease.lose(LostReason::Revoked);
        lease.lose_injected(LostReason::Revoked);
        assert!(!lease.injected(), "the first loss stays");
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_deadline_it_is_lost_without_any_timer() {
        let session = Liveness::new(Instant::now() + Duration::from_secs(1));
        let lease = Liveness::under(&session);
        // Nothing awaits the deadline: only the clock is read.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(lease.check());
        assert_eq!(lease.reason(), Some(LostReason::SessionLost));
        assert_eq!(session.reason(), Some(LostReason::Expired));
    }
}
