//! Leases through `/v3`, confined like keys: a lease granted here gets a marker key attached
//! (`{prefix}v3/leases/{id}`, living and dying with the lease), and revoke, keepalive,
//! time-to-live, listing, and every `lease` a put or a lock names only accept marked leases. Any
//! other lease — the proxy's own `/v1` grants and sessions (whose ids are guessable), its spare
//! pool, anyone else's — is answered as etcd answers a lease it does not know. An id that does
//! not parse is refused before any of this ([`super::request`]), never taken for "ours".
//!
//! With authentication on, the marker's value is the principal that granted the lease, and a
//! lease is "ours" only for that principal ([`Caller`]): another tenant's lease is as unknown as
//! the proxy's own. A marker with an empty value (granted with authentication off) belongs to
//! no principal.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, PoisonError};
use tokio::time::Instant;

use etcd_client::proto::{
    PbLeaseGrantResponse, PbLeaseKeepAliveResponse, PbLeaseLeasesResponse, PbLeaseRevokeResponse,
    PbLeaseTimeToLiveResponse,
};
use etcd_client::{LeaseGrantOptions, LeaseTimeToLiveOptions};

use super::remembered::{Misses, Remembered};
use super::request::{LeaseGrant, TimeToLive};
use super::service::{Caller, Service};
use super::status::{Code, Status, LEASE_NOT_FOUND};
use crate::etcd::{prefix_end, Etcd, Header, Opened, RangePage, Renewed};
use crate::lease::Slot;

/// The marker keys of `/v3` leases.
pub(crate) struct Markers {
    etcd: Etcd,
    prefix: String,
    /// Markers read (or written) here lately ([`Remembered`]; who may use them:
    /// [`Markers::owned_remembered`]).
    remembered: Mutex<Remembered>,
    /// Ids principals named lately that were not theirs ([`Misses`]).
    misses: Mutex<Misses>,
}

/// Whether a lease is the caller's, for a call that answers an unknown lease as etcd does.
pub(crate) enum Lookup {
    Ours,
    /// Not the caller's: the header to answer with (of the read that found it so, lately).
    NotOurs(Header),
}

impl Markers {
    /// Markers under `prefix`.
    pub(crate) fn new(etcd: Etcd, prefix: String) -> Self {
        Self {
            etcd,
            prefix,
            remembered: Mutex::new(Remembered::default()),
            misses: Mutex::new(Misses::default()),
        }
    }

    fn misses(&self) -> MutexGuard<'_, Misses> {
        self.misses.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn remembered(&self) -> MutexGuard<'_, Remembered> {
        self.remembered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn remember(&self, id: i64, owner: &[u8]) {
        self.remembered().insert(id, owner, Instant::now());
    }

    /// Forgets lease `id` (revoked, or found gone).
    pub(crate) fn forget(&self, id: i64) {
        self.remembered().remove(id);
    }

    fn key(&self, id: i64) -> String {
        format!("{}{id}", self.prefix)
    }

    /// Marks lease `id` as granted through `/v3` by `s`'s principal (if any).
    async fn mark(&self, id: i64, s: &Caller) -> Result<(), Status> {
        let owner = s.owner.as_deref().unwrap_or_default();
        self.etcd
            .put_value_with_lease(&self.key(id), owner.as_bytes(), id)
            .await?;
        self.remember(id, owner.as_bytes());
        self.misses().remove(owner.as_bytes(), id);
        Ok(())
    }

    /// [`Self::owned`] from the marker this replica read lately, if it did ([`Remembered`]),
    /// else read. A gone lease may still be taken for `s`'s here: only for calls that then
    /// answer it as etcd answers an unknown lease — a renewal (TTL 0) and a lock or campaign's
    /// join (etcd refuses the put under a gone lease: "requested lease not found").
    pub(crate) async fn owned_remembered(&self, id: i64, s: &Caller) -> Result<bool, Status> {
        Ok(id != 0 && matches!(self.lookup(id, s).await?, Lookup::Ours))
    }

    /// [`Self::owned_remembered`], and for a lease not `s`'s a header to answer with: a miss
    /// `s`'s principal had lately costs etcd nothing, a new one one read ([`Misses`]).
    pub(crate) async fn lookup(&self, id: i64, s: &Caller) -> Result<Lookup, Status> {
        let now = Instant::now();
        let principal = s.owner.as_deref().unwrap_or_default().as_bytes();
        if let Some(header) = self.misses().get(principal, id, now) {
            return Ok(Lookup::NotOurs(header));
        }
        let remembered = self.remembered().get(id, now).map(|owner| s.owns(owner));
        let header = match remembered {
            Some(true) => return Ok(Lookup::Ours),
            // Another principal's, remembered: only a header to read.
            Some(false) => self.etcd.header().await?,
            None => {
                let (kv, header) = self.etcd.get_with_header(&self.key(id)).await?;
                if let Some(kv) = kv {
                    self.remember(id, kv.value());
                    if s.owns(kv.value()) {
                        return Ok(Lookup::Ours);
                    }
                }
                header
            }
        };
        self.misses().insert(principal, id, header, now);
        Ok(Lookup::NotOurs(header))
    }

    /// Whether lease `id` was granted through `/v3` (by `s`'s principal, when authentication is
    /// on) and still exists (a linearizable read).
    pub(crate) async fn owned(&self, id: i64, s: &Caller) -> Result<bool, Status> {
        if id == 0 {
            return Ok(false);
        }
        Ok(self
            .etcd
            .get(&self.key(id))
            .await?
            .is_some_and(|kv| s.owns(kv.value())))
    }

    /// Every lease named in `ids` (0 meaning none) is a `/v3` lease; otherwise etcd's error for
    /// an unknown lease.
    pub(crate) async fn require_all(
        &self,
        ids: impl IntoIterator<Item = i64>,
        s: &Caller,
    ) -> Result<(), Status> {
        for id in ids.into_iter().filter(|id| *id != 0) {
            if !self.owned(id, s).await? {
                return Err(Status::new(Code::NotFound, LEASE_NOT_FOUND));
            }
        }
        Ok(())
    }

    /// Every `/v3` lease of `s`'s principal (every one, with authentication off).
    async fn all(&self, s: &Caller) -> Result<HashSet<i64>, Status> {
        let start = self.prefix.as_bytes();
        let end = prefix_end(start);
        let mut ids = HashSet::new();
        let mut from = start.to_vec();
        loop {
            let RangePage { kvs, more, .. } = self.etcd.range(&from, &end, 1000).await?;
            ids.extend(kvs.iter().filter(|kv| s.owns(kv.value())).filter_map(|kv| {
                let id = kv.key().strip_prefix(start)?;
                std::str::from_utf8(id).ok()?.parse::<i64>().ok()
            }));
            match kvs.last() {
                Some(last) if more => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(ids),
            }
        }
    }
}

impl Service {
    /// `lease/grant`, then the marker; if marking fails the lease is revoked again.
    ///
    /// An explicit non-zero `ID` is refused (code 3): with it a client could learn whether any
    /// lease exists (etcd answers "lease already exists") and take ids ahead of etcd's counter,
    /// so that the proxy's own grants fail with that error.
    pub(crate) async fn lease_grant(
        &self,
        s: &Caller,
        g: LeaseGrant,
    ) -> Result<PbLeaseGrantResponse, Status> {
        if g.id != 0 {
            return Err(Status::invalid(
                "lease-proxy: an explicit lease ID is not accepted; leave it 0 and etcd chooses",
            ));
        }
        let resp = self
            .etcd
            .bounded_once("v3_grant", |c| async move {
                c.lease_client()
                    .grant(g.ttl, Some(LeaseGrantOptions::new().with_id(g.id)))
                    .await
            })
            .await?;
        if resp.id() != 0 {
            if let Err(e) = self.leases.mark(resp.id(), s).await {
                self.etcd.revoke_in_background(resp.id());
                return Err(e);
            }
        }
        Ok(resp.0)
    }

    /// `lease/revoke`: of a `/v3` lease, else etcd's 404 for an unknown lease.
    pub(crate) async fn lease_revoke(
        &self,
        s: &Caller,
        id: i64,
    ) -> Result<PbLeaseRevokeResponse, Status> {
        if !self.leases.owned(id, s).await? {
            return Err(Status::new(Code::NotFound, LEASE_NOT_FOUND));
        }
        let resp = self
            .etcd
            .bounded_once(
                "v3_revoke",
                |c| async move { c.lease_client().revoke(id).await },
            )
            .await?;
        self.leases.forget(id);
        Ok(resp.0)
    }

    /// `lease/timetolive`: of a `/v3` lease (its keys outside the namespace, such as the marker,
    /// not listed), else etcd's answer for an unknown lease: `TTL: -1`.
    pub(crate) async fn lease_time_to_live(
        &self,
        s: &Caller,
        t: TimeToLive,
    ) -> Result<PbLeaseTimeToLiveResponse, Status> {
        if !self.leases.owned(t.id, s).await? {
            let header = self.etcd.header().await?;
            return Ok(PbLeaseTimeToLiveResponse {
                header: Some(header.into()),
                id: t.id,
                ttl: -1,
                ..Default::default()
            });
        }
        let options = if t.keys {
            LeaseTimeToLiveOptions::new().with_keys()
        } else {
            LeaseTimeToLiveOptions::new()
        };
        let resp = self
            .etcd
            .bounded("v3_time_to_live", |c| {
                let options = options.clone();
                async move { c.lease_client().time_to_live(t.id, Some(options)).await }
            })
            .await?;
        Ok(s.namespace.time_to_live_out(resp.0))
    }

    /// `lease/leases`: the `/v3` leases among etcd's, in etcd's order.
    pub(crate) async fn lease_leases(&self, s: &Caller) -> Result<PbLeaseLeasesResponse, Status> {
        let resp = self
            .etcd
            .bounded(
                "v3_leases",
                |c| async move { c.lease_client().leases().await },
            )
            .await?;
        let ours = self.leases.all(s).await?;
        let mut leases = resp.0;
        leases.leases.retain(|l| ours.contains(&l.id));
        Ok(leases)
    }

    /// `lease/keepalive` of one id: renewed over the proxy's shared keepalive streams if it is
    /// a `/v3` lease, else answered as etcd answers an unknown lease (no TTL).
    pub(crate) async fn lease_keep_alive(
        &self,
        s: &Caller,
        id: i64,
    ) -> Result<PbLeaseKeepAliveResponse, Status> {
        match self.judge_keep_alive(s, id).await? {
            Judged::Ours => self.renew_ours(id).await,
            Judged::Answer(answer) => Ok(answer),
        }
    }

    /// Whether `s` may renew lease `id`: [`Judged::Ours`] if it is the caller's `/v3` lease, else
    /// the answer etcd gives for a lease it does not know (no TTL).
    pub(crate) async fn judge_keep_alive(&self, s: &Caller, id: i64) -> Result<Judged, Status> {
        // A stream outlives its authorisation: every renewal is judged again.
        s.still_authorised()?;
        Ok(match self.leases.lookup(id, s).await? {
            Lookup::Ours => Judged::Ours,
            Lookup::NotOurs(header) => Judged::Answer(PbLeaseKeepAliveResponse {
                header: Some(header.into()),
                id,
                ttl: 0,
            }),
        })
    }

    /// Renews lease `id`, judged the caller's, over the proxy's shared keepalive streams.
    pub(crate) async fn renew_ours(&self, id: i64) -> Result<PbLeaseKeepAliveResponse, Status> {
        let mut renewed = self.keepalive.renew_with_header(id).await?;
        if renewed.header.is_none() {
            renewed.header = Some(self.etcd.header().await?);
        }
        Ok(self.renewed(id, renewed))
    }

    /// The answer to a renewal of lease `id` etcd answered with `renewed` (with a header).
    pub(crate) fn renewed(&self, id: i64, renewed: Renewed) -> PbLeaseKeepAliveResponse {
        if renewed.ttl <= 0 {
            self.leases.forget(id);
        }
        PbLeaseKeepAliveResponse {
            header: renewed.header.map(Into::into),
            id,
            ttl: renewed.ttl.max(0),
        }
    }

    /// An etcd keepalive stream of the caller's own, opened with lease `id` (judged the
    /// caller's), and the slot it holds while open; `None` when the caller's principal, or the
    /// replica, has as many open as `--keepalive-own-streams` allows.
    pub(crate) async fn open_keep_alive(&self, s: &Caller, id: i64) -> Option<(Opened, Slot)> {
        let slot = self.streams.own_keepalives.take(s.owner.as_deref()).ok()?;
        Some((self.keepalive.open_own(id).await, slot))
    }
}

/// Whether a renewal is the caller's to make.
pub(crate) enum Judged {
    /// The caller's `/v3` lease: renew it.
    Ours,
    /// Not the caller's: etcd's answer for a lease it does not know.
    Answer(PbLeaseKeepAliveResponse),
}
