//! The held quota (`--quota-held N`): at most N grants per principal at once, across every
//! replica.
//!
//! Each grant of a principal carries an index key `{prefix}principals/{principal}/{resource}`,
//! written in the grant's own create transaction and attached to the grant's etcd lease, so it
//! lives exactly as long as the grant: a release (which revokes the lease) or an expiry deletes
//! it with the ownership key, with no bookkeeping that could drift. Before creating, an
//! attempt counts the principal's index keys (a count-only linearizable read at revision R); the
//! create transaction then also requires that no key of that range was written after R (see
//! [`crate::etcd::Quota`]). Keys that went away since R only make room, so two acquires racing
//! for the last slot — on one replica or on two — cannot both succeed: the second one's compare
//! fails, it counts again, and is refused.

use super::{Acquire, Leases};
use crate::etcd::Counted;
use crate::{Error, QuotaKind, Result};

/// How long a client refused by the held quota is told to wait: a grant ends when its holder
/// releases it or stops renewing, which the proxy cannot predict.
const HELD_RETRY_AFTER_SECS: u64 = 1;

impl Leases {
    /// Counts the grants `req`'s principal holds. `None` when no held quota applies (no quota,
    /// or authentication off); a [`Error::QuotaExceeded`] when the principal holds its quota,
    /// unless this may be a retry of one of its own keyed grants (then the guard is set to
    /// allow a create only if the principal holds nothing, so the retry is answered with its
    /// grant, and no grant beyond the quota can be made).
    pub(super) async fn count_held(&self, req: &Acquire) -> Result<Option<Counted>> {
        let (Some(max), Some(principal)) = (self.limits.quota_held, &req.principal) else {
            return Ok(None);
        };
        let counted = self
            .etcd
            .count_quota(
                self.layout.principal(principal),
                self.layout.principal_grant(principal, &req.resource),
            )
            .await?;
        if u64::try_from(counted.count).unwrap_or(0) < max {
            return Ok(Some(counted));
        }
        let replay = req.idempotency_key.is_some()
            && self.current(&req.resource).await?.is_some_and(|current| {
                let record = &current.record;
                record.holder == req.holder && record.principal.as_ref() == Some(principal)
            });
        if replay {
            return Ok(Some(counted.only_if_empty()));
        }
        Err(Error::QuotaExceeded {
            quota: QuotaKind::Held,
            retry_after: HELD_RETRY_AFTER_SECS,
        })
    }
}
