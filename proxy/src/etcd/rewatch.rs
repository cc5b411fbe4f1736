//! Long-lived watches that re-open themselves: the holder watch (`lease::view`) and the
//! deletion watch waiters use (`deletions`) both read a starting point, follow a watch until it
//! fails, and start again after a pause — written once here.

use std::future::Future;
use std::time::Duration;

use etcd_client::{WatchOptions, WatchResponse};
use runtime::backoff::Backoff;
use tokio_util::sync::CancellationToken;

use super::Etcd;

/// Pauses between re-opening a failed watch; reset once a watch has delivered anything.
const REOPEN: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));

/// Runs `round` (read a starting point, then [`Etcd::follow`] a watch) again and again until
/// `cancel` fires, pausing between rounds; a round that delivered a response (it answers
/// `true`) starts the pauses again from the shortest.
pub(crate) async fn reopening<Fut>(cancel: CancellationToken, mut round: impl FnMut() -> Fut)
where
    Fut: Future<Output = bool>,
{
    let mut backoff = REOPEN;
    loop {
        let delivered = tokio::select! {
            _ = cancel.cancelled() => return,
            delivered = round() => delivered,
        };
        if delivered {
            backoff.reset();
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff.pause()) => {}
        }
    }
}

impl Etcd {
    /// Opens the `what` watch of `prefix` with `options` and hands every response to `each`
    /// until the watch ends, fails or is cancelled by etcd; whether any response came.
    pub(crate) async fn follow(
        &self,
        prefix: &str,
        options: WatchOptions,
        what: &str,
        mut each: impl FnMut(&WatchResponse),
    ) -> bool {
        let Some((index, mut stream)) = self.open_watch(prefix, options, what).await else {
            return false;
        };
        let mut delivered = false;
        loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    delivered = true;
                    if resp.canceled() {
                        tracing::warn!(
                            reason = resp.cancel_reason(),
                            "{what} watch cancelled by etcd"
                        );
                        return delivered;
                    }
                    each(&resp);
                }
                Ok(None) => return delivered,
                Err(e) => {
                    tracing::warn!(error = %e, "{what} watch failed");
                    self.unpin(index);
                    return delivered;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::time::Instant;

    use super::*;

    /// Failing rounds are spaced by the doubling pauses; a round that delivered starts them
    /// again from the shortest. On a paused clock: the spacing is exact and nothing sleeps.
    #[tokio::test(start_paused = true)]
    async fn rounds_are_spaced_by_a_backoff_that_progress_resets() {
        let started = Instant::now();
        let rounds = Arc::new(std::sync::Mutex::new(Vec::new()));
        let count = Arc::new(AtomicUsize::new(0));
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let (seen, n) = (rounds.clone(), count.clone());
        reopening(cancel, move || {
            let (seen, n, stop) = (seen.clone(), n.clone(), stop.clone());
            async move {
                let i = n.fetch_add(1, Ordering::SeqCst);
                seen.lock().unwrap().push(started.elapsed().as_millis());
                if i == 5 {
                    stop.cancel();
                }
                // The fourth round (at 350 ms) delivers something.
                i == 3
            }
        })
        .await;
        // Pauses 50, 100, 200; the round at 350 delivered, so 50 again, then 100.
        assert_eq!(*rounds.lock().unwrap(), [0, 50, 150, 350, 400, 500]);
    }
}
