//! One acquire attempt, the only one: [`Leases::attempt`] takes a lease (a renewed spare, a new
//! grant, or the session's), writes the grant's record with a create-if-absent transaction, and
//! answers what that came to — a new grant, a replay of a keyed grant, the current holder, or
//! "again". Its steps, in order: the checks before any lease ([`Leases::prepare`]), the lease,
//! the record ([`Draft`]), the caller's right judged again, the create transaction
//! ([`Leases::create`]), and what it found ([`Leases::granted`], [`Leases::found_held`]).

use fencing::Keyring;
use tokio::sync::oneshot;
use tracing::Instrument as _;

use super::shared::GrantLease;
use super::{expires_in_ms, secret, unix_millis, Acquire, Grant, HolderRecord, Leases, Recheck};
use crate::etcd::{Companion, Counted, Create, Creation};
use crate::{Conflict, Error, Result};

/// What one acquire attempt came to.
pub(super) enum Attempt {
    /// A new grant, made at this create revision.
    Granted {
        /// The grant, as the client is told of it.
        grant: Grant,
        /// Its create revision (its token).
        revision: i64,
    },
    /// An earlier grant returned again to a retry with its `Idempotency-Key`.
    Replayed(Grant),
    /// Someone else holds the resource.
    Held(Box<Conflict>),
    /// The grant a retry found was withdrawn meanwhile (its first attempt's client was gone), or
    /// the principal's quota count went stale: try again at once.
    Again,
}

/// What an attempt checked before taking a lease: the principal's held count (with the
/// quota on), and for a keyed acquire its salt and the replay window's lease.
struct Prepared<'r> {
    held: Option<Counted>,
    idempotent: Option<(&'r str, [u8; secret::SALT_LEN])>,
    window: Option<i64>,
}

/// The grant as it will be written: its secret (shown to the client once) and its record.
struct Draft {
    secret: String,
    record: HolderRecord,
    value: Vec<u8>,
}

impl Draft {
    /// The grant of `req` on `lease`, its secret made with `keys` (one keyring for the secret
    /// and the idempotency marker: a replay finds the key that made both).
    fn new(req: &Acquire, lease: &GrantLease, keys: &Keyring, prepared: &Prepared<'_>) -> Self {
        let secret = match prepared.idempotent {
            Some((k, salt)) => {
                secret::idempotent(keys, &req.resource, &req.holder, k, lease.id, &salt)
            }
            None => secret::random(keys, lease.id),
        };
        let record = HolderRecord {
            holder: req.holder.clone(),
            lease_id: lease.id,
            secret_hash: secret::hash(&secret),
            metadata: req.metadata.clone(),
            acquired_at: unix_millis(),
            ttl_seconds: lease.ttl,
            principal: req.principal.clone(),
            idempotency: prepared.idempotent.map(|(k, salt)| {
                secret::idempotency_marker(keys, &req.resource, &req.holder, k, &salt)
            }),
            session: req.session.is_some(),
            fleet: None,
        };
        let value = record.encode();
        Self {
            secret,
            record,
            value,
        }
    }
}

impl Leases {
    /// One attempt, run to its end in a task of its own whatever the caller does: once the
    /// create transaction may have committed, the grant is either pre-fenced and handed to the
    /// caller or withdrawn. A caller that has gone away (client disconnected, request timed
    /// out) cannot take it, so a grant made for it is revoked rather than left to its TTL —
    /// unless the request carried an `Idempotency-Key`: then a retry may take (or already have
    /// taken) that grant, so it is kept, and lapses by its TTL if no retry comes.
    pub(super) async fn attempt(&self, req: &Acquire) -> Result<Attempt> {
        let (answer, answered) = oneshot::channel();
        let this = self.clone();
        let req = req.clone();
        // The task stays in the request's span, so its etcd calls and pre-fence join its trace.
        self.tracker.spawn(
            async move {
                let outcome = this.attempt_steps(&req).await;
                if let Err(Ok(Attempt::Granted { grant, revision })) = answer.send(outcome) {
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

    /// The steps of [`Leases::attempt`], in order.
    async fn attempt_steps(&self, req: &Acquire) -> Result<Attempt> {
        let prepared = self.prepare(req).await?;
        // etcd starts (or restarts) the lease's clock after `counted_from`, so the lease lasts
        // at least until `counted_from + ttl` — measured from the request's arrival, that is
        // `waited + ttl`. Under a session, the lease is the session's, renewed now.
        let lease = match req.session {
            Some(session) => {
                let (ttl, renewing) = self.session_lease_for_acquire(session).await?;
                GrantLease {
                    id: session,
                    ttl,
                    counted_from: renewing,
                }
            }
            None => self.lease_for(req.ttl_seconds).await?,
        };
        let keys = self.keys.current();
        let draft = Draft::new(req, &lease, &keys, &prepared);
        // The last moment before the grant can exist: a caller removed from (or narrowed in)
        // the token file since its request was authorised gets the check's 401 or 403.
        if let Err(e) = Recheck::check_if_any(req.recheck.as_ref()) {
            self.give_back_unless_session(req, &lease).await?;
            return Err(e);
        }
        match self.create(req, &prepared, &lease, &draft).await? {
            Create::Created(revision) => self.granted(req, &lease, draft, revision).await,
            Create::Exists(kv, window_kv) => {
                // Held: the lease carries no key; keep it for the next acquire (or revoke it),
                // so a refused acquire leaves no key and no unaccounted lease behind.
                self.give_back_unless_session(req, &lease).await?;
                self.found_held(req, &keys, &kv, window_kv.as_deref()).await
            }
            Create::Crowded => {
                // Another grant of the principal came in since the count: count again.
                self.give_back_unless_session(req, &lease).await?;
                Ok(Attempt::Again)
            }
            Create::NoSession => Err(Error::SessionLost),
        }
    }

    /// The checks before any lease is taken: a retry whose key's grant has ended is refused,
    /// the principal's grants are counted (with the quota on), and a keyed acquire gets its
    /// salt and the lease of its replay window — a key written with the grant, on a short lease
    /// of its own: a retry is answered with this grant only while that key (of this
    /// incarnation) exists.
    async fn prepare<'r>(&self, req: &'r Acquire) -> Result<Prepared<'r>> {
        let idempotent = req.idempotency_key.as_deref().map(|k| (k, secret::salt()));
        if let Some((k, _)) = idempotent {
            self.refuse_a_used_key(req, k, &self.layout.idempotency(&req.resource))
                .await?;
        }
        let held = self.count_held(req).await?;
        let window = match idempotent {
            Some(_) => Some(self.window.lease(&self.etcd).await?),
            None => None,
        };
        Ok(Prepared {
            held,
            idempotent,
            window,
        })
    }

    /// A lease that carries no key goes back to the pool; a session's lease stays the
    /// session's.
    async fn give_back_unless_session(&self, req: &Acquire, lease: &GrantLease) -> Result<()> {
        match req.session {
            Some(_) => Ok(()),
            None => self.give_back(lease).await,
        }
    }

    /// The create transaction: the ownership key (with the replay window's key, the quota's
    /// guard and the session's) if absent. Its failure leaves the outcome unknown — the key may
    /// exist — so no grant the client never heard of may linger: revoking the lease removes
    /// the key too; a session's lease carries other grants, so there the key is deleted if it
    /// holds this very record (its secret hash is this attempt's alone).
    async fn create(
        &self,
        req: &Acquire,
        prepared: &Prepared<'_>,
        lease: &GrantLease,
        draft: &Draft,
    ) -> Result<Create> {
        let key = self.key(&req.resource);
        let window_key = self.layout.idempotency(&req.resource);
        let marker = draft.record.idempotency.clone().unwrap_or_default();
        let session_key = req.session.map(|s| self.session_key(s));
        let created = self
            .commit
            .create_if_absent(Creation {
                key: &key,
                value: &draft.value,
                lease: lease.id,
                companion: prepared.window.map(|lease| Companion {
                    key: &window_key,
                    value: marker.as_bytes(),
                    lease,
                }),
                quota: prepared.held.as_ref().map(Counted::guard),
                session_key: session_key.as_deref(),
            })
            .await;
        if created.is_err() {
            if req.session.is_some() {
                self.forget_unknown(key, draft.value.clone(), req);
            } else {
                self.etcd.revoke_in_background(lease.id);
            }
            if let Some(window) = prepared.window {
                self.window.forget(window).await;
            }
        }
        created
    }

    /// The create made the grant: the enforcer learns its token before the client does (a
    /// grant the enforcer does not know of would leave the previous holder able to write), or
    /// the grant is withdrawn.
    async fn granted(
        &self,
        req: &Acquire,
        lease: &GrantLease,
        draft: Draft,
        revision: i64,
    ) -> Result<Attempt> {
        let signed = self.token(&req.resource, revision);
        if let Err(e) = self.prefence(&req.resource, &signed.fencing_token).await {
            self.withdraw(
                &req.resource,
                lease.id,
                revision,
                req.session.is_some(),
                req.principal.as_deref(),
            )
            .await;
            return Err(e);
        }
        tracing::info!(resource = %req.resource, holder = %req.holder, token = %signed.token, "granted");
        self.holders.granted(&req.resource, revision);
        self.metrics.grants.add(1, &[]);
        let grant = Grant {
            resource: req.resource.clone(),
            holder: req.holder.clone(),
            lease_id: lease.id,
            secret: draft.secret,
            token: signed.token,
            fencing_token: signed.fencing_token,
            ttl_seconds: lease.ttl,
            expires_in_ms: expires_in_ms(lease.counted_from, lease.ttl, req.received),
            metadata: req.metadata.clone(),
            session: req.session,
        };
        Ok(Attempt::Granted { grant, revision })
    }
}
