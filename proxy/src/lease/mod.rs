//! Leases: acquire, renew, release, inspect — every transition a compare-and-set in etcd.
//!
//! A grant is an etcd lease plus the ownership key `{prefix}holders/{resource}` attached to it,
//! created only if absent. The key's create revision is the fencing token: etcd gives every new
//! incarnation of the key a larger one, so tokens rise with every new holder. When the holder
//! dies its lease lapses, etcd deletes the key, and waiters are woken by the holder watch.
//! Leases that end up carrying no key are reused by later acquires (see [`spares`]).

mod events;
mod list;
mod position;
mod queue;
mod quota;
mod recheck;
mod record;
mod secret;
pub(crate) mod session;
mod spares;
pub(crate) mod validate;
mod view;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencing::{Keys, Token};
use serde::Serialize;
use tokio::sync::{broadcast, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::etcd::{Companion, Create, Creation, Deleted, Deletions, Etcd, GroupCommit, KeepAlive};
use crate::keys::Layout;
use crate::metrics;
use crate::upstream::Upstream;
use crate::{Conflict, Error, Result};
pub(crate) use events::{Feed, Next, OwnershipEvent, Subscription};
pub(crate) use list::{list_prefixes, Page};
pub(crate) use position::Position;
pub(crate) use recheck::Recheck;
pub(crate) use record::{i64_string, opt_i64_string, HolderRecord};
pub(crate) use view::{Holders, Wakeup};

/// Bounds applied to client requests.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Shortest TTL accepted, in seconds (at least etcd's own minimum of 2 s).
    pub(crate) min_ttl: u64,
    /// Longest TTL accepted, in seconds.
    pub(crate) max_ttl: u64,
    /// Longest `wait_ms` accepted.
    pub(crate) max_wait: Duration,
    /// Most grants one principal may hold at once (`--quota-held`), with authentication on.
    pub(crate) quota_held: Option<u64>,
}

/// An acquire, validated.
#[derive(Debug, Clone)]
pub(crate) struct Acquire {
    /// The resource to own.
    pub(crate) resource: String,
    /// Who asks.
    pub(crate) holder: String,
    /// The authenticated principal, recorded in the grant (`None` with authentication off).
    pub(crate) principal: Option<String>,
    /// Requested TTL in seconds.
    pub(crate) ttl_seconds: u64,
    /// How long to wait for a held resource to become free.
    pub(crate) wait: Duration,
    /// Opaque metadata stored with the grant.
    pub(crate) metadata: Option<serde_json::Value>,
    /// Makes a retried acquire return the same grant.
    pub(crate) idempotency_key: Option<String>,
    /// When the request reached the proxy: `expires_in_ms` is measured from here.
    pub(crate) received: Instant,
    /// The session to hold the resource under (its lease), instead of a lease of its own;
    /// verified (secret, principal) by the caller.
    pub(crate) session: Option<i64>,
    /// The caller's right to this acquire, judged again before every create transaction and
    /// whenever it may have changed while the acquire waits (`None` with authentication off).
    pub(crate) recheck: Option<Recheck>,
}

/// A successful acquire, as returned to the client (the only time the secret is shown).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct Grant {
    /// The resource now held.
    pub(crate) resource: String,
    /// The holder.
    pub(crate) holder: String,
    /// The etcd lease id.
    #[serde(with = "i64_string")]
    #[schema(value_type = String, example = "7587869420498113795")]
    pub(crate) lease_id: i64,
    /// Proof of holding, required in `Lease-Secret` to renew, release and forward.
    pub(crate) secret: String,
    /// The fencing token's revision, as a decimal string.
    pub(crate) token: String,
    /// The signed fencing token to present to protected storage.
    pub(crate) fencing_token: String,
    /// The TTL granted.
    pub(crate) ttl_seconds: u64,
    /// The lease lasts at least this long from when the request reached the proxy.
    pub(crate) expires_in_ms: u64,
    /// Metadata stored with the grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub(crate) metadata: Option<serde_json::Value>,
    /// The session the grant lives on (its lease is the session's).
    #[serde(
        skip_serializing_if = "Option::is_none",
        with = "record::opt_i64_string"
    )]
    #[schema(value_type = Option<String>)]
    pub(crate) session: Option<i64>,
}

/// A successful renewal.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct Renewal {
    /// The resource.
    pub(crate) resource: String,
    /// The TTL etcd renewed the lease to.
    pub(crate) ttl_seconds: u64,
    /// The lease lasts at least this long from when the request reached the proxy.
    pub(crate) expires_in_ms: u64,
    /// The token (revision, decimal string) — unchanged by renewal.
    pub(crate) token: String,
    /// The signed fencing token of the same revision, signed with the key that signs now
    /// (after a key rotation, the new key).
    pub(crate) fencing_token: String,
}

/// A public view of a held resource.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct Holding {
    /// The resource.
    pub(crate) resource: String,
    /// Who holds it.
    pub(crate) holder: String,
    /// The etcd lease id.
    #[serde(with = "i64_string")]
    #[schema(value_type = String, example = "7587869420498113795")]
    pub(crate) lease_id: i64,
    /// The token (revision, decimal string).
    pub(crate) token: String,
    /// The TTL granted.
    pub(crate) ttl_seconds: u64,
    /// Remaining lifetime: for one resource as etcd reports it (whole seconds, rounded down);
    /// in a listing the grant's TTL, the most the lease can have left (no look-up per lease).
    pub(crate) expires_in_ms: u64,
    /// Wall-clock grant time in Unix milliseconds, for display.
    pub(crate) acquired_at: u64,
    /// Metadata stored with the grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub(crate) metadata: Option<serde_json::Value>,
    /// The session the grant lives on.
    #[serde(
        skip_serializing_if = "Option::is_none",
        with = "record::opt_i64_string"
    )]
    #[schema(value_type = Option<String>)]
    pub(crate) session: Option<i64>,
}

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
    /// Ownership events, and the markers releases write for them.
    feed: Feed,
    commit: GroupCommit,
    era: u64,
    limits: Limits,
    prefence: Option<Upstream>,
    spares: Arc<spares::Spares>,
    window: Arc<Window>,
    queue: Arc<queue::WaitQueue>,
    deletions: Deletions,
    tracker: TaskTracker,
    stopping: CancellationToken,
}

/// The etcd lease the replay-window keys of this replica live on: granted with the window as
/// its TTL and replaced once half of it has passed, so a window key lasts at least half the
/// window and at most the window (by etcd's clock; a leader change may extend it, as it does
/// every lease).
struct Window {
    ttl: u64,
    current: tokio::sync::Mutex<Option<(i64, Instant)>>,
}

impl Window {
    fn new(window: Duration) -> Self {
        Self {
            ttl: window.as_secs().max(crate::etcd::ETCD_MIN_TTL),
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// The lease for a window key written now.
    async fn lease(&self, etcd: &Etcd) -> Result<i64> {
        let mut current = self.current.lock().await;
        if let Some((id, granted)) = *current {
            if granted.elapsed() < Duration::from_secs(self.ttl) / 2 {
                return Ok(id);
            }
        }
        let granting = Instant::now();
        let (id, _) = etcd.grant(self.ttl).await?;
        *current = Some((id, granting));
        Ok(id)
    }

    /// Stops using `id` (a write with it failed: it may be gone).
    async fn forget(&self, id: i64) {
        let mut current = self.current.lock().await;
        if current.is_some_and(|(current, _)| current == id) {
            *current = None;
        }
    }
}

/// A spare granted or renewed less than this long ago is handed out without a keepalive: its
/// grant's `expires_in_ms` is measured from that grant, so it is at most this much short of the
/// TTL.
const FRESH: Duration = Duration::from_secs(1);

/// How long a lease counted from `counted_from` with `ttl` seconds lasts at least, measured from
/// `received` (when the request reached the proxy), in milliseconds.
fn expires_in_ms(counted_from: Instant, ttl: u64, received: Instant) -> u64 {
    let until = counted_from + Duration::from_secs(ttl);
    u64::try_from(until.saturating_duration_since(received).as_millis()).unwrap_or(u64::MAX)
}

/// Why a wait ended.
enum Woken<T> {
    /// The event waited for.
    By(T),
    /// Events were missed: look again.
    Lagged,
    /// The wait's deadline passed.
    Deadline,
}

/// What one acquire attempt came to.
enum Attempt {
    /// A new grant, at this create revision.
    Granted(Grant, i64),
    /// An earlier grant returned again to a retry with its `Idempotency-Key`.
    Replayed(Grant),
    /// Someone else holds the resource.
    Held(Box<Conflict>),
    /// The grant a retry found was withdrawn meanwhile (its first attempt's client was gone):
    /// try again at once.
    Again,
}

impl Leases {
    /// Assembles the service. `stopping` fires when the proxy starts draining; waiting acquires
    /// then give up at once. Up to `spares` leases are kept for reuse. Acquire attempts run on
    /// `tracker`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        etcd: Etcd,
        commit: GroupCommit,
        keepalive: KeepAlive,
        holders: Holders,
        keys: Keys,
        layout: Layout,
        idempotency_window: Duration,
        era: u64,
        limits: Limits,
        prefence: Option<Upstream>,
        spares: usize,
        tracker: TaskTracker,
        stopping: CancellationToken,
    ) -> Self {
        let waiters_prefix = layout.waiters().to_owned();
        let feed = Feed::new(etcd.clone(), &layout);
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
            commit,
            era,
            limits,
            prefence,
            spares: Arc::new(spares::Spares::new(spares)),
            window: Arc::new(Window::new(idempotency_window)),
            queue,
            deletions,
            tracker,
            stopping,
        }
    }

    /// Revokes the spare leases and the wait queue's lease (at shutdown; they would lapse by
    /// their TTL anyway).
    pub(crate) async fn revoke_spares(&self) {
        self.queue.revoke().await;
        let revokes = self
            .spares
            .drain()
            .into_iter()
            .map(|id| self.etcd.revoke(id));
        for result in futures::future::join_all(revokes).await {
            if let Err(e) = result {
                tracing::debug!(error = %e, "spare lease not revoked; it lapses by its TTL");
            }
        }
    }

    /// A lease of `ttl` seconds for an acquire, and the instant its TTL counts from at the
    /// latest (the lease lasts at least `ttl` from there): a spare granted or renewed less than
    /// [`FRESH`] ago as it is (a refill's, under load: no etcd call at all), another spare
    /// renewed now, else a new grant.
    async fn lease_for(&self, ttl: u64) -> Result<(i64, u64, Instant)> {
        self.refill(ttl);
        let full = Duration::from_secs(ttl);
        while let Some((id, alive_until)) = self.spares.take(ttl) {
            let counted_from = alive_until.checked_sub(full);
            if let Some(from) = counted_from.filter(|from| from.elapsed() < FRESH) {
                return Ok((id, ttl, from));
            }
            let renewing = Instant::now();
            match self.keepalive.renew(id).await {
                Ok(renewed) if u64::try_from(renewed).ok() == Some(ttl) => {
                    return Ok((id, ttl, renewing));
                }
                // Lapsed meanwhile (TTL 0): forget it and try the next one.
                Ok(_) => continue,
                Err(e) => {
                    self.etcd.revoke_in_background(id);
                    return Err(e);
                }
            }
        }
        let granting = Instant::now();
        let (id, granted) = self.etcd.grant(ttl).await?;
        Ok((id, u64::try_from(granted).unwrap_or(ttl), granting))
    }

    /// Grants leases of `ttl` seconds ahead of demand into the spare pool, in the background,
    /// when the pool runs low (see [`spares`]).
    fn refill(&self, ttl: u64) {
        if self.stopping.is_cancelled() {
            return;
        }
        let Some(want) = self.spares.refill(ttl) else {
            return;
        };
        let this = self.clone();
        self.tracker.spawn(async move {
            let grants = (0..want).map(|_| async {
                let granting = Instant::now();
                (this.etcd.grant(ttl).await, granting)
            });
            for (granted, granting) in futures::future::join_all(grants).await {
                match granted {
                    Ok((id, granted)) => {
                        let kept = u64::try_from(granted).ok() == Some(ttl)
                            && !this.stopping.is_cancelled()
                            && this
                                .spares
                                .put(ttl, id, granting + Duration::from_secs(ttl));
                        if !kept {
                            this.etcd.revoke_in_background(id);
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "granting a spare lease failed"),
                }
            }
            this.spares.refilled(ttl);
        });
    }

    /// Keeps a lease that carries no key for reuse, or revokes it when the pool is full.
    async fn give_back(&self, lease_id: i64, ttl: u64, counted_from: Instant) -> Result<()> {
        let alive_until = counted_from + std::time::Duration::from_secs(ttl);
        if self.spares.put(ttl, lease_id, alive_until) {
            return Ok(());
        }
        self.etcd.revoke(lease_id).await
    }

    /// The ownership event feed (`GET /v1/watch`).
    pub(crate) fn feed(&self) -> &Feed {
        &self.feed
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
    fn token(&self, resource: &str, revision: i64) -> (String, String) {
        let revision = u64::try_from(revision).unwrap_or_default();
        let signed = self
            .keys
            .current()
            .mint(resource, Token::new(self.era, revision));
        (revision.to_string(), signed)
    }

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
            return self.try_once(req).await;
        }
        // A retried acquire (same Idempotency-Key) whose grant exists must get it back, not
        // queue behind it.
        if req.idempotency_key.is_some() {
            if let Some((record, _)) = self.current(&req.resource).await? {
                if record.holder == req.holder && record.idempotency.is_some() {
                    match self.attempt(req).await? {
                        Attempt::Granted(grant, _) | Attempt::Replayed(grant) => return Ok(grant),
                        Attempt::Held(_) | Attempt::Again => {}
                    }
                }
            }
        }
        // Judged again whenever the token file changes while this acquire waits: a caller
        // removed or narrowed meanwhile leaves the line with the check's 401 or 403.
        let mut recheck = req.recheck.clone();
        let mut place = self.queue.enqueue(&req.resource).await?;
        // 1. Wait until nobody is ahead in line.
        loop {
            // Subscribed before the read, so a deletion right after it is not missed.
            let mut deletions = self.deletions.subscribe();
            let Some(ahead) = self
                .etcd
                .last_created_before(&place.line, place.revision)
                .await?
            else {
                break;
            };
            let own = place.key().as_bytes().to_vec();
            let woken = self
                .wait_for(&mut deletions, deadline, &mut recheck, |d: &Deleted| {
                    d.concerns(&ahead) || d.concerns(&own)
                })
                .await?;
            match woken {
                Woken::Deadline => {
                    drop(place);
                    return self.try_once(req).await;
                }
                Woken::By(Deleted::Key(k)) if k == own => {
                    // Our own entry lapsed with the replica's queue lease (etcd unreachable
                    // for a while): stand in line again rather than wait behind nothing.
                    drop(place);
                    place = self.queue.enqueue(&req.resource).await?;
                }
                Woken::By(_) | Woken::Lagged => {}
            }
        }
        // 2. First in line: take the resource as soon as it is free. Only this waiter watches
        // the ownership key, so a release wakes one waiter, not every one.
        let key = self.key(&req.resource);
        loop {
            let mut released = self.holders.subscribe();
            let conflict = match self.etcd.get(&key).await? {
                // Held: wait for its end without a write (a create txn would be refused).
                Some(_) => None,
                None => match self.attempt(req).await? {
                    Attempt::Granted(grant, _) | Attempt::Replayed(grant) => {
                        // Leaving the line (the drop of `place`) wakes the next waiter.
                        drop(place);
                        return Ok(grant);
                    }
                    Attempt::Held(conflict) => Some(conflict),
                    Attempt::Again => continue,
                },
            };
            let resource = req.resource.as_str();
            let woken = self
                .wait_for(&mut released, deadline, &mut recheck, |w: &Wakeup| {
                    w.concerns(resource)
                })
                .await?;
            if let Woken::Deadline = woken {
                drop(place);
                return match conflict {
                    Some(conflict) => {
                        self.etcd.metrics().conflicts.add(1, &[]);
                        Err(Error::Held(conflict))
                    }
                    None => self.try_once(req).await,
                };
            }
        }
    }

    /// One attempt, answered as a conflict when the resource is held.
    async fn try_once(&self, req: &Acquire) -> Result<Grant> {
        loop {
            match self.attempt(req).await? {
                Attempt::Granted(grant, _) | Attempt::Replayed(grant) => return Ok(grant),
                Attempt::Held(conflict) => {
                    self.etcd.metrics().conflicts.add(1, &[]);
                    return Err(Error::Held(conflict));
                }
                Attempt::Again => continue,
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
                () = recheck::changed(recheck) => {
                    if let Some(r) = recheck {
                        r.check()?;
                    }
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

    /// One attempt, run to its end in a task of its own whatever the caller does: once the
    /// create transaction may have committed, the grant is either pre-fenced and handed to the
    /// caller or withdrawn. A caller that has gone away (client disconnected, request timed
    /// out) cannot take it, so a grant made for it is revoked rather than left to its TTL —
    /// unless the request carried an `Idempotency-Key`: then a retry may take (or already have
    /// taken) that grant, so it is kept, and lapses by its TTL if no retry comes.
    async fn attempt(&self, req: &Acquire) -> Result<Attempt> {
        let (answer, answered) = oneshot::channel();
        let this = self.clone();
        let req = req.clone();
        // The task stays in the request's span, so its etcd calls and pre-fence join its trace.
        self.tracker.spawn(
            async move {
                let outcome = this.try_acquire(&req).await;
                if let Err(Ok(Attempt::Granted(grant, revision))) = answer.send(outcome) {
                    if req.idempotency_key.is_some() {
                        // Kept for the retry the key announces: a retry may already have been
                        // answered with this very grant (on any replica). Without one it lapses
                        // by its TTL.
                        tracing::info!(resource = %grant.resource, "acquiring client gone; keyed grant kept for its retry");
                    } else {
                        tracing::info!(resource = %grant.resource, "acquiring client gone; withdrawing its grant");
                        this.withdraw(&grant.resource, grant.lease_id, revision, grant.session.is_some(), req.principal.as_deref()).await;
                    }
                }
            }
            .instrument(tracing::Span::current()),
        );
        answered.await.map_err(|_| Error::ShuttingDown)?
    }

    /// Refuses a retry whose key was used on this resource within the replay window by this
    /// holder, but whose grant has ended (released or expired): a late duplicate of an acquire
    /// must not create a second grant nobody holds. The window key carries the marker of the
    /// last keyed grant of the resource; if that grant is still the resource's, the retry goes
    /// on and is answered with it.
    async fn refuse_a_used_key(&self, req: &Acquire, key: &str, window_key: &str) -> Result<()> {
        let Some(window) = self.etcd.get(window_key).await? else {
            return Ok(());
        };
        let keys = self.keys.current();
        let used = std::str::from_utf8(window.value())
            .ok()
            .and_then(|marker| {
                secret::idempotency_salt(&keys, marker, &req.resource, &req.holder, key)
            })
            .is_some();
        if !used {
            return Ok(());
        }
        let alive = self
            .current(&req.resource)
            .await?
            .is_some_and(|(_, created)| created == window.mod_revision());
        if alive {
            Ok(())
        } else {
            Err(Error::IdempotencyKeyUsed)
        }
    }

    /// Ends a grant nobody was told of. Its own lease carries its key and nothing else, so it
    /// is revoked; a session's lease carries the session's other grants, so the key alone is
    /// deleted (with the principal's quota index key), if it is still this incarnation.
    async fn withdraw(
        &self,
        resource: &str,
        lease_id: i64,
        revision: i64,
        session: bool,
        principal: Option<&str>,
    ) {
        self.holders.releasing(resource, revision);
        if session {
            let key = self.key(resource);
            let index = self.index_key(principal, resource);
            if let Err(e) = self
                .commit
                .delete_if_created(&key, revision, index.as_deref(), None)
                .await
            {
                // It ends with its session at the latest.
                tracing::warn!(%resource, error = %e, "could not withdraw a session grant nobody was told of");
            }
            return;
        }
        if self.etcd.revoke(lease_id).await.is_err() {
            // Unreachable etcd: the unannounced lease lapses by its TTL.
            self.etcd.revoke_in_background(lease_id);
        }
    }

    /// Cleans up after a create on a session's lease whose outcome is unknown: deletes the key
    /// if it holds this attempt's record, in the background (the client has its error).
    fn forget_unknown(&self, key: String, value: Vec<u8>, req: &Acquire) {
        let this = self.clone();
        let index = self.index_key(req.principal.as_deref(), &req.resource);
        // Retried (it is safe to repeat) while etcd is unreachable, for as long as the session
        // could live without a keepalive; the session's end deletes the key anyway.
        let give_up = Instant::now() + Duration::from_secs(req.ttl_seconds.max(1));
        self.tracker.spawn(async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                match this
                    .commit
                    .delete_if_value(&key, &value, index.as_deref())
                    .await
                {
                    Ok(_) => return,
                    Err(e) if Instant::now() + backoff >= give_up => {
                        tracing::warn!(%key, error = %e, "a session grant of unknown outcome may stay until its session ends");
                        return;
                    }
                    Err(_) => {}
                }
                tokio::select! {
                    () = this.stopping.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        });
    }

    /// The held-quota index key of `principal`'s grant of `resource`, when the quota is on.
    fn index_key(&self, principal: Option<&str>, resource: &str) -> Option<String> {
        match (self.limits.quota_held, principal) {
            (Some(_), Some(p)) => Some(self.layout.principal_grant(p, resource)),
            _ => None,
        }
    }

    /// One attempt: take a lease (a renewed spare or a new grant), then create the ownership
    /// key if absent.
    async fn try_acquire(&self, req: &Acquire) -> Result<Attempt> {
        let key = self.key(&req.resource);
        let idempotent = req.idempotency_key.as_deref().map(|k| (k, secret::salt()));
        // The replay window: a key written with the grant, on a short lease of its own. A retry
        // is answered with this grant only while that key (of this incarnation) exists.
        let window_key = self.layout.idempotency(&req.resource);
        if let Some((k, _)) = idempotent {
            self.refuse_a_used_key(req, k, &window_key).await?;
        }
        let held = self.count_held(req).await?;
        let window = match idempotent {
            Some(_) => Some(self.window.lease(&self.etcd).await?),
            None => None,
        };
        // etcd starts (or restarts) the lease's clock after `counted_from`, so the lease lasts
        // at least until `counted_from + ttl` — measured from the request's arrival, that is
        // `waited + ttl`. Under a session, the lease is the session's, renewed now.
        let (lease_id, ttl_seconds, counted_from) = match req.session {
            Some(session) => {
                let (ttl, renewing) = self.session_lease_for_acquire(session).await?;
                (session, ttl, renewing)
            }
            None => self.lease_for(req.ttl_seconds).await?,
        };
        let in_session = req.session.is_some();
        let session_guard = req.session.map(|s| self.session_key(s));
        let expires_in_ms = expires_in_ms(counted_from, ttl_seconds, req.received);
        // One keyring for the secret and the marker: a replay finds the key that made both.
        let keys = self.keys.current();
        let secret = match idempotent {
            Some((k, salt)) => {
                secret::idempotent(&keys, &req.resource, &req.holder, k, lease_id, &salt)
            }
            None => secret::random(&keys, lease_id),
        };
        let record = HolderRecord {
            holder: req.holder.clone(),
            lease_id,
            secret_hash: secret::hash(&secret),
            metadata: req.metadata.clone(),
            acquired_at: unix_millis(),
            ttl_seconds,
            principal: req.principal.clone(),
            idempotency: idempotent.map(|(k, salt)| {
                secret::idempotency_marker(&keys, &req.resource, &req.holder, k, &salt)
            }),
            session: in_session,
        };
        let marker = record.idempotency.clone().unwrap_or_default();
        let companion = window.map(|lease| Companion {
            key: &window_key,
            value: marker.as_bytes(),
            lease,
        });
        let value = record.encode();
        // The last moment before the grant can exist: a caller removed from (or narrowed in)
        // the token file since its request was authorised gets the check's 401 or 403.
        if let Err(e) = req.recheck.as_ref().map_or(Ok(()), Recheck::check) {
            if !in_session {
                self.give_back(lease_id, ttl_seconds, counted_from).await?;
            }
            return Err(e);
        }
        let created = match self
            .commit
            .create_if_absent(Creation {
                key: &key,
                value: &value,
                lease: lease_id,
                companion,
                quota: held.as_ref().map(quota::Counted::guard),
                session_key: session_guard.as_deref(),
            })
            .await
        {
            Ok(created) => created,
            Err(e) => {
                // The outcome is unknown: the key may exist. Revoking the lease removes it too,
                // so no grant the client never heard of can linger; a session's lease carries
                // other grants, so there the key is deleted if it holds this very record (its
                // secret hash is this attempt's alone).
                if in_session {
                    self.forget_unknown(key.clone(), value, req);
                } else {
                    self.etcd.revoke_in_background(lease_id);
                }
                if let Some(window) = window {
                    self.window.forget(window).await;
                }
                return Err(e);
            }
        };
        let (kv, window_kv) = match created {
            Create::Created(revision) => {
                let (token, fencing_token) = self.token(&req.resource, revision);
                if let Err(e) = self.prefence(&req.resource, &fencing_token).await {
                    // A grant the enforcer does not know of would leave the previous holder
                    // able to write: withdrawn.
                    self.withdraw(
                        &req.resource,
                        lease_id,
                        revision,
                        in_session,
                        req.principal.as_deref(),
                    )
                    .await;
                    return Err(e);
                }
                tracing::info!(resource = %req.resource, holder = %req.holder, token = %token, "granted");
                self.holders.granted(&req.resource, revision);
                self.etcd.metrics().grants.add(1, &[]);
                let grant = Grant {
                    resource: req.resource.clone(),
                    holder: req.holder.clone(),
                    lease_id,
                    secret,
                    token,
                    fencing_token,
                    ttl_seconds,
                    expires_in_ms,
                    metadata: req.metadata.clone(),
                    session: req.session,
                };
                return Ok(Attempt::Granted(grant, revision));
            }
            Create::Exists(kv, window_kv) => (kv, window_kv),
            Create::Crowded => {
                // Another grant of the principal came in since the count: count again.
                if !in_session {
                    self.give_back(lease_id, ttl_seconds, counted_from).await?;
                }
                return Ok(Attempt::Again);
            }
            Create::NoSession => return Err(Error::SessionLost),
        };
        // Held: the lease carries no key; keep it for the next acquire (or revoke it), so a
        // refused acquire leaves no key and no unaccounted lease behind. (A session's lease
        // stays the session's.)
        if !in_session {
            self.give_back(lease_id, ttl_seconds, counted_from).await?;
        }
        let existing = HolderRecord::decode(&key, kv.value())?;
        let remaining = self.etcd.time_to_live(existing.lease_id).await?;
        if let (Some(k), Some(remaining)) = (&req.idempotency_key, remaining) {
            // A retry of an acquire that already succeeded gets the same grant again, if it
            // names the same holder and key (checked against a keyed marker) and comes while
            // the grant's window key is still there (written with it: same revision).
            let in_window = window_kv.is_some_and(|w| w.mod_revision() == kv.create_revision());
            // Under whichever key of the ring made it (a rotation since then is fine as long as
            // that key is still a line of the file): the replayed secret is made with it again.
            let salt = existing.idempotency.as_deref().and_then(|marker| {
                secret::idempotency_salt(&keys, marker, &req.resource, &req.holder, k)
            });
            // Under a session, only a retry under the same session gets its grant back.
            let same_lease = !existing.session && !in_session
                || existing.session && req.session == Some(existing.lease_id);
            if let (true, true, Some((salt, signer))) =
                (in_window && same_lease, existing.holder == req.holder, salt)
            {
                // The key and holder are right, but an Idempotency-Key is no credential: a
                // retry is answered with the grant only for the principal that acquired it.
                existing.owned_by(req.principal.as_deref())?;
                let (token, fencing_token) = self.token(&req.resource, kv.create_revision());
                // The first attempt may still be pre-fencing (or have failed to): the grant is
                // only ever returned once the enforcer knows its token.
                self.prefence(&req.resource, &fencing_token).await?;
                if self.etcd.time_to_live(existing.lease_id).await?.is_none() {
                    return Ok(Attempt::Again);
                }
                return Ok(Attempt::Replayed(Grant {
                    resource: req.resource.clone(),
                    secret: secret::idempotent(
                        &signer,
                        &req.resource,
                        &req.holder,
                        k,
                        existing.lease_id,
                        &salt,
                    ),
                    holder: existing.holder,
                    lease_id: existing.lease_id,
                    token,
                    fencing_token,
                    ttl_seconds: existing.ttl_seconds,
                    expires_in_ms: secs_to_ms(remaining),
                    session: existing.session.then_some(existing.lease_id),
                    metadata: existing.metadata,
                }));
            }
        }
        Ok(Attempt::Held(Box::new(Conflict {
            resource: req.resource.clone(),
            holder: existing.holder,
            token: kv.create_revision().to_string(),
            expires_in_ms: secs_to_ms(remaining.unwrap_or(0)),
        })))
    }

    /// Raises the enforcer's mark for `resource` to this token, if pre-fencing is configured.
    async fn prefence(&self, resource: &str, fencing_token: &str) -> Result<()> {
        match &self.prefence {
            Some(enforcer) => enforcer.prefence(resource, fencing_token).await,
            None => Ok(()),
        }
    }

    /// The current record of `resource` and its create revision.
    async fn current(&self, resource: &str) -> Result<Option<(HolderRecord, i64)>> {
        let key = self.key(resource);
        match self.etcd.get(&key).await? {
            Some(kv) => Ok(Some((
                HolderRecord::decode(&key, kv.value())?,
                kv.create_revision(),
            ))),
            None => Ok(None),
        }
    }

    /// The current grant of `resource` if `secret` proves holding it; `None` if the secret's
    /// grant is no longer the resource's (released, expired, or replaced by another holder's).
    async fn held_with(&self, resource: &str, secret: &str) -> Result<Option<(HolderRecord, i64)>> {
        let lease_id = secret::lease_id(secret).ok_or(Error::NotHolder)?;
        match self.current(resource).await? {
            Some((record, revision)) if record.lease_id == lease_id => {
                if secret::matches(secret, &record.secret_hash) {
                    Ok(Some((record, revision)))
                } else if secret::sealed(&self.keys.current(), secret) {
                    // An earlier grant's secret on a lease since reused for this grant.
                    Ok(None)
                } else {
                    Err(Error::NotHolder)
                }
            }
            _ => Ok(None),
        }
    }

    /// The grant `secret` proves holding of `resource`, and its create revision. Served from
    /// the watch-fed view when the view confirms the secret; anything else (no entry, another
    /// lease, another secret) is settled by a linearizable read, so a grant made a moment ago
    /// through another replica is found, and a wrong secret is told from a lost lease.
    ///
    /// A confirming view may be stale towards a grant that has just ended; see
    /// [`view_confirms`] for who may act on it, and how.
    async fn confirmed(
        &self,
        resource: &str,
        secret: &str,
        purpose: Purpose,
    ) -> Result<(HolderRecord, i64)> {
        let lease_id = secret::lease_id(secret).ok_or(Error::NotHolder)?;
        if let Some(seen) = self.holders.seen(resource) {
            let record = HolderRecord::decode(&self.key(resource), &seen.value)?;
            if view_confirms(&record, lease_id, secret, purpose) {
                return Ok((record, seen.create_revision));
            }
        }
        self.held_with(resource, secret).await?.ok_or(Error::Lost)
    }

    /// The holder's record and signed fencing token, for forwarding its request. Always a
    /// linearizable read: a forward acts on the token, not the lease, so a view that has not yet
    /// seen a completed release (on any replica) must not be trusted here.
    pub(crate) async fn holding_for_forward(
        &self,
        resource: &str,
        secret: &str,
        principal: Option<&str>,
    ) -> Result<(HolderRecord, String)> {
        let (record, revision) = self
            .held_with(resource, secret)
            .await
            .and_then(|held| held.ok_or(Error::Lost))
            .inspect_err(|e| self.count_stale(e))?;
        record.owned_by(principal)?;
        let (_, signed) = self.token(resource, revision);
        Ok((record, signed))
    }

    /// Counts a request refused because its grant has ended.
    fn count_stale(&self, e: &Error) {
        if matches!(e, Error::Lost) {
            let metrics = self.etcd.metrics();
            metrics.stale.add(1, &metrics::reason("lease_lost"));
        }
    }

    /// Extends the holder's lease by its TTL. Fails with [`Error::Lost`] once the lease is gone.
    /// Only `principal` (the caller, `None` with authentication off) may renew its grant.
    pub(crate) async fn renew(
        &self,
        resource: &str,
        secret: &str,
        principal: Option<&str>,
    ) -> Result<Renewal> {
        let renewed = self.renew_grant(resource, secret, principal).await;
        let outcome = match &renewed {
            Ok(_) => "renewed",
            Err(Error::Lost) => "lost",
            Err(_) => return renewed,
        };
        self.etcd
            .metrics()
            .renewals
            .add(1, &metrics::outcome(outcome));
        renewed.inspect_err(|e| self.count_stale(e))
    }

    async fn renew_grant(
        &self,
        resource: &str,
        secret: &str,
        principal: Option<&str>,
    ) -> Result<Renewal> {
        let (record, revision) = self.confirmed(resource, secret, Purpose::Renew).await?;
        record.owned_by(principal)?;
        let ttl = self.keepalive.renew(record.lease_id).await?;
        if ttl <= 0 {
            return Err(Error::Lost);
        }
        let ttl_seconds = u64::try_from(ttl).unwrap_or_default();
        let (token, fencing_token) = self.token(resource, revision);
        Ok(Renewal {
            resource: resource.to_owned(),
            ttl_seconds,
            expires_in_ms: ttl_seconds * 1000,
            token,
            fencing_token,
        })
    }

    /// Gives the resource up. Idempotent: releasing a free resource succeeds.
    ///
    /// Revokes the grant's lease before answering. A grant's lease carries that grant's key and
    /// nothing else, ever (released leases are not reused; only leases that never carried a key
    /// are), so the revoke deletes exactly this incarnation — or nothing, if it has already
    /// ended. Once it has returned, etcd answers every keepalive of the lease with TTL 0, so no
    /// replica renews the grant any more, whatever its view says; forwards read linearizably.
    ///
    /// Only `principal` (the caller, `None` with authentication off) may release its grant.
    /// Answers the token of the grant this call ended, if it ended one.
    pub(crate) async fn release(
        &self,
        resource: &str,
        secret: &str,
        principal: Option<&str>,
    ) -> Result<Option<String>> {
        let (record, revision) = match self.confirmed(resource, secret, Purpose::Release).await {
            Ok(found) => found,
            Err(Error::Lost) => return Ok(None),
            Err(e) => return Err(e),
        };
        record.owned_by(principal)?;
        // From here on the release runs to its end in a task of its own, even if the client
        // goes away: a marker written and a revoke never sent would leave the grant alive (to
        // lapse later, labelled `released`).
        let this = self.clone();
        let resource = resource.to_owned();
        self.tracker
            .spawn(async move { this.end_grant(&resource, &record, revision).await })
            .await
            .map_err(|_| Error::ShuttingDown)?
    }

    /// The second half of [`Leases::release`]: ends the confirmed grant `revision` of
    /// `resource` with its release marker.
    async fn end_grant(
        &self,
        resource: &str,
        record: &HolderRecord,
        revision: i64,
    ) -> Result<Option<String>> {
        self.holders.releasing(resource, revision);
        // The marker tells the event stream this end is a release, not an expiry.
        let marker = self
            .feed
            .released_marker(resource, revision, record.lease_id);
        let ending = if record.session {
            // The session's lease carries its other grants: this key alone, if it is still
            // this incarnation.
            let index = self.index_key(record.principal.as_deref(), resource);
            self.commit
                .delete_if_created(
                    &self.key(resource),
                    revision,
                    index.as_deref(),
                    Some(&marker),
                )
                .await
        } else {
            // The marker goes on the grant's own lease, so the revoke deletes it with the key;
            // it is written only while the key is still on that lease.
            match self.commit.mark(&marker, &self.key(resource)).await {
                Ok(true) => self.etcd.revoke_existing(record.lease_id).await,
                other => other,
            }
        };
        let ended = ending.inspect_err(|_| {
            // Perhaps not ended: should the grant lapse later, that is an expiry.
            self.holders.granted(resource, revision);
        })?;
        // This replica's view must not confirm the grant once the release has answered.
        self.holders.forget(resource, revision);
        if !ended {
            return Ok(None);
        }
        tracing::info!(%resource, holder = %record.holder, "released");
        self.etcd.metrics().releases.add(1, &[]);
        Ok(Some(revision.to_string()))
    }

    /// Who holds `resource`, without secrets.
    pub(crate) async fn get(&self, resource: &str) -> Result<Holding> {
        let (record, revision) = self.current(resource).await?.ok_or(Error::NotFound)?;
        let remaining = self
            .etcd
            .time_to_live(record.lease_id)
            .await?
            .ok_or(Error::NotFound)?;
        Ok(holding(resource.to_owned(), record, revision, remaining))
    }
}

fn holding(resource: String, record: HolderRecord, revision: i64, remaining: i64) -> Holding {
    Holding {
        resource,
        holder: record.holder,
        lease_id: record.lease_id,
        token: revision.to_string(),
        ttl_seconds: record.ttl_seconds,
        expires_in_ms: secs_to_ms(remaining),
        acquired_at: record.acquired_at,
        session: record.session.then_some(record.lease_id),
        metadata: record.metadata,
    }
}

/// What a confirmed grant is wanted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// A keepalive of the grant's lease.
    Renew,
    /// Ending the grant: revoking its lease, or (under a session) deleting its key if it is
    /// still the confirmed incarnation.
    Release,
}

/// Whether a record seen in the watch-fed view may confirm `secret` (of `lease_id`) for
/// `purpose` without a linearizable read. The view may be stale towards a grant that has just
/// ended, so only acts that are harmless on an ended grant may trust it: renewing a grant on a
/// lease of its own (a release revokes that lease before answering, so etcd answers its
/// keepalive with TTL 0), and releasing any grant (a revoke or a compare-and-delete on the
/// confirmed incarnation does nothing to an ended one). A session's lease outlives the release
/// of one of its grants, so its renewal needs the key read: a stale view would renew the session
/// for a released grant.
fn view_confirms(record: &HolderRecord, lease_id: i64, secret: &str, purpose: Purpose) -> bool {
    (purpose == Purpose::Release || !record.session)
        && record.lease_id == lease_id
        && secret::matches(secret, &record.secret_hash)
}

fn secs_to_ms(secs: i64) -> u64 {
    u64::try_from(secs).unwrap_or_default().saturating_mul(1000)
}

fn unix_millis() -> u64 {
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
    fn a_holding_shows_the_grant_and_its_token_but_no_secret() {
        let record = HolderRecord {
            holder: "h".into(),
            lease_id: 7,
            secret_hash: "hash".into(),
            metadata: Some(serde_json::json!({"zone": "b"})),
            acquired_at: 1234,
            ttl_seconds: 30,
            idempotency: None,
            session: false,
            principal: None,
        };
        let h = holding("r".into(), record, 42, 5);
        assert_eq!(
            (
                h.resource.as_str(),
                h.holder.as_str(),
                h.lease_id,
                h.token.as_str()
            ),
            ("r", "h", 7, "42")
        );
        assert_eq!(
            (h.ttl_seconds, h.expires_in_ms, h.acquired_at),
            (30, 5000, 1234)
        );
        assert_eq!(h.metadata, Some(serde_json::json!({"zone": "b"})));
        assert!(!serde_json::to_string(&h).unwrap().contains("hash"));
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
    fn the_view_never_confirms_a_session_grant_for_renewal() {
        let keys = fencing::Keyring::parse(&fencing::Keyring::generate_file(
            &fencing::KeyId::parse("k1").unwrap(),
        ))
        .unwrap();
        let secret = secret::random(&keys, 7);
        let record = HolderRecord {
            holder: "h".into(),
            lease_id: 7,
            secret_hash: secret::hash(&secret),
            metadata: None,
            acquired_at: 0,
            ttl_seconds: 10,
            idempotency: None,
            session: false,
            principal: None,
        };
        for purpose in [Purpose::Renew, Purpose::Release] {
            assert!(view_confirms(&record, 7, &secret, purpose));
            assert!(!view_confirms(&record, 8, &secret, purpose));
            assert!(!view_confirms(
                &record,
                7,
                &secret::random(&keys, 7),
                purpose
            ));
        }
        let in_session = HolderRecord {
            session: true,
            ..record
        };
        assert!(!view_confirms(&in_session, 7, &secret, Purpose::Renew));
        assert!(view_confirms(&in_session, 7, &secret, Purpose::Release));
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
