//! RFC 9457 problem details: the one place where an [`Error`] becomes an HTTP response.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::Error;

/// Base of every problem `type` URI; each problem is documented under this path in the README.
pub const PROBLEM_BASE: &str = "https://lease-proxy.dev/problems/";

/// The challenge of a 401 for a missing, malformed or unknown bearer token.
pub(crate) const BEARER_CHALLENGE: &str = "Bearer realm=\"lease-proxy\"";

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: String,
    title: &'a str,
    status: u16,
    detail: String,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    extra: Option<serde_json::Value>,
}

impl Error {
    /// The status, the problem slug and its title. The classification follows whose fault the
    /// error is: client mistakes are 4xx, etcd trouble is 503, nothing a client sends is 5xx.
    fn classify(&self) -> (StatusCode, &'static str, &'static str) {
        use StatusCode as S;
        match self {
            Error::InvalidRequest(_) => (S::BAD_REQUEST, "invalid-request", "Invalid request"),
            Error::InvalidField { field, .. } => match *field {
                "resource" => (S::BAD_REQUEST, "invalid-resource", "Invalid resource name"),
                "ttl_seconds" => (S::BAD_REQUEST, "invalid-ttl", "Invalid TTL"),
                _ => (S::BAD_REQUEST, "invalid-field", "Invalid field value"),
            },
            Error::BodyTooLarge { .. } => {
                (S::PAYLOAD_TOO_LARGE, "body-too-large", "Body too large")
            }
            Error::BodyTimeout(_) => (S::REQUEST_TIMEOUT, "body-timeout", "Body too slow"),
            Error::UnsupportedMediaType => (
                S::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
            ),
            Error::MissingSecret => (S::UNAUTHORIZED, "missing-secret", "Lease secret required"),
            Error::NotHolder => (S::FORBIDDEN, "not-holder", "Not the holder"),
            Error::Unauthenticated(_) => (
                S::UNAUTHORIZED,
                "unauthenticated",
                "Authentication required",
            ),
            Error::Forbidden { .. } => (S::FORBIDDEN, "forbidden", "Not permitted"),
            Error::OtherPrincipal => (S::FORBIDDEN, "other-principal", "Another principal's grant"),
            Error::QuotaExceeded { .. } => {
                (S::TOO_MANY_REQUESTS, "quota-exceeded", "Quota exceeded")
            }
            Error::Held(_) => (S::CONFLICT, "lease-held", "Lease held"),
            Error::IdempotencyKeyUsed => (
                S::CONFLICT,
                "idempotency-key-used",
                "Idempotency key already used",
            ),
            Error::Lost => (S::GONE, "lease-lost", "Lease lost"),
            Error::SessionLost => (S::GONE, "session-lost", "Session lost"),
            Error::NotSessionHolder => (
                S::FORBIDDEN,
                "not-session-holder",
                "Not the session's holder",
            ),
            Error::NotFound => (S::NOT_FOUND, "not-found", "No lease"),
            Error::NoSession => (S::NOT_FOUND, "no-session", "No such session"),
            Error::NoRoute => (S::NOT_FOUND, "no-route", "Not found"),
            Error::EventsUnavailable(_) => {
                (S::GONE, "events-compacted", "Events no longer available")
            }
            Error::TooManyWatches(_) => (
                S::SERVICE_UNAVAILABLE,
                "too-many-watches",
                "Too many event streams",
            ),
            Error::MethodNotAllowed => (
                S::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            Error::Etcd(_) | Error::EtcdBatch(_) | Error::EtcdTimeout(_) => (
                S::SERVICE_UNAVAILABLE,
                "etcd-unavailable",
                "etcd unavailable",
            ),
            Error::ShuttingDown => (S::SERVICE_UNAVAILABLE, "shutting-down", "Shutting down"),
            Error::ForwardingDisabled => {
                (S::NOT_FOUND, "forwarding-disabled", "Forwarding disabled")
            }
            Error::UpstreamUnavailable(_) => (
                S::BAD_GATEWAY,
                "upstream-unavailable",
                "Upstream unavailable",
            ),
            Error::UpstreamTimeout(_) => {
                (S::GATEWAY_TIMEOUT, "upstream-timeout", "Upstream timeout")
            }
            Error::PrefenceFailed(_) => (
                S::SERVICE_UNAVAILABLE,
                "prefence-failed",
                "Pre-fence failed",
            ),
            Error::CorruptRecord { .. } => {
                (S::INTERNAL_SERVER_ERROR, "corrupt-record", "Corrupt record")
            }
        }
    }
}

impl Error {
    /// The problem slug (the last segment of its `type`), for audit lines.
    pub(crate) fn slug(&self) -> &'static str {
        self.classify().1
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, slug, title) = self.classify();
        if status.is_server_error() {
            tracing::warn!(error = %self, status = status.as_u16(), "request failed");
        }
        let mut retry_after = None;
        let extra = match &self {
            Error::Held(conflict) => {
                retry_after = Some(conflict.retry_after_secs());
                serde_json::to_value(conflict.as_ref()).ok()
            }
            Error::QuotaExceeded {
                quota,
                retry_after: secs,
            } => {
                retry_after = Some(*secs);
                Some(serde_json::json!({ "quota": quota }))
            }
            Error::Etcd(_)
            | Error::EtcdBatch(_)
            | Error::EtcdTimeout(_)
            | Error::ShuttingDown
            | Error::PrefenceFailed(_) => {
                retry_after = Some(1);
                None
            }
            _ => None,
        };
        let body = Problem {
            kind: format!("{PROBLEM_BASE}{slug}"),
            title,
            status: status.as_u16(),
            detail: self.to_string(),
            extra,
        };
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let mut response = (status, bytes).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if status == StatusCode::UNAUTHORIZED {
            // RFC 9110: a 401 names the scheme that would work — the client's bearer token, or
            // (authenticated or not) the grant's secret.
            let scheme = match &self {
                Error::Unauthenticated(_) => BEARER_CHALLENGE,
                _ => "Lease-Secret",
            };
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(scheme));
        }
        response
    }
}
