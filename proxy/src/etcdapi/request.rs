//! The typed etcd requests every etcd front hands the core: one struct per request message of
//! the etcd API the proxy serves, with the proto enums as indexes into their value names. The
//! JSON gateway decodes them from JSON (`crate::v3`'s `request`), the gRPC front from tonic's
//! protobuf messages (`crate::grpc`'s `proto`); both produce the same values, so the core makes
//! one set of checks.

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

    /// The index of the value named `name`, if one is.
    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| *n == name)
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

/// `DeleteRangeRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DeleteRange {
    pub(crate) key: Vec<u8>,
    pub(crate) range_end: Vec<u8>,
    pub(crate) prev_kv: bool,
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

/// `TxnRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Txn {
    pub(crate) compare: Vec<Compare>,
    pub(crate) success: Vec<Option<Op>>,
    pub(crate) failure: Vec<Option<Op>>,
}

impl Txn {
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

/// `LeaseTimeToLiveRequest`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TimeToLive {
    pub(crate) id: i64,
    pub(crate) keys: bool,
}

/// `LockRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Lock {
    pub(crate) name: Vec<u8>,
    pub(crate) lease: i64,
}
