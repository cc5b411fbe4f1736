//! The background task that keeps a grant or a session alive: renewals at a third of the TTL
//! (±10 %), retries of transient failures, and the deadline timer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::liveness::{Liveness, LostReason};
use crate::test_mode::Fault;
use crate::upkeep::{deadline_after, lifetime};
use crate::{Client, Error, Result};

/// First pause before retrying a renewal that failed (doubled up to [`MAX_RETRY_PAUSE`]).
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Longest pause between retries of a failed renewal.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(1);
/// The shortest pause between two renewals, whatever the answers say.
pub(crate) const MIN_RENEW_INTERVAL: Duration = Duration::from_millis(100);

/// What is kept alive.
#[derive(Clone)]
pub(crate) enum Target {
    /// A grant, renewed by `POST /v1/leases/{resource}/renew`.
    Grant { resource: String, secret: String },
    /// A session, renewed by `POST /v1/sessions/{id}/keepalive`.
    Session { id: String, secret: String },
}

impl Target {
    /// The resource, or the session's id.
    fn name(&self) -> &str {
        match self {
            Target::Grant { resource, .. } => resource,
            Target::Session { id, .. } => id,
        }
    }

    /// Releases the grant (closes the session) on the proxy. A failure is left alone: the
    /// grant then ends at its TTL, as nothing renews it any more.
    async fn end(self, client: Client) {
        let _ended = match &self {
            Target::Grant { resource, secret } => client.release(resource, secret).await,
            Target::Session { id, secret } => client.close(id, secret).await,
        };
    }
}

/// The background renewal of one grant or session.
pub(crate) struct Renewer {
    pub(crate) client: Client,
    pub(crate) target: Target,
    /// The lifetime the last successful answer granted (the renewal period is a third).
    pub(crate) lifetime: Duration,
    pub(crate) liveness: Arc<Liveness>,
    /// Test hook: renewals are skipped while set.
    pub(crate) paused: Arc<AtomicBool>,
}

impl Renewer {
    /// Renews until stopped or lost; marks it lost at the deadline whatever the renewals do.
    /// `granted` is the instant read before sending the request that made the grant.
    pub(crate) async fn run(self, stop: CancellationToken, granted: Instant) {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = self.liveness.expire_at_deadline() => {}
            _ = self.renew_loop(granted) => {}
        }
    }

    /// One renewal: the lifetime it grants ([`lifetime`]), or why not.
    async fn renew(&self) -> Result<Duration> {
        if self
            .client
            .injects(Fault::FailedRenewal, self.target.name())
        {
            // As if the proxy were unreachable: nothing is sent, and it is retried.
            return Err(Error::Timeout);
        }
        let (ttl_seconds, expires_in_ms) = match &self.target {
            Target::Grant { resource, secret } => self
                .client
                .renew(resource, secret)
                .await
                .map(|r| (r.ttl_seconds, r.expires_in_ms))?,
            Target::Session { id, secret } => self
                .client
                .keepalive(id, secret)
                .await
                .map(|h| (h.ttl_seconds, h.expires_in_ms))?,
        };
        Ok(lifetime(ttl_seconds, expires_in_ms, Duration::ZERO))
    }

    /// Renews at a third of the lifetime last granted (±10 %, at least [`MIN_RENEW_INTERVAL`])
    /// after the last successful renewal was sent; any other failure than a 410 is retried
    /// with a short backoff (the deadline timer bounds it); a 410, or an answer granting no
    /// time (`ttl_seconds` 0), ends it at once.
    async fn renew_loop(&self, granted: Instant) {
        let mut last = granted;
        let mut granted_for = self.lifetime;
        loop {
            tokio::time::sleep_until(last + renew_interval(granted_for)).await;
            if self.paused.load(Ordering::SeqCst) {
                last = Instant::now();
                continue;
            }
            if self.injected_at_due(granted_for).await {
                return;
            }
            let mut pause = FIRST_RETRY_PAUSE;
            loop {
                let sent = Instant::now();
                match self.renew().await {
                    Ok(lifetime) if lifetime.is_zero() => {
                        self.liveness.lose(LostReason::Expired);
                        return;
                    }
                    Ok(lifetime) => {
                        let margin = self.client.safety_margin();
                        self.liveness.extend(deadline_after(sent, lifetime, margin));
                        last = sent;
                        granted_for = lifetime;
                        break;
                    }
                    Err(Error::Lost | Error::SessionLost) => {
                        self.liveness.lose(LostReason::Revoked);
                        return;
                    }
                    Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(MAX_RETRY_PAUSE);
                    }
                }
            }
        }
    }
}

impl Renewer {
    /// The test mode's chances at a renewal due: the guard lost (`true`: renew no more), or
    /// the renewal sent late (waited for here, while the deadline timer runs on).
    async fn injected_at_due(&self, granted_for: Duration) -> bool {
        let name = self.target.name();
        if self.client.injects(Fault::Loss, name) {
            // Lost first, as if the renewal had been refused, then ended on the proxy from a
            // task of its own: the deadline timer's `select!` drops this one once it is lost,
            // and the event stream may tell of the release before its answer arrives.
            self.liveness.lose_injected(LostReason::Revoked);
            tokio::spawn(self.target.clone().end(self.client.clone()));
            return true;
        }
        if self.client.injects(Fault::LateRenewal, name) {
            tokio::time::sleep(self.client.late_by(granted_for)).await;
        }
        false
    }
}

/// The pause after a renewal granting `lifetime`: a third of it ±10 %, at least
/// [`MIN_RENEW_INTERVAL`].
fn renew_interval(lifetime: Duration) -> Duration {
    jittered(lifetime / 3).max(MIN_RENEW_INTERVAL)
}

/// `base` ±10 %.
fn jittered(base: Duration) -> Duration {
    base.mul_f64(rand::rng().random_range(0.9..=1.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent() {
        let base = Duration::from_secs(10);
        for _ in 0..1000 {
            let j = jittered(base);
            assert!(j >= Duration::from_secs(9) && j <= Duration::from_secs(11));
        }
        assert_eq!(renew_interval(Duration::ZERO), MIN_RENEW_INTERVAL);
        assert_eq!(
            renew_interval(Duration::from_millis(30)),
            MIN_RENEW_INTERVAL
        );
    }
}
