//! `/v3`: etcd's JSON gateway API for leases, locks and KV, served by the proxy
//! (docs/DESIGN.md §5.2) — a front over the etcd-compatible core ([`crate::etcdapi`]), as etcd's
//! gateway is JSON ↔ its gRPC server.
//!
//! Fails closed (docs/DESIGN.md §7.6). Every request body is read into the core's typed
//! requests exactly as etcd's gateway would read it ([`json`], [`request`]); whatever the proxy
//! cannot read exactly as etcd would is refused with etcd's error shape (HTTP 400, gRPC code 3),
//! never passed on. The core's answers are printed as etcd's gateway prints them ([`encode`]),
//! its refusals as the gateway renders them ([`status`]); `/version` and `/health` are relayed
//! from etcd ([`discovery`]).

mod discovery;
mod encode;
mod gobase64;
mod json;
mod request;
mod status;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, StatusCode};
use axum::response::Response;
use axum::routing::any;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::auth::Judge;
use crate::etcd::Etcd;
use crate::etcdapi::request::{DeleteRange, LeaseGrant, Lock, Put, Range, TimeToLive, Txn};
use crate::etcdapi::{Authorised, Caller, Code, Service, Status};
use json::{JsonError, Reader, Value};
use request::Message;
use status::{json as json_response, plain};

/// What the gateway is configured with, beyond the core's settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Largest request body.
    pub(crate) max_body: usize,
    /// How long a body may take to arrive.
    pub(crate) body_deadline: std::time::Duration,
}

/// The `/v3` JSON gateway: JSON ↔ the etcd-compatible [`Service`], as etcd's gateway is JSON ↔
/// its gRPC server.
pub(crate) struct V3 {
    /// The typed, confined service every etcd front calls.
    core: Arc<Service>,
    /// Judges who calls, as for every etcd front.
    judge: Judge,
    /// etcd itself, for relaying `/version` and `/health`.
    etcd: Etcd,
    max_body: usize,
    /// Deadline for a request's whole body (`--header-read-timeout`).
    body_deadline: std::time::Duration,
    /// For relaying `/version` and `/health`.
    http: Client<HttpConnector, Full<Bytes>>,
}

/// The gateway's routes: `/v3`, `/v3beta` and `/v3alpha` (refused as etcd 3.4 refuses it), and
/// etcd's `/version` and `/health`, for gateway clients that discover the API path from them.
pub(crate) fn router(gateway: Arc<V3>) -> Router {
    let call = |g: Arc<V3>| move |req: Request<Body>| async move { g.handle(req).await };
    let (version, health) = (gateway.clone(), gateway.clone());
    Router::new()
        .route("/v3/{*method}", any(call(gateway.clone())))
        .route("/v3beta/{*method}", any(call(gateway.clone())))
        .route("/v3alpha/{*method}", any(call(gateway)))
        .route(
            "/version",
            any(move |method: Method| async move { version.version(&method).await }),
        )
        .route(
            "/health",
            any(move |method: Method| async move { health.health(&method).await }),
        )
}

/// A `/v3` method the proxy serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Range,
    Put,
    DeleteRange,
    Txn,
    Grant,
    Revoke,
    TimeToLive,
    Leases,
    KeepAlive,
    Lock,
    Unlock,
    LockToken,
}

impl Call {
    fn from_path(method: &str) -> Option<Self> {
        Some(match method {
            "kv/range" => Call::Range,
            "kv/put" => Call::Put,
            "kv/deleterange" => Call::DeleteRange,
            "kv/txn" => Call::Txn,
            "lease/grant" => Call::Grant,
            "lease/revoke" | "kv/lease/revoke" => Call::Revoke,
            "lease/timetolive" | "kv/lease/timetolive" => Call::TimeToLive,
            "lease/leases" | "kv/lease/leases" => Call::Leases,
            "lease/keepalive" => Call::KeepAlive,
            "lock/lock" => Call::Lock,
            "lock/unlock" => Call::Unlock,
            "lock/token" => Call::LockToken,
            _ => return None,
        })
    }
}

/// Methods of etcd 3.4's gateway that the proxy does not serve: answered Unimplemented rather
/// than "Not Found", so a client learns why.
const UNSERVED: &[&str] = &[
    "kv/compaction",
    "watch",
    "cluster/member/add",
    "cluster/member/remove",
    "cluster/member/update",
    "cluster/member/list",
    "cluster/member/promote",
    "maintenance/alarm",
    "maintenance/status",
    "maintenance/defragment",
    "maintenance/hash",
    "maintenance/snapshot",
    "maintenance/transfer-leadership",
    "auth/enable",
    "auth/disable",
    "auth/authenticate",
    "election/campaign",
    "election/proclaim",
    "election/leader",
    "election/observe",
    "election/resign",
];

impl From<JsonError> for Status {
    fn from(e: JsonError) -> Self {
        match e {
            JsonError::Go(message) => Status::invalid(message),
            JsonError::Refused(reason) => Status::refused(reason),
        }
    }
}

/// The request in a unary call's body: its first JSON value (none or `null`: an empty
/// request), decoded by `decode`; data after that value is refused (etcd would ignore it).
fn unary<T>(
    body: &[u8],
    decode: impl FnOnce(Message<'_>) -> Result<T, Status>,
) -> Result<T, Status> {
    let mut reader = Reader::new(body);
    let value = reader.next_value()?.unwrap_or(Value::Null);
    let request = decode(Message::of(&value)?)?;
    if !reader.at_end() {
        return Err(Status::refused(
            "data after the JSON request (etcd would ignore it)",
        ));
    }
    Ok(request)
}

/// The lease ids of a keepalive body: JSON objects back to back, each read as etcd reads a
/// unary body, at most `max` of them.
fn keepalive_ids(body: &[u8], max: usize) -> Result<Vec<i64>, Status> {
    let mut reader = Reader::new(body);
    let mut ids = Vec::new();
    while let Some(value) = reader.next_value()? {
        if ids.len() == max {
            return Err(Status::refused(format!(
                "more than {max} keepalive requests in one body (--v3-max-keepalive-ids)"
            )));
        }
        ids.push(request::lease_id(Message::of(&value)?)?);
    }
    Ok(ids)
}

fn ok(v: &serde_json::Value) -> Response {
    json_response(StatusCode::OK, v.to_string())
}

impl V3 {
    /// Serves `/v3` over `core` for the callers `judge` lets in, as `settings` say (its body
    /// limits).
    pub(crate) fn new(core: Arc<Service>, judge: Judge, etcd: Etcd, settings: Settings) -> Self {
        Self {
            core,
            judge,
            etcd,
            max_body: settings.max_body,
            body_deadline: settings.body_deadline,
            http: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Handles any request under `/v3`, `/v3beta` (etcd 3.4's alias) or `/v3alpha` (which etcd
    /// 3.4 no longer serves): its caller judged first (a refusal in etcd's shape), then served
    /// for the caller it was authorised as (its namespace; its right judged again while a lock
    /// waits).
    async fn handle(&self, req: Request<Body>) -> Response {
        let who = match self.judge.etcd_caller(req.headers(), req.extensions()) {
            Ok(who) => who,
            Err(e) => return Status::from(e).response(),
        };
        self.serve(req, who).await
    }

    async fn serve(&self, req: Request<Body>, who: Authorised) -> Response {
        let path = req.uri().path();
        let Some(method) = path
            .strip_prefix("/v3/")
            .or_else(|| path.strip_prefix("/v3beta/"))
        else {
            return plain(StatusCode::NOT_FOUND, "404 page not found\n");
        };
        let Some(call) = Call::from_path(method) else {
            if UNSERVED.contains(&method) || method.starts_with("auth/") {
                return Status::new(
                    Code::Unimplemented,
                    format!("lease-proxy: /v3/{method} is not served by lease-proxy"),
                )
                .response();
            }
            // grpc-gateway's own answer for a path it has no method for.
            return plain(StatusCode::NOT_FOUND, "Not Found\n");
        };
        if req.method() != Method::POST {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
        }
        let collect = Limited::new(req.into_body(), self.max_body).collect();
        let body = match tokio::time::timeout(self.body_deadline, collect).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(_)) => return status::too_large(self.max_body),
            Err(_) => {
                return Status::invalid(format!(
                    "lease-proxy: the request body did not arrive within {:?}",
                    self.body_deadline
                ))
                .response()
            }
        };
        let caller = self.core.caller(&who);
        match self.call(&caller, call, &body).await {
            Ok(response) => response,
            Err(status) => {
                tracing::debug!(
                    ?call,
                    code = status.code(),
                    message = status.message(),
                    "/v3 call refused or failed"
                );
                status.response()
            }
        }
    }

    /// One unary call: the JSON body decoded into the typed request, the core's answer printed
    /// as the gateway prints it.
    async fn call(&self, s: &Caller, call: Call, body: &[u8]) -> Result<Response, Status> {
        let core = &self.core;
        let answer = match call {
            Call::Range => encode::range(&core.range(s, unary(body, Range::decode)?).await?),
            Call::Put => encode::put(&core.put(s, unary(body, Put::decode)?).await?),
            Call::DeleteRange => encode::delete_range(
                &core
                    .delete_range(s, unary(body, DeleteRange::decode)?)
                    .await?,
            ),
            Call::Txn => encode::txn(&core.txn(s, unary(body, Txn::decode)?).await?),
            Call::Grant => encode::lease_grant(
                &core
                    .lease_grant(s, unary(body, LeaseGrant::decode)?)
                    .await?,
            ),
            Call::Revoke => encode::header_only(
                core.lease_revoke(s, unary(body, request::lease_id)?)
                    .await?
                    .header
                    .as_ref(),
            ),
            Call::TimeToLive => encode::time_to_live(
                &core
                    .lease_time_to_live(s, unary(body, TimeToLive::decode)?)
                    .await?,
            ),
            Call::Leases => {
                unary(body, |_| Ok(()))?;
                encode::lease_leases(&core.lease_leases(s).await?)
            }
            Call::KeepAlive => {
                // One result line per id, as the gateway streams them.
                let mut lines = String::new();
                for id in keepalive_ids(body, core.limits().keepalive_ids)? {
                    let renewed = core.lease_keep_alive(s, id).await?;
                    lines.push_str(&encode::lease_keep_alive(&renewed).to_string());
                    lines.push('\n');
                }
                return Ok(json_response(StatusCode::OK, lines));
            }
            Call::Lock | Call::LockToken => {
                let locked = if call == Call::Lock {
                    core.lock(s, unary(body, Lock::decode)?).await?
                } else {
                    core.lock_token(s, unary(body, request::unlock_key)?)
                        .await?
                };
                let mut response =
                    json_response(StatusCode::OK, encode::lock(&locked.response).to_string());
                let headers = response.headers_mut();
                if let Ok(v) = HeaderValue::from_str(&locked.fencing_token) {
                    headers.insert(fencing::TOKEN_HEADER, v);
                }
                if let Ok(v) = HeaderValue::from_str(&locked.fencing_resource) {
                    headers.insert(fencing::RESOURCE_HEADER, v);
                }
                return Ok(response);
            }
            Call::Unlock => encode::header_only(
                core.unlock(s, unary(body, request::unlock_key)?)
                    .await?
                    .header
                    .as_ref(),
            ),
        };
        Ok(ok(&answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_one_value_and_nothing_after() {
        let ttl = |body: &str| unary(body.as_bytes(), LeaseGrant::decode);
        assert_eq!(ttl(r#"{"TTL":"10"}"#).unwrap().ttl, 10);
        assert_eq!(ttl(" \n").unwrap().ttl, 0);
        assert_eq!(ttl("null").unwrap().ttl, 0);
        assert_eq!(ttl(r#"{"TTL":10} "#).unwrap().ttl, 10);
        for bad in [r#"{"TTL":10} x"#, r#"{"TTL":10}{}"#, "[]", "1"] {
            assert_eq!(ttl(bad).unwrap_err().code(), 3, "{bad}");
        }
        assert_eq!(
            ttl("not json").unwrap_err(),
            Status::invalid("invalid character 'o' in literal null (expecting 'u')")
        );
    }

    #[test]
    fn keepalive_bodies_hold_a_bounded_number_of_ids() {
        assert_eq!(
            keepalive_ids(br#"{"ID":"1"} {"ID":2}{}"#, 3).unwrap(),
            vec![1, 2, 0]
        );
        assert!(keepalive_ids(br#"{"ID":1}{"ID":2}"#, 1).is_err());
        assert!(keepalive_ids(br#"{"ID":1} x"#, 5).is_err());
        assert!(keepalive_ids(br#"{"ID":" 1"}"#, 5).is_err());
        assert_eq!(keepalive_ids(b"", 5).unwrap(), Vec::<i64>::new());
    }
}
