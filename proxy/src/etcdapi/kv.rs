//! `kv/range`, `kv/put`, `kv/deleterange` and `kv/txn`: typed requests checked as etcd checks
//! them (on the client's own keys, before the namespace would hide an empty one), held to the
//! proxy's limits, confined to the namespace, sent through etcd-client with etcd's deadline and
//! failover, and answered with etcd's messages, their keys moved back out of the namespace.

use std::collections::BTreeSet;

use etcd_client::proto::{PbDeleteResponse, PbPutResponse, PbRangeResponse, PbTxnResponse};
use etcd_client::{
    Compare as EtcdCompare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder,
    SortTarget, Txn as EtcdTxn, TxnOp,
};

use super::namespace::Namespace;
use super::request::{Against, Compare, DeleteRange, Op, Put, Range, Txn};
use super::service::{Caller, Service};
use super::status::{Status, EMPTY_KEY, EMPTY_OP};
use super::Limits;
use crate::etcd::client_kv;

const SORT_ORDERS: [SortOrder; 3] = [SortOrder::None, SortOrder::Ascend, SortOrder::Descend];
const SORT_TARGETS: [SortTarget; 5] = [
    SortTarget::Key,
    SortTarget::Version,
    SortTarget::Create,
    SortTarget::Mod,
    SortTarget::Value,
];
const COMPARE_OPS: [CompareOp; 4] = [
    CompareOp::Equal,
    CompareOp::Greater,
    CompareOp::Less,
    CompareOp::NotEqual,
];

fn check_range(r: &Range) -> Result<(), Status> {
    if r.key.is_empty() {
        return Err(Status::invalid(EMPTY_KEY));
    }
    Ok(())
}

fn check_put(p: &Put) -> Result<(), Status> {
    if p.key.is_empty() {
        return Err(Status::invalid(EMPTY_KEY));
    }
    if p.ignore_value && !p.value.is_empty() {
        return Err(Status::invalid("etcdserver: value is provided"));
    }
    if p.ignore_lease && p.lease != 0 {
        return Err(Status::invalid("etcdserver: lease is provided"));
    }
    Ok(())
}

fn check_delete(d: &DeleteRange) -> Result<(), Status> {
    if d.key.is_empty() {
        return Err(Status::invalid(EMPTY_KEY));
    }
    Ok(())
}

/// etcd's `checkTxnRequest`, in its order (its limit on operations is etcd's own to apply).
fn check_txn(t: &Txn) -> Result<(), Status> {
    if t.compare.iter().any(|c| c.key.is_empty()) {
        return Err(Status::invalid(EMPTY_KEY));
    }
    for op in t.success.iter().chain(&t.failure) {
        match op {
            None => return Err(Status::invalid(EMPTY_OP)),
            Some(Op::Range(r)) => check_range(r)?,
            Some(Op::Put(p)) => check_put(p)?,
            Some(Op::DeleteRange(d)) => check_delete(d)?,
            Some(Op::Txn(inner)) => check_txn(inner)?,
        }
    }
    Ok(())
}

/// The proxy's own limits: operations (compares and requests, at every depth) and nesting.
fn check_limits(t: &Txn, limits: &Limits) -> Result<(), Status> {
    let mut ops = t.compare.len() + t.success.len() + t.failure.len();
    let mut depth = 0;
    t.walk(1, &mut |op, d| {
        if let Op::Txn(inner) = op {
            ops += inner.compare.len() + inner.success.len() + inner.failure.len();
            depth = depth.max(d);
        }
    });
    if depth > limits.txn_depth {
        return Err(Status::refused(format!(
            "txns nested {depth} deep; at most {} (--v3-max-txn-depth)",
            limits.txn_depth
        )));
    }
    if ops > limits.txn_ops {
        return Err(Status::refused(format!(
            "txn with {ops} compares and operations in all; at most {} (--v3-max-txn-ops)",
            limits.txn_ops
        )));
    }
    Ok(())
}

/// Every non-zero lease a transaction's puts name, at any depth.
fn txn_leases(t: &Txn) -> BTreeSet<i64> {
    let mut leases = BTreeSet::new();
    t.walk(0, &mut |op, _| {
        if let Op::Put(p) = op {
            if p.lease != 0 {
                leases.insert(p.lease);
            }
        }
    });
    leases
}

fn get_options(ns: &Namespace, r: &Range) -> (Vec<u8>, GetOptions) {
    let mut o = GetOptions::new()
        .with_limit(r.limit)
        .with_revision(r.revision)
        .with_min_mod_revision(r.min_mod_revision)
        .with_max_mod_revision(r.max_mod_revision)
        .with_min_create_revision(r.min_create_revision)
        .with_max_create_revision(r.max_create_revision);
    let end = ns.range_end(&r.range_end);
    if !end.is_empty() {
        o = o.with_range(end);
    }
    if r.sort_order != 0 || r.sort_target != 0 {
        o = o.with_sort(SORT_TARGETS[r.sort_target], SORT_ORDERS[r.sort_order]);
    }
    if r.serializable {
        o = o.with_serializable();
    }
    if r.keys_only {
        o = o.with_keys_only();
    }
    if r.count_only {
        o = o.with_count_only();
    }
    (ns.key(&r.key), o)
}

fn put_options(p: &Put) -> PutOptions {
    let mut o = PutOptions::new().with_lease(p.lease);
    if p.prev_kv {
        o = o.with_prev_key();
    }
    if p.ignore_value {
        o = o.with_ignore_value();
    }
    if p.ignore_lease {
        o = o.with_ignore_lease();
    }
    o
}

fn delete_options(ns: &Namespace, d: &DeleteRange) -> (Vec<u8>, DeleteOptions) {
    let mut o = DeleteOptions::new();
    let end = ns.range_end(&d.range_end);
    if !end.is_empty() {
        o = o.with_range(end);
    }
    if d.prev_kv {
        o = o.with_prev_key();
    }
    (ns.key(&d.key), o)
}

/// A compare as etcd evaluates it: against the value of the compare's target when the request
/// gave one of that kind, else against the target's zero value (etcd's `compareKV`).
fn compare(ns: &Namespace, c: &Compare) -> EtcdCompare {
    let key = ns.key(&c.key);
    let op = COMPARE_OPS[c.result];
    let int = |want: fn(&Against) -> Option<i64>| c.against.as_ref().and_then(want).unwrap_or(0);
    let cmp = match c.target {
        0 => EtcdCompare::version(
            key,
            op,
            int(|a| match a {
                Against::Version(v) => Some(*v),
                _ => None,
            }),
        ),
        1 => EtcdCompare::create_revision(
            key,
            op,
            int(|a| match a {
                Against::CreateRevision(v) => Some(*v),
                _ => None,
            }),
        ),
        2 => EtcdCompare::mod_revision(
            key,
            op,
            int(|a| match a {
                Against::ModRevision(v) => Some(*v),
                _ => None,
            }),
        ),
        3 => {
            let value = match &c.against {
                Some(Against::Value(v)) => v.clone(),
                _ => Vec::new(),
            };
            EtcdCompare::value(key, op, value)
        }
        _ => EtcdCompare::lease(
            key,
            op,
            int(|a| match a {
                Against::Lease(v) => Some(*v),
                _ => None,
            }),
        ),
    };
    let end = ns.range_end(&c.range_end);
    if end.is_empty() {
        cmp
    } else {
        cmp.with_range(end)
    }
}

fn txn_op(ns: &Namespace, op: &Op) -> TxnOp {
    match op {
        Op::Range(r) => {
            let (key, o) = get_options(ns, r);
            TxnOp::get(key, Some(o))
        }
        Op::Put(p) => TxnOp::put(ns.key(&p.key), p.value.clone(), Some(put_options(p))),
        Op::DeleteRange(d) => {
            let (key, o) = delete_options(ns, d);
            TxnOp::delete(key, Some(o))
        }
        Op::Txn(t) => TxnOp::txn(etcd_txn(ns, t)),
    }
}

/// The transaction for etcd (empty ops are refused before: [`check_txn`]).
fn etcd_txn(ns: &Namespace, t: &Txn) -> EtcdTxn {
    let ops = |branch: &[Option<Op>]| -> Vec<TxnOp> {
        branch.iter().flatten().map(|op| txn_op(ns, op)).collect()
    };
    EtcdTxn::new()
        .when(t.compare.iter().map(|c| compare(ns, c)).collect::<Vec<_>>())
        .and_then(ops(&t.success))
        .or_else(ops(&t.failure))
}

impl Service {
    /// `kv/range`.
    pub(crate) async fn range(&self, s: &Caller, r: Range) -> Result<PbRangeResponse, Status> {
        check_range(&r)?;
        let (key, options) = get_options(&s.namespace, &r);
        let resp = self
            .etcd
            .bounded("v3_range", |c| {
                let (key, options) = (key.clone(), options.clone());
                async move { client_kv(&c).get(key, Some(options)).await }
            })
            .await?;
        Ok(s.namespace.range_out(resp.0))
    }

    /// `kv/put`: only with no lease or a `/v3` lease.
    pub(crate) async fn put(&self, s: &Caller, p: Put) -> Result<PbPutResponse, Status> {
        check_put(&p)?;
        self.leases.require_all([p.lease], s).await?;
        let key = s.namespace.key(&p.key);
        let options = put_options(&p);
        let resp = self
            .etcd
            .bounded_once("v3_put", |c| {
                let (key, value, options) = (key.clone(), p.value.clone(), options.clone());
                async move { client_kv(&c).put(key, value, Some(options)).await }
            })
            .await?;
        Ok(s.namespace.put_out(resp.0))
    }

    /// `kv/deleterange`.
    pub(crate) async fn delete_range(
        &self,
        s: &Caller,
        d: DeleteRange,
    ) -> Result<PbDeleteResponse, Status> {
        check_delete(&d)?;
        let (key, options) = delete_options(&s.namespace, &d);
        let resp = self
            .etcd
            .bounded_once("v3_delete", |c| {
                let (key, options) = (key.clone(), options.clone());
                async move { client_kv(&c).delete(key, Some(options)).await }
            })
            .await?;
        Ok(s.namespace.delete_out(resp.0))
    }

    /// `kv/txn`: every put's lease, at any depth, must be a `/v3` lease.
    pub(crate) async fn txn(&self, s: &Caller, t: Txn) -> Result<PbTxnResponse, Status> {
        check_limits(&t, &self.limits)?;
        check_txn(&t)?;
        self.leases.require_all(txn_leases(&t), s).await?;
        let txn = etcd_txn(&s.namespace, &t);
        let resp = self
            .etcd
            .bounded_once("v3_txn", |c| {
                let txn = txn.clone();
                async move { client_kv(&c).txn(txn).await }
            })
            .await?;
        Ok(s.namespace.txn_out(resp.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &[u8], lease: i64) -> Option<Op> {
        Some(Op::Put(Put {
            key: key.to_vec(),
            lease,
            ..Put::default()
        }))
    }

    fn nest(depth: usize) -> Txn {
        let mut t = Txn {
            success: vec![put(b"k", 7)],
            ..Txn::default()
        };
        for _ in 0..depth {
            t = Txn {
                failure: vec![Some(Op::Txn(t))],
                ..Txn::default()
            };
        }
        t
    }

    #[test]
    fn limits_count_every_depth() {
        let limits = Limits {
            keepalive_ids: 1,
            txn_ops: 5,
            txn_depth: 2,
        };
        assert!(check_limits(&nest(2), &limits).is_ok());
        assert!(check_limits(&nest(3), &limits).is_err());
        let wide = Txn {
            success: (0..6).map(|_| put(b"k", 0)).collect(),
            ..Txn::default()
        };
        assert!(check_limits(&wide, &limits).is_err());
        assert_eq!(txn_leases(&nest(3)), BTreeSet::from([7]));
    }

    #[test]
    fn etcds_own_checks_see_the_clients_keys() {
        let empty = Txn {
            success: vec![put(b"", 0)],
            ..Txn::default()
        };
        assert_eq!(check_txn(&empty), Err(Status::invalid(EMPTY_KEY)));
        let hole = Txn {
            failure: vec![None],
            ..Txn::default()
        };
        assert_eq!(check_txn(&hole), Err(Status::invalid(EMPTY_OP)));
        assert!(check_txn(&nest(2)).is_ok());
    }
}
