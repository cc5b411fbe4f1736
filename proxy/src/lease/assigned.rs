//! Grants the service makes on a member's session (a fleet's), and their ends.
//!
//! Such a grant is an ordinary session grant — the ownership key on the session's lease, a
//! record with `session: true` — so the session's keepalive renews it and release, renew and
//! forward work on it unchanged. Its record's secret hash is the *session's*: the member never
//! saw a per-grant secret, and proves holding with the one secret it has. That makes no secret
//! pass for another's: a session's secret is sealed in the session domain, so it matches only
//! records that carry its own hash — the session record and the fleet grants on that session —
//! and a grant's random secret never matches a session's hash. Whoever knows a session's secret
//! can already close the session and so end every grant on it; acting on a fleet grant of that
//! session gives it nothing more. The record names its fleet, so the fleet tells its own grants
//! from any its member took by hand, and never touches those.
//!
//! The create compares the resource's ownership key absent *and* the decision's keys unchanged
//! (the member's record, the fleet's spec and assignment), so a grant is only ever made under
//! the assignment as written and to a member still on that session.

use std::sync::Arc;
use std::time::Duration;

use runtime::backoff::Backoff;
use tokio::time::Instant;

use super::session::SessionRecord;
use super::{unix_millis, HolderRecord, Leases};
use crate::etcd::{prefix_end, Companion, Guarded, Quota, RangeCount, Unchanged};
use crate::{Error, Result};

/// A grant the service makes on a member's session.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OnSession<'a> {
    /// The resource.
    pub(crate) resource: &'a str,
    /// The member's session (its id).
    pub(crate) session: i64,
    /// The fleet that assigns it.
    pub(crate) fleet: &'a str,
    /// Keys the decision read, which must not have changed.
    pub(crate) guards: &'a [Unchanged<'a>],
}

/// A grant made on a member's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Assigned {
    /// Its create revision (its token).
    pub(crate) revision: i64,
}

impl Leases {
    /// Whether `principal`'s grants count against a held quota (`--quota-held`): then the
    /// fleet's grants to its members are made one at a time, each counted first.
    pub(crate) fn held_quota_applies(&self, principal: Option<&str>) -> bool {
        self.limits.quota_held.is_some() && principal.is_some()
    }

    /// Grants `g.resource` on the session, if nobody holds it and the guards hold, then
    /// pre-fences it (withdrawing it if that fails, as every grant). `None`: not granted,
    /// nothing written — also when the session's principal holds its `--quota-held` already:
    /// a fleet's grant counts as any other, so that a fleet is no way around the quota.
    /// [`Error::SessionLost`] if the session has ended.
    pub(crate) async fn grant_assigned(&self, g: OnSession<'_>) -> Result<Option<Assigned>> {
        let session = self.session_record(g.session).await?;
        let principal = session.principal.as_deref();
        let index = self.index_key(principal, g.resource);
        let range = principal.map(|p| self.layout.principal(p).into_bytes());
        let range_end = range.as_deref().map(prefix_end);
        let quota = match (self.limits.quota_held, &index, &range, &range_end) {
            (Some(max), Some(key), Some(range), Some(range_end)) => {
                let RangeCount {
                    count: held,
                    revision,
                } = self.etcd.count(range, range_end).await?;
                if u64::try_from(held).unwrap_or(0) >= max {
                    tracing::debug!(resource = %g.resource, fleet = %g.fleet, "a fleet grant waits for room in its principal's held quota");
                    return Ok(None);
                }
                Some(Quota {
                    key,
                    range,
                    range_end,
                    revision,
                })
            }
            _ => None,
        };
        let record = fleet_record(&session, &g);
        let value = record.encode();
        let key = self.key(g.resource);
        let fleet_index = self.layout.fleet_grant(g.fleet, g.resource);
        let created = self
            .commit
            .create_guarded(Guarded {
                key: &key,
                value: &value,
                lease: g.session,
                guards: g.guards,
                quota,
                alongside: Companion {
                    key: &fleet_index,
                    value: principal.unwrap_or_default().as_bytes(),
                    lease: g.session,
                },
            })
            .await;
        let revision = match created {
            Ok(Some(revision)) => revision,
            Ok(None) => return Ok(None),
            Err(e) => {
                // Perhaps created: deleted if it is exactly this record.
                let also = index.into_iter().chain([fleet_index]).collect();
                self.forget_value(key, value, also, session.ttl_seconds);
                return Err(e);
            }
        };
        let signed = self.token(g.resource, revision);
        if let Err(e) = self.prefence(g.resource, &signed.fencing_token).await {
            self.withdraw(g.resource, g.session, revision, true, principal)
                .await;
            return Err(e);
        }
        tracing::info!(resource = %g.resource, fleet = %g.fleet, member = %record.holder, token = %signed.token, "granted to a fleet member");
        self.holders.granted(g.resource, revision);
        self.metrics.grants.add(1, &[]);
        Ok(Some(Assigned { revision }))
    }

    /// Ends `fleet`'s grant of `resource` created at `revision` on `lease` (a session's), if it
    /// is still that one: a fleet's revocation at a hand-off's deadline, of an evicted member's
    /// grant, of one that left the fleet, or at the fleet's end. Written as a release (its
    /// marker goes with the delete), so the event stream says `released`: the service released
    /// it on the holder's behalf; the held quota's index key of its `principal` and the fleet's
    /// index key go with it. Whether this call ended it.
    pub(crate) async fn revoke_assigned(
        &self,
        (fleet, resource): (&str, &str),
        revision: i64,
        lease: i64,
        principal: Option<&str>,
    ) -> Result<bool> {
        self.holders.releasing(resource, revision);
        // A marker lives on the grant's lease; a grant on no lease (never the fleet's) gets
        // none rather than one that would outlive it.
        let marker =
            (lease != 0).then(|| (self.markers).released_in_fleet(resource, revision, lease));
        let index = self.index_key(principal, resource);
        let fleet_index = self.layout.fleet_grant(fleet, resource);
        let also: Vec<&str> = index
            .iter()
            .map(String::as_str)
            .chain([&*fleet_index])
            .collect();
        let ended = self
            .commit
            .delete_if_created(
                &self.key(resource),
                revision,
                &also,
                marker.as_ref().map(|m| m.put()),
            )
            .await;
        match ended {
            Ok(ended) => {
                self.holders.forget(resource, revision);
                if ended {
                    tracing::debug!(%resource, token = revision, "fleet grant revoked");
                    self.metrics.releases.add(1, &[]);
                }
                Ok(ended)
            }
            Err(e) => {
                self.holders.granted(resource, revision);
                Err(e)
            }
        }
    }

    /// The record of session `id`, from this replica's cache or etcd, without a proof: for
    /// grants the service makes on it. [`Error::SessionLost`] if it has ended.
    pub(crate) async fn session_record(&self, id: i64) -> Result<Arc<SessionRecord>> {
        if let Some(record) = self.sessions_cached(id) {
            return Ok(record);
        }
        self.session_from_etcd(id).await
    }

    /// Ends session `id` as its close would (its marker, then the revoke), without a proof: a
    /// member replaced by a new join of the same name. Whether it was still there.
    pub(crate) async fn end_session(&self, id: i64) -> Result<bool> {
        let ended = self.close_marked(id).await?;
        self.forget_session(id);
        Ok(ended)
    }

    /// Deletes `key` if it holds exactly `value` (and `also`), in the background, for as long
    /// as a session of `ttl` seconds could live without a keepalive: the clean-up after a
    /// create on a session's lease whose outcome is unknown (the session's end deletes the key
    /// anyway).
    pub(super) fn forget_value(&self, key: String, value: Vec<u8>, also: Vec<String>, ttl: u64) {
        let this = self.clone();
        let give_up = Instant::now() + Duration::from_secs(ttl.max(1));
        self.tracker.spawn(async move {
            let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
            let also: Vec<&str> = also.iter().map(String::as_str).collect();
            loop {
                match this.commit.delete_if_value(&key, &value, &also).await {
                    Ok(_) => return,
                    Err(e) if Instant::now() + backoff.peek() >= give_up => {
                        tracing::warn!(%key, error = %e, "a session grant of unknown outcome may stay until its session ends");
                        return;
                    }
                    Err(_) => {}
                }
                tokio::select! {
                    () = this.stopping.cancelled() => return,
                    () = tokio::time::sleep(backoff.pause()) => {}
                }
            }
        });
    }
}

/// The ownership record of a fleet's grant `g` on `session`: the member's name is the
/// session's holder.
fn fleet_record(session: &SessionRecord, g: &OnSession<'_>) -> HolderRecord {
    HolderRecord {
        holder: session.holder.clone(),
        lease_id: g.session,
        secret_hash: session.secret_hash.clone(),
        metadata: None,
        acquired_at: unix_millis(),
        ttl_seconds: session.ttl_seconds,
        principal: session.principal.clone(),
        idempotency: None,
        session: true,
        fleet: Some(g.fleet.to_owned()),
    }
}

/// `Error::SessionLost` and `Error::SessionNotProven` are the same answer: a session that is
/// not there to act on.
pub(crate) fn is_session_gone(e: &Error) -> bool {
    matches!(e, Error::SessionLost | Error::SessionNotProven { .. })
}
