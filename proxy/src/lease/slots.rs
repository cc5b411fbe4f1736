//! Slots for event streams — `GET /v1/watch`, and the etcd fronts' watch streams, waiting locks
//! and campaigns, and leader observers: at most `--max-watch-streams` open on a replica (each is
//! an etcd watch), and with authentication on at most `--quota-watch-streams` of them
//! per principal, so that one principal cannot take every slot and keep the others out.
//!
//! A principal past its share is refused as over a quota (429 `quota-exceeded`, `quota`
//! `watch-streams`): it is the caller's own use that stands in the way, and another replica
//! would answer the same. A full replica is refused 503 `too-many-watches`: capacity, which
//! another replica may have. Both carry `Retry-After`. Without authentication every caller is
//! the one anonymous principal, whose share is the whole replica.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{Error, QuotaKind, Result};

/// What a refused stream is told to wait, in seconds: a slot comes back as soon as a stream
/// ends, and a refusal costs the proxy nothing but the answer.
const RETRY_AFTER: u64 = 1;

type Taken = Arc<Mutex<HashMap<String, usize>>>;

/// The replica's event-stream slots.
pub(crate) struct WatchSlots {
    free: Arc<Semaphore>,
    max: usize,
    per_principal: Option<usize>,
    taken: Taken,
}

/// One stream's slot: held for as long as the stream runs, given back when dropped.
pub(crate) struct Slot {
    _replica: OwnedSemaphorePermit,
    _share: Option<Share>,
}

/// One of a principal's share.
struct Share {
    taken: Taken,
    principal: String,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut taken = lock(&self.taken);
        if let Some(n) = taken.get_mut(&self.principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                taken.remove(&self.principal);
            }
        }
    }
}

fn lock(taken: &Taken) -> MutexGuard<'_, HashMap<String, usize>> {
    // Poisoned only by a panic between two plain integer updates: the map is whole.
    taken.lock().unwrap_or_else(PoisonError::into_inner)
}

impl WatchSlots {
    /// `max` slots, at most `per_principal` of them for any one principal (`None`: no share,
    /// as without authentication).
    pub(crate) fn new(max: usize, per_principal: Option<usize>) -> Self {
        Self {
            free: Arc::new(Semaphore::new(max)),
            max,
            per_principal,
            taken: Taken::default(),
        }
    }

    /// How many streams are open.
    pub(crate) fn open(&self) -> usize {
        self.max.saturating_sub(self.free.available_permits())
    }

    /// A slot for a stream of `principal` (`None`: authentication is off); refused when the
    /// principal has its share open, or the replica is full.
    pub(crate) fn take(&self, principal: Option<&str>) -> Result<Slot> {
        let share = match (principal, self.per_principal) {
            (Some(principal), Some(most)) => {
                let mut taken = lock(&self.taken);
                let n = taken.entry(principal.to_owned()).or_default();
                if *n >= most {
                    return Err(Error::QuotaExceeded {
                        quota: QuotaKind::WatchStreams,
                        retry_after: RETRY_AFTER,
                    });
                }
                *n += 1;
                Some(Share {
                    taken: self.taken.clone(),
                    principal: principal.to_owned(),
                })
            }
            _ => None,
        };
        // A full replica drops `share` here, giving the principal's count back.
        let replica = self
            .free
            .clone()
            .try_acquire_owned()
            .map_err(|_| Error::TooManyWatches(self.max))?;
        Ok(Slot {
            _replica: replica,
            _share: share,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(r: Result<Slot>) -> &'static str {
        match r {
            Err(Error::QuotaExceeded { quota, .. }) => quota.as_str(),
            Err(Error::TooManyWatches(_)) => "full",
            Err(_) => "other",
            Ok(_) => "granted",
        }
    }

    #[test]
    fn a_principal_gets_its_share_and_others_the_rest() {
        let slots = WatchSlots::new(4, Some(2));
        let a: Vec<Slot> = (0..2).map(|_| slots.take(Some("a")).unwrap()).collect();
        assert_eq!(refusal(slots.take(Some("a"))), "watch-streams");
        let b = slots.take(Some("b")).unwrap();
        let c = slots.take(Some("c")).unwrap();
        assert_eq!(slots.open(), 4);
        // Full: refused as such, and the refused principal's count is not kept.
        assert_eq!(refusal(slots.take(Some("d"))), "full");
        drop(c);
        let d = slots.take(Some("d")).unwrap();
        // A slot given back is the principal's again.
        drop(a);
        assert_eq!(slots.open(), 2);
        let again: Vec<Slot> = (0..2).map(|_| slots.take(Some("a")).unwrap()).collect();
        drop((b, d, again));
        assert_eq!(slots.open(), 0);
        assert!(lock(&slots.taken).is_empty(), "counts of nobody are kept");
    }

    #[test]
    fn without_a_principal_or_a_share_only_the_replica_counts() {
        for slots in [WatchSlots::new(3, Some(1)), WatchSlots::new(3, None)] {
            let principal = slots.per_principal.is_none().then_some("a");
            let open: Vec<Slot> = (0..3).map(|_| slots.take(principal).unwrap()).collect();
            assert_eq!(refusal(slots.take(principal)), "full");
            drop(open);
        }
    }
}
