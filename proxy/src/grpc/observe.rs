//! Per-call metrics and traces of the gRPC front: each call's method (one of the methods served,
//! or `unknown`, so a client cannot mint label values), its status code and its duration — a
//! unary call's until its answer is sent, a stream's whole life — in
//! `lease_proxy_grpc_request_duration_seconds{method,code}`, and a span per call.
//!
//! The code is read where gRPC puts it: the trailers, or the headers of a trailers-only answer;
//! a call whose answer was dropped before its end (the client went away) is `cancelled`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, Response};
use bytes::Bytes;
use http_body::Frame;

use crate::metrics::Metrics;

/// Every method of the services served, as `service/method`.
const METHODS: &[&str] = &[
    "etcdserverpb.KV/Range",
    "etcdserverpb.KV/RangeStream",
    "etcdserverpb.KV/Put",
    "etcdserverpb.KV/DeleteRange",
    "etcdserverpb.KV/Txn",
    "etcdserverpb.KV/Compact",
    "etcdserverpb.Lease/LeaseGrant",
    "etcdserverpb.Lease/LeaseRevoke",
    "etcdserverpb.Lease/LeaseKeepAlive",
    "etcdserverpb.Lease/LeaseTimeToLive",
    "etcdserverpb.Lease/LeaseLeases",
    "etcdserverpb.Watch/Watch",
    "etcdserverpb.Cluster/MemberAdd",
    "etcdserverpb.Cluster/MemberRemove",
    "etcdserverpb.Cluster/MemberUpdate",
    "etcdserverpb.Cluster/MemberList",
    "etcdserverpb.Cluster/MemberPromote",
    "etcdserverpb.Maintenance/Alarm",
    "etcdserverpb.Maintenance/Status",
    "etcdserverpb.Maintenance/Defragment",
    "etcdserverpb.Maintenance/Hash",
    "etcdserverpb.Maintenance/HashKV",
    "etcdserverpb.Maintenance/Snapshot",
    "etcdserverpb.Maintenance/MoveLeader",
    "etcdserverpb.Maintenance/Downgrade",
    "etcdserverpb.Auth/Authenticate",
    "etcdserverpb.Auth/AuthStatus",
    "etcdserverpb.Auth/AuthEnable",
    "etcdserverpb.Auth/AuthDisable",
    "etcdserverpb.Auth/UserAdd",
    "etcdserverpb.Auth/UserGet",
    "etcdserverpb.Auth/UserList",
    "etcdserverpb.Auth/UserDelete",
    "etcdserverpb.Auth/UserChangePassword",
    "etcdserverpb.Auth/UserGrantRole",
    "etcdserverpb.Auth/UserRevokeRole",
    "etcdserverpb.Auth/RoleAdd",
    "etcdserverpb.Auth/RoleGet",
    "etcdserverpb.Auth/RoleList",
    "etcdserverpb.Auth/RoleDelete",
    "etcdserverpb.Auth/RoleGrantPermission",
    "etcdserverpb.Auth/RoleRevokePermission",
    "v3lockpb.Lock/Lock",
    "v3lockpb.Lock/Unlock",
    "v3electionpb.Election/Campaign",
    "v3electionpb.Election/Proclaim",
    "v3electionpb.Election/Leader",
    "v3electionpb.Election/Observe",
    "v3electionpb.Election/Resign",
];

/// The metric label of the method at `path` (`/service/method`).
pub(super) fn method(path: &str) -> &'static str {
    let called = path.strip_prefix('/').unwrap_or_default();
    METHODS
        .iter()
        .find(|m| **m == called)
        .copied()
        .unwrap_or("unknown")
}

/// The name of gRPC code `n`, as the metric label.
fn code_name(n: &[u8]) -> &'static str {
    match n {
        b"0" => "OK",
        b"1" => "Canceled",
        b"2" => "Unknown",
        b"3" => "InvalidArgument",
        b"4" => "DeadlineExceeded",
        b"5" => "NotFound",
        b"6" => "AlreadyExists",
        b"7" => "PermissionDenied",
        b"8" => "ResourceExhausted",
        b"9" => "FailedPrecondition",
        b"10" => "Aborted",
        b"11" => "OutOfRange",
        b"12" => "Unimplemented",
        b"13" => "Internal",
        b"14" => "Unavailable",
        b"15" => "DataLoss",
        b"16" => "Unauthenticated",
        _ => "unknown",
    }
}

fn status_in(headers: &HeaderMap) -> Option<&'static str> {
    headers.get("grpc-status").map(|v| code_name(v.as_bytes()))
}

/// A call being observed: recorded once, when its code is known or its answer dropped.
struct Call {
    metrics: Arc<Metrics>,
    method: &'static str,
    started: Instant,
    span: tracing::Span,
    recorded: bool,
}

impl Call {
    fn record(&mut self, code: &'static str) {
        if !self.recorded {
            self.recorded = true;
            self.metrics.grpc_request(self.method, code, self.started);
            self.span.record("rpc.grpc.status_code", code);
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.record("cancelled");
    }
}

/// The span of a call of `method`.
pub(super) fn span(method: &'static str) -> tracing::Span {
    tracing::info_span!(
        "grpc",
        otel.name = method,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
    )
}

/// `response`, observed: its code recorded from its headers now (a trailers-only answer) or
/// from its trailers when they come.
pub(super) fn observed(
    response: Response<Body>,
    metrics: Arc<Metrics>,
    method: &'static str,
    started: Instant,
    span: tracing::Span,
) -> Response<Body> {
    let mut call = Call {
        metrics,
        method,
        started,
        span,
        recorded: false,
    };
    if let Some(code) = status_in(response.headers()) {
        call.record(code);
    }
    response.map(|body| Body::new(Observed { body, call }))
}

/// A response body that records its call's code from its trailers.
struct Observed {
    body: Body,
    call: Call,
}

impl http_body::Body for Observed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(status_in) {
                    this.call.record(code);
                }
            }
            // An answer that ends without trailers has no code: gRPC clients read it as an
            // internal error.
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.call.record("unknown"),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_the_served_ones_or_unknown() {
        assert_eq!(method("/etcdserverpb.KV/Range"), "etcdserverpb.KV/Range");
        assert_eq!(method("/v3lockpb.Lock/Lock"), "v3lockpb.Lock/Lock");
        for odd in [
            "/etcdserverpb.KV/Range2",
            "etcdserverpb.KV/Range",
            "/x/y",
            "",
            "/",
        ] {
            assert_eq!(method(odd), "unknown", "{odd}");
        }
        assert_eq!(code_name(b"14"), "Unavailable");
        assert_eq!(code_name(b"99"), "unknown");
    }
}
