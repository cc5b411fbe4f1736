//! Who holds a resource, and whether a caller's secret proves holding it: from the watch-fed
//! view where that is safe for what the caller wants, else by a linearizable read.

use super::types::holding;
use super::{secret, HolderRecord, Holding, Leases};
use crate::metrics;
use crate::{Error, Result};

/// The current grant of a resource: its record and its create revision (its token).
#[derive(Debug, Clone)]
pub(super) struct Current {
    /// The ownership record.
    pub(super) record: HolderRecord,
    /// The key's create revision.
    pub(super) revision: i64,
}

/// What a confirmed grant is wanted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    /// A keepalive of the grant's lease.
    Renew,
    /// Ending the grant: revoking its lease, or (under a session) deleting its key if it is
    /// still the confirmed incarnation.
    Release,
}

impl Leases {
    /// The current grant of `resource`, if any.
    pub(super) async fn current(&self, resource: &str) -> Result<Option<Current>> {
        let key = self.key(resource);
        match self.etcd.get(&key).await? {
            Some(kv) => Ok(Some(Current {
                record: HolderRecord::decode(&key, kv.value())?,
                revision: kv.create_revision(),
            })),
            None => Ok(None),
        }
    }

    /// The current grant of `resource` if `secret` proves holding it; `None` if the secret's
    /// grant is no longer the resource's (released, expired, or replaced by another holder's).
    async fn held_with(&self, resource: &str, secret: &str) -> Result<Option<Current>> {
        let lease_id = secret::lease_id(secret).ok_or(Error::NotHolder)?;
        match self.current(resource).await? {
            Some(current) if current.record.lease_id == lease_id => {
                if secret::matches(secret, &current.record.secret_hash) {
                    Ok(Some(current))
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
    pub(super) async fn confirmed(
        &self,
        resource: &str,
        secret: &str,
        purpose: Purpose,
    ) -> Result<Current> {
        let lease_id = secret::lease_id(secret).ok_or(Error::NotHolder)?;
        if let Some(seen) = self.holders.seen(resource) {
            let record = HolderRecord::decode(&self.key(resource), &seen.value)?;
            if view_confirms(&record, lease_id, secret, purpose) {
                return Ok(Current {
                    record,
                    revision: seen.create_revision,
                });
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
        let Current { record, revision } = self
            .held_with(resource, secret)
            .await
            .and_then(|held| held.ok_or(Error::Lost))
            .inspect_err(|e| self.count_stale(e))?;
        record.owned_by(principal)?;
        Ok((record, self.token(resource, revision).fencing_token))
    }

    /// Counts a request refused because its grant has ended.
    pub(super) fn count_stale(&self, e: &Error) {
        if matches!(e, Error::Lost) {
            self.metrics.stale.add(1, &metrics::reason("lease_lost"));
        }
    }

    /// Who holds `resource`, without secrets.
    ///
    /// The record is a linearizable read and the remaining TTL is etcd's, asked after the
    /// request arrived. The watch-fed view only guesses which lease to ask about, so both calls
    /// go to etcd at once (one round trip's latency); the TTL is used only for the lease the
    /// record names — a lease carries the grants of one holder (one grant, or one session's), so
    /// its TTL is that grant's — and a wrong or missing guess costs a second, serial call.
    pub(crate) async fn get(&self, resource: &str) -> Result<Holding> {
        let guess = self
            .holders
            .seen(resource)
            .and_then(|seen| HolderRecord::decode(&self.key(resource), &seen.value).ok())
            .map(|record| record.lease_id);
        let (current, guessed) = match guess {
            Some(id) => {
                let (current, ttl) =
                    tokio::join!(self.current(resource), self.etcd.time_to_live(id));
                (current?, Some((id, ttl.ok().flatten())))
            }
            None => (self.current(resource).await?, None),
        };
        let Current { record, revision } = current.ok_or(Error::NotFound)?;
        let remaining = match guessed_ttl(guessed, record.lease_id) {
            Some(ttl) => ttl,
            None => self
                .etcd
                .time_to_live(record.lease_id)
                .await?
                .ok_or(Error::NotFound)?,
        };
        Ok(holding(resource.to_owned(), record, revision, remaining))
    }
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
    view_may_confirm(purpose, record.session)
        && record.lease_id == lease_id
        && secret::matches(secret, &record.secret_hash)
}

/// Whether a grant seen in the watch-fed view (under a session or on a lease of its own) may be
/// confirmed from the view for `purpose`, the secret matching: see [`view_confirms`].
pub(super) fn view_may_confirm(purpose: Purpose, session: bool) -> bool {
    purpose == Purpose::Release || !session
}

/// The remaining TTL that a guessed lease's answer (`(lease, remaining if it exists)`) gives
/// the grant whose record names `lease_id`: the named lease's own, or none (then it is asked).
fn guessed_ttl(guess: Option<(i64, Option<i64>)>, lease_id: i64) -> Option<i64> {
    match guess {
        Some((id, Some(ttl))) if id == lease_id => Some(ttl),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guessed_lease_answers_only_for_the_lease_the_record_names() {
        assert_eq!(guessed_ttl(Some((7, Some(12))), 7), Some(12));
        // The view guessed an earlier holder's lease (a session's, still alive): its TTL is not
        // the grant's.
        assert_eq!(guessed_ttl(Some((7, Some(60))), 8), None);
        // The guessed lease is gone, or there was no guess: the record's lease is asked.
        assert_eq!(guessed_ttl(Some((7, None)), 7), None);
        assert_eq!(guessed_ttl(None, 7), None);
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
            fleet: None,
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
}
