//! etcd's answers as its gateway prints them (grpc-gateway 1.9's `JSONPb{OrigName: true}`):
//! fields under their proto names in declaration order, fields with default values omitted,
//! 64-bit integers as strings, bytes as standard base64 — and every key moved back out of the
//! namespace (a key outside it is dropped, though confined requests cannot produce one).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use etcd_client::proto::{
    PbDeleteResponse, PbKeyValue, PbLeaseGrantResponse, PbLeaseKeepAliveResponse,
    PbLeaseLeasesResponse, PbLeaseTimeToLiveResponse, PbLockResponse, PbPutResponse,
    PbRangeResponse, PbResponseHeader, PbResponseOp, PbTxnOpResponse, PbTxnResponse,
};
use serde_json::{Map, Value};

use crate::etcd::Header;

/// A JSON object being built in field order, defaults left out.
#[derive(Default)]
pub(crate) struct Object(Map<String, Value>);

impl Object {
    /// An empty object.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A signed 64-bit field.
    pub(crate) fn int(mut self, name: &str, v: i64) -> Self {
        if v != 0 {
            self.0.insert(name.into(), Value::String(v.to_string()));
        }
        self
    }

    /// A boolean field.
    pub(crate) fn flag(mut self, name: &str, v: bool) -> Self {
        if v {
            self.0.insert(name.into(), Value::Bool(true));
        }
        self
    }

    /// A bytes field.
    pub(crate) fn bytes(mut self, name: &str, v: &[u8]) -> Self {
        if !v.is_empty() {
            self.0
                .insert(name.into(), Value::String(STANDARD.encode(v)));
        }
        self
    }

    /// A string field.
    pub(crate) fn text(mut self, name: &str, v: &str) -> Self {
        if !v.is_empty() {
            self.0.insert(name.into(), Value::String(v.to_owned()));
        }
        self
    }

    /// A message field (present even when all its fields are defaults).
    pub(crate) fn message(mut self, name: &str, v: Option<Value>) -> Self {
        if let Some(v) = v {
            self.0.insert(name.into(), v);
        }
        self
    }

    /// A repeated field.
    pub(crate) fn list(mut self, name: &str, v: Vec<Value>) -> Self {
        if !v.is_empty() {
            self.0.insert(name.into(), Value::Array(v));
        }
        self
    }

    /// The object.
    pub(crate) fn done(self) -> Value {
        Value::Object(self.0)
    }
}

/// `ResponseHeader`, if present.
pub(crate) fn header(h: Option<&PbResponseHeader>) -> Option<Value> {
    h.map(|h| {
        Header {
            cluster_id: h.cluster_id,
            member_id: h.member_id,
            revision: h.revision,
            raft_term: h.raft_term,
        }
        .to_json()
    })
}

/// `mvccpb.KeyValue` (its key already out of the namespace).
fn kv(kv: &PbKeyValue) -> Value {
    Object::new()
        .bytes("key", &kv.key)
        .int("create_revision", kv.create_revision)
        .int("mod_revision", kv.mod_revision)
        .int("version", kv.version)
        .bytes("value", &kv.value)
        .int("lease", kv.lease)
        .done()
}

fn kvs(list: &[PbKeyValue]) -> Vec<Value> {
    list.iter().map(kv).collect()
}

/// `RangeResponse`.
pub(crate) fn range(r: &PbRangeResponse) -> Value {
    Object::new()
        .message("header", header(r.header.as_ref()))
        .list("kvs", kvs(&r.kvs))
        .flag("more", r.more)
        .int("count", r.count)
        .done()
}

/// `PutResponse`.
pub(crate) fn put(r: &PbPutResponse) -> Value {
    Object::new()
        .message("header", header(r.header.as_ref()))
        .message("prev_kv", r.prev_kv.as_ref().map(kv))
        .done()
}

/// `DeleteRangeResponse`.
pub(crate) fn delete_range(r: &PbDeleteResponse) -> Value {
    Object::new()
        .message("header", header(r.header.as_ref()))
        .int("deleted", r.deleted)
        .list("prev_kvs", kvs(&r.prev_kvs))
        .done()
}

fn response_op(op: &PbResponseOp) -> Value {
    let object = Object::new();
    match &op.response {
        None => object,
        Some(PbTxnOpResponse::ResponseRange(r)) => object.message("response_range", Some(range(r))),
        Some(PbTxnOpResponse::ResponsePut(r)) => object.message("response_put", Some(put(r))),
        Some(PbTxnOpResponse::ResponseDeleteRange(r)) => {
            object.message("response_delete_range", Some(delete_range(r)))
        }
        Some(PbTxnOpResponse::ResponseTxn(r)) => object.message("response_txn", Some(txn(r))),
    }
    .done()
}

/// `TxnResponse`.
pub(crate) fn txn(r: &PbTxnResponse) -> Value {
    Object::new()
        .message("header", header(r.header.as_ref()))
        .flag("succeeded", r.succeeded)
        .list("responses", r.responses.iter().map(response_op).collect())
        .done()
}

/// `LeaseGrantResponse`.
pub(crate) fn lease_grant(r: &PbLeaseGrantResponse) -> Value {
    Object::new()
        .message("header", header(r.header.as_ref()))
        .int("ID", r.id)
        .int("TTL", r.ttl)
        .text("error", &r.error)
        .done()
}

/// `LeaseTimeToLiveResponse`.
pub(crate) fn time_to_live(r: &PbLeaseTimeToLiveResponse) -> Value {
    let keys = r
        .keys
        .iter()
        .map(|k| Value::String(STANDARD.encode(k)))
        .collect();
    Object::new()
        .message("header", header(r.header.as_ref()))
        .int("ID", r.id)
        .int("TTL", r.ttl)
        .int("grantedTTL", r.granted_ttl)
        .list("keys", keys)
        .done()
}

/// A response that carries only its header (`LeaseRevokeResponse`, `UnlockResponse`).
pub(crate) fn header_only(h: Option<&PbResponseHeader>) -> Value {
    Object::new().message("header", header(h)).done()
}

/// `LeaseLeasesResponse`.
pub(crate) fn lease_leases(r: &PbLeaseLeasesResponse) -> Value {
    let leases = r
        .leases
        .iter()
        .map(|l| Object::new().int("ID", l.id).done())
        .collect();
    Object::new()
        .message("header", header(r.header.as_ref()))
        .list("leases", leases)
        .done()
}

/// `LeaseKeepAliveResponse`, as one line of the gateway's keepalive stream: `{"result": …}`.
pub(crate) fn lease_keep_alive(r: &PbLeaseKeepAliveResponse) -> Value {
    let result = Object::new()
        .message("header", header(r.header.as_ref()))
        .int("ID", r.id)
        .int("TTL", r.ttl)
        .done();
    Object::new().message("result", Some(result)).done()
}

/// `LockResponse`.
pub(crate) fn lock(r: &PbLockResponse) -> Value {
    Object::new()
        .message("header", header(r.header.as_ref()))
        .bytes("key", &r.key)
        .done()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcdapi::Namespace;

    #[test]
    fn defaults_are_omitted_and_order_kept() {
        let ns = Namespace::new(b"/ns/".to_vec());
        let r = PbRangeResponse {
            header: Some(PbResponseHeader {
                cluster_id: 1,
                member_id: 2,
                revision: 3,
                raft_term: 4,
            }),
            kvs: vec![
                PbKeyValue {
                    key: b"/ns/a".to_vec(),
                    create_revision: 3,
                    mod_revision: 3,
                    version: 1,
                    value: Vec::new(),
                    lease: 0,
                },
                PbKeyValue {
                    key: b"/elsewhere".to_vec(),
                    ..Default::default()
                },
            ],
            more: false,
            count: 1,
        };
        assert_eq!(
            range(&ns.range_out(r.clone())).to_string(),
            r#"{"header":{"cluster_id":"1","member_id":"2","revision":"3","raft_term":"4"},"kvs":[{"key":"YQ==","create_revision":"3","mod_revision":"3","version":"1"}],"count":"1"}"#
        );
        let t = PbTxnResponse {
            header: None,
            succeeded: false,
            responses: vec![PbResponseOp {
                response: Some(PbTxnOpResponse::ResponsePut(PbPutResponse {
                    header: Some(PbResponseHeader {
                        revision: 9,
                        ..Default::default()
                    }),
                    prev_kv: None,
                })),
            }],
        };
        assert_eq!(
            txn(&ns.txn_out(t.clone())).to_string(),
            r#"{"responses":[{"response_put":{"header":{"revision":"9"}}}]}"#
        );
    }
}
