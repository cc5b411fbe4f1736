//! The `/v3` lease markers a replica has read or written, for a while ([`Remembered`]).
//!
//! A marker is written once, at its lease's grant, and lives and dies with the lease; the id is
//! etcd's (an explicit id is refused) and etcd does not give one again — but its generator is
//! seeded from the clock (a member restarted with its clock stepped back could), and anyone with
//! etcd's own credentials can grant any id. So a marker is trusted from memory only for
//! [`REMEMBER_FOR`] after it was read: a replaced lease is taken for its old principal's for at
//! most that long, and only by calls that answer a gone lease as etcd does.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

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

#[cfg(test)]
mod tests {
    use super::*;

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
