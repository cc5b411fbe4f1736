//! The value stored under an ownership key `{prefix}holders/{resource}`.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Who holds a resource, as stored in etcd. Never carries the secret itself, only its hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct HolderRecord {
    /// The holder identity given at acquire.
    pub(crate) holder: String,
    /// The etcd lease the key is attached to (decimal string, as all 64-bit numbers in JSON).
    #[serde(with = "i64_string")]
    pub(crate) lease_id: i64,
    /// base64url(SHA-256(secret)).
    pub(crate) secret_hash: String,
    /// Opaque client metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) metadata: Option<serde_json::Value>,
    /// Wall-clock time of the grant in Unix milliseconds — for display only, never for decisions.
    pub(crate) acquired_at: u64,
    /// The TTL granted by etcd, in seconds.
    pub(crate) ttl_seconds: u64,
    /// The principal that acquired (with `--auth-tokens`): only it may renew, release, forward
    /// or replay the grant. Absent in grants made without authentication (and in records
    /// written before the field existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) principal: Option<String>,
    /// `v2.{salt}.{HMAC(fencing key; resource, holder, Idempotency-Key, salt)}` when the
    /// acquire carried an `Idempotency-Key` (see `secret::idempotency_marker`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) idempotency: Option<String>,
    /// Whether the grant lives on a session's lease (`lease_id` is then the session id): its
    /// lease carries the session's other grants too, so it is never revoked to end this one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) session: bool,
    /// The fleet whose service made the grant on its member's session (`lease_id`); absent
    /// for every grant a client asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fleet: Option<String>,
}

impl HolderRecord {
    /// Refuses `principal` (the caller, `None` with authentication off) unless it acquired
    /// this grant. With authentication on, a grant that records no principal (made while it
    /// was off) is nobody's: it lapses or is released by an operator, never taken over.
    pub(crate) fn owned_by(&self, principal: Option<&str>) -> Result<()> {
        match principal {
            Some(p) if self.principal.as_deref() != Some(p) => Err(Error::OtherPrincipal),
            _ => Ok(()),
        }
    }

    /// Parses a stored record; a value the proxy cannot read is reported, not guessed at.
    pub(crate) fn decode(key: &str, value: &[u8]) -> Result<Self> {
        serde_json::from_slice(value).map_err(|e| Error::CorruptRecord {
            key: key.to_owned(),
            reason: e.to_string(),
        })
    }

    /// The stored form.
    pub(crate) fn encode(&self) -> Vec<u8> {
        // A struct of strings, numbers and a JSON value always serialises.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Serialises an i64 as a decimal JSON string and reads it back from a string or a number.
pub(crate) mod i64_string {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the number as a string.
    pub(crate) fn serialize<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    /// Reads a string or a number.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            S(String),
            N(i64),
        }
        match Either::deserialize(d)? {
            Either::S(s) => s.parse().map_err(serde::de::Error::custom),
            Either::N(n) => Ok(n),
        }
    }
}

/// An optional i64 written as a decimal JSON string (serialisation only; `None` is skipped).
pub(crate) mod opt_i64_string {
    use serde::Serializer;

    /// Writes the number as a string.
    pub(crate) fn serialize<S: Serializer>(v: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_lease_id_exact() {
        let r = HolderRecord {
            holder: "h".into(),
            lease_id: 7_385_237_249_237_762_323,
            secret_hash: "x".into(),
            metadata: None,
            acquired_at: 1,
            ttl_seconds: 10,
            idempotency: None,
            session: false,
            principal: None,
            fleet: None,
        };
        let bytes = r.encode();
        assert!(String::from_utf8_lossy(&bytes).contains("\"7385237249237762323\""));
        let back = HolderRecord::decode("k", &bytes).unwrap();
        assert_eq!(back.lease_id, r.lease_id);
        assert!(HolderRecord::decode("k", b"nope").is_err());
        assert!(!String::from_utf8_lossy(&bytes).contains("principal"));
        let owned = HolderRecord {
            principal: Some("alice".into()),
            ..back
        };
        let back = HolderRecord::decode("k", &owned.encode()).unwrap();
        assert_eq!(back.principal.as_deref(), Some("alice"));
    }
}
