//! One etcd watch over every ownership key, fanned out to the requests waiting for a resource.
//!
//! Waiting acquires (`wait_ms`) subscribe here instead of polling or opening a watch each: the
//! watcher task turns every deletion of `{prefix}holders/{resource}` (release or lease expiry)
//! into a [`Wakeup::Released`]. Whenever the watch had to be re-opened, events may have been
//! missed, so it sends [`Wakeup::All`] and every waiter tries again.

use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Etcd, Pinned};

const CHANNEL: usize = 4096;
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Why a waiter should try to acquire again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wakeup {
    /// The ownership key of this resource was deleted.
    Released(String),
    /// Events may have been missed; everyone retry.
    All,
}

impl Wakeup {
    /// Whether a waiter for `resource` should retry.
    pub(crate) fn concerns(&self, resource: &str) -> bool {
        match self {
            Wakeup::Released(r) => r == resource,
            Wakeup::All => true,
        }
    }
}

/// Subscription point for ownership-key deletions.
#[derive(Clone)]
pub(crate) struct HolderEvents {
    tx: broadcast::Sender<Wakeup>,
}

impl HolderEvents {
    /// Starts the watcher on `tracker`; it stops when `cancel` fires.
    pub(crate) fn start(
        etcd: &Etcd,
        holders_prefix: String,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let (tx, _) = broadcast::channel(CHANNEL);
        tracker.spawn(watch_loop(etcd.clone(), holders_prefix, tx.clone(), cancel));
        Self { tx }
    }

    /// A receiver of every wakeup from now on. Subscribe *before* checking the resource, so a
    /// release between the check and the wait is not missed. A lagging receiver should treat
    /// the lag as [`Wakeup::All`].
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Wakeup> {
        self.tx.subscribe()
    }
}

async fn watch_loop(
    etcd: Etcd,
    prefix: String,
    tx: broadcast::Sender<Wakeup>,
    cancel: CancellationToken,
) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let Pinned { index, mut client } = etcd.pinned();
        let opened = tokio::select! {
            _ = cancel.cancelled() => return,
            r = tokio::time::timeout(
                etcd.timeout(),
                client.watch(prefix.as_str(), Some(WatchOptions::new().with_prefix())),
            ) => r,
        };
        match opened {
            Ok(Ok(mut stream)) => {
                // The watch starts now: anything deleted while it was down was not seen.
                let _ = tx.send(Wakeup::All);
                loop {
                    let message = tokio::select! {
                        _ = cancel.cancelled() => return,
                        m = stream.message() => m,
                    };
                    match message {
                        Ok(Some(resp)) => {
                            backoff = MIN_BACKOFF;
                            if resp.canceled() {
                                tracing::warn!(
                                    reason = resp.cancel_reason(),
                                    "holder watch cancelled by etcd"
                                );
                                break;
                            }
                            for event in resp.events() {
                                if event.event_type() != EventType::Delete {
                                    continue;
                                }
                                let Some(kv) = event.kv() else { continue };
                                if let Some(resource) = kv
                                    .key()
                                    .strip_prefix(prefix.as_bytes())
                                    .and_then(|r| std::str::from_utf8(r).ok())
                                {
                                    let _ = tx.send(Wakeup::Released(resource.to_owned()));
                                }
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "holder watch failed");
                            break;
                        }
                    }
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot open holder watch"),
            Err(_) => tracing::warn!("opening the holder watch timed out"),
        }
        etcd.unpin(index);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
