//! Confining etcd's JSON API to a key prefix: every key a `/v3` client names is moved under the
//! namespace on the way in, and every key etcd returns is moved back out (or hidden) on the way
//! back, so nothing outside the namespace — the proxy's own keys included — can be read or
//! written.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{Map, Value};

use crate::etcd::prefix_end;

/// A key that is not valid base64: the request goes to etcd untouched so that etcd answers it
/// with its own error (and changes nothing).
#[derive(Debug)]
pub(crate) struct BadKey;

/// The namespace, as raw key bytes.
#[derive(Debug, Clone)]
pub(crate) struct Namespace {
    prefix: Vec<u8>,
}

fn decode(v: &Value) -> Result<Vec<u8>, BadKey> {
    match v {
        Value::String(s) => STANDARD.decode(s).map_err(|_| BadKey),
        Value::Null => Ok(Vec::new()),
        _ => Err(BadKey),
    }
}

fn encode(bytes: &[u8]) -> Value {
    Value::String(STANDARD.encode(bytes))
}

/// The value of `snake` or its lowerCamel spelling, whichever the request used.
fn field<'a>(
    m: &'a mut Map<String, Value>,
    snake: &str,
    camel: &str,
) -> Option<(&'a mut Value, String)> {
    let name = if m.contains_key(snake) { snake } else { camel };
    let name = name.to_owned();
    m.get_mut(&name).map(|v| (v, name))
}

impl Namespace {
    /// A namespace at `prefix`.
    pub(crate) fn new(prefix: impl Into<Vec<u8>>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    fn inside(&self, key: &[u8]) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.extend_from_slice(key);
        k
    }

    /// Rewrites `key` (and `range_end`, if any) of one request object in place.
    fn wrap_range(&self, m: &mut Map<String, Value>) -> Result<(), BadKey> {
        let key = m.get("key").map(decode).transpose()?.unwrap_or_default();
        m.insert("key".to_owned(), encode(&self.inside(&key)));
        let Some((end_value, end_name)) = field(m, "range_end", "rangeEnd") else {
            return Ok(());
        };
        let end = decode(end_value)?;
        let ns_end = prefix_end(&self.prefix);
        let rewritten = if end.is_empty() {
            // No range end: a single key.
            None
        } else if end == [0] {
            // "\0": every key from `key` on — within the namespace, up to its end.
            Some(ns_end)
        } else {
            // Never past the namespace's end, whatever bytes the client sent.
            Some(self.inside(&end).min(ns_end))
        };
        match rewritten {
            Some(e) => {
                m.insert(end_name, encode(&e));
            }
            None => {
                m.remove(&end_name);
            }
        }
        Ok(())
    }

    /// Rewrites the keys of a request to `method` (e.g. `kv/txn`).
    pub(crate) fn wrap_request(&self, method: &str, body: &mut Value) -> Result<(), BadKey> {
        let Value::Object(m) = body else {
            return Ok(());
        };
        match method {
            "kv/range" | "kv/deleterange" | "kv/put" => self.wrap_range(m),
            "kv/txn" => self.wrap_txn(m),
            "lock/lock" => self.wrap_named(m, "name"),
            "lock/unlock" => self.wrap_named(m, "key"),
            _ => Ok(()),
        }
    }

    fn wrap_named(&self, m: &mut Map<String, Value>, name: &str) -> Result<(), BadKey> {
        let key = m.get(name).map(decode).transpose()?.unwrap_or_default();
        m.insert(name.to_owned(), encode(&self.inside(&key)));
        Ok(())
    }

    fn wrap_txn(&self, m: &mut Map<String, Value>) -> Result<(), BadKey> {
        if let Some(Value::Array(compares)) = m.get_mut("compare") {
            for c in compares {
                if let Value::Object(c) = c {
                    self.wrap_range(c)?;
                }
            }
        }
        for branch in ["success", "failure"] {
            let Some(Value::Array(ops)) = m.get_mut(branch) else {
                continue;
            };
            for op in ops {
                let Value::Object(op) = op else { continue };
                for (snake, camel) in [
                    ("request_range", "requestRange"),
                    ("request_put", "requestPut"),
                    ("request_delete_range", "requestDeleteRange"),
                ] {
                    if let Some((Value::Object(inner), _)) = field(op, snake, camel) {
                        self.wrap_range(inner)?;
                    }
                }
                if let Some((Value::Object(inner), _)) = field(op, "request_txn", "requestTxn") {
                    self.wrap_txn(inner)?;
                }
            }
        }
        Ok(())
    }

    /// The client's view of a raw etcd key: without the namespace, or `None` if outside it.
    pub(crate) fn strip(&self, key: &[u8]) -> Option<Vec<u8>> {
        key.strip_prefix(self.prefix.as_slice()).map(<[u8]>::to_vec)
    }

    fn strip_value(&self, v: &mut Value) {
        if let Ok(raw) = decode(v) {
            if let Some(inner) = self.strip(&raw) {
                *v = encode(&inner);
            }
        }
    }

    fn strip_kv(&self, kv: &mut Value) {
        if let Value::Object(m) = kv {
            if let Some(k) = m.get_mut("key") {
                self.strip_value(k);
            }
        }
    }

    /// Moves every key in an etcd response back out of the namespace.
    pub(crate) fn unwrap_response(&self, body: &mut Value) {
        let Value::Object(m) = body else { return };
        for list in ["kvs", "prev_kvs"] {
            if let Some(Value::Array(kvs)) = m.get_mut(list) {
                kvs.iter_mut().for_each(|kv| self.strip_kv(kv));
            }
        }
        if let Some(kv) = m.get_mut("prev_kv") {
            self.strip_kv(kv);
        }
        if let Some(k) = m.get_mut("key") {
            // Lock and unlock answers carry the lock's key.
            self.strip_value(k);
        }
        if let Some(Value::Array(responses)) = m.get_mut("responses") {
            for r in responses {
                let Value::Object(r) = r else { continue };
                for inner in r.values_mut() {
                    self.unwrap_response(inner);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(s: &[u8]) -> String {
        STANDARD.encode(s)
    }

    #[test]
    fn ranges_stay_inside() {
        let ns = Namespace::new(b"/ns/".to_vec());
        let end = b64(&prefix_end(b"/ns/"));
        for (key, range_end, want_key, want_end) in [
            (b"a".as_slice(), None, b64(b"/ns/a"), None),
            (
                b"a",
                Some(b"b".as_slice()),
                b64(b"/ns/a"),
                Some(b64(b"/ns/b")),
            ),
            (b"\0", Some(b"\0"), b64(b"/ns/\0"), Some(end.clone())),
            (
                b"a",
                Some(b"\xff\xff"),
                b64(b"/ns/a"),
                Some(b64(b"/ns/\xff\xff")),
            ),
            (
                b"a",
                Some(b"\x00\x01"),
                b64(b"/ns/a"),
                Some(b64(b"/ns/\x00\x01")),
            ),
        ] {
            let mut req = json!({"key": b64(key)});
            if let Some(e) = range_end {
                req["range_end"] = json!(b64(e));
            }
            ns.wrap_request("kv/range", &mut req).unwrap();
            assert_eq!(req["key"], json!(want_key));
            assert_eq!(req.get("range_end").cloned(), want_end.map(|e| json!(e)));
            if let Some(e) = req.get("range_end") {
                let e = STANDARD.decode(e.as_str().unwrap()).unwrap();
                assert!(e <= prefix_end(b"/ns/"), "range escapes the namespace");
            }
        }
        let mut bad = json!({"key": "not base64!"});
        assert!(ns.wrap_request("kv/range", &mut bad).is_err());
    }

    #[test]
    fn responses_come_back_out() {
        let ns = Namespace::new(b"/ns/".to_vec());
        let mut resp = json!({"kvs": [{"key": b64(b"/ns/a")}], "responses": [
            {"response_range": {"kvs": [{"key": b64(b"/ns/b")}]}}]});
        ns.unwrap_response(&mut resp);
        assert_eq!(resp["kvs"][0]["key"], json!(b64(b"a")));
        assert_eq!(
            resp["responses"][0]["response_range"]["kvs"][0]["key"],
            json!(b64(b"b"))
        );
    }
}
