//! `/v3`: etcd's JSON gateway API for leases, locks and KV, served by the proxy
//! (docs/DESIGN.md §5.2).
//!
//! Fails closed (docs/DESIGN.md §7.6). Every request body is read into typed requests exactly as
//! etcd's gateway would read it ([`json`], [`request`]); whatever the proxy cannot read exactly as
//! etcd would is refused with etcd's error shape (HTTP 400, gRPC code 3), never passed on. The
//! typed values go to etcd through etcd-client's gRPC API — no client bytes reach etcd — under the
//! same deadline and member failover as `/v1`, and etcd's answers are printed as its gateway
//! prints them ([`encode`]). On top of etcd, the proxy adds:
//! - KV and locks are confined to a namespace ([`namespace`]) — with `--auth-tokens`, one per
//!   principal ([`Scope`]);
//! - leases are confined too ([`lease`]): only leases granted through `/v3` can be revoked,
//!   renewed, inspected, listed, or named by a put or a lock (with `--auth-tokens`, only by the
//!   principal that granted them);
//! - keepalives go through the proxy's shared, multiplexed keepalive streams;
//! - a lock answer carries a fencing token in the lock's own token domain ([`lock`]);
//! - per-request limits: ids per keepalive body, operations and nesting per transaction.

mod discovery;
mod encode;
mod gobase64;
mod json;
mod kv;
mod lease;
mod lock;
mod namespace;
mod request;
mod status;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use fencing::Keys;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::etcd::{Etcd, KeepAlive};
use json::{JsonError, Reader, Value};
use lease::Markers;
use namespace::Namespace;
use request::Message;
use status::{json as json_response, plain, Code, Status};

/// A request refused before it reached the `/v3` API (authentication, authorisation), in etcd's
/// shape.
pub(crate) fn refusal(e: crate::Error) -> Response {
    Status::from(e).response()
}

/// What `/v3` is configured with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Where the markers of `/v3` leases live (`{etcd-prefix}v3/leases/`).
    pub(crate) lease_markers: String,
    /// The fencing era of lock tokens.
    pub(crate) era: u64,
    /// The namespace every key is confined to (`--v3-namespace`).
    pub(crate) namespace: String,
    /// Per-request limits.
    pub(crate) limits: Limits,
    /// Largest request body.
    pub(crate) max_body: usize,
    /// How long a body may take to arrive.
    pub(crate) body_deadline: std::time::Duration,
}

/// Per-request limits of `/v3`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Lease ids (JSON objects) in one keepalive body.
    pub(crate) keepalive_ids: usize,
    /// Compares and operations in one transaction, counted at every depth.
    pub(crate) txn_ops: usize,
    /// Transactions nested inside a transaction.
    pub(crate) txn_depth: usize,
}

/// Everything `/v3` needs.
pub(crate) struct V3 {
    etcd: Etcd,
    keepalive: KeepAlive,
    /// The keyring in force (reloaded with the key file).
    keys: Keys,
    era: u64,
    namespace: Namespace,
    leases: Markers,
    limits: Limits,
    max_body: usize,
    /// Deadline for a request's whole body (`--header-read-timeout`).
    body_deadline: std::time::Duration,
    /// For relaying `/version` and `/health`.
    http: Client<HttpConnector, Full<Bytes>>,
}

/// Whose view of `/v3` a request gets: the shared namespace with authentication off; with it
/// on, the principal's own namespace `{--v3-namespace}{principal}/` and only the leases it
/// granted through `/v3`. Principal names are `[A-Za-z0-9._-]{1,64}` (checked when the token
/// file is read) and contain no `/`, so no principal's namespace is inside another's.
pub(crate) struct Scope {
    namespace: Namespace,
    /// The principal, `None` with authentication off.
    owner: Option<String>,
}

impl Scope {
    /// Whether a lease marker with `value` belongs to this scope: any marker with
    /// authentication off (one shared namespace), only the principal's own with it on.
    fn owns(&self, value: &[u8]) -> bool {
        match &self.owner {
            None => true,
            Some(owner) => value == owner.as_bytes(),
        }
    }

    /// The name whose fencing domain a lock `name` gets: the name itself with authentication
    /// off, `{principal}/{name}` with it on.
    fn lock_domain(&self, name: &[u8]) -> Vec<u8> {
        match &self.owner {
            None => name.to_vec(),
            Some(owner) => [owner.as_bytes(), b"/", name].concat(),
        }
    }
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
    /// Serves `/v3` as `settings` say (its namespace, lease markers and limits).
    pub(crate) fn new(etcd: Etcd, keepalive: KeepAlive, keys: Keys, settings: Settings) -> Self {
        Self {
            leases: Markers::new(etcd.clone(), settings.lease_markers),
            etcd,
            keepalive,
            keys,
            era: settings.era,
            namespace: Namespace::new(settings.namespace.into_bytes()),
            limits: settings.limits,
            max_body: settings.max_body,
            body_deadline: settings.body_deadline,
            http: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// The view of `/v3` for `principal` (`None`: authentication is off).
    fn scope(&self, principal: Option<&str>) -> Scope {
        match principal {
            None => Scope {
                namespace: self.namespace.clone(),
                owner: None,
            },
            Some(p) => {
                let mut prefix = self.namespace.key(p.as_bytes());
                prefix.push(b'/');
                Scope {
                    namespace: Namespace::new(prefix),
                    owner: Some(p.to_owned()),
                }
            }
        }
    }

    /// Handles any request under `/v3`, `/v3beta` (etcd 3.4's alias) or `/v3alpha` (which etcd
    /// 3.4 no longer serves), in `principal`'s namespace (`None`: the shared one).
    pub(crate) async fn handle(&self, req: Request<Body>, principal: Option<&str>) -> Response {
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
            Ok(Err(_)) => return Status::too_large(self.max_body).response(),
            Err(_) => {
                return Status::invalid(format!(
                    "lease-proxy: the request body did not arrive within {:?}",
                    self.body_deadline
                ))
                .response()
            }
        };
        let scope = self.scope(principal);
        match self.call(&scope, call, &body).await {
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

    async fn call(&self, s: &Scope, call: Call, body: &[u8]) -> Result<Response, Status> {
        let answer = match call {
            Call::Range => self.range(s, unary(body, request::Range::decode)?).await?,
            Call::Put => self.put(s, unary(body, request::Put::decode)?).await?,
            Call::DeleteRange => {
                self.delete_range(s, unary(body, request::DeleteRange::decode)?)
                    .await?
            }
            Call::Txn => self.txn(s, unary(body, request::Txn::decode)?).await?,
            Call::Grant => {
                self.grant(s, unary(body, request::LeaseGrant::decode)?)
                    .await?
            }
            Call::Revoke => self.revoke(s, unary(body, request::lease_id)?).await?,
            Call::TimeToLive => {
                self.time_to_live(s, unary(body, request::TimeToLive::decode)?)
                    .await?
            }
            Call::Leases => {
                unary(body, |_| Ok(()))?;
                self.leases(s).await?
            }
            Call::KeepAlive => {
                let ids = keepalive_ids(body, self.limits.keepalive_ids)?;
                let lines = self.keepalive(s, ids).await?;
                return Ok(json_response(StatusCode::OK, lines));
            }
            Call::Lock => return self.lock(s, unary(body, request::Lock::decode)?).await,
            Call::Unlock => self.unlock(s, unary(body, request::unlock_key)?).await?,
        };
        Ok(ok(&answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_one_value_and_nothing_after() {
        let ttl = |body: &str| unary(body.as_bytes(), request::LeaseGrant::decode);
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
    fn a_principals_scope_owns_only_its_markers_and_lock_domains() {
        let shared = Scope {
            namespace: Namespace::new(b"/ns/".to_vec()),
            owner: None,
        };
        let acme = Scope {
            namespace: Namespace::new(b"/ns/acme/".to_vec()),
            owner: Some("acme".into()),
        };
        // With authentication off every marker is ours, whoever granted it.
        assert!(shared.owns(b"") && shared.owns(b"acme"));
        assert!(acme.owns(b"acme"));
        for other in [b"".as_slice(), b"acm", b"acme2", b"globex", b"ACME"] {
            assert!(!acme.owns(other), "{other:?}");
        }
        assert_eq!(shared.lock_domain(b"L"), b"L");
        assert_eq!(acme.lock_domain(b"L"), b"acme/L");
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
