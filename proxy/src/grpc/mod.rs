//! etcd's gRPC API on the proxy's own listener (docs/DESIGN.md §5.2): HTTP/2 requests with
//! `content-type: application/grpc…` go to etcd's services, everything else to the HTTP routes,
//! as etcd serves gRPC and HTTP on one client port ([`front`]).
//!
//! A front over the etcd-compatible core ([`crate::etcdapi::Service`]): tonic decodes etcd's protobuf
//! messages, the core checks, confines (namespace both ways, leases per principal) and calls
//! etcd under `--etcd-timeout`, and its [`Status`] becomes a `tonic::Status` in one place
//! ([`status`]) — the codes and messages etcd gives, which Go clients match by text. Callers are
//! judged by the one judge of etcd callers ([`crate::auth::Judge::etcd_caller`]), as the `/v3`
//! JSON gateway's are, before any service runs.
//!
//! One file per etcd service, as etcd's `v3rpc` has them: `kv.rs`, `lease.rs`, `cluster.rs`
//! (Cluster and Maintenance, what clients call at connect time), `watch.rs`, `lock.rs`, `auth.rs`
//! and `election.rs` (the last three served by hand, [`manual`]).

mod auth;
mod cluster;
mod election;
mod kv;
mod lease;
mod lock;
mod manual;
mod observe;
mod proto;
mod renewals;
mod watch;

use std::borrow::Cow;
use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Version};
use axum::response::{IntoResponse, Response};
use axum::Router;
use etcd_client::proto::{
    PbClusterServer, PbKvServer, PbLeaseServer, PbMaintenanceServer, PbWatchServer,
};
use futures::future::{BoxFuture, FutureExt};
use runtime::serve::LongLived;
use tonic::service::Routes;

use crate::auth::Judge;
use crate::etcd::Etcd;
use crate::etcdapi::{
    Authorised, Caller, Code, Service, Status, Written, PERMISSION_DENIED, USER_EMPTY,
};

/// The etcd services, each holding what the gRPC front needs: the core, the judge of callers,
/// and etcd (for the header of the answers the core does not make).
#[derive(Clone)]
struct Front {
    core: Arc<Service>,
    judge: Judge,
    etcd: Etcd,
}

/// A gRPC call judged before it reaches a service, carried in its extensions.
#[derive(Clone)]
struct Judged {
    /// Whom it is served for (the principal, `None` with authentication off), and its right
    /// judged again while a call waits.
    who: Authorised,
    /// The URI the client called; `Cluster.MemberList` answers with its scheme, host and port
    /// ([`called_url`]).
    uri: axum::http::Uri,
}

impl Front {
    /// The core every service calls.
    fn core(&self) -> &Service {
        &self.core
    }

    /// The caller of `req`, as `/v3` JSON builds it; refused if [`front`] did not judge it
    /// (which cannot happen: every gRPC request goes through it).
    fn caller<T>(&self, req: &tonic::Request<T>) -> Result<Caller, tonic::Status> {
        let judged = req
            .extensions()
            .get::<Judged>()
            .ok_or_else(|| tonic::Status::internal("lease-proxy: gRPC call not authorised"))?;
        Ok(self.core().caller(&judged.who))
    }
}

/// A refusal or failure of the core, as etcd's gRPC server gives it: etcd's code and message.
/// The only place a gRPC status is made from one.
fn status(s: Status) -> tonic::Status {
    tonic::Status::new(tonic::Code::from_i32(s.code()), s.message())
}

/// A lock's (or a leader's) fencing token and its domain, in `answer`'s response metadata:
/// `fencing-token` and `fencing-resource`.
fn fencing_metadata<T>(
    answer: &mut tonic::Response<T>,
    token: String,
    resource: String,
) -> Result<(), tonic::Status> {
    for (name, value) in [("fencing-token", token), ("fencing-resource", resource)] {
        // Both are printable ASCII (base64url and `lock/` + hex).
        let value = tonic::metadata::MetadataValue::try_from(value)
            .map_err(|_| tonic::Status::internal("lease-proxy: unprintable fencing token"))?;
        answer.metadata_mut().insert(name, value);
    }
    Ok(())
}

/// `http` with etcd's gRPC services over `core` beside it on the same listener: callers judged
/// by `judge`, messages of at most `limit` bytes.
pub(crate) fn front(
    core: Arc<Service>,
    judge: Judge,
    etcd: Etcd,
    limit: usize,
    http: Router,
) -> Router {
    let services = Front { core, judge, etcd };
    let front = services.clone();
    let grpc = Routes::new(PbKvServer::new(services.clone()).max_decoding_message_size(limit))
        .add_service(PbLeaseServer::new(services.clone()).max_decoding_message_size(limit))
        .add_service(PbClusterServer::new(services.clone()).max_decoding_message_size(limit))
        .add_service(PbWatchServer::new(services.clone()).max_decoding_message_size(limit))
        .add_service(manual::served::<lock::LockService>(services.clone(), limit))
        .add_service(manual::served::<election::ElectionService>(
            services.clone(),
            limit,
        ))
        .add_service(manual::served::<auth::AuthService>(services.clone(), limit))
        .add_service(PbMaintenanceServer::new(services).max_decoding_message_size(limit))
        .prepare();
    Router::new().fallback_service(Dispatch { front, http, grpc })
}

/// Routes each request to gRPC or HTTP.
#[derive(Clone)]
struct Dispatch {
    front: Front,
    http: Router,
    grpc: Routes,
}

/// Whether `req` is a gRPC call: HTTP/2 with a gRPC content type (`application/grpc`,
/// `application/grpc+proto`…). Anything else is the HTTP routes', whatever its path.
fn is_grpc(req: &Request<Body>) -> bool {
    // `application/grpc`, `application/grpc+proto`, `application/grpc;…` — not gRPC-Web
    // (`application/grpc-web…`), whose framing differs.
    let grpc = |v: &[u8]| {
        v.strip_prefix(b"application/grpc")
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
    };
    req.version() == Version::HTTP_2
        && req
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| grpc(v.as_bytes()))
}

impl tower::Service<Request<Body>> for Dispatch {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        // Both are always ready (a Router and tonic's Routes are).
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        use tower::ServiceExt;
        if !is_grpc(&req) {
            let http = self.http.clone();
            return Box::pin(async move { http.oneshot(req).await });
        }
        let (front, grpc) = (self.front.clone(), self.grpc.clone());
        let method = observe::method(req.uri().path());
        let span = observe::span(method);
        let started = tokio::time::Instant::now();
        let call = async move {
            let answer = serve(&front.judge, grpc, req).await;
            let metrics = front.etcd.metrics().clone();
            Ok(observe::observed(
                answer,
                metrics,
                method,
                started,
                tracing::Span::current(),
            ))
        };
        Box::pin(tracing::Instrument::instrument(call, span))
    }
}

/// The answer to the gRPC call `req`: its caller judged, its deadline kept, a panic answered.
/// A call of a caller let in marks its connection [`LongLived`]: no idle deadline, as etcd sets
/// none, for as long as the caller would still be let in (a refused caller's connection goes
/// idle as any other, and so does a removed principal's once the token file is reloaded).
async fn serve(judge: &Judge, grpc: Routes, req: Request<Body>) -> Response {
    // Authenticate is how a caller gets its credentials: served for anyone.
    if req.uri().path() == auth::AUTHENTICATE {
        return call(grpc, req, Authorised::default()).await;
    }
    match judge.etcd_caller(&credentials(&req), req.extensions()) {
        Ok(who) => {
            let mark = long_lived(&who);
            let mut answer = call(grpc, req, who).await;
            answer.extensions_mut().insert(mark);
            answer
        }
        Err(e) => refusal(e).into_http(),
    }
}

/// The [`LongLived`] mark of a call `who` was let in for: for ever with authentication off;
/// with it, until a reload of the token file no longer lets the caller in — judged once per
/// reload (a refusal is counted and audited once, not at every look at the connection).
fn long_lived(who: &Authorised) -> LongLived {
    let Some(recheck) = who.recheck.clone() else {
        return LongLived::always();
    };
    let judged = std::sync::Mutex::new((recheck, true));
    LongLived::while_holds(move || {
        let mut judged = judged.lock().unwrap_or_else(|p| p.into_inner());
        let (recheck, holds) = &mut *judged;
        if *holds && recheck.changed_now() {
            *holds = recheck.check().is_ok();
        }
        *holds
    })
}

/// A caller refused before any service runs, answered as etcd 3.4 with authentication on
/// answers its equivalent — clients match these by text, and Go's clientv3 (etcdctl) retries
/// "invalid auth token" up to 100 times, fetching a token it has no password for:
/// - no credential at all is etcd's request without a user: `InvalidArgument "etcdserver: user
///   name is empty"`, retried by no client;
/// - a client certificate that names no principal is etcd's certificate user without a role,
///   and a principal without `v3:*` etcd's user without permission: `PermissionDenied
///   "etcdserver: permission denied"`;
/// - any other refused credential (an unknown, malformed or doubled token) is etcd's token it
///   does not know: `Unauthenticated "etcdserver: invalid auth token"`.
fn refusal(e: crate::Error) -> tonic::Status {
    use crate::auth::Unauthenticated as Why;
    let answer = match e {
        crate::Error::Unauthenticated(why) if why == Why::Missing.as_str() => {
            Status::new(Code::InvalidArgument, USER_EMPTY)
        }
        crate::Error::Unauthenticated(why) if why == Why::UnknownCertificate.as_str() => {
            Status::new(Code::PermissionDenied, PERMISSION_DENIED)
        }
        other => Status::from(other),
    };
    status(answer)
}

/// `req` served by the gRPC services for `who`, under the client's deadline.
async fn call(grpc: Routes, mut req: Request<Body>, who: Authorised) -> Response {
    use tower::ServiceExt;
    let deadline = client_deadline(&req);
    let uri = req.uri().clone();
    req.extensions_mut().insert(Judged { who, uri });
    // A panic is a bug: the call fails with Internal, the connection and its other streams go
    // on (as the HTTP routes' CatchPanicLayer does for them).
    let call = AssertUnwindSafe(grpc.oneshot(req)).catch_unwind();
    let answer = match deadline {
        Some(d) => tokio::time::timeout(d, call).await.ok(),
        None => Some(call.await),
    };
    match answer {
        Some(Ok(Ok(response))) => counted(response.into_response()),
        Some(Ok(Err(never))) => match never {},
        Some(Err(_)) => {
            tracing::error!("gRPC handler panicked");
            status(Status::internal()).into_http()
        }
        None => status(Status::deadline_exceeded()).into_http(),
    }
}

/// A watch answer with its body counted until written ([`watch::Counted`]); any other answer as
/// it is.
fn counted(mut answer: Response) -> Response {
    match answer.extensions_mut().remove::<Written>() {
        Some(written) => answer.map(|body| Body::new(watch::Counted::new(body, written))),
        None => answer,
    }
}

/// The client's deadline for a call (`grpc-timeout`: at most 8 digits and a unit), if it sent
/// one that parses; one that does not is ignored, as grpc-go ignores it. It bounds the call up
/// to its answer's headers — a unary call whole; a stream's messages run on under the etcd
/// deadline of each call they make.
fn client_deadline(req: &Request<Body>) -> Option<Duration> {
    // `to_str` admits visible ASCII only, so the split below is at a character boundary.
    let value = req.headers().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The request's headers with etcd's `token` metadata read as a bearer token (Go's clientv3
/// sends its auth token so); borrowed when there is none.
fn credentials(req: &Request<Body>) -> Cow<'_, axum::http::HeaderMap> {
    if !req.headers().contains_key("token") {
        return Cow::Borrowed(req.headers());
    }
    let mut headers = req.headers().clone();
    // Every `token` value joins the `authorization` values, so a credential given twice —
    // two tokens, or a token and an `authorization` — is refused as two `authorization`
    // values are, never one of them chosen.
    let tokens: Vec<_> = headers.get_all("token").iter().cloned().collect();
    for token in tokens {
        let bearer = [b"Bearer ".as_slice(), token.as_bytes()].concat();
        // A value that was a header value stays one with a prefix of visible ASCII.
        if let Ok(value) = HeaderValue::from_bytes(&bearer) {
            headers.append(header::AUTHORIZATION, value);
        }
    }
    Cow::Owned(headers)
}

/// The URL the client called: the request's scheme (`http` for h2c), host and port — `None`
/// unless the authority is a plain `host[:port]` (no user info, a DNS name or an IP address),
/// since a client that syncs its endpoints dials what it is told.
fn called_url(uri: &axum::http::Uri) -> Option<String> {
    let scheme = uri.scheme_str().unwrap_or("http");
    let authority = uri.authority()?;
    let host = authority.host();
    let name = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'-';
    let ipv6 = host.len() > 2
        && host.starts_with('[')
        && host.ends_with(']')
        && host[1..host.len() - 1]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
    let plain = !host.is_empty() && (host.bytes().all(name) || ipv6);
    if !plain || authority.as_str().contains('@') {
        return None;
    }
    Some(match authority.port_u16() {
        Some(port) => format!("{scheme}://{host}:{port}"),
        None => format!("{scheme}://{host}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_timeout(value: &str) -> Request<Body> {
        Request::builder()
            .header("grpc-timeout", value)
            .body(Body::empty())
            .unwrap()
    }

    #[test]
    fn the_called_url_is_a_plain_host_and_port_or_none() {
        let called = |uri: &str| called_url(&uri.parse().unwrap());
        assert_eq!(
            called("http://proxy.example:7070/x").as_deref(),
            Some("http://proxy.example:7070")
        );
        assert_eq!(
            called("https://10.0.0.1:443/x").as_deref(),
            Some("https://10.0.0.1:443")
        );
        assert_eq!(
            called("http://[::1]:7070/x").as_deref(),
            Some("http://[::1]:7070")
        );
        assert_eq!(called("http://proxy/x").as_deref(), Some("http://proxy"));
        // Authorities that parse as URIs but are not a plain host and port (one that does not
        // parse never reaches a service: hyper refuses the request).
        for odd in [
            "http://user@host:1/x",
            "http://a_b:1/x",
            "http://a%2cb:1/x",
            "/x",
        ] {
            if let Ok(uri) = odd.parse::<axum::http::Uri>() {
                assert_eq!(called_url(&uri), None, "{odd}");
            }
        }
    }

    #[test]
    fn refused_callers_are_answered_as_etcd_answers_their_equivalent() {
        use crate::auth::Unauthenticated as Why;
        let answer = |e: crate::Error| {
            let s = refusal(e);
            (s.code(), s.message().to_owned())
        };
        let unauthenticated = |why: Why| answer(crate::Error::Unauthenticated(why.as_str()));
        let denied = (tonic::Code::PermissionDenied, PERMISSION_DENIED.to_owned());
        let invalid = (
            tonic::Code::Unauthenticated,
            "etcdserver: invalid auth token".to_owned(),
        );
        assert_eq!(
            unauthenticated(Why::Missing),
            (tonic::Code::InvalidArgument, USER_EMPTY.to_owned())
        );
        assert_eq!(unauthenticated(Why::UnknownCertificate), denied);
        for why in [
            Why::Unknown,
            Why::Malformed,
            Why::Replaced,
            Why::Conflicting,
        ] {
            assert_eq!(unauthenticated(why), invalid, "{why:?}");
        }
        let forbidden = crate::Error::Forbidden {
            principal: "reader".into(),
            op: crate::error::Op::V3,
            target: "the /v3 API".into(),
        };
        assert_eq!(answer(forbidden), denied);
    }

    #[test]
    fn grpc_is_its_content_types_and_not_grpc_web() {
        let h2 = |ct: &str| {
            let req = Request::builder()
                .version(Version::HTTP_2)
                .header(header::CONTENT_TYPE, ct)
                .body(Body::empty())
                .unwrap();
            is_grpc(&req)
        };
        for yes in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc; x=y",
        ] {
            assert!(h2(yes), "{yes}");
        }
        for no in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpcx",
        ] {
            assert!(!h2(no), "{no}");
        }
    }

    #[test]
    fn client_deadlines_parse_as_grpc_go_parses_them() {
        for (value, want) in [
            ("1S", Some(Duration::from_secs(1))),
            ("250m", Some(Duration::from_millis(250))),
            ("2M", Some(Duration::from_secs(120))),
            ("1H", Some(Duration::from_secs(3600))),
            ("99999999u", Some(Duration::from_micros(99_999_999))),
            ("7n", Some(Duration::from_nanos(7))),
            ("123456789S", None),
            ("S", None),
            ("", None),
            ("1s", None),
            ("-1S", None),
            ("+1S", None),
        ] {
            assert_eq!(client_deadline(&with_timeout(value)), want, "{value:?}");
        }
    }
}
