//! The core's typed requests ([`crate::etcdapi::request`]) from etcd's protobuf request messages,
//! as the gRPC front receives them decoded by tonic: the same values the JSON gateway's decoders
//! produce, so both fronts reach the core ([`crate::etcdapi::Service`]) with one kind of request
//! and one set of checks.
//!
//! Protobuf leaves nothing ambiguous that JSON does (one spelling per field, a `oneof` has one
//! member), so only enum numbers can be refused here: a number that names no value, which etcd
//! would pass on and the proxy cannot read as etcd does — refused as the JSON front refuses it.

use etcd_client::proto::{
    PbCompare, PbDeleteRequest, PbLeaseGrantRequest, PbLeaseTimeToLiveRequest, PbPutRequest,
    PbRangeRequest, PbTargetUnion, PbTxnOpRequest, PbTxnRequest, PbTxnRequestOp,
};

use crate::etcdapi::request::{
    Against, Compare, DeleteRange, EnumType, LeaseGrant, Op, Put, Range, TimeToLive, Txn,
    COMPARE_RESULT, COMPARE_TARGET, SORT_ORDER, SORT_TARGET,
};
use crate::etcdapi::Status;

/// The index of enum number `n` in `e`, or the JSON front's refusal of a number naming no value.
fn enumeration(field: &str, n: i32, e: &EnumType) -> Result<usize, Status> {
    e.index(n)
        .ok_or_else(|| Status::refused(format!("{field:?}: {n} is no value of {}", e.full_name())))
}

impl TryFrom<PbRangeRequest> for Range {
    type Error = Status;

    fn try_from(r: PbRangeRequest) -> Result<Self, Status> {
        Ok(Self {
            sort_order: enumeration("sort_order", r.sort_order, &SORT_ORDER)?,
            sort_target: enumeration("sort_target", r.sort_target, &SORT_TARGET)?,
            key: r.key,
            range_end: r.range_end,
            limit: r.limit,
            revision: r.revision,
            serializable: r.serializable,
            keys_only: r.keys_only,
            count_only: r.count_only,
            min_mod_revision: r.min_mod_revision,
            max_mod_revision: r.max_mod_revision,
            min_create_revision: r.min_create_revision,
            max_create_revision: r.max_create_revision,
        })
    }
}

impl From<PbPutRequest> for Put {
    fn from(p: PbPutRequest) -> Self {
        Self {
            key: p.key,
            value: p.value,
            lease: p.lease,
            prev_kv: p.prev_kv,
            ignore_value: p.ignore_value,
            ignore_lease: p.ignore_lease,
        }
    }
}

impl From<PbDeleteRequest> for DeleteRange {
    fn from(d: PbDeleteRequest) -> Self {
        Self {
            key: d.key,
            range_end: d.range_end,
            prev_kv: d.prev_kv,
        }
    }
}

/// One operation; an op with no request is the empty op, which the core refuses as etcd does.
fn op(o: PbTxnRequestOp) -> Result<Option<Op>, Status> {
    Ok(match o.request {
        None => None,
        Some(PbTxnOpRequest::RequestRange(r)) => Some(Op::Range(r.try_into()?)),
        Some(PbTxnOpRequest::RequestPut(p)) => Some(Op::Put(p.into())),
        Some(PbTxnOpRequest::RequestDeleteRange(d)) => Some(Op::DeleteRange(d.into())),
        Some(PbTxnOpRequest::RequestTxn(t)) => Some(Op::Txn(t.try_into()?)),
    })
}

impl TryFrom<PbCompare> for Compare {
    type Error = Status;

    fn try_from(c: PbCompare) -> Result<Self, Status> {
        Ok(Self {
            result: enumeration("result", c.result, &COMPARE_RESULT)?,
            target: enumeration("target", c.target, &COMPARE_TARGET)?,
            key: c.key,
            range_end: c.range_end,
            against: c.target_union.map(|t| match t {
                PbTargetUnion::Version(v) => Against::Version(v),
                PbTargetUnion::CreateRevision(v) => Against::CreateRevision(v),
                PbTargetUnion::ModRevision(v) => Against::ModRevision(v),
                PbTargetUnion::Value(v) => Against::Value(v),
                PbTargetUnion::Lease(v) => Against::Lease(v),
            }),
        })
    }
}

impl TryFrom<PbTxnRequest> for Txn {
    type Error = Status;

    fn try_from(t: PbTxnRequest) -> Result<Self, Status> {
        let ops = |ops: Vec<PbTxnRequestOp>| -> Result<Vec<_>, Status> {
            ops.into_iter().map(op).collect()
        };
        Ok(Self {
            compare: t
                .compare
                .into_iter()
                .map(Compare::try_from)
                .collect::<Result<_, _>>()?,
            success: ops(t.success)?,
            failure: ops(t.failure)?,
        })
    }
}

impl From<PbLeaseGrantRequest> for LeaseGrant {
    fn from(g: PbLeaseGrantRequest) -> Self {
        Self {
            ttl: g.ttl,
            id: g.id,
        }
    }
}

impl From<PbLeaseTimeToLiveRequest> for TimeToLive {
    fn from(t: PbLeaseTimeToLiveRequest) -> Self {
        Self {
            id: t.id,
            keys: t.keys,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_numbers_naming_no_value_are_refused() {
        let r = PbRangeRequest {
            sort_order: 2,
            sort_target: 4,
            ..Default::default()
        };
        let r = Range::try_from(r).unwrap();
        assert_eq!((r.sort_order, r.sort_target), (2, 4));
        for (order, target) in [(3, 0), (-1, 0), (0, 5)] {
            let bad = PbRangeRequest {
                sort_order: order,
                sort_target: target,
                ..Default::default()
            };
            assert_eq!(Range::try_from(bad).unwrap_err().code(), 3);
        }
    }

    #[test]
    fn nested_txns_and_empty_ops_convert() {
        let inner = PbTxnRequest {
            failure: vec![PbTxnRequestOp {
                request: Some(PbTxnOpRequest::RequestPut(PbPutRequest {
                    key: b"a".to_vec(),
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        let t = PbTxnRequest {
            compare: vec![PbCompare {
                target: 3,
                key: b"k".to_vec(),
                target_union: Some(PbTargetUnion::Value(b"v".to_vec())),
                ..Default::default()
            }],
            success: vec![
                PbTxnRequestOp { request: None },
                PbTxnRequestOp {
                    request: Some(PbTxnOpRequest::RequestTxn(inner)),
                },
            ],
            failure: vec![],
        };
        let t = Txn::try_from(t).unwrap();
        assert_eq!(t.compare[0].against, Some(Against::Value(b"v".to_vec())));
        assert_eq!(t.success[0], None);
        let mut seen = Vec::new();
        t.walk(0, &mut |op, depth| {
            seen.push((matches!(op, Op::Put(_)), depth))
        });
        assert_eq!(seen, vec![(false, 0), (true, 1)]);
    }
}
