//! Renewing a grant: a keepalive of its lease, for the holder its secret proves.

use super::confirm::{Current, Purpose};
use super::{Leases, Renewal};
use crate::metrics;
use crate::{Error, Result};

impl Leases {
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
        self.metrics.renewals.add(1, &metrics::outcome(outcome));
        renewed.inspect_err(|e| self.count_stale(e))
    }

    /// The renewal itself, once the caller is confirmed as the holder.
    async fn renew_grant(
        &self,
        resource: &str,
        secret: &str,
        principal: Option<&str>,
    ) -> Result<Renewal> {
        let Current { record, revision } = self.confirmed(resource, secret, Purpose::Renew).await?;
        record.owned_by(principal)?;
        let ttl = self.keepalive.renew(record.lease_id).await?;
        if ttl <= 0 {
            return Err(Error::Lost);
        }
        let ttl_seconds = u64::try_from(ttl).unwrap_or_default();
        let signed = self.token(resource, revision);
        Ok(Renewal {
            resource: resource.to_owned(),
            ttl_seconds,
            expires_in_ms: ttl_seconds * 1000,
            token: signed.token,
            fencing_token: signed.fencing_token,
        })
    }
}
