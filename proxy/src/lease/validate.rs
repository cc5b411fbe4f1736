//! The grammar of everything a client names: resources, holders, TTLs, metadata, keys.
//!
//! - **resource**: the fencing library's grammar, written once there
//!   ([`fencing::check_resource_name`]): 1–200 bytes of `[A-Za-z0-9._:-]`, starting with a
//!   letter or digit, never containing `..`.
//! - **holder**: 1–256 characters, no control characters.
//! - **ttl_seconds**: a whole number within the configured bounds (default 2–3600); values
//!   outside are rejected, never clamped.
//! - **metadata**: a JSON object of at most 4 KiB, stored and returned verbatim.
//! - **Idempotency-Key**: 1–255 visible ASCII characters.

use std::time::Duration;

use super::Limits;
use crate::{Error, Result};

/// Longest holder identity, in characters.
pub(crate) const MAX_HOLDER_CHARS: usize = 256;
/// Largest metadata object, serialised.
pub(crate) const MAX_METADATA_BYTES: usize = 4096;
/// Longest idempotency key.
pub(crate) const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// Checks a resource name: the fencing library's grammar ([`fencing::check_resource_name`]),
/// so every resource granted here can be fenced.
pub(crate) fn resource(name: &str) -> Result<()> {
    fencing::check_resource_name(name).map_err(|why| Error::InvalidField {
        field: "resource",
        reason: why.to_string(),
    })
}

/// Checks a prefix used to list resources: empty, or a valid start of a resource name.
pub(crate) fn resource_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() {
        return Ok(());
    }
    resource(prefix).map_err(|_| Error::InvalidField {
        field: "prefix",
        reason: "must be the start of a valid resource name".to_owned(),
    })
}

/// Checks a holder identity.
pub(crate) fn holder(holder: &str) -> Result<()> {
    let bad = |reason: &str| Error::InvalidField {
        field: "holder",
        reason: reason.to_owned(),
    };
    if holder.is_empty() {
        return Err(bad("must not be empty"));
    }
    if holder.chars().count() > MAX_HOLDER_CHARS {
        return Err(bad("longer than 256 characters"));
    }
    if holder.chars().any(char::is_control) {
        return Err(bad("must not contain control characters"));
    }
    Ok(())
}

/// `value` as a whole number: `10.0` is the same JSON number as `10` (what JSON Schema calls an
/// integer, and what a client whose numbers are all floats sends); `None` with a fractional
/// part, negative or beyond `u64`.
pub(crate) fn whole_number(value: &serde_json::Number) -> Option<u64> {
    if let Some(n) = value.as_u64() {
        return Some(n);
    }
    let f = value.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0)?;
    // 2^64 is exactly representable; below it every whole f64 converts exactly (at or above
    // it the cast saturates, and the value is refused).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    (f < 18_446_744_073_709_551_616.0).then_some(f as u64)
}

/// Deserialises an optional whole number given as any JSON number (see [`whole_number`]).
pub(crate) fn opt_whole_number<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<u64>, D::Error> {
    use serde::Deserialize;
    Option::<serde_json::Number>::deserialize(d)?
        .map(|n| {
            whole_number(&n)
                .ok_or_else(|| serde::de::Error::custom(format!("not a whole number: {n}")))
        })
        .transpose()
}

/// Checks a TTL given as a JSON number against `[min, max]` and returns it in whole seconds.
pub(crate) fn ttl(value: &serde_json::Number, min: u64, max: u64) -> Result<u64> {
    let bad = |reason: String| Error::InvalidField {
        field: "ttl_seconds",
        reason,
    };
    let secs = whole_number(value)
        .ok_or_else(|| bad(format!("must be a whole number of seconds, got {value}")))?;
    if secs < min || secs > max {
        return Err(bad(format!("must be between {min} and {max}, got {secs}")));
    }
    Ok(secs)
}

/// Checks metadata: an object of bounded size.
pub(crate) fn metadata(value: &serde_json::Value) -> Result<()> {
    let bad = |reason: &str| Error::InvalidField {
        field: "metadata",
        reason: reason.to_owned(),
    };
    if !value.is_object() {
        return Err(bad("must be a JSON object"));
    }
    let size = serde_json::to_vec(value)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_METADATA_BYTES {
        return Err(bad("larger than 4096 bytes"));
    }
    Ok(())
}

/// Checks an `Idempotency-Key` header value.
pub(crate) fn idempotency_key(key: &str) -> Result<()> {
    let ok = !key.is_empty()
        && key.len() <= MAX_IDEMPOTENCY_KEY_LEN
        && key.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidField {
            field: "Idempotency-Key",
            reason: "must be 1-255 visible ASCII characters".to_owned(),
        })
    }
}

/// An acquire's own fields, as checked by [`acquire`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcquireFields {
    /// The TTL asked for, within the bounds (`None`: not given).
    pub(crate) ttl_seconds: Option<u64>,
    /// How long to wait in line, at most `--max-wait`.
    pub(crate) wait: Duration,
}

/// Checks an acquire's own fields in order — holder, TTL, wait, metadata — each a 400, before
/// anything is looked up: an invalid request is refused whatever the state of what it names.
pub(crate) fn acquire(
    holder_name: &str,
    ttl_seconds: Option<&serde_json::Number>,
    wait_ms: Option<u64>,
    meta: Option<&serde_json::Value>,
    limits: &Limits,
) -> Result<AcquireFields> {
    holder(holder_name)?;
    let ttl_seconds = ttl_seconds
        .map(|t| ttl(t, limits.min_ttl, limits.max_ttl))
        .transpose()?;
    let wait = Duration::from_millis(wait_ms.unwrap_or(0));
    if wait > limits.max_wait {
        return Err(Error::InvalidField {
            field: "wait_ms",
            reason: format!("must be at most {}", limits.max_wait.as_millis()),
        });
    }
    if let Some(m) = meta {
        metadata(m)?;
    }
    Ok(AcquireFields { ttl_seconds, wait })
}

/// The TTL of a grant: under a session the session's (a `ttl_seconds` that differs is
/// refused), else the one asked for, which is then required.
pub(crate) fn grant_ttl(asked: Option<u64>, session_ttl: Option<u64>) -> Result<u64> {
    match session_ttl {
        Some(ttl) if asked.is_some_and(|asked| asked != ttl) => Err(Error::InvalidField {
            field: "ttl_seconds",
            reason: format!(
                "a grant under a session lives as long as the session ({ttl} s); omit ttl_seconds"
            ),
        }),
        Some(ttl) => Ok(ttl),
        None => asked.ok_or_else(|| Error::InvalidRequest("missing field `ttl_seconds`".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources() {
        for ok in [
            "a",
            "aisle-7",
            "shard:12",
            "job_nightly.v2",
            &"x".repeat(200),
        ] {
            assert!(resource(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a..b",
            "-a",
            "a/b",
            "a b",
            "a\n",
            "é",
            "a%2F",
            &"x".repeat(201),
        ] {
            assert!(resource(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn prefixes() {
        for ok in ["", "a", "aisle-", "shard:1"] {
            assert!(resource_prefix(ok).is_ok(), "{ok:?}");
        }
        for bad in ["-a", "a/", "a..", "é", &"x".repeat(201)] {
            assert!(
                matches!(
                    resource_prefix(bad),
                    Err(Error::InvalidField {
                        field: "prefix",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn every_bound_is_inclusive() {
        let n = |v: u64| serde_json::Number::from(v);
        assert_eq!(ttl(&n(2), 2, 3600).unwrap(), 2);
        assert_eq!(ttl(&n(3600), 2, 3600).unwrap(), 3600);
        assert!(holder(&"h".repeat(MAX_HOLDER_CHARS)).is_ok());
        assert!(idempotency_key(&"k".repeat(MAX_IDEMPOTENCY_KEY_LEN)).is_ok());
        assert!(idempotency_key(&"k".repeat(MAX_IDEMPOTENCY_KEY_LEN + 1)).is_err());
        // `{"x":"…"}` is 8 bytes around the string.
        let exactly = serde_json::json!({ "x": "y".repeat(MAX_METADATA_BYTES - 8) });
        assert_eq!(
            serde_json::to_vec(&exactly).unwrap().len(),
            MAX_METADATA_BYTES
        );
        assert!(metadata(&exactly).is_ok());
        let over = serde_json::json!({ "x": "y".repeat(MAX_METADATA_BYTES - 7) });
        assert!(metadata(&over).is_err());
    }

    #[test]
    fn ttls() {
        let n = |s: &str| serde_json::from_str::<serde_json::Number>(s).unwrap();
        assert_eq!(ttl(&n("10"), 2, 3600).unwrap(), 10);
        // The same numbers as 2, 10 and 3600 (JSON Schema's integers), as a float-only client
        // writes them (found by schemathesis).
        assert_eq!(ttl(&n("2.0"), 2, 3600).unwrap(), 2);
        assert_eq!(ttl(&n("10.0"), 2, 3600).unwrap(), 10);
        assert_eq!(ttl(&n("3.6e3"), 2, 3600).unwrap(), 3600);
        for bad in [
            "0", "1", "-5", "1.5", "3601", "1.0", "-0.0", "3600.5", "1e300", "-1e300",
        ] {
            assert!(ttl(&n(bad), 2, 3600).is_err(), "{bad}");
        }
        assert_eq!(whole_number(&n("18446744073709551615")), Some(u64::MAX));
        assert_eq!(whole_number(&n("1.8446744073709552e19")), None);
        assert_eq!(whole_number(&n("9007199254740992.0")), Some(1 << 53));
        for bad in ["-1", "0.5", "-0.5", "1e20"] {
            assert_eq!(whole_number(&n(bad)), None, "{bad}");
        }
    }

    #[test]
    fn holders_and_keys() {
        assert!(holder("robot-1").is_ok());
        assert!(holder("").is_err());
        assert!(holder("a\u{7}").is_err());
        assert!(holder(&"h".repeat(257)).is_err());
        assert!(idempotency_key("req-1").is_ok());
        assert!(idempotency_key("a b").is_err());
        assert!(idempotency_key("").is_err());
    }

    #[test]
    fn metadata_bounds() {
        assert!(metadata(&serde_json::json!({"zone": "b"})).is_ok());
        assert!(metadata(&serde_json::json!([1])).is_err());
        assert!(metadata(&serde_json::json!({"x": "y".repeat(5000)})).is_err());
    }
}
