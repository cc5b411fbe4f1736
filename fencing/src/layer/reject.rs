use axum_core::body::Body;
use http::{header, HeaderValue, Response, StatusCode};

use crate::error::GateError;
use crate::{Token, TokenError};

/// Why the enforcer refused a request. A refused request reaches nothing behind the enforcer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// A protected write without a token.
    #[error("a fencing token is required for writes")]
    MissingToken,
    /// More than one token header value.
    #[error("exactly one fencing token must be given")]
    DuplicateToken,
    /// A write that names no resource.
    #[error("the Fencing-Resource header is required for writes")]
    MissingResource,
    /// A resource name outside the resource grammar (1–200 bytes of `[A-Za-z0-9._:-]`, starting
    /// with a letter or digit, no `..`), in the `Fencing-Resource` header or the path.
    #[error("invalid resource name")]
    BadResource,
    /// More than one `Fencing-Resource` header value: which one the storage would use is
    /// anybody's guess.
    #[error("exactly one Fencing-Resource header may be given")]
    DuplicateResource,
    /// A `Fencing-Resource` header naming another resource than the path (path mode): a token
    /// must not be replayed against another resource's path.
    #[error("the Fencing-Resource header disagrees with the resource in the path")]
    ResourceMismatch,
    /// A write whose path is not canonical (path mode): dot-segments, empty segments, encoded
    /// `.`, `/`, `\` or `%`, a raw backslash or non-ASCII byte, or any encoding in the prefix or
    /// the resource segment. The storage might resolve it to another resource than the one
    /// checked, so it is refused rather than normalised.
    #[error("the path is not canonical: it could name another resource at the storage")]
    AmbiguousPath,
    /// A write whose path does not match the configured resource pattern (path mode): no
    /// resource to fence, and no fallback to the header.
    #[error("writes are accepted only on paths matching the resource pattern")]
    UnmatchedPath,
    /// A GET, HEAD or OPTIONS with a body (`Content-Length` other than 0, or any
    /// `Transfer-Encoding`): a lenient storage could apply it as an unfenced write.
    #[error("a read must not carry a body")]
    ReadWithBody,
    /// The token is malformed, forged, from an unknown key, or for another resource.
    #[error("{0}")]
    Token(TokenError),
    /// The token is below the resource's high-water mark.
    #[error("fencing token {token} is below the high-water mark {mark}")]
    Stale {
        /// The refused token.
        token: Token,
        /// The mark.
        mark: Token,
    },
    /// The mark store failed: fail closed.
    #[error("the high-water-mark store is unavailable")]
    StoreUnavailable,
    /// The write was admitted, but its exchange could not begin before the gate's deadline (the
    /// gateway was paused, or starved, after its admission): nothing was sent; retry.
    #[error("the write was admitted too late to be sent safely; nothing was sent")]
    AdmittedTooLate,
}

impl From<GateError> for Rejection {
    fn from(e: GateError) -> Self {
        match e {
            GateError::Stale { token, mark } => Rejection::Stale { token, mark },
            GateError::Store(e) => {
                tracing::error!(error = %e, "mark store failed; refusing the write");
                Rejection::StoreUnavailable
            }
        }
    }
}

impl Rejection {
    /// Status and problem slug — the one place the enforcer maps refusals to HTTP.
    pub fn classify(&self) -> (StatusCode, &'static str) {
        match self {
            Rejection::MissingToken => (StatusCode::PRECONDITION_REQUIRED, "missing-fencing-token"),
            Rejection::DuplicateToken => (StatusCode::BAD_REQUEST, "duplicate-fencing-token"),
            Rejection::MissingResource => (StatusCode::BAD_REQUEST, "missing-fencing-resource"),
            Rejection::BadResource => (StatusCode::BAD_REQUEST, "invalid-fencing-resource"),
            Rejection::DuplicateResource => (StatusCode::BAD_REQUEST, "duplicate-fencing-resource"),
            Rejection::ResourceMismatch => (StatusCode::FORBIDDEN, "fencing-resource-mismatch"),
            Rejection::AmbiguousPath => (StatusCode::BAD_REQUEST, "ambiguous-resource-path"),
            Rejection::UnmatchedPath => (StatusCode::BAD_REQUEST, "unfenced-write-path"),
            Rejection::ReadWithBody => (StatusCode::BAD_REQUEST, "read-with-body"),
            Rejection::Token(TokenError::WrongResource) => {
                (StatusCode::FORBIDDEN, "wrong-resource-fencing-token")
            }
            Rejection::Token(_) => (StatusCode::UNAUTHORIZED, "invalid-fencing-token"),
            Rejection::Stale { .. } => (StatusCode::CONFLICT, "stale-fencing-token"),
            Rejection::StoreUnavailable => {
                (StatusCode::SERVICE_UNAVAILABLE, "fence-store-unavailable")
            }
            Rejection::AdmittedTooLate => (StatusCode::SERVICE_UNAVAILABLE, "admitted-too-late"),
        }
    }

    /// The problem+json response.
    pub fn into_response(self) -> Response<Body> {
        let (status, slug) = self.classify();
        let extra = match &self {
            Rejection::Stale { mark, .. } => {
                let mut extra = serde_json::Map::new();
                extra.insert(
                    "mark".into(),
                    serde_json::json!({"era": mark.era.to_string(), "revision": mark.revision.to_string()}),
                );
                Some(extra)
            }
            _ => None,
        };
        let mut response: Response<Body> = runtime::problem::response(
            status,
            slug,
            status.canonical_reason().unwrap_or("Refused"),
            &self.to_string(),
            extra,
        );
        // Tells an intermediary (lease-proxy's forward route) that the enforcer refused, and
        // why, without reading the body.
        response
            .headers_mut()
            .insert(crate::REJECTION_HEADER, HeaderValue::from_static(slug));
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
