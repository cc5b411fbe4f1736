//! Wake-ups for the requests that wait on a fleet (a member's long poll): one counter per fleet
//! that the replica's watch bumps whenever the fleet's keys or its resources' grants change.
//! A waiter subscribes before it reads, so no change falls between its read and its wait.
//!
//! Every waiter of a fleet is woken by each change, and each must read the fleet again; the
//! waiters share that reading: the first to look reads the fleet's keys and its resources'
//! grants once for every waiter woken by the same bumps (a thousand members each polling would
//! otherwise read the fleet's every record and their grants a thousand times per change, on one
//! replica, starving its other callers). A reading costs what one decision's reading does.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use super::views::Reading;
use crate::Result;

/// The fleet as last read for its waiters: after which bump, and what was read.
type Shared = Arc<tokio::sync::Mutex<Option<(u64, Option<Arc<Reading>>)>>>;

struct Fleet {
    bumps: watch::Sender<u64>,
    shared: Shared,
}

/// The replica's per-fleet wake-ups.
#[derive(Default)]
pub(super) struct Signals {
    fleets: Mutex<HashMap<String, Fleet>>,
}

/// One waiter of a fleet.
pub(super) struct Waiter {
    bumps: watch::Receiver<u64>,
    shared: Shared,
}

impl Waiter {
    /// Waits for the next change of the fleet (for ever if the replica forgets it).
    pub(super) async fn changed(&mut self) {
        if self.bumps.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The fleet read after every change this waiter has been woken by: the reading another
    /// waiter made since, or one made now by `read` (and shared).
    pub(super) async fn reading<F, Fut>(&mut self, read: F) -> Result<Option<Arc<Reading>>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<Reading>>>,
    {
        let seen = *self.bumps.borrow_and_update();
        let mut slot = self.shared.lock().await;
        if let Some((after, snapshot)) = slot.as_ref() {
            if *after >= seen {
                return Ok(snapshot.clone());
            }
        }
        // Every change bumped so far happened in etcd before its bump: a read begun now sees
        // it, so this reading serves every waiter woken by bumps up to here.
        let now = *self.bumps.borrow();
        let snapshot = read().await?.map(Arc::new);
        *slot = Some((now, snapshot.clone()));
        Ok(snapshot)
    }
}

impl Signals {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Fleet>> {
        // Poisoned only by a panic between two map operations: the map is whole.
        self.fleets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A waiter that sees every change of `fleet` from now on.
    pub(super) fn subscribe(&self, fleet: &str) -> Waiter {
        let mut fleets = self.lock();
        let entry = fleets.entry(fleet.to_owned()).or_insert_with(|| Fleet {
            bumps: watch::channel(0).0,
            shared: Shared::default(),
        });
        Waiter {
            bumps: entry.bumps.subscribe(),
            shared: entry.shared.clone(),
        }
    }

    /// `fleet` changed: its waiters look again. A fleet nobody waits on is forgotten.
    pub(super) fn bump(&self, fleet: &str) {
        let mut fleets = self.lock();
        if let Some(f) = fleets.get(fleet) {
            if f.bumps.receiver_count() == 0 {
                fleets.remove(fleet);
            } else {
                f.bumps.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Anything may have changed: every waiter looks again.
    pub(super) fn bump_all(&self) {
        let mut fleets = self.lock();
        fleets.retain(|_, f| f.bumps.receiver_count() > 0);
        for f in fleets.values() {
            f.bumps.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_sees_a_bump_of_its_fleet_only() {
        let signals = Signals::default();
        let mut a = signals.subscribe("a").bumps;
        let b = signals.subscribe("b").bumps;
        signals.bump("a");
        assert!(a.has_changed().unwrap());
        assert!(!b.has_changed().unwrap());
        a.mark_unchanged();
        signals.bump_all();
        assert!(a.has_changed().unwrap() && b.has_changed().unwrap());
        drop((a, b));
        signals.bump("a");
        signals.bump_all();
        assert!(signals.lock().is_empty());
    }
}
