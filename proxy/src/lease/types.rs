//! What the lease service reads and answers: an acquire as validated, a grant, a renewal, a
//! holding (a grant without its secret), and the bounds requests are held to.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::record::{i64_string, opt_i64_string};
use super::{secs_to_ms, HolderRecord, Recheck};

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
    #[serde(skip_serializing_if = "Option::is_none", with = "opt_i64_string")]
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
    #[serde(skip_serializing_if = "Option::is_none", with = "opt_i64_string")]
    #[schema(value_type = Option<String>)]
    pub(crate) session: Option<i64>,
}

/// What is answered about a grant whose lease has `remaining` seconds left (etcd's word). At
/// most the grant's TTL: a new etcd leader extends every lease by its election timeout
/// (14 s left of a 10 s grant has been seen), and the extra time is not promised to a holder
/// (nor shown as more than a full bar).
pub(super) fn holding(
    resource: String,
    record: HolderRecord,
    revision: i64,
    remaining: i64,
) -> Holding {
    let remaining = remaining.min(i64::try_from(record.ttl_seconds).unwrap_or(i64::MAX));
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

#[cfg(test)]
mod tests {
    use super::*;

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
            fleet: None,
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
        // etcd's extension at a leader change is not promised.
        let extended = holding("r".into(), h_record(), 42, 44);
        assert_eq!(extended.expires_in_ms, 30_000);
    }

    fn h_record() -> HolderRecord {
        HolderRecord {
            holder: "h".into(),
            lease_id: 7,
            secret_hash: "hash".into(),
            metadata: None,
            acquired_at: 1234,
            ttl_seconds: 30,
            idempotency: None,
            session: false,
            principal: None,
            fleet: None,
        }
    }
}
