//! The typed `/v3` requests, decoded from JSON as etcd's gateway (grpc-gateway 1.9 with the
//! `jsonpb` of golang/protobuf 1.3, as in Debian's etcd 3.4.23) decodes them — or refused.
//!
//! What etcd accepts, and so what is accepted here:
//! - each field under its proto name (`range_end`) or its JSON name (`rangeEnd`); unknown
//!   fields are ignored; `null` is the same as an absent field; a `null` body is an empty one;
//! - 64-bit integers as a JSON number or a JSON string; booleans as `true`/`false`; enums by
//!   name (exactly, no escapes) or by number;
//! - bytes as standard base64 with padding, in a JSON string.
//!
//! What etcd would read but the proxy refuses (InvalidArgument, HTTP 400, `lease-proxy: …`),
//! because the proxy cannot be certain to read it as etcd does: both spellings of one field
//! (etcd silently takes the JSON name), two members of one `oneof` (etcd takes the last in
//! Go's map order, so at random), a `null` list element (which makes etcd's gateway fail without
//! an answer), base64 with line breaks or non-zero padding bits (which Go skips or
//! ignores), integers in a string with spaces around them or the string `"null"` (which Go
//! reads as a number and as 0), and enum numbers that name no value (which etcd passes on).
//! Everything Go refuses is refused with Go's message where it matters to clients (base64 and
//! syntax errors), else with a message of the same kind.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use super::gobase64::go_base64;
use super::json::Value;
use super::status::Status;

/// A proto enum: its full name (for errors) and its value names, numbered from 0.
pub(crate) struct EnumType {
    full_name: &'static str,
    names: &'static [&'static str],
}

impl EnumType {
    /// The index of the value numbered `n`, if `n` names one.
    pub(crate) fn index(&self, n: impl Into<i64>) -> Option<usize> {
        usize::try_from(n.into())
            .ok()
            .filter(|i| *i < self.names.len())
    }

    /// The enum's full name, as Go's messages give it.
    pub(crate) fn full_name(&self) -> &'static str {
        self.full_name
    }
}

/// `RangeRequest.SortOrder`.
pub(crate) const SORT_ORDER: EnumType = EnumType {
    full_name: "etcdserverpb.RangeRequest_SortOrder",
    names: &["NONE", "ASCEND", "DESCEND"],
};
/// `RangeRequest.SortTarget`.
pub(crate) const SORT_TARGET: EnumType = EnumType {
    full_name: "etcdserverpb.RangeRequest_SortTarget",
    names: &["KEY", "VERSION", "CREATE", "MOD", "VALUE"],
};
/// `Compare.CompareResult`.
pub(crate) const COMPARE_RESULT: EnumType = EnumType {
    full_name: "etcdserverpb.Compare_CompareResult",
    names: &["EQUAL", "GREATER", "LESS", "NOT_EQUAL"],
};
/// `Compare.CompareTarget`.
pub(crate) const COMPARE_TARGET: EnumType = EnumType {
    full_name: "etcdserverpb.Compare_CompareTarget",
    names: &["VERSION", "CREATE", "MOD", "VALUE", "LEASE"],
};

/// A decimal `int64` exactly as both Go and Rust read it: an optional `-`, then `0` or digits
/// without a leading zero; no `+`, no spaces, no exponent.
fn canonical_int64(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

/// One JSON object read as a proto message.
#[derive(Clone, Copy)]
pub(crate) struct Message<'a> {
    members: &'a [(String, Value)],
}

fn type_error(v: &Value, go_type: &str) -> Status {
    Status::invalid(format!(
        "json: cannot unmarshal {} into Go value of type {go_type}",
        v.kind()
    ))
}

/// An element of a repeated message field: an object. etcd's gateway (jsonpb) fails on a
/// `null` element without answering at all, so it is refused.
fn element(v: &Value) -> Result<Message<'_>, Status> {
    if *v == Value::Null {
        return Err(Status::refused(
            "null in a list of messages (etcd's gateway fails on it)",
        ));
    }
    Message::of(v)
}

impl<'a> Message<'a> {
    /// The message in `v`: an object, or `null` for an empty message.
    pub(crate) fn of(v: &'a Value) -> Result<Self, Status> {
        match v {
            Value::Object(members) => Ok(Self { members }),
            Value::Null => Ok(Self { members: &[] }),
            other => Err(type_error(other, "map[string]json.RawMessage")),
        }
    }

    fn member(&self, name: &str) -> Option<&'a Value> {
        self.members.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// The field with proto name `proto` and JSON name `json`: `None` if absent or `null`.
    pub(crate) fn field(&self, proto: &str, json: &str) -> Result<Option<&'a Value>, Status> {
        let by_proto = self.member(proto);
        let by_json = if json == proto {
            None
        } else {
            self.member(json)
        };
        match (by_proto, by_json) {
            (Some(_), Some(_)) => Err(Status::refused(format!(
                "both {proto:?} and {json:?} are given (etcd would silently use {json:?})"
            ))),
            (Some(v), None) | (None, Some(v)) => Ok((*v != Value::Null).then_some(v)),
            (None, None) => Ok(None),
        }
    }

    /// A `bytes` field: standard base64 with padding, canonical.
    pub(crate) fn bytes(&self, proto: &str, json: &str) -> Result<Vec<u8>, Status> {
        let Some(v) = self.field(proto, json)? else {
            return Ok(Vec::new());
        };
        let Value::String(s) = v else {
            return Err(type_error(v, "[]uint8"));
        };
        let decoded = go_base64(s.text.as_bytes())
            .map_err(|at| Status::invalid(format!("illegal base64 data at input byte {at}")))?;
        if s.text.contains(['\n', '\r']) {
            return Err(Status::refused(format!(
                "line breaks inside the base64 of {proto:?} (etcd would skip them)"
            )));
        }
        if STANDARD.encode(&decoded) != s.text {
            return Err(Status::refused(format!(
                "non-canonical base64 in {proto:?}: the unused bits of its last character must \
                 be zero (etcd would ignore them)"
            )));
        }
        Ok(decoded)
    }

    /// An `int64` field: a JSON number or string holding a canonical decimal integer.
    pub(crate) fn int64(&self, proto: &str, json: &str) -> Result<i64, Status> {
        let Some(v) = self.field(proto, json)? else {
            return Ok(0);
        };
        let parsed = match v {
            Value::Number(n) => canonical_int64(n),
            // Go strips the quotes and parses what is between them, spaces and all.
            Value::String(s) => canonical_int64(&s.raw),
            _ => None,
        };
        parsed.ok_or_else(|| {
            Status::refused(format!(
                "{proto:?} must be a decimal int64 (digits with an optional leading '-', no \
                 spaces, '+' or leading zeros) as a JSON number or string"
            ))
        })
    }

    /// A `bool` field.
    pub(crate) fn boolean(&self, proto: &str, json: &str) -> Result<bool, Status> {
        match self.field(proto, json)? {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(type_error(other, "bool")),
        }
    }

    /// An enum field: the index of its value in `e`.
    pub(crate) fn enumeration(
        &self,
        proto: &str,
        json: &str,
        e: &EnumType,
    ) -> Result<usize, Status> {
        let Some(v) = self.field(proto, json)? else {
            return Ok(0);
        };
        match v {
            // Go looks the name up exactly as sent, escapes and all.
            Value::String(s) => e.names.iter().position(|n| *n == s.raw).ok_or_else(|| {
                Status::invalid(format!(
                    "unknown value {:?} for enum {}",
                    s.raw, e.full_name
                ))
            }),
            Value::Number(n) => canonical_int64(n).and_then(|i| e.index(i)).ok_or_else(|| {
                Status::refused(format!("{proto:?}: {n} is no value of {}", e.full_name))
            }),
            other => Err(type_error(other, "protoreflect.EnumNumber")),
        }
    }

    /// Checks that at most one member of a `oneof` is given (under any spelling, `null` or
    /// not): etcd's gateway sets them in Go's map order, so with two the one that wins is
    /// random. A lone `null` member reads as no member, as etcd ends up reading it.
    pub(crate) fn one_of(&self, members: &[(&str, &str)]) -> Result<(), Status> {
        let given = members
            .iter()
            .filter(|(proto, json)| self.member(proto).is_some() || self.member(json).is_some())
            .count();
        if given > 1 {
            let names: Vec<&str> = members.iter().map(|(proto, _)| *proto).collect();
            return Err(Status::refused(format!(
                "more than one of {} (etcd would pick one at random)",
                names.join(", ")
            )));
        }
        Ok(())
    }

    /// A message field, `None` if absent.
    pub(crate) fn message(&self, proto: &str, json: &str) -> Result<Option<Message<'a>>, Status> {
        self.field(proto, json)?.map(Message::of).transpose()
    }

    /// A repeated field's elements.
    pub(crate) fn repeated(&self, proto: &str, json: &str) -> Result<&'a [Value], Status> {
        match self.field(proto, json)? {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(type_error(other, "[]json.RawMessage")),
        }
    }
}

/// `RangeRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Range {
    pub(crate) key: Vec<u8>,
    pub(crate) range_end: Vec<u8>,
    pub(crate) limit: i64,
    pub(crate) revision: i64,
    /// Index in [`SORT_ORDER`].
    pub(crate) sort_order: usize,
    /// Index in [`SORT_TARGET`].
    pub(crate) sort_target: usize,
    pub(crate) serializable: bool,
    pub(crate) keys_only: bool,
    pub(crate) count_only: bool,
    pub(crate) min_mod_revision: i64,
    pub(crate) max_mod_revision: i64,
    pub(crate) min_create_revision: i64,
    pub(crate) max_create_revision: i64,
}

impl Range {
    /// Decodes the fields in declaration order, so the first error is the one etcd reports.
    pub(crate) fn decode(m: Message<'_>) -> Result<Self, Status> {
        Ok(Self {
            key: m.bytes("key", "key")?,
            range_end: m.bytes("range_end", "rangeEnd")?,
            limit: m.int64("limit", "limit")?,
            revision: m.int64("revision", "revision")?,
            sort_order: m.enumeration("sort_order", "sortOrder", &SORT_ORDER)?,
            sort_target: m.enumeration("sort_target", "sortTarget", &SORT_TARGET)?,
            serializable: m.boolean("serializable", "serializable")?,
            keys_only: m.boolean("keys_only", "keysOnly")?,
            count_only: m.boolean("count_only", "countOnly")?,
            min_mod_revision: m.int64("min_mod_revision", "minModRevision")?,
            max_mod_revision: m.int64("max_mod_revision", "maxModRevision")?,
            min_create_revision: m.int64("min_create_revision", "minCreateRevision")?,
            max_create_revision: m.int64("max_create_revision", "maxCreateRevision")?,
        })
    }
}

/// `PutRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Put {
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
    pub(crate) lease: i64,
    pub(crate) prev_kv: bool,
    pub(crate) ignore_value: bool,
    pub(crate) ignore_lease: bool,
}

impl Put {
    /// Decodes the fields in declaration order.
    pub(crate) fn decode(m: Message<'_>) -> Result<Self, Status> {
        Ok(Self {
            key: m.bytes("key", "key")?,
            value: m.bytes("value", "value")?,
            lease: m.int64("lease", "lease")?,
            prev_kv: m.boolean("prev_kv", "prevKv")?,
            ignore_value: m.boolean("ignore_value", "ignoreValue")?,
            ignore_lease: m.boolean("ignore_lease", "ignoreLease")?,
        })
    }
}

/// `DeleteRangeRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DeleteRange {
    pub(crate) key: Vec<u8>,
    pub(crate) range_end: Vec<u8>,
    pub(crate) prev_kv: bool,
}

impl DeleteRange {
    /// Decodes the fields in declaration order.
    pub(crate) fn decode(m: Message<'_>) -> Result<Self, Status> {
        Ok(Self {
            key: m.bytes("key", "key")?,
            range_end: m.bytes("range_end", "rangeEnd")?,
            prev_kv: m.boolean("prev_kv", "prevKv")?,
        })
    }
}

/// One operation of a transaction (`RequestOp`); `None` in a branch is an empty op, which etcd
/// refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Range(Range),
    Put(Put),
    DeleteRange(DeleteRange),
    Txn(Txn),
}

impl Op {
    fn decode(v: &Value) -> Result<Option<Self>, Status> {
        let m = element(v)?;
        m.one_of(&[
            ("request_range", "requestRange"),
            ("request_put", "requestPut"),
            ("request_delete_range", "requestDeleteRange"),
            ("request_txn", "requestTxn"),
        ])?;
        if let Some(r) = m.message("request_range", "requestRange")? {
            return Ok(Some(Op::Range(Range::decode(r)?)));
        }
        if let Some(p) = m.message("request_put", "requestPut")? {
            return Ok(Some(Op::Put(Put::decode(p)?)));
        }
        if let Some(d) = m.message("request_delete_range", "requestDeleteRange")? {
            return Ok(Some(Op::DeleteRange(DeleteRange::decode(d)?)));
        }
        if let Some(t) = m.message("request_txn", "requestTxn")? {
            return Ok(Some(Op::Txn(Txn::decode(t)?)));
        }
        Ok(None)
    }
}

/// The value a compare checks against (`Compare.target_union`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Against {
    Version(i64),
    CreateRevision(i64),
    ModRevision(i64),
    Value(Vec<u8>),
    Lease(i64),
}

/// `Compare`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Compare {
    /// Index in [`COMPARE_RESULT`].
    pub(crate) result: usize,
    /// Index in [`COMPARE_TARGET`].
    pub(crate) target: usize,
    pub(crate) key: Vec<u8>,
    pub(crate) against: Option<Against>,
    pub(crate) range_end: Vec<u8>,
}

impl Compare {
    fn decode(v: &Value) -> Result<Self, Status> {
        let m = element(v)?;
        let result = m.enumeration("result", "result", &COMPARE_RESULT)?;
        let target = m.enumeration("target", "target", &COMPARE_TARGET)?;
        let key = m.bytes("key", "key")?;
        // etcd's jsonpb reads the oneof after every other field.
        let range_end = m.bytes("range_end", "rangeEnd")?;
        m.one_of(&[
            ("version", "version"),
            ("create_revision", "createRevision"),
            ("mod_revision", "modRevision"),
            ("value", "value"),
            ("lease", "lease"),
        ])?;
        let against = if m.field("version", "version")?.is_some() {
            Some(Against::Version(m.int64("version", "version")?))
        } else if m.field("create_revision", "createRevision")?.is_some() {
            Some(Against::CreateRevision(
                m.int64("create_revision", "createRevision")?,
            ))
        } else if m.field("mod_revision", "modRevision")?.is_some() {
            Some(Against::ModRevision(
                m.int64("mod_revision", "modRevision")?,
            ))
        } else if m.field("value", "value")?.is_some() {
            Some(Against::Value(m.bytes("value", "value")?))
        } else if m.field("lease", "lease")?.is_some() {
            Some(Against::Lease(m.int64("lease", "lease")?))
        } else {
            None
        };
        Ok(Self {
            result,
            target,
            key,
            against,
            range_end,
        })
    }
}

/// `TxnRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Txn {
    pub(crate) compare: Vec<Compare>,
    pub(crate) success: Vec<Option<Op>>,
    pub(crate) failure: Vec<Option<Op>>,
}

impl Txn {
    /// Decodes the fields in declaration order.
    pub(crate) fn decode(m: Message<'_>) -> Result<Self, Status> {
        let compare = m
            .repeated("compare", "compare")?
            .iter()
            .map(Compare::decode)
            .collect::<Result<_, _>>()?;
        let ops = |name: &str| -> Result<Vec<Option<Op>>, Status> {
            m.repeated(name, name)?.iter().map(Op::decode).collect()
        };
        Ok(Self {
            compare,
            success: ops("success")?,
            failure: ops("failure")?,
        })
    }

    /// Every operation in both branches, at every depth, with its depth (0: this txn's own).
    pub(crate) fn walk<'t>(&'t self, depth: usize, visit: &mut impl FnMut(&'t Op, usize)) {
        for op in self.success.iter().chain(&self.failure).flatten() {
            visit(op, depth);
            if let Op::Txn(inner) = op {
                inner.walk(depth + 1, visit);
            }
        }
    }
}

/// `LeaseGrantRequest`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LeaseGrant {
    pub(crate) ttl: i64,
    pub(crate) id: i64,
}

impl LeaseGrant {
    /// Decodes the fields in declaration order.
    pub(crate) fn decode(m: Message<'_>) -> Result<Self, Status> {
        Ok(Self {
            ttl: m.int64("TTL", "TTL")?,
            id: m.int64("ID", "ID")?,
        })
    }
}

/// The lease id of `LeaseRevokeRequest` and `LeaseKeepAliveRequest`.
pub(crate) fn lease_id(m: Message<'_>) -> Result<i64, Status> {
    m.int64("ID", "ID")
}

/// `LeaseTimeToLiveRequest`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TimeToLive {
    pub(crate) id: i64,
    pub(crate) keys: bool,
}

impl TimeToLive {
    /// Decodes the fields in declaration order.
    pub(crate) fn decode(m: Message<'_>) -> Result<Self, Status> {
        Ok(Self {
            id: m.int64("ID", "ID")?,
            keys: m.boolean("keys", "keys")?,
        })
    }
}

/// `LockRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Lock {
    pub(crate) name: Vec<u8>,
    pub(crate) lease: i64,
}

impl Lock {
    /// Decodes the fields in declaration order.
    pub(crate) fn decode(m: Message<'_>) -> Result<Self, Status> {
        Ok(Self {
            name: m.bytes("name", "name")?,
            lease: m.int64("lease", "lease")?,
        })
    }
}

/// The key of `UnlockRequest`.
pub(crate) fn unlock_key(m: Message<'_>) -> Result<Vec<u8>, Status> {
    m.bytes("key", "key")
}

#[cfg(test)]
mod tests {
    use super::super::json::Reader;
    use super::*;

    fn parse(s: &str) -> Value {
        Reader::new(s.as_bytes()).next_value().unwrap().unwrap()
    }

    fn message_error<T: std::fmt::Debug>(
        s: &str,
        f: impl Fn(Message<'_>) -> Result<T, Status>,
    ) -> Status {
        let v = parse(s);
        f(Message::of(&v).unwrap()).unwrap_err()
    }

    #[test]
    fn fields_decode_as_etcd_reads_them() {
        let v = parse(
            r#"{"key":"YQ==","rangeEnd":"Yg==","limit":"5","revision":-3,"sortOrder":"DESCEND",
                "sort_target":2,"keysOnly":true,"bogus":[{"x":1}],"count_only":null}"#,
        );
        let r = Range::decode(Message::of(&v).unwrap()).unwrap();
        assert_eq!(r.key, b"a");
        assert_eq!(r.range_end, b"b");
        assert_eq!((r.limit, r.revision), (5, -3));
        assert_eq!((r.sort_order, r.sort_target), (2, 2));
        assert!(r.keys_only && !r.count_only);
        let empty = Range::decode(Message::of(&Value::Null).unwrap()).unwrap();
        assert_eq!(empty, Range::default());
    }

    #[test]
    fn what_etcd_reads_differently_is_refused() {
        for body in [
            r#"{"key":"YQ==","range_end":"AA==","rangeEnd":"AA=="}"#,
            r#"{"key":"Y\nQ=="}"#,
            r#"{"key":"YR=="}"#,
            r#"{"limit":" 1"}"#,
            r#"{"limit":"1 "}"#,
            r#"{"limit":"+1"}"#,
            r#"{"limit":"01"}"#,
            r#"{"limit":"null"}"#,
            r#"{"limit":"1e3"}"#,
            r#"{"limit":1.0}"#,
            r#"{"limit":"\u0031"}"#,
            r#"{"limit":99999999999999999999}"#,
            r#"{"sort_order":7}"#,
        ] {
            let s = message_error(body, Range::decode);
            assert_eq!(s.code(), 3, "{body}");
        }
        let s = message_error(r#"{"key":"not base64!"}"#, Range::decode);
        assert_eq!(s, Status::invalid("illegal base64 data at input byte 3"));
        let s = message_error(r#"{"sort_order":"descend"}"#, Range::decode);
        assert_eq!(
            s,
            Status::invalid(
                r#"unknown value "descend" for enum etcdserverpb.RangeRequest_SortOrder"#
            )
        );
        let s = message_error(
            r#"{"success":[{"request_put":{"key":"YQ=="},"requestRange":{"key":"YQ=="}}]}"#,
            Txn::decode,
        );
        assert_eq!(s.code(), 3);
        let s = message_error(
            r#"{"compare":[{"key":"YQ==","version":"1","value":"YQ=="}]}"#,
            Txn::decode,
        );
        assert_eq!(s.code(), 3);
    }

    #[test]
    fn int64_forms_etcd_and_rust_agree_on() {
        for (text, want) in [
            ("0", 0),
            ("-0", 0),
            ("7", 7),
            ("-9223372036854775808", i64::MIN),
            ("9223372036854775807", i64::MAX),
        ] {
            assert_eq!(canonical_int64(text), Some(want), "{text}");
        }
        for text in [
            "",
            "-",
            "+1",
            "01",
            " 1",
            "1 ",
            "1.0",
            "0x10",
            "9223372036854775808",
        ] {
            assert_eq!(canonical_int64(text), None, "{text}");
        }
    }

    #[test]
    fn nested_txns_and_empty_ops() {
        let v = parse(
            r#"{"success":[{},{"request_txn":{"failure":[{"requestPut":{"key":"YQ=="}}]}}]}"#,
        );
        let t = Txn::decode(Message::of(&v).unwrap()).unwrap();
        assert_eq!(t.success[0], None);
        let v = parse(r#"{"success":[{"request_put":null}]}"#);
        assert_eq!(
            Txn::decode(Message::of(&v).unwrap()).unwrap().success,
            [None]
        );
        for null in [
            r#"{"success":[null]}"#,
            r#"{"compare":[null]}"#,
            r#"{"success":[{"request_put":null,"request_range":{"key":"YQ=="}}]}"#,
            r#"{"compare":[{"key":"YQ==","version":null,"lease":1}]}"#,
        ] {
            assert_eq!(message_error(null, Txn::decode).code(), 3);
        }
        let mut seen = Vec::new();
        t.walk(0, &mut |op, depth| {
            seen.push((matches!(op, Op::Put(_)), depth))
        });
        assert_eq!(seen, vec![(false, 0), (true, 1)]);
    }
}
