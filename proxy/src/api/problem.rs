//! RFC 9457 problem details: the one place where an [`Error`] becomes an HTTP response.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::headers::BEARER_CHALLENGE;
use crate::Error;

/// Declares every problem the proxy answers: the fieldless [`Kind`], its status, slug and
/// title, and [`Kind::ALL`] (the OpenAPI document lists them from there).
macro_rules! problems {
    ($($kind:ident => $status:ident, $slug:literal, $title:literal;)*) => {
        /// A problem type: one per `type` URI the proxy answers.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Kind {
            $(
                #[doc = $title]
                $kind,
            )*
        }

        impl Kind {
            /// Every problem type.
            pub(crate) const ALL: &'static [Kind] = &[$(Kind::$kind,)*];

            /// The status it is answered with.
            pub(crate) fn status(self) -> StatusCode {
                match self {
                    $(Kind::$kind => StatusCode::$status,)*
                }
            }

            /// The last segment of its `type` URI.
            pub(crate) fn slug(self) -> &'static str {
                match self {
                    $(Kind::$kind => $slug,)*
                }
            }

            /// Its `title`.
            pub(crate) fn title(self) -> &'static str {
                match self {
                    $(Kind::$kind => $title,)*
                }
            }
        }
    };
}

// The classification follows whose fault the error is: client mistakes are 4xx, etcd trouble is
// 503, nothing a client sends is 5xx.
problems! {
    InvalidRequest => BAD_REQUEST, "invalid-request", "Invalid request";
    InvalidResource => BAD_REQUEST, "invalid-resource", "Invalid resource name";
    InvalidTtl => BAD_REQUEST, "invalid-ttl", "Invalid TTL";
    InvalidField => BAD_REQUEST, "invalid-field", "Invalid field value";
    BodyTooLarge => PAYLOAD_TOO_LARGE, "body-too-large", "Body too large";
    BodyTimeout => REQUEST_TIMEOUT, "body-timeout", "Body too slow";
    UnsupportedMediaType => UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type", "Unsupported media type";
    MissingSecret => UNAUTHORIZED, "missing-secret", "Lease secret required";
    NotHolder => FORBIDDEN, "not-holder", "Not the holder";
    Unauthenticated => UNAUTHORIZED, "unauthenticated", "Authentication required";
    Forbidden => FORBIDDEN, "forbidden", "Not permitted";
    OtherPrincipal => FORBIDDEN, "other-principal", "Another principal's grant";
    QuotaExceeded => TOO_MANY_REQUESTS, "quota-exceeded", "Quota exceeded";
    Held => CONFLICT, "lease-held", "Lease held";
    IdempotencyKeyUsed => CONFLICT, "idempotency-key-used", "Idempotency key already used";
    Lost => GONE, "lease-lost", "Lease lost";
    SessionLost => GONE, "session-lost", "Session lost";
    NotFound => NOT_FOUND, "not-found", "No lease";
    NoSession => NOT_FOUND, "no-session", "No such session";
    NoRoute => NOT_FOUND, "no-route", "Not found";
    NoFleet => NOT_FOUND, "no-fleet", "No such fleet";
    NoMember => NOT_FOUND, "no-member", "No such member";
    MemberTaken => CONFLICT, "member-taken", "Member name taken";
    NotMember => FORBIDDEN, "not-member", "Not the member";
    FleetFull => CONFLICT, "fleet-full", "Fleet full";
    FleetChanged => CONFLICT, "fleet-changed", "Fleet changed meanwhile";
    EventsCompacted => GONE, "events-compacted", "Events no longer available";
    TooManyWatches => SERVICE_UNAVAILABLE, "too-many-watches", "Too many event streams";
    MethodNotAllowed => METHOD_NOT_ALLOWED, "method-not-allowed", "Method not allowed";
    EtcdUnavailable => SERVICE_UNAVAILABLE, "etcd-unavailable", "etcd unavailable";
    ShuttingDown => SERVICE_UNAVAILABLE, "shutting-down", "Shutting down";
    ForwardingDisabled => NOT_FOUND, "forwarding-disabled", "Forwarding disabled";
    UpstreamUnavailable => BAD_GATEWAY, "upstream-unavailable", "Upstream unavailable";
    UpstreamTimeout => GATEWAY_TIMEOUT, "upstream-timeout", "Upstream timeout";
    PrefenceFailed => SERVICE_UNAVAILABLE, "prefence-failed", "Pre-fence failed";
    CorruptRecord => INTERNAL_SERVER_ERROR, "corrupt-record", "Corrupt record";
    Internal => INTERNAL_SERVER_ERROR, "internal", "Internal error";
}

impl Error {
    /// The problem type of this error.
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Error::InvalidRequest(_) => Kind::InvalidRequest,
            Error::InvalidField { field, .. } => match *field {
                "resource" => Kind::InvalidResource,
                "ttl_seconds" => Kind::InvalidTtl,
                _ => Kind::InvalidField,
            },
            Error::BodyTooLarge { .. } => Kind::BodyTooLarge,
            Error::BodyTimeout(_) => Kind::BodyTimeout,
            Error::UnsupportedMediaType => Kind::UnsupportedMediaType,
            Error::MissingSecret => Kind::MissingSecret,
            Error::NotHolder => Kind::NotHolder,
            Error::Unauthenticated(_) => Kind::Unauthenticated,
            Error::Forbidden { .. } => Kind::Forbidden,
            Error::OtherPrincipal | Error::OtherPrincipalsFleet => Kind::OtherPrincipal,
            Error::NoFleet => Kind::NoFleet,
            Error::NoMember => Kind::NoMember,
            Error::MemberTaken => Kind::MemberTaken,
            Error::NotMember => Kind::NotMember,
            Error::FleetFull(_) => Kind::FleetFull,
            Error::FleetChanged => Kind::FleetChanged,
            Error::QuotaExceeded { .. } => Kind::QuotaExceeded,
            Error::Held(_) => Kind::Held,
            Error::IdempotencyKeyUsed => Kind::IdempotencyKeyUsed,
            Error::Lost => Kind::Lost,
            // One answer for both: see `Error::SessionNotProven`.
            Error::SessionLost | Error::SessionNotProven { .. } => Kind::SessionLost,
            Error::NotFound => Kind::NotFound,
            Error::NoSession => Kind::NoSession,
            Error::NoRoute => Kind::NoRoute,
            Error::EventsUnavailable(_) => Kind::EventsCompacted,
            Error::TooManyWatches(_) => Kind::TooManyWatches,
            Error::MethodNotAllowed => Kind::MethodNotAllowed,
            Error::Etcd(_) | Error::EtcdBatch(_) | Error::EtcdTimeout(_) => Kind::EtcdUnavailable,
            Error::ShuttingDown => Kind::ShuttingDown,
            Error::ForwardingDisabled => Kind::ForwardingDisabled,
            Error::UpstreamUnavailable(_) => Kind::UpstreamUnavailable,
            Error::UpstreamTimeout(_) => Kind::UpstreamTimeout,
            Error::PrefenceFailed(_) => Kind::PrefenceFailed,
            Error::CorruptRecord { .. } => Kind::CorruptRecord,
        }
    }
}

impl Error {
    /// The problem slug (the last segment of its `type`), for audit lines.
    pub(crate) fn slug(&self) -> &'static str {
        self.kind().slug()
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let kind = self.kind();
        let (status, slug, title) = (kind.status(), kind.slug(), kind.title());
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
                Some(serde_json::json!({ "quota": quota.as_str() }))
            }
            Error::Etcd(_)
            | Error::EtcdBatch(_)
            | Error::EtcdTimeout(_)
            | Error::ShuttingDown
            | Error::PrefenceFailed(_)
            | Error::TooManyWatches(_) => {
                retry_after = Some(1);
                None
            }
            _ => None,
        };
        let extra = match extra {
            Some(serde_json::Value::Object(members)) => Some(members),
            _ => None,
        };
        let mut response: Response =
            runtime::problem::response(status, slug, title, &self.to_string(), extra);
        let headers = response.headers_mut();
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
