//! What the client sends and what the proxy answers: acquire options, grants, renewals,
//! holdings and sessions.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How to acquire a resource.
#[derive(Debug, Clone, PartialEq)]
pub struct AcquireOptions {
    /// Who asks (free text; shown to others in conflicts and listings).
    pub holder: String,
    /// The lease's time to live (whole seconds are sent; a fraction is rounded up).
    pub ttl: Duration,
    /// Wait up to this long (server-side, first come first served) for a held resource.
    pub wait: Option<Duration>,
    /// Makes a retried acquire return the same grant; use an unguessable value.
    pub idempotency_key: Option<String>,
    /// A JSON object stored with the grant.
    pub metadata: Option<serde_json::Value>,
}

impl AcquireOptions {
    /// Options for `holder` and `ttl`, without waiting, idempotency key or metadata.
    pub fn new(holder: impl Into<String>, ttl: Duration) -> Self {
        Self {
            holder: holder.into(),
            ttl,
            wait: None,
            idempotency_key: None,
            metadata: None,
        }
    }

    /// Wait up to `wait` for a held resource to become free.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Send this `Idempotency-Key` (and retry with it on a transport error).
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Store `metadata` (a JSON object) with the grant.
    pub fn metadata(mut self, metadata: serde_json::Value) -> Self {
        self.metadata = Some(metadata);
        self
    }

    /// The TTL in whole seconds, rounded up.
    pub(crate) fn ttl_seconds(&self) -> u64 {
        whole_seconds(self.ttl)
    }
}

/// `d` in whole seconds, rounded up (what the API's `ttl_seconds` takes).
pub(crate) fn whole_seconds(d: Duration) -> u64 {
    let secs = d.as_secs();
    if d.subsec_nanos() > 0 {
        secs + 1
    } else {
        secs
    }
}

/// How to acquire a resource under a session: its TTL is the session's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionAcquireOptions {
    /// Who asks; the session's holder when `None`.
    pub holder: Option<String>,
    /// Wait up to this long (server-side) for a held resource.
    pub wait: Option<Duration>,
    /// Makes a retried acquire return the same grant.
    pub idempotency_key: Option<String>,
    /// A JSON object stored with the grant.
    pub metadata: Option<serde_json::Value>,
}

impl SessionAcquireOptions {
    /// No holder override, no waiting, no key, no metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// Name the grant's holder (instead of the session's).
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// Wait up to `wait` for a held resource to become free.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Send this `Idempotency-Key` (and retry with it on a transport error).
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Store `metadata` (a JSON object) with the grant.
    pub fn metadata(mut self, metadata: serde_json::Value) -> Self {
        self.metadata = Some(metadata);
        self
    }
}

/// A successful acquire (`201`): the only answer that carries the secret. Serializes as the
/// proxy's JSON (secret included).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Grant {
    /// The resource now held.
    pub resource: String,
    /// The holder.
    pub holder: String,
    /// The etcd lease id (decimal); the session id under a session.
    pub lease_id: String,
    /// Proof of holding: renew, release and forward with it.
    pub secret: String,
    /// The fencing token's revision (the ownership key's etcd create revision).
    #[serde(deserialize_with = "u64_string", serialize_with = "to_u64_string")]
    pub token: u64,
    /// The signed fencing token for protected storage (`Fencing-Token` header).
    pub fencing_token: String,
    /// The TTL granted.
    pub ttl_seconds: u64,
    /// The lease lasts at least this long from when the request reached the proxy.
    pub expires_in_ms: u64,
    /// The session the grant lives on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Metadata stored with the grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
}

/// A successful renewal (`200`). Serializes as the proxy's JSON.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Renewal {
    /// The TTL etcd renewed the lease to.
    pub ttl_seconds: u64,
    /// The lease lasts at least this long from when the request reached the proxy.
    pub expires_in_ms: u64,
    /// The token, unchanged by renewal.
    #[serde(deserialize_with = "u64_string", serialize_with = "to_u64_string")]
    pub token: u64,
}

/// A held resource as `GET /v1/leases/{resource}` and the listing show it (never a secret).
/// Serializes as the proxy's JSON.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Holding {
    /// The resource.
    pub resource: String,
    /// Who holds it.
    pub holder: String,
    /// The holder's token.
    #[serde(deserialize_with = "u64_string", serialize_with = "to_u64_string")]
    pub token: u64,
    /// The etcd lease id (decimal).
    pub lease_id: String,
    /// The TTL granted.
    pub ttl_seconds: u64,
    /// Remaining lifetime: as etcd reports it for one resource; in a listing the grant's TTL
    /// (an upper bound).
    pub expires_in_ms: u64,
    /// Wall-clock grant time, Unix milliseconds (for display only).
    pub acquired_at: u64,
    /// The session the grant lives on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Metadata stored with the grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
}

/// One page of `GET /v1/leases`.
#[derive(Debug, Deserialize)]
pub(crate) struct Page {
    pub(crate) leases: Vec<Holding>,
    #[serde(default)]
    pub(crate) next_cursor: Option<String>,
}

/// `201` of `POST /v1/sessions`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Opened {
    pub(crate) session_id: String,
    pub(crate) holder: String,
    pub(crate) secret: String,
    pub(crate) ttl_seconds: u64,
    pub(crate) expires_in_ms: u64,
}

/// `200` of a session keepalive.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Heartbeat {
    pub(crate) ttl_seconds: u64,
    pub(crate) expires_in_ms: u64,
}

/// Writes a 64-bit number as the API does: a decimal string.
pub(crate) fn to_u64_string<S: Serializer>(n: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(n)
}

/// A 64-bit number the API writes as a decimal string.
pub(crate) fn u64_string<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        let opts = |ms| AcquireOptions::new("h", Duration::from_millis(ms));
        assert_eq!(opts(3000).ttl_seconds(), 3);
        assert_eq!(opts(3001).ttl_seconds(), 4);
        assert_eq!(opts(500).ttl_seconds(), 1);
    }

    #[test]
    fn a_grant_reads_its_string_numbers() {
        let g: Grant = serde_json::from_str(
            r#"{"resource":"a","holder":"h","lease_id":"75","secret":"s","token":"12",
                "fencing_token":"v1.x","ttl_seconds":5,"expires_in_ms":5000,"session":"75"}"#,
        )
        .unwrap();
        assert_eq!((g.token, g.session.as_deref()), (12, Some("75")));
        assert!(serde_json::from_str::<Renewal>(
            r#"{"ttl_seconds":5,"expires_in_ms":5000,"token":"x"}"#
        )
        .is_err());
    }
}
