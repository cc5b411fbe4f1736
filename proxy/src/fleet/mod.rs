//! Fleets: many members sharing many resources (docs/DESIGN.md §5.5).
//!
//! A fleet is a spec (the resources, `drain_ms`, `max_moves`, its principal), members (each a
//! session, its record on the session's lease) and an assignment, all under
//! `{prefix}fleets/{fleet}/` (`records.rs`). Who should hold what is decided by [`assign`], a
//! pure function of what etcd holds; every replica runs the same decision (`reconcile.rs`,
//! driven by `driver.rs`): no leader, since the assignment is written only with a compare on its
//! last revision, and replicas that read the same state write the same bytes. Grants are made
//! only of free resources, on the member's session, guarded by the keys the decision read
//! (`lease::assigned`). The requests — a spec written or ended (`spec.rs`), a join, drain or
//! evict (`members.rs`), the views (`views.rs`) — act on etcd; the replicas' watch then decides.
//! `tests.rs` carries a decision out after the fleet changed, on a real etcd.

pub(crate) mod assign;
mod driver;
mod members;
#[cfg(feature = "model")]
pub mod model;
mod reconcile;
pub(crate) mod records;
mod signals;
mod spec;
#[cfg(test)]
mod tests;
mod views;

use std::sync::Arc;

use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::audit::Audit;
use crate::etcd::{Etcd, GroupCommit};
use crate::keys::Layout;
use crate::lease::{HolderRecord, Leases};
use crate::metrics::Metrics;
use crate::Result;

pub(crate) use members::{check_fleet, check_member, Drainer, Join, Joined, Standing};
pub(crate) use spec::{SpecChange, Written};
pub(crate) use views::{Asked, FleetView, MemberView};

/// Whether a principal (`None`: a member joined without authentication) may acquire every
/// one of the resources: the token file's judgement, asked whenever a fleet decides.
pub(crate) type Entitlement = Arc<dyn Fn(Option<&str>, &[String]) -> bool + Send + Sync>;

/// What the fleet service works with, from the replica.
pub(crate) struct Parts {
    /// Grants and revocations go through the lease service (tokens, pre-fencing, quotas).
    pub(crate) leases: Leases,
    /// Reads of the fleets' keys.
    pub(crate) etcd: Etcd,
    /// Writes of the fleets' keys.
    pub(crate) commit: GroupCommit,
    /// Where the keys are.
    pub(crate) layout: Layout,
    /// Who may hold a fleet's resources.
    pub(crate) entitled: Entitlement,
    /// The service's own grants and revocations are audited (`fleet-grant`, `fleet-revoke`).
    pub(crate) audit: Audit,
    /// And counted (`lease_proxy_fleet_*`).
    pub(crate) metrics: Arc<Metrics>,
    /// The fleets one principal may have made (`--quota-fleets`; `None`: no bound).
    pub(crate) quota: Option<usize>,
}

/// Grants (or revocations) of one decision, or of a fleet's end, in flight at once.
const IN_FLIGHT: usize = 256;

/// Runs `tasks` at most [`IN_FLIGHT`] at a time, each to its end; their outcomes, in the order
/// they finished.
async fn each<T>(tasks: Vec<impl std::future::Future<Output = T>>) -> Vec<T> {
    futures::stream::iter(tasks)
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await
}

/// The fleet service of this replica. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Fleets {
    inner: Arc<Inner>,
}

struct Inner {
    parts: Parts,
    signals: signals::Signals,
    stopping: CancellationToken,
    /// Owns what must run to its end whoever stops waiting for it (a fleet's end).
    tracker: TaskTracker,
}

/// A resource's current grant, as the fleet reads it.
#[derive(Debug, Clone)]
pub(crate) struct Owned {
    /// Whose it is, and its create revision.
    pub(crate) held: assign::Held,
    /// The lease it lives on (a member's session, for the fleet's own grants).
    pub(crate) lease: i64,
    /// The principal its record names: a revocation deletes its held-quota index key too.
    pub(crate) principal: Option<String>,
}

impl Owned {
    /// Ends this grant of `fleet`, if it is still the one read.
    async fn revoke(&self, leases: &Leases, fleet: &str, resource: &str) -> Result<bool> {
        leases
            .revoke_assigned(
                (fleet, resource),
                self.held.revision,
                self.lease,
                self.principal.as_deref(),
            )
            .await
    }
}

impl Fleets {
    /// The service, its decisions driven on `tracker` until `stopping` fires.
    pub(crate) fn start(parts: Parts, tracker: &TaskTracker, stopping: CancellationToken) -> Self {
        let fleets = Self::undriven(parts, tracker, stopping);
        driver::start(fleets.clone(), tracker);
        fleets
    }

    /// The service with no driver: nothing decides but what calls [`Fleets::decide`].
    fn undriven(parts: Parts, tracker: &TaskTracker, stopping: CancellationToken) -> Self {
        Self {
            inner: Arc::new(Inner {
                parts,
                signals: signals::Signals::default(),
                stopping,
                tracker: tracker.clone(),
            }),
        }
    }

    /// The fleet's keys, read at one revision; `None` if there is no such fleet.
    async fn snapshot(&self, fleet: &str) -> Result<Option<records::Snapshot>> {
        let listed = self
            .inner
            .parts
            .etcd
            .list(&self.inner.parts.layout.fleet(fleet), 1_000)
            .await?;
        records::Snapshot::decode(&self.inner.parts.layout, fleet, listed)
    }

    /// The grants of `resources` when `snap` was read, each classified for `snap`'s fleet: its
    /// own on a member's session, its own on a session no member has any more, or another's.
    ///
    /// Read at the snapshot's revision, not now: a grant made since, on the session of a member
    /// the snapshot does not have yet (or has on its old session), would read as an orphan's
    /// and be revoked; and a view whose assignment still hands a resource over while its grant
    /// to the new holder is already read would list that grant as both held and to release.
    async fn owned(
        &self,
        snap: &records::Snapshot,
        resources: impl IntoIterator<Item = String>,
    ) -> Result<std::collections::BTreeMap<String, Owned>> {
        let resources: Vec<String> = resources.into_iter().collect();
        let keys: Vec<String> = resources
            .iter()
            .map(|r| self.inner.parts.layout.holder(r))
            .collect();
        let found = self.inner.parts.etcd.get_many(&keys, snap.revision).await?;
        let mut owned = std::collections::BTreeMap::new();
        for ((resource, key), kv) in resources.into_iter().zip(&keys).zip(found) {
            let Some(kv) = kv else { continue };
            let (holder, principal) = match HolderRecord::decode(key, kv.value()) {
                Ok(record) if record.fleet.as_deref() == Some(snap.fleet.as_str()) => {
                    let holder = match snap.member_on(record.lease_id) {
                        Some(name) => assign::Holder::Member(name.to_owned()),
                        None => assign::Holder::Orphan,
                    };
                    (holder, record.principal)
                }
                // Not the fleet's (or unreadable): never touched.
                _ => (assign::Holder::Foreign, None),
            };
            owned.insert(
                resource,
                Owned {
                    held: assign::Held {
                        holder,
                        revision: kv.create_revision(),
                    },
                    lease: kv.lease(),
                    principal,
                },
            );
        }
        Ok(owned)
    }
}
