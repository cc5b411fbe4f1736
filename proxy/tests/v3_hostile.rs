//! A hostile client against the etcd-compatible `/v3` API (DESIGN §7.6): thousands of request
//! variants for every endpoint — data after the JSON value, line breaks and spaces inside base64,
//! both spellings of a field, duplicate keys, unicode escapes in field names and values, signs,
//! spaces and leading zeros in ids, nested transactions, range ends at and past the namespace's
//! end, empty and `\0` keys, other leases' ids — and then etcd itself, read directly, must show
//! that nothing outside the namespace was created, changed or deleted, that the proxy's own
//! leases (a live `/v1` grant, a spare) were neither revoked nor renewed nor given keys, and no
//! answer carried a byte of what lies outside.
//!
//! The requests come from a seeded generator; the seed is printed, and `V3_HOSTILE_SEED=<seed>`
//! replays a run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use common::*;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

const REQUESTS: usize = 2400;
const CONCURRENCY: usize = 8;
/// The proxy's default `/v3` namespace and lease markers (`--etcd-prefix /lease-proxy/`).
const NS: &[u8] = b"/lease-proxy/v3/kv/";
const MARKERS: &[u8] = b"/lease-proxy/v3/leases/";
const HOLDER_KEY: &[u8] = b"/lease-proxy/holders/aisle-1";
/// Leases the generator grants with explicit ids, so it can revoke and renew them too.
const FUZZ_IDS: std::ops::Range<i64> = 5000..5040;

/// Keys planted outside the namespace, right next to it and far from it, that requests never
/// name: neither their keys nor their values may appear in any answer. (The keys requests do
/// name, [`planted`], may legitimately come back as keys inside the namespace.)
fn hidden() -> Vec<(Vec<u8>, Vec<u8>)> {
    [
        (b"/outside/hidden".as_slice(), b"HIDDEN-outside".as_slice()),
        (b"\0hidden", b"HIDDEN-nul"),
        (b"\xffhidden", b"HIDDEN-high"),
        (b"/lease-proxy/v3/kv0hidden", b"HIDDEN-ns-end"),
        (b"/lease-proxy/v3/kv.hidden", b"HIDDEN-ns-dot"),
        (b"/lease-proxy/v3/hidden", b"HIDDEN-v3"),
        (b"/lease-proxy/hidden", b"HIDDEN-prefix"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_vec(), v.to_vec()))
    .collect()
}

/// Keys planted outside the namespace that requests name (raw, as if the namespace did not
/// exist): their values may not appear in any answer.
fn planted() -> Vec<(Vec<u8>, Vec<u8>)> {
    [
        (b"/outside/secret".as_slice(), b"PLANTED-outside".as_slice()),
        (b"\0", b"PLANTED-nul"),
        (b"\xff\xfe", b"PLANTED-high"),
        (b"/lease-proxy/v3/kv", b"PLANTED-ns-no-slash"),
        (b"/lease-proxy/v3/kv0", b"PLANTED-ns-end"),
        (b"/lease-proxy/v3/kv.", b"PLANTED-ns-dot"),
        (b"/lease-proxy/v3/", b"PLANTED-v3"),
        (b"/lease-proxy/v3/kw", b"PLANTED-kw"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_vec(), v.to_vec()))
    .collect()
}

/// Every key outside the namespace (except `/v3` lease markers, which `/v3` grants create):
/// key → (create revision, mod revision, value, lease).
async fn outside(etcd: &Etcd) -> BTreeMap<Vec<u8>, (i64, i64, Vec<u8>, i64)> {
    snapshot(etcd)
        .await
        .kvs
        .into_iter()
        .filter(|kv| !kv.0.starts_with(NS) && !kv.0.starts_with(MARKERS))
        .map(|(k, c, m, v, l)| (k, (c, m, v, l)))
        .collect()
}

/// A lease's remaining TTL as etcd reports it (-1: gone).
async fn remaining(etcd: &Etcd, id: i64) -> i64 {
    etcd.client()
        .await
        .lease_time_to_live(id, None)
        .await
        .unwrap()
        .ttl()
}

fn jstr(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

fn prefix_end(key: &[u8]) -> Vec<u8> {
    let mut end = key.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The request generator.
struct Gen {
    rng: StdRng,
    /// Whether this request's encoding may be mangled; if not, only what it names is hostile
    /// (outside keys, range ends, other leases, nesting), so that it reaches etcd.
    wild: bool,
    native: i64,
    spare: i64,
    own: i64,
    outside: Vec<Vec<u8>>,
}

/// A JSON object under construction: (name as JSON text, value as JSON text).
#[derive(Default)]
struct Obj(Vec<(String, String)>);

impl Gen {
    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.rng.random_range(0..items.len())].clone()
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    /// A key a client might name: inside-looking, empty, `\0`, high bytes, outside paths.
    fn key(&mut self) -> Vec<u8> {
        match self.rng.random_range(0..12) {
            0..=3 => {
                let len = self.rng.random_range(1..8);
                (0..len)
                    .map(|_| self.pick(b"abcxyz019/-._\0\xff\x80"))
                    .collect()
            }
            4 => Vec::new(),
            5 => b"\0".to_vec(),
            6 | 7 => {
                let outside = self.outside.clone();
                self.pick(&outside)
            }
            8 => self.pick(&[
                b"../holders/aisle-1".to_vec(),
                b"../../".to_vec(),
                b"%2e%2e/holders".to_vec(),
            ]),
            9 => self.pick(&[b"\xff".to_vec(), b"\xff\xff\xff".to_vec()]),
            10 => HOLDER_KEY.to_vec(),
            _ => (0..self.rng.random_range(1..4))
                .map(|_| self.rng.random_range(0..=255u8))
                .filter(|b| *b != b'L')
                .collect(),
        }
    }

    /// A range end, or none.
    fn range_end(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        let mut after = key.to_vec();
        after.push(0);
        match self.rng.random_range(0..12) {
            0..=2 => None,
            3 => Some(Vec::new()),
            4 | 5 => Some(b"\0".to_vec()),
            6 => Some(b"\xff".to_vec()),
            7 => Some(vec![0xff; 6]),
            8 => Some(after),
            9 => Some(prefix_end(key)),
            10 => Some(self.pick(&[b"0".to_vec(), b"/".to_vec(), b"\0\0".to_vec()])),
            _ => {
                let outside = self.outside.clone();
                Some(self.pick(&outside))
            }
        }
    }

    /// `bytes` as a JSON string of base64 — canonical, or one of the spellings Go reads
    /// differently or not at all.
    fn b64(&mut self, bytes: &[u8]) -> String {
        let canon = STANDARD.encode(bytes);
        if !self.wild {
            return jstr(&canon);
        }
        let at = self.rng.random_range(0..=canon.len());
        let insert = |s: &str| format!("\"{}{s}{}\"", &canon[..at], &canon[at..]);
        match self.rng.random_range(0..16) {
            0..=6 => jstr(&canon),
            7 => insert(r"\n"),
            8 => insert(r"\r\n"),
            9 => insert(" "),
            10 => insert("\t"),
            11 => {
                // Non-zero bits in the last character before the padding.
                let mut chars: Vec<char> = canon.chars().collect();
                let pads = chars.iter().filter(|c| **c == '=').count();
                if pads > 0 && chars.len() > pads {
                    let i = chars.len() - pads - 1;
                    chars[i] = if chars[i] == 'B' { 'C' } else { 'B' };
                }
                jstr(&chars.into_iter().collect::<String>())
            }
            12 => jstr(canon.trim_end_matches('=')),
            13 => {
                // One character as a unicode escape (Go and the proxy both undo it).
                let escaped: String = canon
                    .chars()
                    .enumerate()
                    .map(|(i, c)| {
                        if i == at {
                            format!("\\u{:04x}", u32::from(c))
                        } else {
                            c.to_string()
                        }
                    })
                    .collect();
                format!("\"{escaped}\"")
            }
            14 => jstr(&canon.replace('+', "-").replace('/', "_")),
            _ => format!("\"{}\n{}\"", &canon[..at], &canon[at..]),
        }
    }

    /// `id` as JSON — a number or a string, or a spelling Go and Rust read differently.
    fn id(&mut self, id: i64) -> String {
        if !self.wild {
            return self.pick(&[id.to_string(), format!("\"{id}\"")]);
        }
        match self.rng.random_range(0..18) {
            0..=4 => id.to_string(),
            5..=7 => format!("\"{id}\""),
            8 => format!("\" {id}\""),
            9 => format!("\"{id} \""),
            10 => format!("\"+{id}\""),
            11 => format!("\"0{id}\""),
            12 => "\"null\"".into(),
            13 => format!("{id}.0"),
            14 => {
                let escaped: String = id
                    .to_string()
                    .chars()
                    .map(|c| format!("\\u{:04x}", u32::from(c)))
                    .collect();
                format!("\"{escaped}\"")
            }
            15 => format!("\"{id}\\n\""),
            16 => format!("{id}e0"),
            _ => format!("[{id}]"),
        }
    }

    /// A lease id to name: the proxy's own leases, `/v3` ones, nothing, or something near.
    fn lease(&mut self, allow_fuzz: bool) -> i64 {
        match self.rng.random_range(0..8) {
            0 | 1 => self.native,
            2 => self.spare,
            3 => self.own,
            4 => 0,
            5 => self.native + self.pick(&[-1, 1]),
            6 if allow_fuzz => self.rng.random_range(FUZZ_IDS),
            _ => self.rng.random_range(1..100_000),
        }
    }

    fn enumeration(&mut self, names: &[&str]) -> String {
        let name = self.pick(names);
        if !self.wild {
            return jstr(name);
        }
        match self.rng.random_range(0..10) {
            0..=5 => jstr(name),
            6 => jstr(&name.to_lowercase()),
            7 => self.rng.random_range(0..names.len() + 2).to_string(),
            8 => format!("\"\\u{:04x}{}\"", u32::from(name.as_bytes()[0]), &name[1..]),
            _ => "null".into(),
        }
    }

    fn bool(&mut self) -> String {
        if !self.wild {
            return self.pick(&["true", "false"]).into();
        }
        self.pick(&["true", "false", "null", "\"true\"", "1"])
            .into()
    }

    /// Adds a field under its proto name, its JSON name, both (with another value), twice, or
    /// with an escape in its name.
    fn field(&mut self, obj: &mut Obj, snake: &str, camel: &str, value: String, other: String) {
        let escaped_name = |name: &str| {
            let mut chars = name.chars();
            let first = chars.next().map(|c| format!("\\u{:04x}", u32::from(c)));
            format!("\"{}{}\"", first.unwrap_or_default(), chars.as_str())
        };
        let spelling = if self.wild {
            self.rng.random_range(0..12)
        } else {
            self.rng.random_range(0..8)
        };
        match spelling {
            0..=5 => obj.0.push((jstr(snake), value)),
            6 | 7 => obj.0.push((jstr(camel), value)),
            8 => {
                obj.0.push((jstr(snake), value));
                obj.0.push((jstr(camel), other));
            }
            9 => {
                obj.0.push((jstr(camel), value));
                obj.0.push((jstr(snake), other));
            }
            10 => {
                obj.0.push((jstr(snake), value));
                obj.0.push((jstr(snake), other));
            }
            _ => {
                obj.0.push((jstr(snake), value));
                obj.0.push((escaped_name(snake), other));
            }
        }
    }

    fn bytes_field(&mut self, obj: &mut Obj, snake: &str, camel: &str, bytes: &[u8]) {
        let value = self.b64(bytes);
        let hostile = {
            let outside = self.outside.clone();
            let target = self.pick(&outside);
            self.pick(&[STANDARD.encode(target), "AA==".into()])
        };
        self.field(obj, snake, camel, value, jstr(&hostile));
    }

    fn id_field(&mut self, obj: &mut Obj, name: &str, id: i64) {
        let value = self.id(id);
        let other = self.native.to_string();
        self.field(obj, name, name, value, other);
    }

    fn render(&mut self, obj: Obj) -> String {
        let ws = ["", " ", "\n", "\t", "  "];
        let members: Vec<String> = obj
            .0
            .into_iter()
            .map(|(k, v)| {
                let (a, b) = (self.pick(&ws), self.pick(&ws));
                format!("{a}{k}{b}:{a}{v}{b}")
            })
            .collect();
        format!("{{{}}}", members.join(","))
    }

    fn range_body(&mut self) -> Obj {
        let mut obj = Obj::default();
        let key = self.key();
        self.bytes_field(&mut obj, "key", "key", &key);
        if let Some(end) = self.range_end(&key) {
            self.bytes_field(&mut obj, "range_end", "rangeEnd", &end);
        }
        if self.chance(0.3) {
            let limit = self.rng.random_range(0..5);
            let v = self.id(limit);
            self.field(&mut obj, "limit", "limit", v, "0".into());
        }
        if self.chance(0.3) {
            let v = self.enumeration(&["NONE", "ASCEND", "DESCEND"]);
            self.field(&mut obj, "sort_order", "sortOrder", v, "\"ASCEND\"".into());
            let v = self.enumeration(&["KEY", "VERSION", "CREATE", "MOD", "VALUE"]);
            self.field(&mut obj, "sort_target", "sortTarget", v, "\"KEY\"".into());
        }
        for (snake, camel) in [
            ("serializable", "serializable"),
            ("keys_only", "keysOnly"),
            ("count_only", "countOnly"),
        ] {
            if self.chance(0.2) {
                let v = self.bool();
                self.field(&mut obj, snake, camel, v, "false".into());
            }
        }
        obj
    }

    fn put_body(&mut self) -> Obj {
        let mut obj = Obj::default();
        let key = self.key();
        self.bytes_field(&mut obj, "key", "key", &key);
        let value: Vec<u8> = (0..self.rng.random_range(0..6))
            .map(|_| self.rng.random_range(0..=255u8))
            .collect();
        self.bytes_field(&mut obj, "value", "value", &value);
        if self.chance(0.6) {
            let lease = self.lease(true);
            self.id_field(&mut obj, "lease", lease);
        }
        for (snake, camel) in [
            ("prev_kv", "prevKv"),
            ("ignore_value", "ignoreValue"),
            ("ignore_lease", "ignoreLease"),
        ] {
            if self.chance(0.15) {
                let v = self.bool();
                self.field(&mut obj, snake, camel, v, "true".into());
            }
        }
        obj
    }

    fn delete_body(&mut self) -> Obj {
        let mut obj = Obj::default();
        let key = self.key();
        self.bytes_field(&mut obj, "key", "key", &key);
        if let Some(end) = self.range_end(&key) {
            self.bytes_field(&mut obj, "range_end", "rangeEnd", &end);
        }
        if self.chance(0.3) {
            let v = self.bool();
            self.field(&mut obj, "prev_kv", "prevKv", v, "true".into());
        }
        obj
    }

    fn compare(&mut self) -> String {
        let mut obj = Obj::default();
        let v = self.enumeration(&["EQUAL", "GREATER", "LESS", "NOT_EQUAL"]);
        obj.0.push((jstr("result"), v));
        let v = self.enumeration(&["VERSION", "CREATE", "MOD", "VALUE", "LEASE"]);
        obj.0.push((jstr("target"), v));
        let key = self.key();
        self.bytes_field(&mut obj, "key", "key", &key);
        for _ in 0..self.rng.random_range(0..3) {
            match self.rng.random_range(0..5) {
                0 => {
                    let v = self.id(0);
                    obj.0.push((jstr("version"), v));
                }
                1 => {
                    let rev = self.rng.random_range(0..3);
                    let v = self.id(rev);
                    self.field(&mut obj, "create_revision", "createRevision", v, "0".into());
                }
                2 => {
                    let v = self.id(1);
                    self.field(&mut obj, "mod_revision", "modRevision", v, "0".into());
                }
                3 => {
                    let v = self.key();
                    self.bytes_field(&mut obj, "value", "value", &v);
                }
                _ => {
                    let lease = self.lease(true);
                    self.id_field(&mut obj, "lease", lease);
                }
            }
        }
        if let Some(end) = self.range_end(&key) {
            self.bytes_field(&mut obj, "range_end", "rangeEnd", &end);
        }
        self.render(obj)
    }

    fn op(&mut self, depth: usize) -> String {
        let kinds = if self.wild {
            self.rng.random_range(0..12)
        } else {
            self.rng.random_range(0..9)
        };
        let mut obj = Obj::default();
        let add = |gen: &mut Self, kind: usize, obj: &mut Obj| match kind {
            0 => {
                let b = gen.range_body();
                let v = gen.render(b);
                gen.field(obj, "request_range", "requestRange", v, "{}".into());
            }
            1 => {
                let b = gen.put_body();
                let v = gen.render(b);
                gen.field(obj, "request_put", "requestPut", v, "{}".into());
            }
            2 => {
                let b = gen.delete_body();
                let v = gen.render(b);
                gen.field(
                    obj,
                    "request_delete_range",
                    "requestDeleteRange",
                    v,
                    "{}".into(),
                );
            }
            _ => {
                let v = if depth < 6 {
                    gen.txn(depth + 1)
                } else {
                    "{}".into()
                };
                gen.field(obj, "request_txn", "requestTxn", v, "null".into());
            }
        };
        match kinds {
            0..=8 => add(self, kinds % 4, &mut obj),
            9 => {
                add(self, 0, &mut obj);
                add(self, 1, &mut obj);
            }
            10 => return "null".into(),
            _ => {}
        }
        self.render(obj)
    }

    fn txn(&mut self, depth: usize) -> String {
        let mut obj = Obj::default();
        let list = |gen: &mut Self, f: &mut dyn FnMut(&mut Self) -> String| {
            let n = gen.rng.random_range(0..4);
            format!("[{}]", (0..n).map(|_| f(gen)).collect::<Vec<_>>().join(","))
        };
        let compares = list(self, &mut |g| g.compare());
        obj.0.push((jstr("compare"), compares));
        let success = list(self, &mut |g| g.op(depth));
        obj.0.push((jstr("success"), success));
        let failure = list(self, &mut |g| g.op(depth));
        obj.0.push((jstr("failure"), failure));
        self.render(obj)
    }

    fn lock_name(&mut self) -> Vec<u8> {
        match self.rng.random_range(0..10) {
            0 => Vec::new(),
            1 => vec![b'L'; 97],
            2 => b"aisle-1".to_vec(),
            _ => {
                let mut name = b"L-".to_vec();
                let letter = self.pick(b"abcdefgh\0\xff");
                name.push(letter);
                name
            }
        }
    }

    /// Data after the JSON value, sometimes.
    fn trailing(&mut self) -> String {
        if !self.wild || !self.chance(0.3) {
            return String::new();
        }
        let holder = STANDARD.encode(HOLDER_KEY);
        self.pick(&[
            " x".to_string(),
            "{}".into(),
            format!(" {{\"key\":\"{holder}\"}}"),
            "\n]".into(),
            " null".into(),
            format!("{{\"ID\":{}}}", self.native),
        ])
    }

    /// One request: (path, body).
    fn request(&mut self) -> (String, String) {
        self.wild = self.chance(0.5);
        let endpoint = self.rng.random_range(0..16);
        let (path, body) = match endpoint {
            0 | 1 => {
                let b = self.range_body();
                ("kv/range", self.render(b))
            }
            2 | 3 => {
                let b = self.put_body();
                ("kv/put", self.render(b))
            }
            4 => {
                let b = self.delete_body();
                ("kv/deleterange", self.render(b))
            }
            5 | 6 => ("kv/txn", self.txn(0)),
            7 => {
                let mut obj = Obj::default();
                let ttl = self.pick(&[30, 60, 9_999_999_999]);
                let ttl = self.id(ttl);
                obj.0.push((jstr("TTL"), ttl));
                if self.chance(0.7) {
                    let fuzz = self.rng.random_range(FUZZ_IDS);
                    let id = self.pick(&[fuzz, self.native, self.spare, self.own, 0]);
                    self.id_field(&mut obj, "ID", id);
                }
                ("lease/grant", self.render(obj))
            }
            8 => {
                let mut obj = Obj::default();
                let id = self.lease(true);
                let id = if id == self.own { self.native } else { id };
                self.id_field(&mut obj, "ID", id);
                let path = self.pick(&["lease/revoke", "kv/lease/revoke"]);
                (path, self.render(obj))
            }
            9 => {
                let mut obj = Obj::default();
                let id = self.lease(true);
                self.id_field(&mut obj, "ID", id);
                if self.chance(0.7) {
                    obj.0.push((jstr("keys"), "true".into()));
                }
                let path = self.pick(&["lease/timetolive", "kv/lease/timetolive"]);
                (path, self.render(obj))
            }
            10 => {
                let path = self.pick(&["lease/leases", "kv/lease/leases"]);
                (path, "{}".to_string())
            }
            11 | 12 => {
                let n = if self.chance(0.05) {
                    70
                } else {
                    self.rng.random_range(1..5)
                };
                let objects: Vec<String> = (0..n)
                    .map(|_| {
                        let mut obj = Obj::default();
                        let id = self.lease(true);
                        self.id_field(&mut obj, "ID", id);
                        self.render(obj)
                    })
                    .collect();
                let sep = self.pick(&["", " ", "\n"]);
                ("lease/keepalive", objects.join(sep))
            }
            13 | 14 => {
                let mut obj = Obj::default();
                let name = self.lock_name();
                self.bytes_field(&mut obj, "name", "name", &name);
                // Only the own /v3 lease may lock (two /v3 leases on one name would wait).
                let lease = match self.lease(false) {
                    id if id == self.native || id == self.spare || id == 0 => id,
                    _ => self.own,
                };
                self.id_field(&mut obj, "lease", lease);
                ("lock/lock", self.render(obj))
            }
            _ => {
                let mut obj = Obj::default();
                let key = if self.chance(0.5) {
                    let mut k = b"L-a/".to_vec();
                    k.extend_from_slice(format!("{:x}", self.own).as_bytes());
                    k
                } else {
                    self.key()
                };
                self.bytes_field(&mut obj, "key", "key", &key);
                ("lock/unlock", self.render(obj))
            }
        };
        let version = if self.chance(0.1) { "v3beta" } else { "v3" };
        let trailing = self.trailing();
        (format!("/{version}/{path}"), format!("{body}{trailing}"))
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_client_cannot_reach_outside_the_namespace() {
    let seed: u64 = std::env::var("V3_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("v3_hostile seed: {seed} (replay with V3_HOSTILE_SEED={seed})");

    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let mut client = etcd.client().await;
    for (key, value) in planted().into_iter().chain(hidden()) {
        client.put(key, value, None).await.unwrap();
    }
    // A live /v1 grant, and a spare lease (a refused acquire's, kept by the proxy for reuse).
    let (status, grant) = acquire(&proxy, "aisle-1", "robot-1", 60).await;
    assert_eq!(status, 201, "{grant}");
    let native = lease_id(&grant);
    let leases_before = snapshot(&etcd).await.leases;
    let (status, refused) = acquire(&proxy, "aisle-1", "robot-2", 60).await;
    assert_eq!(status, 409, "{refused}");
    let spares: Vec<i64> = snapshot(&etcd)
        .await
        .leases
        .into_iter()
        .filter(|l| !leases_before.contains(l))
        .collect();
    assert_eq!(
        spares.len(),
        1,
        "the refused acquire's lease is kept as a spare"
    );
    let spare = spares[0];
    // The client's own /v3 lease.
    let own: serde_json::Value = http()
        .post(format!("{}/v3/lease/grant", proxy.url))
        .body(r#"{"TTL":600}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let own: i64 = own["ID"].as_str().unwrap().parse().unwrap();

    let before = outside(&etcd).await;
    let holder_value = before[HOLDER_KEY].2.clone();
    let ttl_before = [
        (native, remaining(&etcd, native).await),
        (spare, remaining(&etcd, spare).await),
    ];
    let started = Instant::now();

    // Everything outside must stay invisible: keys and values, raw and in base64.
    let mut needles: Vec<Vec<u8>> = Vec::new();
    for (key, _) in hidden() {
        needles.push(STANDARD.encode(&key).into_bytes());
        needles.push(key);
    }
    for (_, value) in planted()
        .into_iter()
        .chain(hidden())
        .chain([(HOLDER_KEY.to_vec(), holder_value.clone())])
    {
        needles.push(STANDARD.encode(&value).into_bytes());
        needles.push(value);
    }
    needles.push(b"secret_hash".to_vec());

    let mut gen = Gen {
        rng: StdRng::seed_from_u64(seed),
        wild: false,
        native,
        spare,
        own,
        outside: planted().into_iter().map(|(k, _)| k).collect(),
    };
    let requests: Vec<(String, String)> = (0..REQUESTS).map(|_| gen.request()).collect();
    let client = http();
    let answers: Vec<(String, String, u16, String)> = futures::stream::iter(requests)
        .map(|(path, body)| {
            let req = client
                .post(format!("{}{path}", proxy.url))
                .timeout(Duration::from_secs(10))
                .body(body.clone());
            async move {
                let resp = req
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{path} {body}: {e}"));
                let status = resp.status().as_u16();
                (path, body, status, resp.text().await.unwrap())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;

    let mut by_status: BTreeMap<(String, u16), usize> = BTreeMap::new();
    for (path, body, status, text) in &answers {
        *by_status.entry((path.clone(), *status)).or_default() += 1;
        let context = format!("{path} {body:?} → {status} {text}");
        assert!(
            matches!(status, 200 | 400 | 404 | 500),
            "unexpected status: {context}"
        );
        if *status == 500 {
            assert!(
                text.contains("requested lease not found") || text.contains("key is not provided"),
                "{context}"
            );
        }
        for needle in &needles {
            assert!(
                !contains(text.as_bytes(), needle),
                "an answer carried {:?} from outside the namespace: {context}",
                String::from_utf8_lossy(needle)
            );
        }
    }
    println!(
        "{} requests in {:?}; by endpoint and status: {by_status:?}",
        answers.len(),
        started.elapsed()
    );
    let refused = answers.iter().filter(|a| a.2 == 400).count();
    let served = answers.iter().filter(|a| a.2 == 200).count();
    assert!(
        refused > 200 && served > 200,
        "{refused} refused, {served} served"
    );

    // Nothing outside the namespace was created, changed or deleted.
    let after = outside(&etcd).await;
    for (key, state) in &before {
        assert_eq!(
            after.get(key),
            Some(state),
            "{:?} changed or vanished",
            String::from_utf8_lossy(key)
        );
    }
    for key in after.keys() {
        assert!(
            before.contains_key(key),
            "{:?} was created outside the namespace",
            String::from_utf8_lossy(key)
        );
    }
    // Lease markers exist only for leases granted through /v3, each attached to its own lease.
    for (key, _, _, _, lease) in snapshot(&etcd).await.kvs {
        if let Some(id) = key.strip_prefix(MARKERS) {
            let id: i64 = String::from_utf8(id.to_vec()).unwrap().parse().unwrap();
            assert_eq!(id, lease, "marker {key:?}");
            assert!(
                id != native && id != spare,
                "a proxy lease was marked as /v3's"
            );
        }
        // No key anywhere was attached to the proxy's own leases, beyond the holder's record.
        if lease == native || lease == spare {
            assert_eq!(key, HOLDER_KEY, "{key:?} attached to a proxy lease");
        }
    }
    // The proxy's leases were neither revoked nor renewed: their TTL only ran down.
    let elapsed = started.elapsed().as_secs() as i64;
    for (id, ttl) in ttl_before {
        let now = remaining(&etcd, id).await;
        assert!(now > 0, "lease {id} was revoked");
        assert!(
            now <= ttl - elapsed + 1,
            "lease {id} was renewed: {ttl} s left before, {now} s after {elapsed} s"
        );
    }
    // And the /v1 holder still holds, with its token.
    let (status, held) = send(http().get(format!("{}/v1/leases/aisle-1", proxy.url))).await;
    assert_eq!(status, 200, "{held}");
    assert_eq!(token(&held), token(&grant));
}
