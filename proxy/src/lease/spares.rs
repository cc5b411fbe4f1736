//! Spare etcd leases, kept for the next acquire instead of being revoked.
//!
//! A grant needs an etcd lease with the requested TTL. Granting one is a raft write, and so is
//! revoking it; an acquire that finds the resource held would otherwise pay for both. Instead,
//! the fresh lease of a refused acquire — which never carried a key — is kept here, and the next
//! acquire with the same TTL renews it (a keepalive: no raft write) instead of granting a new
//! one. A spare that lapsed meanwhile is answered with TTL 0 and dropped.
//!
//! The pool is also filled ahead of demand: when an acquire finds fewer than half of
//! [`REFILL`] spares of its TTL, fresh leases of that TTL are granted in the background
//! (pipelined, one refill per TTL at a time), so the acquires that follow take a lease without
//! waiting for a grant — the grant's raft proposal is off their path.
//!
//! Why this is safe: a lease only enters this pool when it has never held an ownership key (its
//! create transaction answered "exists"; that transaction is never retried once it may have
//! reached etcd, so no late attempt can attach a key afterwards), and it leaves the pool to
//! exactly one acquire. A lease therefore carries at most one grant in its life, and each grant
//! still expires on its own when its holder stops renewing. Released grants' leases are revoked,
//! never pooled: a release must leave every later keepalive of the grant's lease answered with
//! TTL 0. The fencing token is the ownership key's create revision and does not depend on the
//! lease.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use tokio::time::Instant;

/// The pool. Bounded; when full, callers revoke instead.
pub(crate) struct Spares {
    capacity: usize,
    inner: Mutex<Inner>,
}

/// Spares granted ahead of demand per TTL in use.
pub(crate) const REFILL: usize = 16;

#[derive(Default)]
struct Inner {
    by_ttl: HashMap<u64, Vec<Spare>>,
    count: usize,
    /// TTLs being refilled.
    refilling: HashSet<u64>,
    /// Drained for shutdown: nothing is kept any more.
    closed: bool,
}

#[derive(Debug, Clone, Copy)]
struct Spare {
    lease_id: i64,
    /// The lease lasts at least until here (its last keepalive or grant was sent before
    /// `alive_until - ttl`).
    alive_until: Instant,
}

impl Spares {
    /// A pool of at most `capacity` leases (0 disables reuse).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The pool holds plain data; a panic elsewhere cannot leave it inconsistent.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A spare lease granted with `ttl` seconds, the most recently kept first, and the instant
    /// it lasts at least until; spares known to have lapsed are dropped on the way. The caller
    /// renews it before use unless it is fresh enough to hand out as it is.
    pub(crate) fn take(&self, ttl: u64) -> Option<(i64, Instant)> {
        let now = Instant::now();
        let mut inner = self.lock();
        let Inner { by_ttl, count, .. } = &mut *inner;
        let stack = by_ttl.get_mut(&ttl)?;
        let mut found = None;
        while let Some(spare) = stack.pop() {
            *count -= 1;
            if spare.alive_until > now {
                found = Some((spare.lease_id, spare.alive_until));
                break;
            }
        }
        if stack.is_empty() {
            by_ttl.remove(&ttl);
        }
        found
    }

    /// Keeps `lease_id` (granted with `ttl` seconds, alive at least until `alive_until`), which
    /// must carry no key. `false` when the pool is full: the caller revokes the lease instead.
    pub(crate) fn put(&self, ttl: u64, lease_id: i64, alive_until: Instant) -> bool {
        let mut inner = self.lock();
        if inner.closed {
            return false;
        }
        if inner.count >= self.capacity {
            let now = Instant::now();
            let Inner { by_ttl, count, .. } = &mut *inner;
            for stack in by_ttl.values_mut() {
                let before = stack.len();
                stack.retain(|s| s.alive_until > now);
                *count -= before - stack.len();
            }
            by_ttl.retain(|_, s| !s.is_empty());
            if *count >= self.capacity {
                return false;
            }
        }
        inner.count += 1;
        inner.by_ttl.entry(ttl).or_default().push(Spare {
            lease_id,
            alive_until,
        });
        true
    }

    /// Whether the pool should be refilled for `ttl` (it keeps fewer than half of [`REFILL`]
    /// and no refill is running); if so, the refill is marked running and the answer is how
    /// many leases to grant. [`Spares::refilled`] ends it.
    pub(crate) fn refill(&self, ttl: u64) -> Option<usize> {
        let mut inner = self.lock();
        let kept = inner.by_ttl.get(&ttl).map_or(0, Vec::len);
        let room = self.capacity.saturating_sub(inner.count);
        if kept >= REFILL / 2 || room == 0 || inner.closed || inner.refilling.contains(&ttl) {
            return None;
        }
        inner.refilling.insert(ttl);
        Some((REFILL - kept).min(room))
    }

    /// Ends the refill of `ttl`.
    pub(crate) fn refilled(&self, ttl: u64) {
        self.lock().refilling.remove(&ttl);
    }

    /// Whether a `put` would be accepted without evicting anything.
    #[cfg(test)]
    pub(crate) fn has_room(&self) -> bool {
        self.capacity > 0 && self.lock().count < self.capacity
    }

    /// Empties the pool for good, returning its leases (to be revoked at shutdown); later
    /// `put`s are refused, so a refill still running revokes what it grants.
    pub(crate) fn drain(&self) -> Vec<i64> {
        let mut inner = self.lock();
        inner.closed = true;
        inner.count = 0;
        inner
            .by_ttl
            .drain()
            .flat_map(|(_, s)| s.into_iter().map(|s| s.lease_id))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn later(secs: u64) -> Instant {
        Instant::now() + Duration::from_secs(secs)
    }

    #[test]
    fn hands_out_by_ttl_freshest_first() {
        let spares = Spares::new(10);
        assert!(spares.put(10, 1, later(10)));
        assert!(spares.put(10, 2, later(10)));
        assert!(spares.put(20, 3, later(20)));
        assert_eq!(spares.take(10).map(|s| s.0), Some(2));
        assert_eq!(spares.take(10).map(|s| s.0), Some(1));
        assert_eq!(spares.take(10), None);
        assert_eq!(spares.take(30), None);
        assert_eq!(spares.take(20).map(|s| s.0), Some(3));
        assert_eq!(spares.lock().count, 0);
    }

    #[test]
    fn lapsed_spares_are_never_handed_out() {
        let spares = Spares::new(10);
        assert!(spares.put(10, 1, Instant::now()));
        assert!(spares.put(10, 2, later(10)));
        assert!(spares.put(10, 3, Instant::now()));
        assert_eq!(spares.take(10).map(|s| s.0), Some(2));
        assert_eq!(spares.take(10), None);
        assert_eq!(spares.lock().count, 0);
    }

    /// A spare lapses as tokio's clock passes the end of its lease: handed out just before,
    /// never at or after it. On a paused clock, advanced rather than slept.
    #[tokio::test(start_paused = true)]
    async fn spares_lapse_when_the_clock_passes_their_end() {
        let spares = Spares::new(10);
        assert!(spares.put(10, 1, later(10)));
        assert!(spares.put(10, 2, later(10)));
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert_eq!(spares.take(10).map(|s| s.0), Some(2));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(spares.take(10), None);
        assert_eq!(spares.lock().count, 0);
    }

    #[test]
    fn bounded_and_lapsed_spares_make_room() {
        let spares = Spares::new(2);
        assert!(spares.put(10, 1, Instant::now()));
        assert!(spares.put(10, 2, later(10)));
        assert!(!spares.has_room());
        // Full, but lease 1 has lapsed: it is dropped to make room.
        assert!(spares.put(10, 3, later(10)));
        assert!(!spares.put(10, 4, later(10)));
        let mut drained = spares.drain();
        drained.sort_unstable();
        assert_eq!(drained, vec![2, 3]);
        // Drained for shutdown: nothing more is kept.
        assert!(!spares.put(10, 5, later(10)));
        assert_eq!(spares.refill(10), None);
    }

    #[test]
    fn refills_run_one_at_a_time_per_ttl_when_the_pool_runs_low() {
        let spares = Spares::new(20);
        assert_eq!(spares.refill(10), Some(REFILL));
        // Running already.
        assert_eq!(spares.refill(10), None);
        // Another TTL is refilled independently, within the room left.
        assert_eq!(spares.refill(30), Some(REFILL));
        for id in 0..10 {
            assert!(spares.put(10, id, later(10)));
        }
        spares.refilled(10);
        // Enough kept: nothing to do.
        assert_eq!(spares.refill(10), None);
        for _ in 0..3 {
            spares.take(10);
        }
        // 7 kept, 13 of 20 used: at most the room.
        assert_eq!(spares.refill(10), Some(REFILL - 7));
        spares.refilled(10);
        for id in 10..23 {
            spares.put(20, id, later(10));
        }
        assert_eq!(spares.refill(40), None, "no room");
        assert_eq!(Spares::new(0).refill(10), None);
    }

    #[test]
    fn capacity_zero_disables_reuse() {
        let spares = Spares::new(0);
        assert!(!spares.has_room());
        assert!(!spares.put(10, 1, later(10)));
        assert_eq!(spares.take(10), None);
    }
}
