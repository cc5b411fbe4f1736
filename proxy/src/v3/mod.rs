//! `/v3`: etcd's own JSON gateway API for leases, locks and KV, served by the proxy (DESIGN §5.2).
//!
//! Requests are passed to etcd's JSON gateway on the pinned member, so encodings, field order
//! and errors are etcd's own, byte for byte. The proxy adds what etcd alone does not:
//! - KV and locks are confined to a namespace (see [`namespace`]);
//! - leases are confined too: a lease granted here gets a marker key attached, and revoke,
//!   time-to-live, keepalive, listing and locking only see marked leases — the proxy's own
//!   leases (whose ids are guessable) are invisible and untouchable from `/v3`;
//! - keepalives go through the proxy's shared, multiplexed keepalive streams;
//! - a lock answer carries the lock key's fencing token in `Fencing-Token`.

mod namespace;

use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use fencing::{Keyring, Token};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

pub(crate) use namespace::Namespace;

use crate::etcd::{prefix_end, Etcd, KeepAlive};

/// etcd's error for a lease it does not know (HTTP 404, gRPC NotFound).
const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";

/// Everything `/v3` needs.
pub(crate) struct V3 {
    etcd: Etcd,
    keepalive: KeepAlive,
    keys: Arc<Keyring>,
    era: u64,
    namespace: Namespace,
    /// Marker keys of leases granted through `/v3`: `{prefix}{lease id}`.
    lease_markers: String,
    http: Client<HttpConnector, Full<Bytes>>,
    max_body: usize,
}

/// An answer from etcd's gateway.
struct Gateway {
    status: StatusCode,
    body: Bytes,
}

impl V3 {
    /// Serves `/v3` with the given namespaces.
    pub(crate) fn new(
        etcd: Etcd,
        keepalive: KeepAlive,
        keys: Arc<Keyring>,
        era: u64,
        namespace: Vec<u8>,
        lease_markers: String,
        max_body: usize,
    ) -> Self {
        Self {
            etcd,
            keepalive,
            keys,
            era,
            namespace: Namespace::new(namespace),
            lease_markers,
            http: Client::builder(TokioExecutor::new()).build_http(),
            max_body,
        }
    }

    /// Handles any request under `/v3` or `/v3beta`.
    pub(crate) async fn handle(&self, req: Request<Body>) -> Response {
        let path = req.uri().path().to_owned();
        let Some(method) = path
            .strip_prefix("/v3/")
            .or_else(|| path.strip_prefix("/v3beta/"))
            .map(str::to_owned)
        else {
            return not_found();
        };
        let known = matches!(
            method.as_str(),
            "kv/range"
                | "kv/put"
                | "kv/deleterange"
                | "kv/txn"
                | "lease/grant"
                | "lease/revoke"
                | "kv/lease/revoke"
                | "lease/timetolive"
                | "kv/lease/timetolive"
                | "lease/leases"
                | "kv/lease/leases"
                | "lease/keepalive"
                | "lock/lock"
                | "lock/unlock"
        );
        if !known {
            return not_found();
        }
        if req.method() != Method::POST {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
        }
        let raw = match Limited::new(req.into_body(), self.max_body).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return grpc_error(StatusCode::PAYLOAD_TOO_LARGE, 8, "request body too large")
            }
        };
        let Ok(mut body) = serde_json::from_slice::<Value>(&raw) else {
            if method == "lease/keepalive" {
                return self.keepalive(&path, &raw).await;
            }
            // etcd phrases its own parse errors; a request it cannot parse changes nothing.
            return self.pass(&path, raw).await;
        };
        match method.as_str() {
            "kv/range" | "kv/put" | "kv/deleterange" | "kv/txn" | "lock/unlock" => {
                self.namespaced(&path, &method, raw, body).await
            }
            "lock/lock" => self.lock(&path, raw, body).await,
            "lease/grant" => self.grant(&path, raw).await,
            "lease/revoke" | "kv/lease/revoke" => match self.own_lease(&body).await {
                Ok(true) => self.pass(&path, raw).await,
                Ok(false) => grpc_error(StatusCode::NOT_FOUND, 5, LEASE_NOT_FOUND),
                Err(r) => r,
            },
            "lease/timetolive" | "kv/lease/timetolive" => match self.own_lease(&body).await {
                Ok(true) => self.time_to_live(&path, raw).await,
                Ok(false) => self.unknown_lease_ttl(&mut body).await,
                Err(r) => r,
            },
            "lease/leases" | "kv/lease/leases" => self.leases(&path, raw).await,
            _ => self.keepalive(&path, &raw).await,
        }
    }

    /// Sends `body` to etcd's gateway at `path` on the pinned member.
    async fn gateway(&self, path: &str, body: Bytes) -> Result<Gateway, Response> {
        let pinned = self.etcd.pinned();
        let url = format!(
            "{}{path}",
            self.etcd.endpoint(pinned.index).trim_end_matches('/')
        );
        let req = http::Request::post(url)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| grpc_error(StatusCode::SERVICE_UNAVAILABLE, 14, &e.to_string()))?;
        let resp = match self.http.request(req).await {
            Ok(r) => r,
            Err(e) => {
                self.etcd.unpin(pinned.index);
                return Err(grpc_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    14,
                    &e.to_string(),
                ));
            }
        };
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| grpc_error(StatusCode::SERVICE_UNAVAILABLE, 14, &e.to_string()))?
            .to_bytes();
        Ok(Gateway { status, body })
    }

    async fn pass(&self, path: &str, body: Bytes) -> Response {
        match self.gateway(path, body).await {
            Ok(g) => json_response(g.status, g.body),
            Err(r) => r,
        }
    }

    /// KV calls and unlock: keys into the namespace, etcd's answer back out of it.
    async fn namespaced(&self, path: &str, method: &str, raw: Bytes, mut body: Value) -> Response {
        if self.namespace.wrap_request(method, &mut body).is_err() {
            return self.pass(path, raw).await;
        }
        let g = match self.gateway(path, Bytes::from(body.to_string())).await {
            Ok(g) => g,
            Err(r) => return r,
        };
        self.unwrapped(g)
    }

    fn unwrapped(&self, g: Gateway) -> Response {
        if !g.status.is_success() {
            return json_response(g.status, g.body);
        }
        match serde_json::from_slice::<Value>(&g.body) {
            Ok(mut v) => {
                self.namespace.unwrap_response(&mut v);
                json_response(g.status, Bytes::from(v.to_string()))
            }
            Err(_) => json_response(g.status, g.body),
        }
    }

    /// The lease id of a lease request (`ID`, string or number), if any.
    fn lease_id(body: &Value) -> Option<i64> {
        match body.get("ID").or_else(|| body.get("id"))? {
            Value::String(s) => s.parse().ok(),
            Value::Number(n) => n.as_i64(),
            _ => None,
        }
    }

    fn marker(&self, id: i64) -> String {
        format!("{}{id}", self.lease_markers)
    }

    /// Whether the request's lease was granted through `/v3`. A request without a usable id is
    /// treated as ours, so etcd answers it as it would.
    async fn own_lease(&self, body: &Value) -> Result<bool, Response> {
        let Some(id) = Self::lease_id(body) else {
            return Ok(true);
        };
        self.etcd
            .get(&self.marker(id))
            .await
            .map(|kv| kv.is_some())
            .map_err(|e| grpc_error(StatusCode::SERVICE_UNAVAILABLE, 14, &e.to_string()))
    }

    async fn grant(&self, path: &str, raw: Bytes) -> Response {
        let g = match self.gateway(path, raw).await {
            Ok(g) => g,
            Err(r) => return r,
        };
        if g.status.is_success() {
            let id = serde_json::from_slice::<Value>(&g.body)
                .ok()
                .and_then(|v| Self::lease_id(&v));
            if let Some(id) = id {
                // Mark the lease as /v3's: the marker lives and dies with the lease.
                if let Err(e) = self.etcd.put_with_lease(&self.marker(id), id).await {
                    let _ = self.etcd.revoke(id).await;
                    return grpc_error(StatusCode::SERVICE_UNAVAILABLE, 14, &e.to_string());
                }
            }
        }
        json_response(g.status, g.body)
    }

    /// TimeToLive of one of our leases: attached keys outside the namespace (the marker) hidden.
    async fn time_to_live(&self, path: &str, raw: Bytes) -> Response {
        let g = match self.gateway(path, raw).await {
            Ok(g) => g,
            Err(r) => return r,
        };
        let Ok(mut v) = serde_json::from_slice::<Value>(&g.body) else {
            return json_response(g.status, g.body);
        };
        if let Some(Value::Array(keys)) = v.get_mut("keys") {
            let visible: Vec<Value> = keys
                .iter()
                .filter_map(|k| {
                    let raw = base64_decode(k.as_str()?)?;
                    self.namespace
                        .strip(&raw)
                        .map(|inner| json!(base64_encode(&inner)))
                })
                .collect();
            *keys = visible;
            if keys.is_empty() {
                if let Value::Object(m) = &mut v {
                    m.remove("keys");
                }
            }
        }
        json_response(g.status, Bytes::from(v.to_string()))
    }

    /// What etcd answers for a lease it does not know: `TTL: -1`.
    async fn unknown_lease_ttl(&self, body: &mut Value) -> Response {
        let header = match self.etcd.header().await {
            Ok(h) => h,
            Err(e) => return grpc_error(StatusCode::SERVICE_UNAVAILABLE, 14, &e.to_string()),
        };
        let id = Self::lease_id(body).unwrap_or_default();
        let v = json!({"header": header.to_json(), "ID": id.to_string(), "TTL": "-1"});
        json_response(StatusCode::OK, Bytes::from(v.to_string()))
    }

    /// etcd lists every lease of the cluster; only ours are shown.
    async fn leases(&self, path: &str, raw: Bytes) -> Response {
        let g = match self.gateway(path, raw).await {
            Ok(g) => g,
            Err(r) => return r,
        };
        let Ok(mut v) = serde_json::from_slice::<Value>(&g.body) else {
            return json_response(g.status, g.body);
        };
        let ours = match self.marked_leases().await {
            Ok(s) => s,
            Err(r) => return r,
        };
        if let Value::Object(m) = &mut v {
            if let Some(Value::Array(list)) = m.get_mut("leases") {
                list.retain(|l| Self::lease_id(l).is_some_and(|id| ours.contains(&id)));
                if list.is_empty() {
                    m.remove("leases");
                }
            }
        }
        json_response(g.status, Bytes::from(v.to_string()))
    }

    async fn marked_leases(&self) -> Result<HashSet<i64>, Response> {
        let start = self.lease_markers.as_bytes();
        let end = prefix_end(start);
        let mut ids = HashSet::new();
        let mut from = start.to_vec();
        loop {
            let (kvs, more) = self
                .etcd
                .range(&from, &end, 1000)
                .await
                .map_err(|e| grpc_error(StatusCode::SERVICE_UNAVAILABLE, 14, &e.to_string()))?;
            for kv in &kvs {
                if let Some(id) = kv
                    .key()
                    .strip_prefix(start)
                    .and_then(|s| std::str::from_utf8(s).ok())
                    .and_then(|s| s.parse().ok())
                {
                    ids.insert(id);
                }
            }
            match kvs.last() {
                Some(last) if more => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(ids),
            }
        }
    }

    /// Keepalives, possibly several JSON objects in one body, each answered on its own line,
    /// renewed over the proxy's shared streams.
    async fn keepalive(&self, path: &str, raw: &Bytes) -> Response {
        let requests: Result<Vec<Value>, _> = serde_json::Deserializer::from_slice(raw)
            .into_iter::<Value>()
            .collect();
        let Ok(requests) = requests else {
            return self.pass(path, raw.clone()).await;
        };
        let mut out = String::new();
        for request in requests {
            let id = Self::lease_id(&request).unwrap_or_default();
            let ours = match self.own_lease(&request).await {
                Ok(ours) => ours && id != 0,
                Err(r) => return r,
            };
            let renewed = if ours {
                match self.keepalive.renew_with_header(id).await {
                    Ok(r) => Some(r),
                    Err(e) => {
                        return grpc_error(StatusCode::SERVICE_UNAVAILABLE, 14, &e.to_string())
                    }
                }
            } else {
                None
            };
            let header = match renewed.and_then(|r| r.header) {
                Some(h) => h,
                None => match self.etcd.header().await {
                    Ok(h) => h,
                    Err(e) => {
                        return grpc_error(StatusCode::SERVICE_UNAVAILABLE, 14, &e.to_string())
                    }
                },
            };
            let mut result = serde_json::Map::new();
            result.insert("header".into(), header.to_json());
            result.insert("ID".into(), json!(id.to_string()));
            if let Some(r) = renewed.filter(|r| r.ttl > 0) {
                result.insert("TTL".into(), json!(r.ttl.to_string()));
            }
            out.push_str(&json!({ "result": result }).to_string());
            out.push('\n');
        }
        json_response(StatusCode::OK, Bytes::from(out))
    }

    /// Lock: only with a lease of ours; the answer also carries the lock key's fencing token.
    async fn lock(&self, path: &str, raw: Bytes, mut body: Value) -> Response {
        let lease = body.get("lease").and_then(|v| match v {
            Value::String(s) => s.parse::<i64>().ok(),
            Value::Number(n) => n.as_i64(),
            _ => None,
        });
        if let Some(lease) = lease.filter(|l| *l != 0) {
            match self.own_lease(&json!({"ID": lease})).await {
                Ok(true) => {}
                // What etcd's lock service answers for a lease it does not know: the error
                // surfaces untyped (gRPC Unknown, HTTP 500), unlike LeaseRevoke's NotFound.
                Ok(false) => {
                    return grpc_error(StatusCode::INTERNAL_SERVER_ERROR, 2, LEASE_NOT_FOUND)
                }
                Err(r) => return r,
            }
        }
        let name = body
            .get("name")
            .and_then(Value::as_str)
            .and_then(base64_decode)
            .map(|n| String::from_utf8_lossy(&n).into_owned());
        if self.namespace.wrap_request("lock/lock", &mut body).is_err() {
            return self.pass(path, raw).await;
        }
        let g = match self.gateway(path, Bytes::from(body.to_string())).await {
            Ok(g) => g,
            Err(r) => return r,
        };
        let key = serde_json::from_slice::<Value>(&g.body)
            .ok()
            .and_then(|v| v.get("key").and_then(Value::as_str).and_then(base64_decode));
        let mut response = self.unwrapped(g);
        if let (Some(key), Some(name)) = (key, name) {
            // The lock is held while its key exists; its create revision orders holders.
            if let Ok(Some(kv)) = self.etcd.get_bytes(&key).await {
                let token = Token::new(self.era, u64::try_from(kv.create_revision()).unwrap_or(0));
                if let Ok(v) = HeaderValue::from_str(&self.keys.mint(&name, token)) {
                    response.headers_mut().insert(fencing::TOKEN_HEADER, v);
                }
            }
        }
        response
    }
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn json_response(status: StatusCode, body: Bytes) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

fn not_found() -> Response {
    plain(StatusCode::NOT_FOUND, "404 page not found\n")
}

/// An error in the gateway's shape.
fn grpc_error(status: StatusCode, code: u16, message: &str) -> Response {
    let body = json!({"error": message, "message": message, "code": code});
    json_response(status, Bytes::from(body.to_string()))
}
