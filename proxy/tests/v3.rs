//! The etcd-compatible `/v3` API against real etcd's own JSON gateway: the same scripted requests
//! give the same answers; the namespace cannot be escaped; locks block and carry fencing tokens.
//!
//! Normalisation (docs/ARCHITECTURE.md, "The etcd-compatible API"): cluster and member ids, raft
//! terms and every revision are replaced by placeholders; lease ids by symbols in order of first
//! appearance (so the same lease is the same symbol on both sides); a remaining TTL other than -1
//! by a placeholder (a second may tick between the two requests); the lease-id suffix of a lock key
//! by a placeholder; a lease's `keys` sorted (etcd lists them in Go map order, which varies).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use common::*;
use lease_proxy_testkit::process::exit_within;
use serde_json::Value;

/// One side of the comparison: a base URL, and what its lease ids and lock keys were.
struct Side {
    base: String,
    vars: HashMap<String, String>,
    symbols: HashMap<String, String>,
}

impl Side {
    fn new(base: String) -> Self {
        Self {
            base,
            vars: HashMap::new(),
            symbols: HashMap::new(),
        }
    }

    async fn send(&mut self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut body = body.to_owned();
        for (k, v) in &self.vars {
            body = body.replace(k, v);
        }
        let req = match method {
            "GET" => http().get(format!("{}{path}", self.base)),
            _ => http().post(format!("{}{path}", self.base)).body(body),
        };
        let resp = req.send().await.unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    fn symbol(&mut self, id: &str) -> String {
        let n = self.symbols.len();
        self.symbols
            .entry(id.to_owned())
            .or_insert_with(|| format!("L{n}"))
            .clone()
    }

    fn normalise(&mut self, v: &mut Value, field: Option<&str>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m.iter_mut() {
                    self.normalise(v, Some(k.as_str()));
                }
            }
            Value::Array(a) => {
                a.iter_mut().for_each(|v| self.normalise(v, field));
                if field == Some("keys") {
                    // etcd lists a lease's keys in Go map order, which varies run to run.
                    a.sort_by_key(|v| v.to_string());
                }
            }
            Value::String(s) => match field {
                Some(
                    "cluster_id" | "member_id" | "raft_term" | "revision" | "create_revision"
                    | "mod_revision" | "compact_revision",
                ) => *s = "N".into(),
                Some("ID" | "lease") => *s = self.symbol(s),
                Some("TTL") if s != "-1" => *s = "T".into(),
                Some("key") => {
                    let decoded = STANDARD.decode(s.as_bytes()).unwrap_or_default();
                    let text = String::from_utf8_lossy(&decoded).into_owned();
                    if let Some((name, hex)) = text.rsplit_once('/') {
                        let is_hex = !hex.is_empty()
                            && hex.len() <= 16
                            && hex.chars().all(|c| c.is_ascii_hexdigit());
                        if name.starts_with("lock") && is_hex {
                            *s = format!("{name}/LEASEHEX");
                        }
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }

    /// The answer, normalised: status and one normalised line per JSON object (or the text).
    fn normalised(&mut self, status: u16, text: &str) -> String {
        let lines: Vec<String> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| match serde_json::from_str::<Value>(l) {
                Ok(mut v) => {
                    self.normalise(&mut v, None);
                    v.to_string()
                }
                Err(_) => l.to_owned(),
            })
            .collect();
        format!("{status} {}", lines.join("\n"))
    }

    /// Remembers the value of `field` of the answer as `var` for later requests.
    fn capture(&mut self, var: &str, text: &str, field: &str) {
        let v: Value = serde_json::from_str(text).unwrap();
        let value = v[field]
            .as_str()
            .unwrap_or_else(|| panic!("no {field} in {text}"))
            .to_owned();
        self.vars.insert(var.to_owned(), value);
    }
}

fn b64(s: &str) -> String {
    STANDARD.encode(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_requests_same_answers_as_real_etcd() {
    let raw_etcd = Etcd::single().await;
    let behind = Etcd::single().await;
    let proxy = Proxy::start(behind.endpoints(), |_| {}).await;
    let mut etcd = Side::new(raw_etcd.endpoint(0));
    let mut ours = Side::new(proxy.url.clone());

    let (a, b, c, lock1, pfx, pfx_end) = (
        b64("/lab/gw/a"),
        b64("/lab/gw/b"),
        b64("/lab/gw/c"),
        b64("/lab/gw/lock1"),
        b64("/lab/gw/"),
        b64("/lab/gw0"),
    );
    /// (method, path, body, capture (var, field))
    type Step<'a> = (&'a str, &'a str, String, Option<(&'a str, &'a str)>);
    let script: Vec<Step> = vec![
        (
            "POST",
            "/v3/lease/grant",
            r#"{"TTL":10}"#.into(),
            Some(("$L1", "ID")),
        ),
        // An explicit non-zero `ID` is refused by the proxy (a /v3 client could otherwise
        // probe for, or pre-take, the ids of the proxy's own leases): see
        // `explicit_lease_ids_are_refused`. `ID` 0 means "etcd chooses", as on etcd.
        (
            "POST",
            "/v3/lease/grant",
            r#"{"TTL":10,"ID":"0"}"#.into(),
            Some(("$L2", "ID")),
        ),
        (
            "POST",
            "/v3/lease/grant",
            r#"{"TTL":"10","ID":0}"#.into(),
            None,
        ),
        (
            "POST",
            "/v3/kv/put",
            format!(r#"{{"key":"{a}","value":"aGVsbG8=","lease":"$L1"}}"#),
            None,
        ),
        ("POST", "/v3/kv/range", format!(r#"{{"key":"{a}"}}"#), None),
        (
            "POST",
            "/v3/kv/range",
            format!(
                r#"{{"key":"{pfx}","range_end":"{pfx_end}","serializable":true,"keys_only":true}}"#
            ),
            None,
        ),
        (
            "POST",
            "/v3/kv/put",
            format!(r#"{{"key":"{b}","value":"eA=="}}"#),
            None,
        ),
        (
            "POST",
            "/v3/kv/put",
            format!(r#"{{"key":"{c}","value":"MQ==","prev_kv":true}}"#),
            None,
        ),
        (
            "POST",
            "/v3/kv/put",
            format!(r#"{{"key":"{c}","value":"Mg==","prev_kv":true}}"#),
            None,
        ),
        (
            "POST",
            "/v3/kv/range",
            r#"{"key":"AA==","range_end":"AA=="}"#.into(),
            None,
        ),
        (
            "POST",
            "/v3/kv/range",
            format!(r#"{{"key":"{pfx}","range_end":"{pfx_end}","limit":1}}"#),
            None,
        ),
        (
            "POST",
            "/v3/kv/range",
            format!(r#"{{"key":"{pfx}","range_end":"{pfx_end}","count_only":true}}"#),
            None,
        ),
        (
            "POST",
            "/v3/kv/range",
            format!(
                r#"{{"key":"{pfx}","range_end":"{pfx_end}","sort_order":"DESCEND","sort_target":"KEY"}}"#
            ),
            None,
        ),
        (
            "POST",
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"{lock1}","target":"CREATE","result":"EQUAL","create_revision":"0"}}],"success":[{{"request_put":{{"key":"{lock1}","value":"b3duZXItQQ==","lease":"$L1"}}}}],"failure":[{{"request_range":{{"key":"{lock1}"}}}}]}}"#
            ),
            None,
        ),
        (
            "POST",
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"{lock1}","target":"CREATE","result":"EQUAL","create_revision":"0"}}],"success":[{{"request_put":{{"key":"{lock1}","value":"b3duZXItQQ==","lease":"$L1"}}}}],"failure":[{{"request_range":{{"key":"{lock1}"}}}}]}}"#
            ),
            None,
        ),
        (
            "POST",
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"{}","target":"CREATE","result":"EQUAL","createRevision":0}}],"success":[{{"requestPut":{{"key":"{}","value":"eA=="}}}}]}}"#,
                b64("/lab/gw/x"),
                b64("/lab/gw/x")
            ),
            None,
        ),
        (
            "POST",
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"{b}","target":"VALUE","result":"EQUAL","value":"eA=="}}],"success":[{{"request_range":{{"key":"{b}"}}}},{{"request_delete_range":{{"key":"{c}","prev_kv":true}}}}]}}"#
            ),
            None,
        ),
        (
            "POST",
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"{b}","target":"VERSION","result":"GREATER","version":"5"}}],"failure":[{{"request_txn":{{"success":[{{"request_put":{{"key":"{c}","value":"Mw=="}}}}]}}}}]}}"#
            ),
            None,
        ),
        (
            "POST",
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"{pfx}","range_end":"{pfx_end}","target":"MOD","result":"LESS","mod_revision":"1"}}],"success":[{{"request_range":{{"key":"{pfx}","range_end":"{pfx_end}"}}}}],"failure":[{{"request_range":{{"key":"{pfx}","range_end":"{pfx_end}","count_only":true}}}}]}}"#
            ),
            None,
        ),
        (
            "POST",
            "/v3/kv/range",
            format!(r#"{{"key":"{b}","bogusField":1}}"#),
            None,
        ),
        (
            "POST",
            "/v3/kv/range",
            r#"{"key":"not base64!"}"#.into(),
            None,
        ),
        (
            "POST",
            "/v3/kv/put",
            r#"{"key":"YQ==","value":"***"}"#.into(),
            None,
        ),
        (
            "POST",
            "/v3/kv/txn",
            r#"{"compare":[{"key":"%%%","target":"CREATE","result":"EQUAL"}]}"#.into(),
            None,
        ),
        ("POST", "/v3/lease/grant", "not json".into(), None),
        ("POST", "/v3/kv/range", r#"{"key":"#.into(), None),
        // etcd's own checks, on the client's keys (the namespace must not hide an empty key).
        ("POST", "/v3/kv/range", r#"{"key":""}"#.into(), None),
        ("POST", "/v3/kv/range", "{}".into(), None),
        ("POST", "/v3/kv/range", String::new(), None),
        (
            "POST",
            "/v3/kv/txn",
            r#"{"compare":[{"target":"CREATE","result":"EQUAL"}]}"#.into(),
            None,
        ),
        ("POST", "/v3/kv/txn", r#"{"success":[{}]}"#.into(), None),
        (
            "POST",
            "/v3/kv/txn",
            r#"{"success":[{"request_put":null}]}"#.into(),
            None,
        ),
        // Go's base64 errors, offsets and all.
        ("POST", "/v3/kv/range", r#"{"key":"YQ="}"#.into(), None),
        ("POST", "/v3/kv/range", r#"{"key":"Y==="}"#.into(), None),
        ("POST", "/v3/kv/range", r#"{"key":"YQ==x"}"#.into(), None),
        ("POST", "/v3/kv/range", r#"{"key":"abcde"}"#.into(), None),
        (
            "POST",
            "/v3/kv/range",
            r#"{"key":"YWJjZA\n\n"}"#.into(),
            None,
        ),
        (
            "POST",
            "/v3/kv/range",
            r#"{"key":"AA==","sort_order":"\u0044ESCEND"}"#.into(),
            None,
        ),
        (
            "POST",
            "/v3/kv/put",
            format!(r#"{{"key":"{b}","value":"eA==","ignore_value":true}}"#),
            None,
        ),
        (
            "POST",
            "/v3/kv/put",
            format!(r#"{{"key":"{b}","value":"eA==","lease":"999"}}"#),
            None,
        ),
        // Both spellings (one at a time), numeric enums, null fields, unknown enum names, types.
        (
            "POST",
            "/v3/kv/range",
            format!(
                r#"{{"key":"{pfx}","rangeEnd":"{pfx_end}","keysOnly":true,"sort_order":2,"sortTarget":0}}"#
            ),
            None,
        ),
        (
            "POST",
            "/v3/kv/range",
            format!(r#"{{"key":"{b}","range_end":null,"limit":null}}"#),
            None,
        ),
        (
            "POST",
            "/v3/kv/range",
            format!(r#"{{"key":"{b}","sort_order":"descend"}}"#),
            None,
        ),
        ("POST", "/v3/kv/range", r#"{"key":5}"#.into(), None),
        (
            "POST",
            "/v3/kv/range",
            format!(r#"{{"key":"{b}","keys_only":"true"}}"#),
            None,
        ),
        ("POST", "/v3/kv/range", "[]".into(), None),
        ("POST", "/v3/lease/leases", "null".into(), None),
        // Leases etcd does not know.
        ("POST", "/v3/lease/keepalive", r#"{"ID":0}"#.into(), None),
        ("POST", "/v3/lease/timetolive", r#"{"ID":"0"}"#.into(), None),
        ("POST", "/v3/lease/revoke", r#"{"ID":0}"#.into(), None),
        // Paths and discovery.
        ("POST", "/v3/kv/nosuch", "{}".into(), None),
        ("GET", "/version", String::new(), None),
        ("POST", "/version", String::new(), None),
        ("GET", "/health", String::new(), None),
        (
            "POST",
            "/v3/lease/keepalive",
            r#"{"ID":"$L1"}"#.into(),
            None,
        ),
        (
            "POST",
            "/v3/lease/keepalive",
            r#"{"ID":"$L1"} {"ID":"$L2"}"#.into(),
            None,
        ),
        (
            "POST",
            "/v3/lease/keepalive",
            r#"{"ID":"999"}"#.into(),
            None,
        ),
        (
            "POST",
            "/v3/lease/timetolive",
            r#"{"ID":"$L1","keys":true}"#.into(),
            None,
        ),
        (
            "POST",
            "/v3/kv/lease/timetolive",
            r#"{"ID":"$L1"}"#.into(),
            None,
        ),
        (
            "POST",
            "/v3/lease/timetolive",
            r#"{"ID":"12345"}"#.into(),
            None,
        ),
        ("POST", "/v3/lease/leases", "{}".into(), None),
        ("POST", "/v3beta/lease/leases", "{}".into(), None),
        ("POST", "/v3/kv/lease/leases", "{}".into(), None),
        (
            "POST",
            "/v3/lock/lock",
            format!(r#"{{"name":"{}","lease":"$L1"}}"#, b64("lock-a")),
            Some(("$LOCK", "key")),
        ),
        (
            "POST",
            "/v3/kv/range",
            format!(
                r#"{{"key":"{}","range_end":"{}","keys_only":true}}"#,
                b64("lock-a/"),
                b64("lock-a0")
            ),
            None,
        ),
        ("POST", "/v3/lock/unlock", r#"{"key":"$LOCK"}"#.into(), None),
        ("POST", "/v3/lease/revoke", r#"{"ID":4661}"#.into(), None),
        (
            "POST",
            "/v3/lock/lock",
            format!(r#"{{"name":"{}","lease":"4661"}}"#, b64("lock-b")),
            None,
        ),
        ("POST", "/v3/lease/revoke", r#"{"ID":"$L1"}"#.into(), None),
        ("POST", "/v3/lease/revoke", r#"{"ID":"$L1"}"#.into(), None),
        (
            "POST",
            "/v3/lease/keepalive",
            r#"{"ID":"$L1"}"#.into(),
            None,
        ),
        (
            "POST",
            "/v3/lease/timetolive",
            r#"{"ID":"$L1"}"#.into(),
            None,
        ),
        ("POST", "/v3/kv/range", format!(r#"{{"key":"{a}"}}"#), None),
        (
            "POST",
            "/v3/kv/range",
            format!(r#"{{"key":"{lock1}"}}"#),
            None,
        ),
        (
            "POST",
            "/v3/kv/lease/revoke",
            r#"{"ID":"4660"}"#.into(),
            None,
        ),
        ("POST", "/v3/lease/leases", "{}".into(), None),
        (
            "POST",
            "/v3/kv/deleterange",
            format!(r#"{{"key":"{pfx}","range_end":"{pfx_end}","prev_kv":true}}"#),
            None,
        ),
        (
            "POST",
            "/v3/kv/deleterange",
            format!(r#"{{"key":"{b}"}}"#),
            None,
        ),
        (
            "POST",
            "/v3/kv/range",
            format!(r#"{{"key":"{pfx}","range_end":"{pfx_end}"}}"#),
            None,
        ),
        ("GET", "/v3/lease/leases", String::new(), None),
        ("POST", "/v3alpha/lease/leases", "{}".into(), None),
    ];
    assert!(script.len() >= 52, "{} steps", script.len());
    for (i, (method, path, body, capture)) in script.iter().enumerate() {
        let (s1, t1) = etcd.send(method, path, body).await;
        let (s2, t2) = ours.send(method, path, body).await;
        let (n1, n2) = (etcd.normalised(s1, &t1), ours.normalised(s2, &t2));
        assert_eq!(
            n1, n2,
            "step {i}: {method} {path} {body}\n etcd: {t1}\nproxy: {t2}"
        );
        if let Some((var, field)) = capture {
            etcd.capture(var, &t1, field);
            ours.capture(var, &t2, field);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespace_cannot_be_escaped() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    // Something outside the namespace: a native lease's ownership key, and a foreign key.
    let (_, grant) = acquire(&proxy, "secret-aisle", "native", 30).await;
    let mut client = etcd.client().await;
    client.put("/outside/key", "x", None).await.unwrap();
    client.put("\u{0}", "x", None).await.unwrap();
    client.put("\u{ff}", "x", None).await.unwrap();
    let before = snapshot(&etcd).await;

    let send_v3 = |path: &'static str, body: String| {
        let url = format!("{}{path}", proxy.url);
        async move {
            let resp = http().post(url).body(body).send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.text().await.unwrap())
        }
    };
    let everything = [
        ("AA==", "AA=="),
        ("AA==", ""),
        ("", "AA=="),
        ("Lw==", "MA=="),
        ("/w==", "AA=="),
        ("AA==", "//8="),
        ("Li4v", "AA=="),
    ];
    for (key, end) in everything {
        let body = format!(r#"{{"key":"{key}","range_end":"{end}"}}"#);
        let (status, text) = send_v3("/v3/kv/range", body.clone()).await;
        // As etcd: a request without a key is refused ("key is not provided").
        assert_eq!(status, if key.is_empty() { 400 } else { 200 }, "{text}");
        assert!(
            !text.contains("kvs"),
            "range {body} saw keys outside the namespace: {text}"
        );
        let (_, text) = send_v3("/v3/kv/deleterange", body.clone()).await;
        assert!(
            !text.contains("\"deleted\""),
            "deleterange {body} deleted outside: {text}"
        );
        let txn = format!(
            r#"{{"success":[{{"request_delete_range":{{"key":"{key}","range_end":"{end}"}}}},{{"request_range":{{"key":"{key}","range_end":"{end}"}}}}]}}"#
        );
        let (_, text) = send_v3("/v3/kv/txn", txn).await;
        assert!(
            !text.contains("kvs") && !text.contains("\"deleted\""),
            "txn {key}..{end}: {text}"
        );
    }
    // The native lease is invisible and untouchable from /v3.
    let native = str_field(&grant, "lease_id");
    let (status, text) = send_v3("/v3/lease/revoke", format!(r#"{{"ID":"{native}"}}"#)).await;
    assert_eq!(status, 404, "{text}");
    let (_, text) = send_v3("/v3/lease/leases", "{}".into()).await;
    assert!(!text.contains(&native), "{text}");
    let (_, text) = send_v3("/v3/lease/keepalive", format!(r#"{{"ID":"{native}"}}"#)).await;
    assert!(!text.contains("TTL"), "{text}");
    let (_, text) = send_v3(
        "/v3/lease/timetolive",
        format!(r#"{{"ID":"{native}","keys":true}}"#),
    )
    .await;
    assert!(text.contains(r#""TTL":"-1""#), "{text}");
    let (status, text) = send_v3(
        "/v3/lock/lock",
        format!(r#"{{"name":"eA==","lease":"{native}"}}"#),
    )
    .await;
    assert_eq!(status, 500, "{text}");
    assert!(text.contains("requested lease not found"), "{text}");
    assert_eq!(
        snapshot(&etcd).await,
        before,
        "a /v3 request changed something outside"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_blocks_the_next_and_tokens_rise() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let keys = proxy.keyring();
    let grant = |ttl: u64| {
        let url = format!("{}/v3/lease/grant", proxy.url);
        async move {
            let v: Value = http()
                .post(url)
                .body(format!(r#"{{"TTL":{ttl}}}"#))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["ID"].as_str().unwrap().to_owned()
        }
    };
    let lock = |lease: String| {
        let url = format!("{}/v3/lock/lock", proxy.url);
        async move {
            let resp = http()
                .post(url)
                .body(format!(
                    r#"{{"name":"{}","lease":"{lease}"}}"#,
                    b64("robot-arm")
                ))
                .send()
                .await
                .unwrap();
            let token = resp.headers()["fencing-token"].to_str().unwrap().to_owned();
            let v: Value = resp.json().await.unwrap();
            (v["key"].as_str().unwrap().to_owned(), token)
        }
    };
    // 1. Released by unlock.
    let (first_key, first_token) = lock(grant(30).await).await;
    let second = tokio::spawn(lock(grant(30).await));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!second.is_finished(), "the second locker did not wait");
    http()
        .post(format!("{}/v3/lock/unlock", proxy.url))
        .body(format!(r#"{{"key":"{first_key}"}}"#))
        .send()
        .await
        .unwrap();
    let (second_key, second_token) = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .unwrap()
        .unwrap();
    // Lock tokens live in the lock's own domain, never the /v1 resource of the same name.
    let domain = fencing::lock_resource(b"robot-arm");
    assert!(keys.verify("robot-arm", &first_token).is_err());
    let t1 = keys.verify(&domain, &first_token).unwrap();
    let t2 = keys.verify(&domain, &second_token).unwrap();
    assert!(t2 > t1, "{t2} after {t1}");
    // 2. Released by the holder's lease expiring (the second holder's lease: TTL 30 — revoke
    //    the key's lease through etcd directly to make it lapse now).
    let third = tokio::spawn(lock(grant(30).await));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!third.is_finished());
    let raw_key = STANDARD.decode(&second_key).unwrap();
    let lease_hex = String::from_utf8(raw_key).unwrap();
    let lease = i64::from_str_radix(lease_hex.rsplit('/').next().unwrap(), 16).unwrap();
    etcd.client().await.lease_revoke(lease).await.unwrap();
    let (_, third_token) = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .unwrap()
        .unwrap();
    assert!(keys.verify(&domain, &third_token).unwrap() > t2);
}

/// The answer to a `/v3` call: status, body, and the `Fencing-Token` header if any.
async fn v3_call(base: &str, path: &str, body: String) -> (u16, Value, Option<String>) {
    let resp = http()
        .post(format!("{base}{path}"))
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let token = resp
        .headers()
        .get("fencing-token")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        token,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_token_never_fences_a_v1_resource() {
    let etcd = Etcd::shared().await;
    let Storage {
        url: storage,
        log: received,
    } = Storage::start().await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("keys");
    fencing::Keyring::create_file(&key_file, &fencing::KeyId::parse("k1").unwrap()).unwrap();
    let gateway = start_gateway(&storage, &key_file).await;
    let proxy = Proxy::start_with_keys(etcd.endpoints(), key_file, |c| {
        c.etcd_prefix = lease_proxy_testkit::prefix("v3-lock");
        c.upstream = Some(gateway.clone());
    })
    .await;
    // A /v1 holder of aisle-1 writes through the proxy and the gateway.
    let (status, grant) = acquire(&proxy, "aisle-1", "robot-1", 60).await;
    assert_eq!(status, 201, "{grant}");
    let secret = str_field(&grant, "secret");
    let forward = |n: u32| {
        let (url, secret) = (proxy.url.clone(), secret.clone());
        async move {
            http()
                .put(format!("{url}/v1/leases/aisle-1/forward/shelf/{n}"))
                .header("lease-secret", secret)
                .body("1 box")
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(forward(1).await, 200);

    // Later, a /v3 client locks a lock named like the resource: a newer revision.
    let (_, lease, _) = v3_call(&proxy.url, "/v3/lease/grant", r#"{"TTL":60}"#.into()).await;
    let lease = lease["ID"].as_str().unwrap().to_owned();
    let resp = http()
        .post(format!("{}/v3/lock/lock", proxy.url))
        .body(format!(
            r#"{{"name":"{}","lease":"{lease}"}}"#,
            b64("aisle-1")
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let domain = fencing::lock_resource(b"aisle-1");
    let lock_token = resp.headers()["fencing-token"].to_str().unwrap().to_owned();
    let named = resp.headers().get("fencing-resource").cloned();

    // Its token is refused for the /v1 resource (403, another resource's token)…
    let direct = |resource: String| {
        let (url, token) = (gateway.clone(), lock_token.clone());
        async move {
            let resp = http()
                .put(format!("{url}/shelf/9"))
                .header("fencing-token", token)
                .header("fencing-resource", resource)
                .body("lock holder's write")
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.text().await.unwrap())
        }
    };
    let (status, text) = direct("aisle-1".into()).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("wrong-resource"), "{text}");
    // …so the /v1 holder goes on writing…
    assert_eq!(forward(2).await, 200);
    // …and the lock token fences its own domain, which the lock answer names.
    assert_eq!(named.unwrap(), domain.as_str());
    let (status, text) = direct(domain.clone()).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(forward(3).await, 200);
    let seen = received.all();
    assert_eq!(
        seen.iter().map(|w| w.resource()).collect::<Vec<_>>(),
        ["aisle-1", "aisle-1", domain.as_str(), "aisle-1"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v3_answers_within_the_deadline_while_a_member_is_stopped() {
    let etcd = Etcd::cluster(3).await;
    let deadline = Duration::from_secs(2);
    let proxy = Proxy::start(etcd.endpoints(), |c| c.etcd_timeout = deadline).await;
    let (_, lease, _) = v3_call(&proxy.url, "/v3/lease/grant", r#"{"TTL":60}"#.into()).await;
    let lease = lease["ID"].as_str().unwrap().to_owned();
    let (key, value) = (b64("k"), b64("v"));

    // The proxy pins the first endpoint first: stop that member.
    etcd.signal(0, "STOP");
    // First a write that goes straight to etcd (no lease check before it): it cannot be tried
    // twice, so it answers 503 at the deadline or succeeds; the member is unpinned either way.
    let calls: Vec<(&str, String)> = vec![
        (
            "/v3/kv/deleterange",
            format!(r#"{{"key":"{}"}}"#, b64("gone")),
        ),
        (
            "/v3/kv/put",
            format!(r#"{{"key":"{key}","value":"{value}","lease":"{lease}"}}"#),
        ),
        ("/v3/kv/range", format!(r#"{{"key":"{key}"}}"#)),
        (
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"{key}","target":"VERSION","result":"GREATER","version":"0"}}],"success":[{{"request_range":{{"key":"{key}"}}}}]}}"#
            ),
        ),
        ("/v3/lease/grant", r#"{"TTL":30}"#.into()),
        ("/v3/lease/keepalive", format!(r#"{{"ID":"{lease}"}}"#)),
        (
            "/v3/lease/timetolive",
            format!(r#"{{"ID":"{lease}","keys":true}}"#),
        ),
        ("/v3/lease/leases", "{}".into()),
        (
            "/v3/lock/lock",
            format!(r#"{{"name":"{}","lease":"{lease}"}}"#, b64("m")),
        ),
        (
            "/v3/lock/unlock",
            format!(r#"{{"key":"{}"}}"#, b64("m/none")),
        ),
    ];
    let mut succeeded = vec![false; calls.len()];
    let slack = Duration::from_millis(750);
    for round in 0..4 {
        for (i, (path, body)) in calls.iter().enumerate() {
            let started = Instant::now();
            let resp = http()
                .post(format!("{}{path}", proxy.url))
                .timeout(deadline * 3)
                .body(body.clone())
                .send()
                .await
                .unwrap_or_else(|e| panic!("round {round}: {path} had no answer: {e}"));
            let took = started.elapsed();
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            println!("round {round}: {path} → {status} in {took:?}");
            assert!(
                took <= deadline + slack,
                "round {round}: {path} took {took:?} (deadline {deadline:?}): {status} {text}"
            );
            assert!(
                status == 200 || status == 503,
                "round {round}: {path}: {status} {text}"
            );
            succeeded[i] |= status == 200;
        }
        if succeeded.iter().all(|s| *s) {
            break;
        }
    }
    for ((path, _), ok) in calls.iter().zip(&succeeded) {
        assert!(ok, "{path} never succeeded through another member");
    }
    // Discovery fails over too.
    let started = Instant::now();
    let health = http()
        .get(format!("{}/health", proxy.url))
        .send()
        .await
        .unwrap();
    assert!(started.elapsed() <= deadline + slack);
    assert_eq!(health.status(), 200);
    etcd.signal(0, "CONT");
}

#[test]
fn a_v3_namespace_over_the_proxys_own_keys_is_refused_at_start() {
    let bin = env!("CARGO_BIN_EXE_lease-proxy");
    for namespace in [
        "",
        "/",
        "/lease-proxy/",
        "/lease-proxy/holders/",
        "/lease-proxy/v3/",
    ] {
        let mut child = std::process::Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--v3-namespace", namespace])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A proxy that accepted the namespace would go on serving: give it a few seconds.
        let status = exit_within(&mut child, Duration::from_secs(5));
        if status.is_none() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(64),
            "{namespace:?} was accepted: {stderr}"
        );
        assert!(stderr.contains("v3-namespace"), "{stderr}");
    }
}

/// A `/v3` grant may not choose its lease id: with an explicit id a client could learn whether
/// the proxy's own (or spare) leases exist ("lease already exists"), and take ids ahead of
/// etcd's counter so that `/v1` acquires fail. Refused with code 3; nothing is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_lease_ids_are_refused() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let (_, grant) = acquire(&proxy, "aisle-1", "native", 30).await;
    let native = str_field(&grant, "lease_id");
    let mut client = etcd.client().await;
    // The acquire may have started a refill of spare leases in the background: count once it
    // has settled, so that only leases this test's calls would create could change the count.
    let mut before = client.leases().await.unwrap().leases().len();
    let settle = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = client.leases().await.unwrap().leases().len();
        if now == before || tokio::time::Instant::now() > settle {
            break;
        }
        before = now;
    }
    for body in [
        format!(r#"{{"TTL":10,"ID":"{native}"}}"#),
        r#"{"TTL":10,"ID":"4660"}"#.to_owned(),
        r#"{"TTL":10,"ID":4661}"#.to_owned(),
        r#"{"TTL":10,"ID":"-7"}"#.to_owned(),
    ] {
        let (status, answer, _) = v3_call(&proxy.url, "/v3/lease/grant", body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["code"], 3, "{body}: {answer}");
    }
    assert_eq!(client.leases().await.unwrap().leases().len(), before);
    // An id of etcd's choosing still works.
    let (status, answer, _) = v3_call(
        &proxy.url,
        "/v3/lease/grant",
        r#"{"TTL":10,"ID":"0"}"#.into(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
}
