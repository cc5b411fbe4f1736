//! Acquiring: one attempt when the caller does not wait; with a wait, a place in the resource's
//! fair line (see [`super::queue`]), then the resource taken as soon as it is free. Each step is
//! a function of its own; one attempt is [`Leases::attempt`] (in `attempt.rs`).

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::attempt::Attempt;
use super::queue::Place;
use super::{Acquire, Grant, Leases, Recheck};
use crate::etcd::Deleted;
use crate::lease::Wakeup;
use crate::{Error, Result};

/// Why a wait ended.
enum Woken<T> {
    /// The event waited for.
    By(T),
    /// Events were missed: look again.
    Lagged,
    /// The wait's deadline passed.
    Deadline,
}

impl Leases {
    /// Takes `resource` for `req.holder`, waiting up to `req.wait` for it to become free.
    ///
    /// Without a wait this is one attempt: it succeeds exactly when nobody holds the resource,
    /// whether or not others are waiting for it (see [`queue`] for why). With a wait, the
    /// request stands in the resource's wait queue and is served first come, first served
    /// across all replicas: it tries to take the resource only once nobody is ahead of it,
    /// woken by the watch, never by polling. When the wait runs out it leaves the line and is
    /// answered as an acquire without a wait would be at that moment (409 if held).
    pub(crate) async fn acquire(&self, req: &Acquire) -> Result<Grant> {
        let deadline = Instant::now() + req.wait;
        if req.wait.is_zero() {
            return self.acquire_now(req).await;
        }
        if let Some(grant) = self.replay_before_waiting(req).await? {
            return Ok(grant);
        }
        // Judged again whenever the token file changes while this acquire waits: a caller
        // removed or narrowed meanwhile leaves the line with the check's 401 or 403.
        let mut recheck = req.recheck.clone();
        match self.wait_in_line(req, deadline, &mut recheck).await? {
            Some(place) => {
                self.take_when_free(req, place, deadline, &mut recheck)
                    .await
            }
            None => self.acquire_now(req).await,
        }
    }

    /// An acquire without a wait: attempts until one settles, answered as a conflict when the
    /// resource is held.
    async fn acquire_now(&self, req: &Acquire) -> Result<Grant> {
        loop {
            match self.attempt(req).await? {
                Attempt::Granted { grant, .. } | Attempt::Replayed(grant) => return Ok(grant),
                Attempt::Held(conflict) => {
                    self.metrics.conflicts.add(1, &[]);
                    return Err(Error::Held(conflict));
                }
                Attempt::Again => continue,
            }
        }
    }

    /// A retried acquire (same Idempotency-Key) whose grant exists must get it back, not queue
    /// behind it: its grant, if this is such a retry.
    async fn replay_before_waiting(&self, req: &Acquire) -> Result<Option<Grant>> {
        if req.idempotency_key.is_none() {
            return Ok(None);
        }
        let Some(current) = self.current(&req.resource).await? else {
            return Ok(None);
        };
        if current.record.holder != req.holder || current.record.idempotency.is_none() {
            return Ok(None);
        }
        Ok(match self.attempt(req).await? {
            Attempt::Granted { grant, .. } | Attempt::Replayed(grant) => Some(grant),
            Attempt::Held(_) | Attempt::Again => None,
        })
    }

    /// Step 1 of a waiting acquire: stands in the resource's line and waits until nobody is
    /// ahead. `None` when the deadline passed first (the place is left).
    async fn wait_in_line(
        &self,
        req: &Acquire,
        deadline: Instant,
        recheck: &mut Option<Recheck>,
    ) -> Result<Option<Place>> {
        let mut place = self.queue.enqueue(&req.resource).await?;
        loop {
            // Subscribed before the read, so a deletion right after it is not missed.
            let mut deletions = self.deletions.subscribe();
            let Some(ahead) = self
                .etcd
                .last_created_before(&place.line, place.revision)
                .await?
            else {
                return Ok(Some(place));
            };
            let own = place.key().as_bytes().to_vec();
            let woken = self
                .wait_for(&mut deletions, deadline, recheck, |d: &Deleted| {
                    d.concerns(&ahead) || d.concerns(&own)
                })
                .await?;
            match woken {
                Woken::Deadline => return Ok(None),
                Woken::By(Deleted::Key(k)) if k == own => {
                    // Our own entry lapsed with the replica's queue lease (etcd unreachable
                    // for a while): stand in line again rather than wait behind nothing.
                    drop(place);
                    place = self.queue.enqueue(&req.resource).await?;
                }
                Woken::By(_) | Woken::Lagged => {}
            }
        }
    }

    /// Step 2 of a waiting acquire, first in line: takes the resource as soon as it is free.
    /// Only this waiter watches the ownership key, so a release wakes one waiter, not every one.
    /// Leaving the line (the drop of `place`) wakes the next waiter.
    async fn take_when_free(
        &self,
        req: &Acquire,
        place: Place,
        deadline: Instant,
        recheck: &mut Option<Recheck>,
    ) -> Result<Grant> {
        let key = self.key(&req.resource);
        loop {
            let mut released = self.holders.subscribe();
            let conflict = match self.etcd.get(&key).await? {
                // Held: wait for its end without a write (a create txn would be refused).
                Some(_) => None,
                None => match self.attempt(req).await? {
                    Attempt::Granted { grant, .. } | Attempt::Replayed(grant) => {
                        drop(place);
                        return Ok(grant);
                    }
                    Attempt::Held(conflict) => Some(conflict),
                    Attempt::Again => continue,
                },
            };
            let resource = req.resource.as_str();
            let woken = self
                .wait_for(&mut released, deadline, recheck, |w: &Wakeup| {
                    w.concerns(resource)
                })
                .await?;
            if let Woken::Deadline = woken {
                drop(place);
                return match conflict {
                    Some(conflict) => {
                        self.metrics.conflicts.add(1, &[]);
                        Err(Error::Held(conflict))
                    }
                    None => self.acquire_now(req).await,
                };
            }
        }
    }

    /// Waits for a broadcast that `wanted` says concerns the waiter, or the deadline. A
    /// lagging receiver may have missed one, so it is woken too. Ends with the error of
    /// `recheck` once the caller may no longer make the acquire.
    async fn wait_for<T: Clone>(
        &self,
        events: &mut broadcast::Receiver<T>,
        deadline: Instant,
        recheck: &mut Option<Recheck>,
        wanted: impl Fn(&T) -> bool,
    ) -> Result<Woken<T>> {
        loop {
            tokio::select! {
                _ = self.stopping.cancelled() => return Err(Error::ShuttingDown),
                _ = tokio::time::sleep_until(deadline) => return Ok(Woken::Deadline),
                () = Recheck::changed_or_never(recheck) => {
                    Recheck::check_if_any(recheck.as_ref())?;
                }
                event = events.recv() => match event {
                    Ok(e) if wanted(&e) => return Ok(Woken::By(e)),
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => return Ok(Woken::Lagged),
                    Err(broadcast::error::RecvError::Closed) => return Err(Error::ShuttingDown),
                },
            }
        }
    }
}
