//! Leases: acquire, renew, release, inspect — every transition a compare-and-set in etcd.
//!
//! A grant is an etcd lease plus the ownership key `{prefix}holders/{resource}` attached to it,
//! created only if absent. The key's create revision is the fencing token: etcd gives every new
//! incarnation of the key a larger one, so tokens rise with every new holder. When the holder
//! dies its lease lapses, etcd deletes the key, and waiters are woken by the holder watch.
//! Leases that end up carrying no key are reused by later acquires (see [`spares`]).
//!
//! The files follow an acquire's steps: `types` (what is read and answered), `acquire` (waiting
//! in line, then one attempt), `attempt` (the one attempt: lease, record, create transaction),
//! `shared` (spare leases), `replay` (idempotent retries), `confirm` (who holds, and whether a
//! secret proves it), `renew`, `ending` (release, withdrawal), `session`, `list`; the event feed
//! is `events` (reading ownership events from an etcd watch) and `feed` (one such watch shared
//! by the replica's streams), the watch-fed view `view`; `assigned` makes and ends the grants
//! a fleet assigns to its members' sessions.

mod acquire;
mod assigned;
mod attempt;
mod confirm;
mod ending;
mod events;
mod feed;
mod list;
mod marker;
#[cfg(feature = "model")]
pub mod model;
mod position;
mod queue;
mod quota;
mod recheck;
mod record;
mod renew;
mod replay;
mod secret;
pub(crate) mod session;
mod shared;
mod slots;
mod spares;
mod types;
pub(crate) mod validate;
mod view;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencing::{Keys, Token};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::etcd::{Deletions, Etcd, GroupCommit, KeepAlive};
use crate::keys::Layout;
use crate::metrics::Metrics;
use crate::prefence::Prefence;
use crate::Result;
pub(crate) use assigned::{is_session_gone, OnSession};
pub(crate) use events::{Next, OwnershipEvent};
pub(crate) use feed::{Feed, Subscription};
pub(crate) use list::{list_prefixes, Page};
pub(crate) use position::Position;
pub(crate) use recheck::Recheck;
pub(crate) use record::{i64_string, opt_i64_string, HolderRecord};
pub(crate) use slots::{Slot, WatchSlots};
pub(crate) use types::{Acquire, Grant, Holding, Limits, Renewal};
pub(crate) use view::{Changed, Holders, Wakeup};

/// The lease service. Stateless apart from its connections: any replica can serve any lease.
/// Cheap to clone (an acquire attempt runs in a task of its own with a clone).
#[derive(Clone)]
pub(crate) struct Leases {
    etcd: Etcd,
    keepalive: KeepAlive,
    holders: Holders,
    /// The keyring in force (reloaded with the key file): read once per operation.
    keys: Keys,
    /// Where every key lives.
    layout: Layout,
    sessions: Arc<session::Cache>,
    /// Ownership events.
    feed: Feed,
    /// The markers releases and closes write for the events (`marker.rs`).
    markers: marker::EndMarkers,
    commit: GroupCommit,
    era: u64,
    limits: Limits,
    prefence: Prefence,
    spares: Arc<spares::Spares>,
    window: Arc<replay::Window>,
    queue: Arc<queue::WaitQueue>,
    deletions: Deletions,
    /// The proxy's metrics: grants, conflicts, renewals, releases, stale requests.
    metrics: Arc<Metrics>,
    tracker: TaskTracker,
    stopping: CancellationToken,
}

/// A grant's token, as answers carry it: the revision in decimal, and signed for the resource.
struct Signed {
    /// The create revision, decimal.
    token: String,
    /// The signed wire form, for the enforcer.
    fencing_token: String,
}

/// What the lease service is assembled from.
pub(crate) struct Parts {
    /// Reads, grants and keepalives of etcd leases.
    pub(crate) etcd: Etcd,
    /// Writes of ownership keys, batched.
    pub(crate) commit: GroupCommit,
    /// The shared keepalive streams.
    pub(crate) keepalive: KeepAlive,
    /// This replica's view of the holders.
    pub(crate) holders: Holders,
    /// The signing keys of fencing tokens.
    pub(crate) keys: Keys,
    /// Where the keys are.
    pub(crate) layout: Layout,
    /// How long an `Idempotency-Key` is remembered.
    pub(crate) idempotency_window: Duration,
    /// The token era.
    pub(crate) era: u64,
    /// TTL, wait and quota bounds.
    pub(crate) limits: Limits,
    /// The enforcer pre-fenced before a grant is answered.
    pub(crate) prefence: Prefence,
    /// How many etcd leases are kept for reuse.
    pub(crate) spares: usize,
    /// Where what happens is counted.
    pub(crate) metrics: Arc<Metrics>,
}

impl Leases {
    /// Assembles the service. `stopping` fires when the proxy starts draining; waiting acquires
    /// then give up at once. Acquire attempts run on `tracker`.
    pub(crate) fn new(parts: Parts, tracker: TaskTracker, stopping: CancellationToken) -> Self {
        let Parts {
            etcd,
            commit,
            keepalive,
            holders,
            keys,
            layout,
            idempotency_window,
            era,
            limits,
            prefence,
            spares,
            metrics,
        } = parts;
        let waiters_prefix = layout.waiters().to_owned();
        let feed = Feed::new(etcd.clone(), &layout, tracker.clone(), stopping.clone());
        let markers = marker::EndMarkers::new(&layout);
        let deletions = Deletions::start(&etcd, waiters_prefix.clone(), &tracker, stopping.clone());
        let queue = queue::WaitQueue::start(
            etcd.clone(),
            keepalive.clone(),
            waiters_prefix,
            tracker.clone(),
            stopping.clone(),
        );
        Self {
            etcd,
            keepalive,
            holders,
            keys,
            layout,
            sessions: Arc::default(),
            feed,
            markers,
            commit,
            era,
            limits,
            prefence,
            spares: Arc::new(spares::Spares::new(spares)),
            window: Arc::new(replay::Window::new(idempotency_window)),
            queue,
            deletions,
            metrics,
            tracker,
            stopping,
        }
    }

    /// The ownership event feed (`GET /v1/watch`).
    pub(crate) fn feed(&self) -> &Feed {
        &self.feed
    }

    /// Every creation and deletion of an ownership key from now on, as this replica's holder
    /// watch sees them (the fleets follow their resources with it).
    pub(crate) fn holder_changes(&self) -> tokio::sync::broadcast::Receiver<Changed> {
        self.holders.changes()
    }

    /// Fires when the proxy starts draining.
    pub(crate) fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }

    /// Runs `task` as one of the service's tracked tasks: shutdown waits for it, so it must end
    /// once [`Leases::stopping`] fires.
    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tracker.spawn(task);
    }

    /// The bounds this service enforces.
    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    fn key(&self, resource: &str) -> String {
        self.layout.holder(resource)
    }

    /// The token of `revision`, signed now: with the signing key in force, so after a key
    /// rotation a renewal or a forward carries the new key's token for the same grant.
    fn token(&self, resource: &str, revision: i64) -> Signed {
        let revision = u64::try_from(revision).unwrap_or_default();
        let fencing_token = self
            .keys
            .current()
            .mint(resource, Token::new(self.era, revision));
        Signed {
            token: revision.to_string(),
            fencing_token,
        }
    }

    /// The token of the grant of `resource` created at `revision`: the revision in decimal, and
    /// its signed form (with the signing key in force).
    pub(crate) fn signed_token(&self, resource: &str, revision: i64) -> (String, String) {
        let signed = self.token(resource, revision);
        (signed.token, signed.fencing_token)
    }

    /// The held-quota index key of `principal`'s grant of `resource`, when the quota is on.
    fn index_key(&self, principal: Option<&str>, resource: &str) -> Option<String> {
        match (self.limits.quota_held, principal) {
            (Some(_), Some(p)) => Some(self.layout.principal_grant(p, resource)),
            _ => None,
        }
    }

    /// Raises the marks of `resource` to this token where pre-fencing is configured.
    async fn prefence(&self, resource: &str, fencing_token: &str) -> Result<()> {
        self.prefence.raise(resource, fencing_token).await
    }
}

/// How long a lease counted from `counted_from` with `ttl` seconds lasts at least, measured from
/// `received` (when the request reached the proxy), in milliseconds.
fn expires_in_ms(counted_from: Instant, ttl: u64, received: Instant) -> u64 {
    let until = counted_from + Duration::from_secs(ttl);
    u64::try_from(until.saturating_duration_since(received).as_millis()).unwrap_or(u64::MAX)
}

fn secs_to_ms(secs: i64) -> u64 {
    u64::try_from(secs).unwrap_or_default().saturating_mul(1000)
}

/// Wall-clock now, Unix milliseconds: for display, and for a fleet's hand-off deadlines (advice
/// for liveness, never a safety decision).
pub(crate) fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_seconds_become_milliseconds_never_negative() {
        assert_eq!(secs_to_ms(7), 7000);
        assert_eq!(secs_to_ms(0), 0);
        // etcd answers -1 for a lease it no longer knows.
        assert_eq!(secs_to_ms(-1), 0);
        assert_eq!(secs_to_ms(i64::MAX), u64::MAX);
    }

    #[test]
    fn lifetimes_count_from_the_lease_not_the_request() {
        let received = Instant::now();
        let ms = Duration::from_millis;
        // Granted after the request arrived: the wait is added.
        assert_eq!(expires_in_ms(received + ms(250), 10, received), 10_250);
        // A spare granted before the request arrived: only what is left of it.
        assert_eq!(expires_in_ms(received - ms(700), 10, received), 9_300);
        assert_eq!(expires_in_ms(received - ms(20_000), 10, received), 0);
    }

    #[test]
    fn grant_times_are_unix_milliseconds() {
        let now = unix_millis();
        // 2020-09-13 .. 2286-11-20: milliseconds, not seconds or nanoseconds.
        assert!(
            (1_600_000_000_000..10_000_000_000_000).contains(&now),
            "{now}"
        );
    }
}
