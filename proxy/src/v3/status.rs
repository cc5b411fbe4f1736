//! Every `/v3` failure as etcd's gateway renders it: a gRPC status (code and message) turned into
//! an HTTP status and `{"error":…,"message":…,"code":…}` in exactly one place, [`Status::response`].

use std::borrow::Cow;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::Error;

/// etcd's error for a lease it does not know (gRPC NotFound).
pub(crate) const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";
/// etcd's error for a request without a key (gRPC InvalidArgument).
pub(crate) const EMPTY_KEY: &str = "etcdserver: key is not provided";
/// etcd's error for an empty operation in a transaction (gRPC InvalidArgument).
pub(crate) const EMPTY_OP: &str = "etcdserver: key not found";

/// etcd's error for a request whose auth token it does not accept (gRPC Unauthenticated).
pub(crate) const INVALID_AUTH_TOKEN: &str = "etcdserver: invalid auth token";
/// etcd's error for a request without credentials while authentication is on (gRPC
/// InvalidArgument).
pub(crate) const USER_EMPTY: &str = "etcdserver: user name is empty";
/// etcd's error for a user without the role a request needs (gRPC PermissionDenied).
pub(crate) const PERMISSION_DENIED: &str = "etcdserver: permission denied";

/// A gRPC status code (the subset the etcd fronts answer with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    PermissionDenied = 7,
    FailedPrecondition = 9,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

/// A refusal or failure of a `/v3` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Status {
    code: i32,
    message: Cow<'static, str>,
    /// An HTTP status other than the code's usual one (413 for an oversized body).
    http: Option<StatusCode>,
}

impl Status {
    /// A status with `code` and etcd's (or Go's) own wording.
    pub(crate) fn new(code: Code, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code: code as i32,
            message: message.into(),
            http: None,
        }
    }

    /// A status as a gRPC library gave it (a stream that could not be read).
    pub(crate) fn from_grpc(code: i32, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            message: message.into(),
            http: None,
        }
    }

    /// InvalidArgument with a message etcd itself would give for the same request.
    pub(crate) fn invalid(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// InvalidArgument for a request etcd would accept but the proxy refuses, because the proxy
    /// cannot read it exactly as etcd would (or a proxy limit forbids it). The message says so.
    pub(crate) fn refused(reason: impl std::fmt::Display) -> Self {
        Self::invalid(format!("lease-proxy: {reason}"))
    }

    /// A call that acts on the whole cluster — a compaction (every namespace's history),
    /// membership, defragmentation, snapshots: no tenant may make one (etcd's own wording, as
    /// its auth refuses a non-root user).
    pub(crate) fn cluster_wide() -> Self {
        Self::new(Code::PermissionDenied, PERMISSION_DENIED)
    }

    /// The client's own deadline (gRPC `grpc-timeout`) passed, in Go gRPC's words, as etcd
    /// answers.
    pub(crate) fn deadline_exceeded() -> Self {
        Self::new(Code::DeadlineExceeded, "context deadline exceeded")
    }

    /// A bug: the handler panicked. The client learns nothing more.
    pub(crate) fn internal() -> Self {
        Self::new(Code::Internal, "lease-proxy: internal error")
    }

    /// The body exceeds the proxy's limit.
    pub(crate) fn too_large(limit: usize) -> Self {
        Self {
            http: Some(StatusCode::PAYLOAD_TOO_LARGE),
            ..Self::new(
                Code::ResourceExhausted,
                format!("lease-proxy: request body larger than {limit} bytes"),
            )
        }
    }

    /// The gRPC code number.
    pub(crate) fn code(&self) -> i32 {
        self.code
    }

    /// The message.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// The HTTP status etcd's gateway (grpc-gateway 1.9's `HTTPStatusFromCode`) gives `code`.
    fn http_status(&self) -> StatusCode {
        if let Some(s) = self.http {
            return s;
        }
        match self.code {
            0 => StatusCode::OK,
            1 => StatusCode::REQUEST_TIMEOUT,
            3 | 9 | 11 => StatusCode::BAD_REQUEST,
            4 => StatusCode::GATEWAY_TIMEOUT,
            5 => StatusCode::NOT_FOUND,
            6 | 10 => StatusCode::CONFLICT,
            7 => StatusCode::FORBIDDEN,
            8 => StatusCode::TOO_MANY_REQUESTS,
            12 => StatusCode::NOT_IMPLEMENTED,
            14 => StatusCode::SERVICE_UNAVAILABLE,
            16 => StatusCode::UNAUTHORIZED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The gateway's answer for this status. Fields in the gateway's order; like its JSON
    /// marshaller, an empty message is omitted.
    pub(crate) fn response(&self) -> Response {
        let mut body = serde_json::Map::new();
        if !self.message.is_empty() {
            body.insert("error".into(), self.message.as_ref().into());
            body.insert("message".into(), self.message.as_ref().into());
        }
        body.insert("code".into(), self.code.into());
        let mut response = json(
            self.http_status(),
            serde_json::Value::Object(body).to_string(),
        );
        if self.code == Code::Unauthenticated as i32 {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static(crate::headers::BEARER_CHALLENGE),
            );
        }
        response
    }
}

impl From<Error> for Status {
    /// etcd's own refusals keep etcd's code and message; the proxy's deadline and an unreachable
    /// cluster are Unavailable (HTTP 503), as etcd's gateway answers when its member is gone.
    fn from(e: Error) -> Self {
        match e {
            Error::Etcd(etcd_client::Error::GRpcStatus(s)) => Self {
                code: s.code() as i32,
                message: Cow::Owned(s.message().to_owned()),
                http: None,
            },
            Error::EtcdTimeout(_) | Error::ShuttingDown => {
                Self::new(Code::Unavailable, e.to_string())
            }
            Error::Etcd(other) => Self::new(Code::Unavailable, format!("etcd: {other}")),
            // The proxy's token check, worded as etcd's own auth refuses, so etcd clients
            // recognise it.
            Error::Unauthenticated(_) => Self::new(Code::Unauthenticated, INVALID_AUTH_TOKEN),
            // Capacity another replica may have; a principal's own share, which it may not.
            Error::TooManyWatches(_) => Self::new(Code::Unavailable, format!("lease-proxy: {e}")),
            Error::QuotaExceeded { .. } => {
                Self::new(Code::ResourceExhausted, format!("lease-proxy: {e}"))
            }
            Error::Forbidden { .. } | Error::OtherPrincipal => {
                Self::new(Code::PermissionDenied, PERMISSION_DENIED)
            }
            other => Self::new(Code::Unknown, other.to_string()),
        }
    }
}

impl IntoResponse for Status {
    fn into_response(self) -> Response {
        self.response()
    }
}

/// A JSON answer.
pub(crate) fn json(status: StatusCode, body: impl Into<Bytes>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.into(),
    )
        .into_response()
}

/// A plain-text answer, as Go's `http.Error` writes it.
pub(crate) fn plain(status: StatusCode, text: &'static str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_like_the_gateway() {
        for (code, http) in [
            (Code::InvalidArgument, 400),
            (Code::NotFound, 404),
            (Code::Unknown, 500),
            (Code::Unavailable, 503),
            (Code::Unimplemented, 501),
            (Code::PermissionDenied, 403),
            (Code::Unauthenticated, 401),
        ] {
            assert_eq!(Status::new(code, "x").http_status().as_u16(), http);
        }
        assert_eq!(Status::too_large(10).http_status().as_u16(), 413);
    }
}
