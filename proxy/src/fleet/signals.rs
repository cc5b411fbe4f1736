//! Wake-ups for the requests that wait on a fleet (a member's long poll): one counter per fleet
//! that the replica's watch bumps whenever the fleet's keys or its resources' grants change.
//! A waiter subscribes before it reads, so no change falls between its read and its wait.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

/// The replica's per-fleet wake-ups.
#[derive(Default)]
pub(super) struct Signals {
    fleets: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Signals {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        // Poisoned only by a panic between two map operations: the map is whole.
        self.fleets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A receiver that sees every change of `fleet` from now on.
    pub(super) fn subscribe(&self, fleet: &str) -> watch::Receiver<u64> {
        self.lock()
            .entry(fleet.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// `fleet` changed: its waiters look again. A fleet nobody waits on is forgotten.
    pub(super) fn bump(&self, fleet: &str) {
        let mut fleets = self.lock();
        if let Some(tx) = fleets.get(fleet) {
            if tx.receiver_count() == 0 {
                fleets.remove(fleet);
            } else {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Anything may have changed: every waiter looks again.
    pub(super) fn bump_all(&self) {
        let mut fleets = self.lock();
        fleets.retain(|_, tx| tx.receiver_count() > 0);
        for tx in fleets.values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_sees_a_bump_of_its_fleet_only() {
        let signals = Signals::default();
        let mut a = signals.subscribe("a");
        let b = signals.subscribe("b");
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
