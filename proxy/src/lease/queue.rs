//! The wait queue: fair, first-come-first-served waiting for a held resource, across replicas.
//!
//! Modelled on etcd's `concurrency.Mutex`. A waiter puts a key
//! `{prefix}waiters/{resource}/{lease:x}-{nonce:x}`; its create revision is its place in the
//! line (etcd numbers every creation, cluster-wide, so places are comparable across replicas).
//! A waiter waits for the deletion of the entry just ahead of it (the key with the largest
//! create revision below its own), and only the waiter with nobody ahead tries to take the
//! resource. A release therefore wakes one waiter, and the next one is woken only when that
//! one leaves the line (granted, gave up, or gone).
//!
//! Entries live on one short lease per replica ([`QUEUE_TTL`]), renewed only while this
//! replica has waiters: a waiter whose client goes away deletes its entry at once (the drop of
//! its [`Place`]), and the entries of a replica that dies lapse within the TTL. A waiter costs
//! one put and one delete; the lease one grant per busy period of the replica.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::etcd::{Etcd, Granted, KeepAlive};
use crate::Result;

/// TTL of the lease the queue entries of a replica live on, in seconds: the longest a dead
/// replica's waiters stand in line. Renewed every third of it while waiters exist.
pub(crate) const QUEUE_TTL: u64 = 6;

/// This replica's side of the wait queues of every resource.
pub(crate) struct WaitQueue {
    etcd: Etcd,
    prefix: String,
    tracker: TaskTracker,
    lease: tokio::sync::Mutex<Option<(i64, Instant)>>,
    waiting: AtomicUsize,
}

/// A waiter's entry in the line of one resource. Dropping it (grant, give-up, or the client's
/// request future dropped on disconnect) deletes the entry in a tracked task, which wakes the
/// waiter behind it.
pub(crate) struct Place {
    queue: Arc<WaitQueue>,
    key: String,
    /// Where the line of this resource lives.
    pub(crate) line: String,
    /// The entry's create revision: its place in the line.
    pub(crate) revision: i64,
}

impl WaitQueue {
    /// A queue under `prefix` (`{etcd-prefix}waiters/`). Its lease is renewed on `tracker`
    /// while waiters exist, until `stopping` fires.
    pub(crate) fn start(
        etcd: Etcd,
        keepalive: KeepAlive,
        prefix: String,
        tracker: TaskTracker,
        stopping: CancellationToken,
    ) -> Arc<Self> {
        let queue = Arc::new(Self {
            etcd,
            prefix,
            tracker: tracker.clone(),
            lease: tokio::sync::Mutex::new(None),
            waiting: AtomicUsize::new(0),
        });
        tracker.spawn(keep_alive(queue.clone(), keepalive, stopping));
        queue
    }

    /// Stands in line for `resource`: the entry is written before this returns.
    pub(crate) async fn enqueue(self: &Arc<Self>, resource: &str) -> Result<Place> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        // From here on the count is given back by the drop of the place, or here on failure.
        let entered = async {
            let lease = self.lease().await?;
            let line = format!("{}{resource}/", self.prefix);
            let key = format!("{line}{lease:x}-{:x}", rand::random::<u64>());
            match self.etcd.put_unique(&key, lease).await {
                Ok(revision) => Ok((line, key, revision)),
                Err(e) => {
                    // Perhaps written: remove it, so it blocks nobody.
                    self.forget(lease).await;
                    self.remove_in_background(key);
                    Err(e)
                }
            }
        }
        .await;
        match entered {
            Ok((line, key, revision)) => Ok(Place {
                queue: self.clone(),
                key,
                line,
                revision,
            }),
            Err(e) => {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    /// The lease for an entry written now: the current one while at least half its TTL is
    /// certainly left, else a new one.
    async fn lease(&self) -> Result<i64> {
        let mut current = self.lease.lock().await;
        if let Some((id, alive_until)) = *current {
            if alive_until.saturating_duration_since(Instant::now())
                > Duration::from_secs(QUEUE_TTL) / 2
            {
                return Ok(id);
            }
        }
        let granting = Instant::now();
        let Granted { id, ttl } = self.etcd.grant(QUEUE_TTL).await?;
        let ttl = u64::try_from(ttl).unwrap_or(QUEUE_TTL);
        *current = Some((id, granting + Duration::from_secs(ttl)));
        Ok(id)
    }

    /// Stops using `id` (it may be gone).
    async fn forget(&self, id: i64) {
        let mut current = self.lease.lock().await;
        if current.is_some_and(|(current, _)| current == id) {
            *current = None;
        }
    }

    fn remove_in_background(&self, key: String) {
        let etcd = self.etcd.clone();
        self.tracker.spawn(async move {
            if let Err(e) = etcd.delete(&key).await {
                tracing::debug!(%key, error = %e, "queue entry not deleted; it lapses with its lease");
            }
        });
    }

    /// Revokes the queue lease (at shutdown; it would lapse by its TTL anyway).
    pub(crate) async fn revoke(&self) {
        if let Some((id, _)) = self.lease.lock().await.take() {
            if let Err(e) = self.etcd.revoke(id).await {
                tracing::debug!(error = %e, "queue lease not revoked; it lapses by its TTL");
            }
        }
    }
}

impl Place {
    /// The entry's key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.queue.waiting.fetch_sub(1, Ordering::SeqCst);
        self.queue
            .remove_in_background(std::mem::take(&mut self.key));
    }
}

/// Renews the queue lease every third of its TTL while this replica has waiters; idle, it lets
/// the lease lapse (the next waiter takes a new one), so an idle replica sends nothing.
async fn keep_alive(queue: Arc<WaitQueue>, keepalive: KeepAlive, stopping: CancellationToken) {
    let period = Duration::from_secs(QUEUE_TTL) / 3;
    loop {
        tokio::select! {
            _ = stopping.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        if queue.waiting.load(Ordering::SeqCst) == 0 {
            continue;
        }
        let Some((id, _)) = *queue.lease.lock().await else {
            continue;
        };
        let renewing = Instant::now();
        match keepalive.renew(id).await {
            Ok(ttl) if ttl > 0 => {
                let mut current = queue.lease.lock().await;
                if let Some((current_id, alive_until)) = current.as_mut() {
                    if *current_id == id {
                        let ttl = u64::try_from(ttl).unwrap_or_default();
                        *alive_until = renewing + Duration::from_secs(ttl);
                    }
                }
            }
            // Lapsed: its entries are gone; waiters on it stand in line again (see acquire).
            Ok(_) => queue.forget(id).await,
            Err(e) => tracing::warn!(error = %e, "renewing the queue lease failed"),
        }
    }
}
