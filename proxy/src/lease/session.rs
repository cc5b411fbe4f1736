//! Sessions (etcd's `concurrency.Session`, Consul's sessions): one etcd lease, kept alive by one
//! heartbeat, that any number of grants live on.
//!
//! A session is its etcd lease (the session id is the lease id, in decimal) plus a session key
//! `{prefix}sessions/{id}` attached to it, holding the [`SessionRecord`]: the holder, the
//! principal that opened it and the hash of the session's secret. An acquire under a session
//! puts the ownership key on the session's lease, in a create transaction that also requires
//! the session key to exist — so a grant is never attached to a session that has ended, and
//! costs one transaction and no lease grant. Keepalives of the session renew every grant on it
//! at once; closing the session revokes its lease, which deletes every key on it (its grants end
//! together, as they do when the session expires). Each grant keeps its own create revision,
//! fencing token and secret: a grant under a session is renewed (that is, its session is),
//! released (its key alone is deleted, compare-and-delete on its create revision) and forwarded
//! like any other.
//!
//! A session is its principal's (the one that opened it, with authentication on): to anyone
//! else, whatever secret they show, it answers as a session that does not exist — inspected,
//! kept alive, closed or acquired under — so session ids, which etcd hands out in sequence,
//! tell other principals nothing. A secret that does not prove the session gets the same answer.
//!
//! The session's secret proves the session: it opens grants on it and heartbeats and closes it;
//! it is sealed in a domain of its own, so it is never taken for a grant's secret on the same
//! lease id. Session ids are never reused (a lease id belongs to one session, since session
//! leases are never spares), so a verified record is cached: a cached session that has ended is
//! found out by etcd itself (keepalive TTL 0, the create transaction's guard).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::record::i64_string;
use super::{secret, unix_millis, Leases};
use crate::{Error, ProofFailure, Result};

/// Most session records cached per replica; past it the cache starts again empty.
const CACHED_SESSIONS: usize = 100_000;

/// The value stored under a session key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    /// Who opened it.
    pub(crate) holder: String,
    /// base64url(SHA-256(session secret)).
    pub(crate) secret_hash: String,
    /// The session's TTL, seconds.
    pub(crate) ttl_seconds: u64,
    /// The principal that opened it (with authentication on): only it may use the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) principal: Option<String>,
    /// Wall-clock opening time, Unix milliseconds, for display.
    pub(crate) created_at: u64,
}

/// A session, as returned when it is opened (the only time its secret is shown).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct Opened {
    /// The session id (its etcd lease id, decimal).
    #[serde(with = "i64_string")]
    #[schema(value_type = String, example = "7587869420498113795")]
    pub(crate) session_id: i64,
    /// The holder.
    pub(crate) holder: String,
    /// Proof of the session, required in `Lease-Secret` to acquire under it, keep it alive and
    /// close it.
    pub(crate) secret: String,
    /// The session's TTL.
    pub(crate) ttl_seconds: u64,
    /// The session lasts at least this long from when the request reached the proxy.
    pub(crate) expires_in_ms: u64,
}

/// A session's heartbeat answer.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct Heartbeat {
    /// The session id.
    #[serde(with = "i64_string")]
    #[schema(value_type = String, example = "7587869420498113795")]
    pub(crate) session_id: i64,
    /// The TTL etcd renewed the session to.
    pub(crate) ttl_seconds: u64,
    /// The session (and each of its grants) lasts at least this long from when the request
    /// reached the proxy.
    pub(crate) expires_in_ms: u64,
}

/// A public view of a session.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct SessionView {
    /// The session id.
    #[serde(with = "i64_string")]
    #[schema(value_type = String, example = "7587869420498113795")]
    pub(crate) session_id: i64,
    /// Who opened it.
    pub(crate) holder: String,
    /// Its TTL.
    pub(crate) ttl_seconds: u64,
    /// Remaining lifetime as etcd reports it (whole seconds, rounded down).
    pub(crate) expires_in_ms: u64,
    /// Wall-clock opening time, Unix milliseconds, for display.
    pub(crate) created_at: u64,
    /// The resources held under it, in name order.
    pub(crate) resources: Vec<String>,
}

/// Verified session records of this replica.
#[derive(Default)]
pub(crate) struct Cache {
    records: Mutex<HashMap<i64, Arc<SessionRecord>>>,
    /// When this replica last renewed each session, and the TTL etcd answered.
    renewed: Mutex<HashMap<i64, (Instant, u64)>>,
}

impl Cache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Arc<SessionRecord>>> {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn get(&self, id: i64) -> Option<Arc<SessionRecord>> {
        self.lock().get(&id).cloned()
    }

    fn put(&self, id: i64, record: Arc<SessionRecord>) {
        let mut records = self.lock();
        if records.len() >= CACHED_SESSIONS {
            records.clear();
        }
        records.insert(id, record);
    }

    fn forget(&self, id: i64) {
        self.lock().remove(&id);
        self.renewals().remove(&id);
    }

    fn renewals(&self) -> std::sync::MutexGuard<'_, HashMap<i64, (Instant, u64)>> {
        self.renewed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The last renewal of `id` through this replica, if it was sent less than `fresh` ago.
    fn renewed_within(&self, id: i64, fresh: std::time::Duration) -> Option<(Instant, u64)> {
        self.renewals()
            .get(&id)
            .copied()
            .filter(|(at, _)| at.elapsed() < fresh)
    }

    fn renewed_at(&self, id: i64, at: Instant, ttl: u64) {
        let mut renewed = self.renewals();
        if renewed.len() >= CACHED_SESSIONS {
            renewed.clear();
        }
        renewed.insert(id, (at, ttl));
    }
}

/// Parses a session id from a path or a body.
pub(crate) fn parse_id(text: &str) -> Result<i64> {
    text.parse::<i64>()
        .ok()
        .filter(|id| *id > 0 && id.to_string() == text)
        .ok_or_else(|| Error::InvalidField {
            field: "session",
            reason: "not a session id (a positive decimal number)".into(),
        })
}

impl Leases {
    /// The key of session `id` (also the create transaction's guard under it).
    pub(super) fn session_key(&self, id: i64) -> String {
        self.layout.session(id)
    }

    /// Opens a session of `ttl` seconds for `holder` (and `principal`).
    pub(crate) async fn open_session(
        &self,
        holder: String,
        principal: Option<String>,
        ttl: u64,
        received: Instant,
    ) -> Result<Opened> {
        // A session's lease never carries a grant's key of its own: a spare (which carried
        // nothing) or a fresh one.
        let lease = self.lease_for(ttl).await?;
        let (lease_id, ttl_seconds, counted_from) = (lease.id, lease.ttl, lease.counted_from);
        let secret = secret::session(&self.keys.current(), lease_id);
        let record = SessionRecord {
            holder,
            secret_hash: secret::hash(&secret),
            ttl_seconds,
            principal,
            created_at: unix_millis(),
        };
        let value = serde_json::to_vec(&record).unwrap_or_default();
        let key = self.session_key(lease_id);
        if let Err(e) = self.etcd.put_value_with_lease(&key, &value, lease_id).await {
            self.etcd.revoke_in_background(lease_id);
            return Err(e);
        }
        tracing::info!(session = lease_id, holder = %record.holder, "session opened");
        self.metrics.sessions_opened.add(1, &[]);
        let holder = record.holder.clone();
        self.sessions.put(lease_id, Arc::new(record));
        Ok(Opened {
            session_id: lease_id,
            holder,
            secret,
            ttl_seconds,
            expires_in_ms: super::expires_in_ms(counted_from, ttl_seconds, received),
        })
    }

    /// The record of session `id` if `secret` proves it and `principal` opened it (`None`:
    /// authentication is off, so anyone may). [`Error::SessionLost`] if it has ended,
    /// [`Error::SessionNotProven`] (answered the same) if it is not proven.
    ///
    /// A request that does not prove a session must not learn that it exists, from the answer
    /// or from its timing: a session found in this replica's cache but not proven costs the
    /// same etcd read as one that is absent.
    pub(crate) async fn verify_session(
        &self,
        id: i64,
        secret: &str,
        principal: Option<&str>,
    ) -> Result<Arc<SessionRecord>> {
        let key = self.session_key(id);
        let (record, cached) = match self.sessions.get(id) {
            Some(record) => (record, true),
            None => (self.session_from_etcd(id).await?, false),
        };
        // The principal first: another principal's session is not proven by any secret.
        let why = if principal.is_some_and(|p| record.principal.as_deref() != Some(p)) {
            ProofFailure::OtherPrincipal
        } else if !secret::matches(secret, &record.secret_hash) {
            ProofFailure::WrongSecret
        } else {
            return Ok(record);
        };
        if cached {
            self.etcd.get(&key).await?;
        }
        tracing::info!(
            session = id,
            why = why.as_str(),
            "session not proven; answered as ended"
        );
        Err(Error::SessionNotProven { why })
    }

    /// The record of session `id` as etcd has it now (then cached). [`Error::SessionLost`] if
    /// it has ended.
    pub(super) async fn session_from_etcd(&self, id: i64) -> Result<Arc<SessionRecord>> {
        let key = self.session_key(id);
        let kv = self.etcd.get(&key).await?.ok_or(Error::SessionLost)?;
        let record: SessionRecord =
            serde_json::from_slice(kv.value()).map_err(|e| Error::CorruptRecord {
                key,
                reason: e.to_string(),
            })?;
        let record = Arc::new(record);
        self.sessions.put(id, record.clone());
        Ok(record)
    }

    /// Session `id`'s record if this replica has it cached.
    pub(super) fn sessions_cached(&self, id: i64) -> Option<Arc<SessionRecord>> {
        self.sessions.get(id)
    }

    /// Forgets what this replica cached of session `id` (it has ended).
    pub(super) fn forget_session(&self, id: i64) {
        self.sessions.forget(id);
    }

    /// Renews session `id` (and so every grant on it) through the multiplexed keepalive
    /// streams.
    pub(crate) async fn keepalive_session(
        &self,
        id: i64,
        secret: &str,
        principal: Option<&str>,
        received: Instant,
    ) -> Result<Heartbeat> {
        self.verify_session(id, secret, principal).await?;
        let (ttl, counted_from) = self.renew_session_lease(id).await?;
        Ok(Heartbeat {
            session_id: id,
            ttl_seconds: ttl,
            expires_in_ms: super::expires_in_ms(counted_from, ttl, received),
        })
    }

    /// Keeps the session's lease alive; its TTL and the instant the TTL counts from at the
    /// latest. [`Error::SessionLost`] once etcd no longer knows it.
    pub(super) async fn renew_session_lease(&self, id: i64) -> Result<(u64, Instant)> {
        let renewing = Instant::now();
        let ttl = self.keepalive.renew(id).await?;
        if ttl <= 0 {
            self.sessions.forget(id);
            return Err(Error::SessionLost);
        }
        let ttl = u64::try_from(ttl).unwrap_or_default();
        self.sessions.renewed_at(id, renewing, ttl);
        Ok((ttl, renewing))
    }

    /// For an acquire under session `id`: its last renewal through this replica if that was
    /// sent less than [`super::shared::FRESH`] ago (the lease lasts at least its TTL from then; had the
    /// session been closed since, the create transaction's guard refuses the grant), else a
    /// renewal now.
    pub(super) async fn session_lease_for_acquire(&self, id: i64) -> Result<(u64, Instant)> {
        match self.sessions.renewed_within(id, super::shared::FRESH) {
            Some((at, ttl)) => Ok((ttl, at)),
            None => self.renew_session_lease(id).await,
        }
    }

    /// Closes session `id`: revokes its lease, which ends every grant on it. Idempotent: a
    /// session that has ended already is closed.
    pub(crate) async fn close_session(
        &self,
        id: i64,
        secret: &str,
        principal: Option<&str>,
    ) -> Result<()> {
        match self.verify_session(id, secret, principal).await {
            Ok(_) => {}
            // Nothing to close for this caller; an unproven session is answered as an ended one
            // (and left alone).
            Err(Error::SessionLost | Error::SessionNotProven { .. }) => return Ok(()),
            Err(e) => return Err(e),
        }
        // The marker tells the event stream its grants were released, not expired; the revoke
        // deletes it with them. Both run to their end in a task of their own, even if the
        // client goes away: a marker without its revoke would leave the session alive. A
        // session that lapsed while its record was cached here writes nothing (its key is
        // gone from its lease): closed already.
        let this = self.clone();
        self.tracker
            .spawn(async move {
                this.close_marked(id).await?;
                this.sessions.forget(id);
                tracing::info!(session = id, "session closed");
                Ok(())
            })
            .await
            .map_err(|_| Error::ShuttingDown)?
    }

    /// Session `id`, its remaining lifetime and the resources held under it (those passing
    /// `visible`), if `principal` opened it (`None`: anyone may see it).
    /// [`Error::NoSession`] if it has ended, or is another principal's: the answer, and the etcd
    /// reads before it, are the same.
    pub(crate) async fn session(
        &self,
        id: i64,
        principal: Option<&str>,
        visible: impl Fn(&str) -> bool,
    ) -> Result<SessionView> {
        let key = self.session_key(id);
        let kv = self.etcd.get(&key).await?.ok_or(Error::NoSession)?;
        let record: SessionRecord =
            serde_json::from_slice(kv.value()).map_err(|e| Error::CorruptRecord {
                key,
                reason: e.to_string(),
            })?;
        if principal.is_some_and(|p| record.principal.as_deref() != Some(p)) {
            return Err(Error::NoSession);
        }
        let (remaining, keys) = self.etcd.lease_keys(id).await?.ok_or(Error::NoSession)?;
        let mut resources: Vec<String> = keys
            .iter()
            .filter_map(|k| k.strip_prefix(self.layout.holders().as_bytes()))
            .filter_map(|r| std::str::from_utf8(r).ok())
            .filter(|r| visible(r))
            .map(str::to_owned)
            .collect();
        resources.sort_unstable();
        Ok(SessionView {
            session_id: id,
            holder: record.holder,
            ttl_seconds: record.ttl_seconds,
            expires_in_ms: super::secs_to_ms(remaining),
            created_at: record.created_at,
            resources,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_positive_decimals_written_one_way() {
        assert_eq!(
            parse_id("7587871913131456521").unwrap(),
            7_587_871_913_131_456_521
        );
        for bad in [
            "",
            "0",
            "-5",
            "+5",
            "05",
            " 5",
            "5 ",
            "x",
            "1e3",
            "99999999999999999999",
        ] {
            assert!(parse_id(bad).is_err(), "{bad:?}");
        }
    }

    /// A renewal sent through this replica stands in for a keepalive for less than the
    /// freshness window, then no more (an acquire under the session renews it again). On a
    /// paused clock: exactly at the window's end, not a millisecond later, and nothing sleeps.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_is_fresh_for_less_than_the_window() {
        let fresh = std::time::Duration::from_secs(1);
        let cache = Cache::default();
        let at = Instant::now();
        cache.renewed_at(7, at, 30);
        assert_eq!(cache.renewed_within(7, fresh), Some((at, 30)));
        assert_eq!(cache.renewed_within(8, fresh), None);
        tokio::time::advance(fresh - std::time::Duration::from_millis(1)).await;
        assert_eq!(cache.renewed_within(7, fresh), Some((at, 30)));
        tokio::time::advance(std::time::Duration::from_millis(1)).await;
        assert_eq!(cache.renewed_within(7, fresh), None);
        // Renewed again: fresh again, from the new renewal.
        cache.renewed_at(7, Instant::now(), 30);
        assert!(cache.renewed_within(7, fresh).is_some());
        cache.forget(7);
        assert_eq!(cache.renewed_within(7, fresh), None);
    }

    #[test]
    fn the_cache_is_bounded() {
        let cache = Cache::default();
        let record = Arc::new(SessionRecord {
            holder: "h".into(),
            secret_hash: String::new(),
            ttl_seconds: 10,
            principal: None,
            created_at: 0,
        });
        for id in 0..=i64::try_from(CACHED_SESSIONS).unwrap() {
            cache.put(id, record.clone());
        }
        assert!(cache.lock().len() <= CACHED_SESSIONS);
        cache.forget(i64::try_from(CACHED_SESSIONS).unwrap());
        assert!(cache.get(i64::try_from(CACHED_SESSIONS).unwrap()).is_none());
    }
}
