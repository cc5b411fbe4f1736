//! The core's refusals and failures as etcd gives them: a gRPC code and etcd's (or Go's) message,
//! which clients match by text. Each front renders a [`Status`] in one place of its own: the JSON
//! gateway as an HTTP status and etcd's error body, the gRPC front as a `tonic::Status`.

use std::borrow::Cow;

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

/// A refusal or failure of an etcd call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Status {
    code: i32,
    message: Cow<'static, str>,
}

impl Status {
    /// A status with `code` and etcd's (or Go's) own wording.
    pub(crate) fn new(code: Code, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code: code as i32,
            message: message.into(),
        }
    }

    /// A status as a gRPC library gave it (a stream that could not be read).
    pub(crate) fn from_grpc(code: i32, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            message: message.into(),
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

    /// The gRPC code number.
    pub(crate) fn code(&self) -> i32 {
        self.code
    }

    /// The message.
    pub(crate) fn message(&self) -> &str {
        &self.message
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
