//! Readiness from a write probe: whether the store can make a raise now, learnt by making a
//! small durable write of its own ([`HighWaterMarks::probe`](super::HighWaterMarks::probe)) —
//! a store that answers reads while every write fails (a full disk, a read-only standby, a lock
//! held elsewhere) is not ready. A success is kept for [`PROBE_TTL`], so a healthy store costs one
//! probe write per TTL however often readiness is asked; a failure is not kept, so a store that
//! recovers is ready at the next check. Concurrent checks share one probe.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::StoreError;

/// How long a successful probe answers readiness checks (load balancers and orchestrators may ask
/// several times a second; each probe is a durable write). Readiness follows a store that stops
/// taking writes within this time (plus the probe's own deadline).
pub const PROBE_TTL: Duration = Duration::from_secs(1);

/// When a probe last succeeded, shared by every readiness check of one gate.
#[derive(Debug, Default)]
pub(crate) struct Readiness {
    last_success: tokio::sync::Mutex<Option<Instant>>,
}

impl Readiness {
    /// Whether the store can make a raise: `true` if a probe succeeded within [`PROBE_TTL`],
    /// else `probe()`'s outcome (the caller bounds it with the store deadline). Checks arriving
    /// while a probe runs wait for it, then use its success or probe again.
    pub(crate) async fn check<F>(&self, probe: impl FnOnce() -> F) -> bool
    where
        F: Future<Output = Result<(), StoreError>>,
    {
        let mut last_success = self.last_success.lock().await;
        if last_success.is_some_and(|at| at.elapsed() < PROBE_TTL) {
            return true;
        }
        match probe().await {
            Ok(()) => {
                *last_success = Some(Instant::now());
                true
            }
            Err(e) => {
                *last_success = None;
                tracing::warn!(error = %e, "readiness probe failed: a raise cannot be made");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn a_success_answers_for_its_ttl_a_failure_is_probed_again() {
        let readiness = Arc::new(Readiness::default());
        let probes = Arc::new(AtomicUsize::new(0));
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let check = || {
            let (readiness, probes, failing) = (readiness.clone(), probes.clone(), failing.clone());
            async move {
                readiness
                    .check(|| async move {
                        probes.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if failing.load(Ordering::SeqCst) {
                            Err(StoreError("full".into()))
                        } else {
                            Ok(())
                        }
                    })
                    .await
            }
        };
        let together = futures::future::join_all((0..5).map(|_| tokio::spawn(check()))).await;
        assert!(together.into_iter().all(|r| r.unwrap()));
        assert_eq!(
            probes.load(Ordering::SeqCst),
            1,
            "concurrent checks probed twice"
        );
        tokio::time::advance(PROBE_TTL / 2).await;
        assert!(check().await);
        assert_eq!(
            probes.load(Ordering::SeqCst),
            1,
            "probed again within the TTL"
        );
        failing.store(true, Ordering::SeqCst);
        tokio::time::advance(PROBE_TTL).await;
        assert!(!check().await, "a failed probe read as ready");
        assert!(!check().await);
        assert_eq!(probes.load(Ordering::SeqCst), 3, "a failure was kept");
        failing.store(false, Ordering::SeqCst);
        assert!(check().await, "readiness did not come back at once");
        assert!(check().await);
        assert_eq!(probes.load(Ordering::SeqCst), 4);
    }
}
