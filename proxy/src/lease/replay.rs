//! Idempotent acquires: a retry with the same `Idempotency-Key` and holder gets the grant its
//! first attempt made, from any replica, while the grant's replay-window key exists; a retry
//! whose grant has ended is refused, never granted anew.

use std::time::Duration;

use etcd_client::KeyValue;
use fencing::Keyring;
use tokio::time::Instant;

use super::attempt::Attempt;
use super::{secret, secs_to_ms, Acquire, Grant, HolderRecord, Leases};
use crate::etcd::Etcd;
use crate::{Conflict, Error, Result};

/// The etcd lease the replay-window keys of this replica live on: granted with the window as
/// its TTL and replaced once half of it has passed, so a window key lasts at least half the
/// window and at most the window (by etcd's clock; a leader change may extend it, as it does
/// every lease).
pub(super) struct Window {
    ttl: u64,
    current: tokio::sync::Mutex<Option<WindowLease>>,
}

impl Window {
    pub(super) fn new(window: Duration) -> Self {
        Self {
            ttl: window.as_secs().max(crate::etcd::ETCD_MIN_TTL),
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// The lease for a window key written now.
    pub(super) async fn lease(&self, etcd: &Etcd) -> Result<i64> {
        let mut current = self.current.lock().await;
        if let Some(lease) = *current {
            if lease.granted.elapsed() < Duration::from_secs(self.ttl) / 2 {
                return Ok(lease.id);
            }
        }
        let granting = Instant::now();
        let id = etcd.grant(self.ttl).await?.id;
        *current = Some(WindowLease {
            id,
            granted: granting,
        });
        Ok(id)
    }

    /// Stops using `id` (a write with it failed: it may be gone).
    pub(super) async fn forget(&self, id: i64) {
        let mut current = self.current.lock().await;
        if current.is_some_and(|lease| lease.id == id) {
            *current = None;
        }
    }
}

/// The window lease in use: its id, and when it was granted.
#[derive(Debug, Clone, Copy)]
struct WindowLease {
    id: i64,
    granted: Instant,
}

/// What the create transaction found of a keyed acquire's earlier grant, for
/// [`Retry::is_replayed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Retry {
    /// The grant's replay-window key is there (written with it: same revision).
    pub(super) in_window: bool,
    /// The grant's holder is the acquire's.
    pub(super) same_holder: bool,
    /// The grant's idempotency marker names this key (under a key of the ring).
    pub(super) key_matches: bool,
    /// The grant's session, if it is under one.
    pub(super) found_session: Option<i64>,
    /// The acquire's session, if any.
    pub(super) asked_session: Option<i64>,
}

impl Retry {
    /// Whether the acquire is a retry of that grant, answered with it: same holder and key,
    /// within the window, and under the same session (or both under none).
    pub(super) fn is_replayed(&self) -> bool {
        self.in_window
            && self.same_holder
            && self.key_matches
            && self.found_session == self.asked_session
    }
}

/// Whether a keyed acquire is refused as a late duplicate: its key was used on the resource
/// within the window (`used`) and that grant is no longer the resource's (`alive` is false).
pub(super) fn key_spent(used: bool, alive: bool) -> bool {
    used && !alive
}

impl Leases {
    /// Refuses a retry whose key was used on this resource within the replay window by this
    /// holder, but whose grant has ended (released or expired): a late duplicate of an acquire
    /// must not create a second grant nobody holds. The window key carries the marker of the
    /// last keyed grant of the resource; if that grant is still the resource's, the retry goes
    /// on and is answered with it.
    pub(super) async fn refuse_a_used_key(
        &self,
        req: &Acquire,
        key: &str,
        window_key: &str,
    ) -> Result<()> {
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
            .is_some_and(|current| current.revision == window.mod_revision());
        if key_spent(used, alive) {
            Err(Error::IdempotencyKeyUsed)
        } else {
            Ok(())
        }
    }

    /// The create found the resource held: a retry of this very grant (same holder, key and
    /// lease, within the window, by the principal that acquired it) gets it again; anyone else
    /// is answered with the holder.
    pub(super) async fn found_held(
        &self,
        req: &Acquire,
        keys: &Keyring,
        kv: &KeyValue,
        window_kv: Option<&KeyValue>,
    ) -> Result<Attempt> {
        let key = self.key(&req.resource);
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
                secret::idempotency_salt(keys, marker, &req.resource, &req.holder, k)
            });
            let retry = Retry {
                in_window,
                same_holder: existing.holder == req.holder,
                key_matches: salt.is_some(),
                found_session: existing.session.then_some(existing.lease_id),
                asked_session: req.session,
            };
            if let (true, Some((salt, signer))) = (retry.is_replayed(), salt) {
                // The key and holder are right, but an Idempotency-Key is no credential: a
                // retry is answered with the grant only for the principal that acquired it.
                existing.owned_by(req.principal.as_deref())?;
                let signed = self.token(&req.resource, kv.create_revision());
                // The first attempt may still be pre-fencing (or have failed to): the grant is
                // only ever returned once the enforcer knows its token.
                self.prefence(&req.resource, &signed.fencing_token).await?;
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
                    token: signed.token,
                    fencing_token: signed.fencing_token,
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
}
