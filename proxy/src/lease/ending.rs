//! Ending grants: a release (its marker, then the revoke or the compare-and-delete), a grant
//! withdrawn because nobody was told of it, and the clean-up after a create of unknown outcome.

use super::confirm::{Current, Purpose};
use super::{Acquire, HolderRecord, Leases};
use crate::{Error, Result};

impl Leases {
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
        let Current { record, revision } =
            match self.confirmed(resource, secret, Purpose::Release).await {
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
        // The marker tells the event stream this end is a release, not an expiry (see
        // `marker.rs`).
        let ending = if record.session {
            self.end_in_session(resource, revision, record).await
        } else {
            self.end_own_lease(resource, revision, record).await
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
        self.metrics.releases.add(1, &[]);
        Ok(Some(revision.to_string()))
    }

    /// Ends a grant nobody was told of. Its own lease carries its key and nothing else, so it
    /// is revoked; a session's lease carries the session's other grants, so the key alone is
    /// deleted (with the principal's quota index key), if it is still this incarnation.
    pub(super) async fn withdraw(
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
                .delete_if_created(&key, revision, index.as_deref().as_slice(), None)
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
    pub(super) fn forget_unknown(&self, key: String, value: Vec<u8>, req: &Acquire) {
        let index = self.index_key(req.principal.as_deref(), &req.resource);
        self.forget_value(key, value, index.into_iter().collect(), req.ttl_seconds);
    }
}
