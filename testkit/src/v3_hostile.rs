//! A seeded generator of hostile requests for the etcd-compatible `/v3` API (docs/DESIGN.md §7.6),
//! and the sentinels it aims at.
//!
//! [`Gen`] draws requests for every `/v3` endpoint: data after the JSON value, line breaks and
//! spaces inside base64, both spellings of a field, duplicate keys, unicode escapes in field
//! names and values, signs, spaces and leading zeros in ids, nested transactions, range ends at
//! and past the namespace's end, empty and `\0` keys, other leases' ids. Half of the requests
//! are *wild* (their encoding is mangled too); the others are well-formed, so that what they
//! name — keys outside the namespace, the proxy's own leases — reaches etcd.
//!
//! The sentinels are keys a deployment plants outside the `/v3` namespace of the default
//! `--etcd-prefix /lease-proxy/`: [`planted`] keys the requests name as if the namespace did
//! not exist, [`hidden`] keys they never name. [`needles`] are the byte strings no answer may
//! ever carry.
//!
//! Used by the proxy's `v3_hostile` test (thousands of requests, then etcd read directly) and by
//! the fault campaign's background traffic.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The proxy's default `/v3` namespace (`--etcd-prefix /lease-proxy/`).
pub const NAMESPACE: &[u8] = b"/lease-proxy/v3/kv/";
/// Where the proxy marks the leases granted through `/v3` (default prefix).
pub const MARKERS: &[u8] = b"/lease-proxy/v3/leases/";
/// The `/v1` holder key the generator names unless told another ([`Gen::set_holder_key`]).
pub const HOLDER_KEY: &[u8] = b"/lease-proxy/holders/aisle-1";
/// Lease ids the generator asks `lease/grant` for explicitly and then revokes, renews and names
/// (the proxy refuses explicit ids, so none of them should ever exist).
pub const FUZZ_IDS: std::ops::Range<i64> = 5000..5040;

fn pairs(list: &[(&[u8], &[u8])]) -> Vec<(Vec<u8>, Vec<u8>)> {
    list.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
}

/// Keys (with their values) to plant outside the namespace, right next to it and far from it,
/// that requests never name: neither their keys nor their values may appear in any answer. (The
/// keys requests do name, [`planted`], may legitimately come back as keys inside the namespace.)
pub fn hidden() -> Vec<(Vec<u8>, Vec<u8>)> {
    pairs(&[
        (b"/outside/hidden", b"HIDDEN-outside"),
        (b"\0hidden", b"HIDDEN-nul"),
        (b"\xffhidden", b"HIDDEN-high"),
        (b"/lease-proxy/v3/kv0hidden", b"HIDDEN-ns-end"),
        (b"/lease-proxy/v3/kv.hidden", b"HIDDEN-ns-dot"),
        (b"/lease-proxy/v3/hidden", b"HIDDEN-v3"),
        (b"/lease-proxy/hidden", b"HIDDEN-prefix"),
    ])
}

/// Keys (with their values) to plant outside the namespace that requests name (raw, as if the
/// namespace did not exist): their values may not appear in any answer.
pub fn planted() -> Vec<(Vec<u8>, Vec<u8>)> {
    pairs(&[
        (b"/outside/secret", b"PLANTED-outside"),
        (b"\0", b"PLANTED-nul"),
        (b"\xff\xfe", b"PLANTED-high"),
        (b"/lease-proxy/v3/kv", b"PLANTED-ns-no-slash"),
        (b"/lease-proxy/v3/kv0", b"PLANTED-ns-end"),
        (b"/lease-proxy/v3/kv.", b"PLANTED-ns-dot"),
        (b"/lease-proxy/v3/", b"PLANTED-v3"),
        (b"/lease-proxy/v3/kw", b"PLANTED-kw"),
    ])
}

/// Every sentinel, [`planted`] then [`hidden`].
pub fn sentinels() -> Vec<(Vec<u8>, Vec<u8>)> {
    planted().into_iter().chain(hidden()).collect()
}

/// `bytes` as it could leak: raw, and in base64 (how `/v3` answers carry keys and values).
pub fn needle_pair(bytes: &[u8]) -> [Vec<u8>; 2] {
    [STANDARD.encode(bytes).into_bytes(), bytes.to_vec()]
}

/// What no answer may carry: every [`hidden`] key, every [`planted`] and [`hidden`] value, raw
/// and in base64, and `secret_hash` (the field of a `/v1` holder record). Values known only at
/// run time — a holder record's — are added with [`needle_pair`].
pub fn needles() -> Vec<Vec<u8>> {
    let mut needles: Vec<Vec<u8>> = Vec::new();
    for (key, _) in hidden() {
        needles.extend(needle_pair(&key));
    }
    for (_, value) in sentinels() {
        needles.extend(needle_pair(&value));
    }
    needles.push(b"secret_hash".to_vec());
    needles
}

/// Whether `haystack` contains `needle` (an empty needle is never found).
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// The first of `needles` that `haystack` contains.
pub fn find_needle<'a>(haystack: &[u8], needles: &'a [Vec<u8>]) -> Option<&'a [u8]> {
    needles
        .iter()
        .find(|n| contains(haystack, n))
        .map(Vec::as_slice)
}

fn jstr(s: &str) -> String {
    // A JSON string: the same text `serde_json::to_string` gives, without its `Result`.
    serde_json::Value::String(s.to_owned()).to_string()
}

/// The end of the range of every key starting with `key` (etcd's prefix end; `[0]` for a key
/// of `0xff` bytes only, meaning "to the end of the keyspace").
pub fn prefix_end(key: &[u8]) -> Vec<u8> {
    let mut end = key.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The leases the generator names besides its own inventions: the ones a hostile client must
/// not be able to touch, and the one it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Leases {
    /// A live `/v1` grant's lease (a holder's): never revocable, renewable or usable via `/v3`.
    pub native: i64,
    /// Another lease of the proxy's own (a spare, a wait queue's): equally off limits.
    pub spare: i64,
    /// The client's own `/v3` lease: the one lease it may lock with.
    pub own: i64,
}

/// One generated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The path, `/v3/…` or `/v3beta/…`.
    pub path: String,
    /// The body, sent as is (often not valid JSON on purpose).
    pub body: String,
    /// Every lease id the body names in an id field, in order (the value meant, before any
    /// mangled spelling; ids in duplicate fields or trailing data are not included).
    pub leases: Vec<i64>,
}

/// The request generator: a seeded stream of hostile `/v3` requests.
pub struct Gen {
    rng: StdRng,
    /// Whether this request's encoding may be mangled; if not, only what it names is hostile
    /// (outside keys, range ends, other leases, nesting), so that it reaches etcd.
    wild: bool,
    native: i64,
    spare: i64,
    own: i64,
    outside: Vec<Vec<u8>>,
    holder_key: Vec<u8>,
    /// The lease ids the current request names.
    named: Vec<i64>,
}

/// A JSON object under construction: (name as JSON text, value as JSON text).
#[derive(Default)]
struct Obj(Vec<(String, String)>);

impl std::fmt::Debug for Gen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gen")
            .field("leases", &self.leases())
            .field("holder_key", &String::from_utf8_lossy(&self.holder_key))
            .finish_non_exhaustive()
    }
}

impl Gen {
    /// A generator drawing from `seed`, naming `leases`, the [`planted`] keys and [`HOLDER_KEY`].
    pub fn new(seed: u64, leases: Leases) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            wild: false,
            native: leases.native,
            spare: leases.spare,
            own: leases.own,
            outside: planted().into_iter().map(|(k, _)| k).collect(),
            holder_key: HOLDER_KEY.to_vec(),
            named: Vec::new(),
        }
    }

    /// The leases named from now on (they change as grants come and go).
    pub fn set_leases(&mut self, leases: Leases) {
        self.native = leases.native;
        self.spare = leases.spare;
        self.own = leases.own;
    }

    /// The leases currently named.
    pub fn leases(&self) -> Leases {
        Leases {
            native: self.native,
            spare: self.spare,
            own: self.own,
        }
    }

    /// The `/v1` holder key named from now on, raw and (in trailing data) in base64.
    pub fn set_holder_key(&mut self, key: &[u8]) {
        self.holder_key = key.to_vec();
    }

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
            10 => self.holder_key.clone(),
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
        self.named.push(id);
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
        let holder = STANDARD.encode(&self.holder_key);
        self.pick(&[
            " x".to_string(),
            "{}".into(),
            format!(" {{\"key\":\"{holder}\"}}"),
            "\n]".into(),
            " null".into(),
            format!("{{\"ID\":{}}}", self.native),
        ])
    }

    /// The next request. The same seed, leases and holder key give the same sequence.
    pub fn request(&mut self) -> Request {
        self.named.clear();
        let (path, body) = self.draw();
        Request {
            path,
            body,
            leases: std::mem::take(&mut self.named),
        }
    }

    /// One request: (path, body).
    fn draw(&mut self) -> (String, String) {
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
