//! End markers: how the event feed tells a release from an expiry (docs/DESIGN.md §2).
//!
//! A grant ends when its ownership key `{prefix}holders/{resource}` is deleted, and etcd does
//! not say *why* a key was deleted — a lease revoked by a release and a lease that lapsed look
//! the same. So every deliberate end writes a marker that goes in the same revision as the
//! deletion:
//! - a release writes `{prefix}ended/released/{lease}` = `{create revision}/{resource}` of the
//!   grant (grants created in one group-commit batch share a create revision), on the grant's
//!   lease: for a grant with a lease of its own before revoking it (the revoke deletes key and
//!   marker together), for a session grant in its compare-and-delete transaction (one marker
//!   key per session, overwritten by each release, gone with the session);
//! - a release of a fleet's grant (a session grant the fleet service made) writes
//!   `{prefix}ended/released/{lease}/{resource}` instead: one key per session *and* resource,
//!   so that the releases of one member's grants, which a fleet's end or a rebalance makes by
//!   the thousand, need not wait for each other (the group commit never puts two writes of one
//!   key in a batch). They are bounded by the fleet's resources and gone with the session;
//! - closing a session writes `{prefix}ended/closed/{session}` on the session's lease before
//!   revoking it.
//!
//! A deletion is `released` when its revision carries a release marker naming exactly that
//! grant (a resource's create revisions are unique, so a marker left by an earlier release
//! never names a later grant), or its lease's close marker; every other deletion — the lease
//! lapsed, or a grant the proxy withdrew because its client went away — is `expired`.
//!
//! Here are the marker's type, its format, its writers ([`Leases::end_own_lease`],
//! [`Leases::end_in_session`], [`Leases::close_marked`]) and its classifier ([`Ends`]).
//!
//! Beside it, and on purpose not folded into it, each replica tracks the grants it made itself
//! (`view.rs`, `granted_here`): a deletion of one it has not released is counted in
//! `lease_proxy.expirations` and audited as `expire` by that replica. The markers answer *what
//! happened* to every grant, for every subscriber, at the cost of a watch over `ended/`; the
//! local tracking answers *which replica counts it*, once, without reading markers — folding it
//! into the markers would make every replica count every expiry, or make the holder watch read
//! `ended/` too.

use std::collections::HashSet;

use etcd_client::EventType;

use super::{HolderRecord, Leases};
use crate::etcd::Companion;
use crate::keys::Layout;
use crate::Result;

/// A marker: a key written on a lease in the same revision as the deletion it explains.
#[derive(Debug, Clone)]
pub(super) struct Marker {
    /// The marker's key.
    key: String,
    /// Its value.
    value: String,
    /// The lease it is attached to (it goes when the lease goes).
    lease: i64,
}

impl Marker {
    /// The marker as the put etcd's transactions write.
    pub(super) fn put(&self) -> Companion<'_> {
        Companion {
            key: &self.key,
            value: self.value.as_bytes(),
            lease: self.lease,
        }
    }
}

/// Where the markers live, and how each is spelled.
#[derive(Debug, Clone)]
pub(super) struct EndMarkers {
    /// `{prefix}ended/released/`.
    released: String,
    /// `{prefix}ended/closed/`.
    closed: String,
}

impl EndMarkers {
    /// The markers of `layout`.
    pub(super) fn new(layout: &Layout) -> Self {
        Self {
            released: layout.released(),
            closed: layout.closed(),
        }
    }

    /// The marker a release of the grant created at `revision` on `resource` and `lease`
    /// writes: it names the grant by revision *and* resource, since grants created in one
    /// group-commit batch share their create revision.
    pub(super) fn released(&self, resource: &str, revision: i64, lease: i64) -> Marker {
        Marker {
            key: format!("{}{lease}", self.released),
            value: grant_name(revision, resource),
            lease,
        }
    }

    /// The marker a release of a fleet's grant writes: as [`EndMarkers::released`], under a
    /// key of the session's *and* the resource's.
    pub(super) fn released_in_fleet(&self, resource: &str, revision: i64, lease: i64) -> Marker {
        Marker {
            key: format!("{}{lease}/{resource}", self.released),
            value: grant_name(revision, resource),
            lease,
        }
    }

    /// The marker closing session `id` writes.
    pub(super) fn closed(&self, id: i64) -> Marker {
        Marker {
            key: format!("{}{id}", self.closed),
            value: String::new(),
            lease: id,
        }
    }

    /// The markers among one revision's events: what that revision's deletions were ended by.
    pub(super) fn read<'e>(&self, events: impl IntoIterator<Item = MarkerEvent<'e>>) -> Ends {
        let mut ends = Ends::default();
        for event in events {
            if event.key.starts_with(self.released.as_bytes()) {
                ends.released.insert(event.value.to_vec());
            } else if let Some(id) = event.key.strip_prefix(self.closed.as_bytes()) {
                if let Some(id) = std::str::from_utf8(id).ok().and_then(|s| s.parse().ok()) {
                    ends.closed.insert(id);
                }
            }
        }
        ends
    }
}

/// One event of a revision, as the classifier reads it.
#[derive(Debug, Clone, Copy)]
pub(super) struct MarkerEvent<'e> {
    /// The key.
    pub(super) key: &'e [u8],
    /// Its value: the new one of a put, the previous one of a delete.
    pub(super) value: &'e [u8],
}

impl<'e> MarkerEvent<'e> {
    /// An etcd watch event (with its previous value) as the classifier reads it.
    pub(super) fn of(event: &'e etcd_client::Event) -> Option<Self> {
        let kv = event.kv()?;
        let value = match event.event_type() {
            EventType::Put => kv.value(),
            EventType::Delete => event.prev_kv().map(|p| p.value()).unwrap_or_default(),
        };
        Some(Self {
            key: kv.key(),
            value,
        })
    }
}

/// The ends one revision's markers explain.
#[derive(Debug, Default)]
pub(super) struct Ends {
    /// Release markers' values: the grants (`{revision}/{resource}`) released.
    released: HashSet<Vec<u8>>,
    /// Sessions closed.
    closed: HashSet<i64>,
}

impl Ends {
    /// Whether the deletion of the grant of `resource` created at `revision` on `lease` was a
    /// release (or its session's close); else it expired.
    pub(super) fn released(&self, resource: &str, revision: i64, lease: i64) -> bool {
        self.released
            .contains(grant_name(revision, resource).as_bytes())
            || self.closed.contains(&lease)
    }
}

/// How a release marker names the grant it ended: create revision and resource (a revision
/// alone is shared by every grant of one group-commit batch).
fn grant_name(revision: i64, resource: &str) -> String {
    format!("{revision}/{resource}")
}

impl Leases {
    /// Ends a grant on a lease of its own: the release marker goes on that lease, written only
    /// while the key is still on it, then the revoke deletes key and marker together. Whether
    /// this call ended it.
    pub(super) async fn end_own_lease(
        &self,
        resource: &str,
        revision: i64,
        record: &HolderRecord,
    ) -> Result<bool> {
        let marker = self.markers.released(resource, revision, record.lease_id);
        match self.commit.mark(marker.put(), &self.key(resource)).await {
            Ok(true) => self.etcd.revoke_existing(record.lease_id).await,
            other => other,
        }
    }

    /// Ends a grant under a session: the session's lease carries its other grants, so this key
    /// alone (with its quota index key), if it is still this incarnation, with the release
    /// marker in the same transaction. Whether this call ended it.
    pub(super) async fn end_in_session(
        &self,
        resource: &str,
        revision: i64,
        record: &HolderRecord,
    ) -> Result<bool> {
        let marker = match record.fleet {
            Some(_) => self
                .markers
                .released_in_fleet(resource, revision, record.lease_id),
            None => self.markers.released(resource, revision, record.lease_id),
        };
        let index = self.index_key(record.principal.as_deref(), resource);
        // A fleet's grant leaves the fleet's index of its grants with it.
        let fleet_index = (record.fleet.as_deref()).map(|f| self.layout.fleet_grant(f, resource));
        let also: Vec<&str> = [index.as_deref(), fleet_index.as_deref()]
            .into_iter()
            .flatten()
            .collect();
        self.commit
            .delete_if_created(&self.key(resource), revision, &also, Some(marker.put()))
            .await
    }

    /// Closes session `id` with its close marker, written only while the session's key is on
    /// its lease, then revokes the lease (every grant on it ends in that revision). Whether the
    /// session was still there to close.
    pub(super) async fn close_marked(&self, id: i64) -> Result<bool> {
        let marker = self.markers.closed(id);
        if !self
            .commit
            .mark(marker.put(), &self.session_key(id))
            .await?
        {
            return Ok(false);
        }
        self.etcd.revoke(id).await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn markers() -> EndMarkers {
        EndMarkers::new(&Layout::new("/p/"))
    }

    fn event<'e>(key: &'e str, value: &'e str) -> MarkerEvent<'e> {
        MarkerEvent {
            key: key.as_bytes(),
            value: value.as_bytes(),
        }
    }

    #[test]
    fn markers_are_spelled_under_the_prefix() {
        let m = markers();
        let released = m.released("aisle-1", 42, 7);
        assert_eq!(
            (
                released.key.as_str(),
                released.value.as_str(),
                released.lease
            ),
            ("/p/ended/released/7", "42/aisle-1", 7)
        );
        let closed = m.closed(9);
        assert_eq!(
            (closed.key.as_str(), closed.value.as_str(), closed.lease),
            ("/p/ended/closed/9", "", 9)
        );
    }

    #[test]
    fn a_deletion_is_a_release_only_when_a_marker_names_exactly_its_grant() {
        let m = markers();
        let ends = m.read([
            event("/p/ended/released/7", "42/aisle-1"),
            event("/p/ended/closed/9", ""),
            event("/p/holders/aisle-1", "{}"),
            // Not markers: another prefix, a close id that is not a number.
            event("/q/ended/released/8", "43/aisle-2"),
            event("/p/ended/closed/x", ""),
        ]);
        // The grant the marker names.
        assert!(ends.released("aisle-1", 42, 7));
        // Another grant of one batch (same revision), or a later grant of the resource.
        assert!(!ends.released("aisle-2", 42, 7));
        assert!(!ends.released("aisle-1", 43, 7));
        // Any grant on a closed session's lease.
        assert!(ends.released("aisle-3", 50, 9));
        // Nothing names it: expired.
        assert!(!ends.released("aisle-2", 43, 8));
        assert!(!m.read([]).released("aisle-1", 42, 7));
    }

    #[test]
    fn the_classifier_reads_what_it_writes() {
        let m = markers();
        let written = m.released("r", 5, 3);
        let ends = m.read([MarkerEvent {
            key: written.key.as_bytes(),
            value: written.value.as_bytes(),
        }]);
        assert!(ends.released("r", 5, 3));
        let closed = m.closed(3);
        let ends = m.read([MarkerEvent {
            key: closed.key.as_bytes(),
            value: closed.value.as_bytes(),
        }]);
        assert!(ends.released("anything", 1, 3));
    }

    #[test]
    fn a_fleets_releases_on_one_session_share_a_revision_and_each_is_read() {
        let m = markers();
        let (a, b) = (
            m.released_in_fleet("aisle-1", 42, 7),
            m.released_in_fleet("aisle-2", 43, 7),
        );
        assert_eq!(a.key, "/p/ended/released/7/aisle-1");
        assert_ne!(a.key, b.key, "one key: the two could not share a batch");
        let ends = m.read([a, b].iter().map(|w| MarkerEvent {
            key: w.key.as_bytes(),
            value: w.value.as_bytes(),
        }));
        assert!(ends.released("aisle-1", 42, 7) && ends.released("aisle-2", 43, 7));
        assert!(!ends.released("aisle-1", 43, 7));
    }
}
