//! The `/v3` lease markers a replica has read or written, for a while ([`Remembered`]).
//!
//! A marker is written once, at its lease's grant, and lives and dies with the lease; the id is
//! etcd's (an explicit id is refused) and etcd does not give one again — but its generator is
//! seeded from the clock (a member restarted with its clock stepped back could), and anyone with
//! etcd's own credentials can grant any id. So a marker is trusted from memory only for
//! [`REMEMBER_FOR`] after it was read: a replaced lease is taken for its old principal's for at
//! most that long, and only by calls that answer a gone lease as etcd does.
//!
//! A lease id a principal named and that is not its own (no marker, or another principal's) is
//! remembered too, as a miss of that principal's ([`Misses`]), for [`MISS_FOR`] only, with the
//! header of the read that found it: renewals of guessed ids then cost etcd nothing while they
//! repeat. Only for that principal — a guess of a lease not granted yet (etcd's ids are
//! predictable) hides nothing from the principal it will be granted to — and a grant through
//! this replica forgets its principal's miss at once.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::etcd::Header;

/// How long a marker read (or written) is taken as still true.
pub(crate) const REMEMBER_FOR: Duration = Duration::from_secs(60);

/// Most markers remembered (then it starts again from none).
pub(crate) const MOST: usize = 1 << 16;

/// Lease id → (the marker's value, when it was read).
#[derive(Default)]
pub(crate) struct Remembered(HashMap<i64, (Box<[u8]>, Instant)>);

impl Remembered {
    /// The marker of `id` if it was read within [`REMEMBER_FOR`] of `now`.
    pub(crate) fn get(&self, id: i64, now: Instant) -> Option<&[u8]> {
        self.0
            .get(&id)
            .filter(|(_, read)| now.saturating_duration_since(*read) < REMEMBER_FOR)
            .map(|(owner, _)| &**owner)
    }

    /// `id`'s marker is `owner`, read at `now`.
    pub(crate) fn insert(&mut self, id: i64, owner: &[u8], now: Instant) {
        if self.0.len() >= MOST && !self.0.contains_key(&id) {
            self.0.clear();
        }
        self.0.insert(id, (owner.into(), now));
    }

    pub(crate) fn remove(&mut self, id: i64) {
        self.0.remove(&id);
    }
}

/// How long a miss is taken as still true.
pub(crate) const MISS_FOR: Duration = Duration::from_secs(2);

/// Most misses remembered, over every principal (then it starts again from none).
pub(crate) const MOST_MISSES: usize = 1 << 14;

/// (principal, lease id) → (the header of the read that found it not the principal's, when).
/// The principal is empty with authentication off.
#[derive(Default)]
pub(crate) struct Misses(HashMap<Missed, (Header, Instant)>);

/// A principal's miss of a lease id.
type Missed = (Box<[u8]>, i64);

impl Misses {
    /// The header of `principal`'s miss of `id`, if it was found within [`MISS_FOR`] of `now`.
    pub(crate) fn get(&self, principal: &[u8], id: i64, now: Instant) -> Option<Header> {
        self.0
            .get(&(principal.into(), id))
            .filter(|(_, found)| now.saturating_duration_since(*found) < MISS_FOR)
            .map(|(header, _)| *header)
    }

    /// `id` is not `principal`'s, found at `now` by a read with `header`.
    pub(crate) fn insert(&mut self, principal: &[u8], id: i64, header: Header, now: Instant) {
        let key = (Box::from(principal), id);
        if self.0.len() >= MOST_MISSES && !self.0.contains_key(&key) {
            self.0.clear();
        }
        self.0.insert(key, (header, now));
    }

    /// `id` is `principal`'s now (granted to it here).
    pub(crate) fn remove(&mut self, principal: &[u8], id: i64) {
        self.0.remove(&(Box::from(principal), id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miss_is_one_principals_for_a_short_while_and_bounded_in_number() {
        let t0 = Instant::now();
        let header = Header {
            cluster_id: 1,
            member_id: 2,
            revision: 3,
            raft_term: 4,
        };
        let mut m = Misses::default();
        m.insert(b"acme", 7, header, t0);
        assert_eq!(m.get(b"acme", 7, t0 + MISS_FOR / 2), Some(header));
        assert_eq!(m.get(b"acme", 7, t0 + MISS_FOR), None, "a miss is brief");
        assert_eq!(m.get(b"other", 7, t0), None, "another principal's lookup");
        assert_eq!(m.get(b"acme", 8, t0), None);
        m.remove(b"acme", 7);
        assert_eq!(m.get(b"acme", 7, t0), None, "granted here: forgotten");
        for id in 0..MOST_MISSES as i64 {
            m.insert(b"", id, header, t0);
        }
        assert_eq!(m.0.len(), MOST_MISSES);
        m.insert(b"", -1, header, t0);
        assert_eq!(m.0.len(), 1, "full: starts again from none");
    }

    #[test]
    fn a_marker_is_remembered_for_a_while_and_bounded_in_number() {
        let t0 = Instant::now();
        let mut r = Remembered::default();
        r.insert(7, b"acme", t0);
        assert_eq!(r.get(7, t0 + REMEMBER_FOR / 2), Some(&b"acme"[..]));
        assert_eq!(
            r.get(7, t0 + REMEMBER_FOR),
            None,
            "read again after REMEMBER_FOR"
        );
        assert_eq!(r.get(8, t0), None);
        r.insert(7, b"other", t0 + REMEMBER_FOR);
        assert_eq!(r.get(7, t0 + REMEMBER_FOR), Some(&b"other"[..]));
        r.remove(7);
        assert_eq!(r.get(7, t0 + REMEMBER_FOR), None);
        for id in 0..MOST as i64 {
            r.insert(id, b"", t0);
        }
        assert_eq!(r.0.len(), MOST);
        r.insert(-1, b"", t0);
        assert_eq!(r.0.len(), 1, "full: starts again from none");
    }
}
