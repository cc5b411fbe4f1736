//! Reading request inputs strictly: bounded JSON bodies with unknown fields refused, and the
//! `Lease-Secret` header.

use axum::body::Body;
use axum::http::{header, HeaderMap};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use crate::headers::{IDEMPOTENCY_HEADER, SECRET_HEADER};
use crate::{Error, Result};

const MAX_SECRET_LEN: usize = 128;

/// How much body a request may send, and how long it may take to send all of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimits {
    /// Largest body, in bytes.
    pub(crate) bytes: usize,
    /// Deadline for the whole body (a client trickling or stalling gets 408).
    pub(crate) deadline: std::time::Duration,
}

/// Reads at most `limits.bytes` of body within `limits.deadline`. An empty body gives `None`.
pub(crate) async fn read(
    headers: &HeaderMap,
    body: Body,
    limits: BodyLimits,
) -> Result<Option<bytes::Bytes>> {
    let limit = limits.bytes;
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(Error::BodyTooLarge { limit });
        }
    }
    let collected = tokio::time::timeout(limits.deadline, Limited::new(body, limit).collect())
        .await
        .map_err(|_| Error::BodyTimeout(limits.deadline))?
        .map_err(|e| {
            if e.downcast_ref::<LengthLimitError>().is_some() {
                Error::BodyTooLarge { limit }
            } else {
                Error::InvalidRequest(format!("could not read the body: {e}"))
            }
        })?;
    let bytes = collected.to_bytes();
    if bytes.is_empty() {
        return Ok(None);
    }
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or_default().to_ascii_lowercase();
        let essence = ct.split(';').next().unwrap_or_default().trim();
        if essence != "application/json" && !essence.ends_with("+json") {
            return Err(Error::UnsupportedMediaType);
        }
    }
    Ok(Some(bytes))
}

/// Parses a JSON object strictly: the target types refuse unknown fields; serde_json bounds
/// nesting. An array is refused before serde could read it as the struct's fields in order.
pub(crate) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    if bytes.trim_ascii_start().first() == Some(&b'[') {
        return Err(Error::InvalidRequest(
            "invalid JSON body: expected an object, got an array".to_owned(),
        ));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| Error::InvalidRequest(format!("invalid JSON body: {e}")))
}

/// A required JSON body.
pub(crate) async fn json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limits: BodyLimits,
) -> Result<T> {
    match read(headers, body, limits).await? {
        Some(bytes) => parse(&bytes),
        None => Err(Error::InvalidRequest("a JSON body is required".to_owned())),
    }
}

/// An optional JSON body: empty or JSON `null` means the default.
pub(crate) async fn optional_json<T: DeserializeOwned + Default>(
    headers: &HeaderMap,
    body: Body,
    limits: BodyLimits,
) -> Result<T> {
    match read(headers, body, limits).await? {
        Some(bytes) => Ok(parse::<Option<T>>(&bytes)?.unwrap_or_default()),
        None => Ok(T::default()),
    }
}

/// The `Lease-Secret` header; exactly one, of sane length.
pub(crate) fn secret(headers: &HeaderMap) -> Result<String> {
    let mut values = headers.get_all(SECRET_HEADER).iter();
    let value = values.next().ok_or(Error::MissingSecret)?;
    if values.next().is_some() {
        return Err(Error::InvalidField {
            field: "Lease-Secret",
            reason: "must be given once".to_owned(),
        });
    }
    let value = value.to_str().ok().map(str::trim).unwrap_or_default();
    if value.is_empty() {
        return Err(Error::MissingSecret);
    }
    if value.len() > MAX_SECRET_LEN {
        return Err(Error::InvalidField {
            field: "Lease-Secret",
            reason: "too long".to_owned(),
        });
    }
    Ok(value.to_owned())
}

/// The optional `Idempotency-Key` header.
pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>> {
    let mut values = headers.get_all(IDEMPOTENCY_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let bad = || Error::InvalidField {
        field: "Idempotency-Key",
        reason: "must be given once, as 1-255 visible ASCII characters".to_owned(),
    };
    if values.next().is_some() {
        return Err(bad());
    }
    let key = value.to_str().map_err(|_| bad())?;
    crate::lease::validate::idempotency_key(key)?;
    Ok(Some(key.to_owned()))
}
