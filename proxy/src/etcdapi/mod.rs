//! The etcd-compatible core (docs/DESIGN.md §5.2): typed etcd requests in, etcd's answers out,
//! confined and checked — one interface ([`Service`]) that every etcd front calls: the `/v3`
//! JSON gateway (`crate::v3`) and etcd's gRPC API (`crate::grpc`). Neither front knows the other;
//! this core knows neither (no JSON, no HTTP, no tonic).
//!
//! Fails closed (docs/DESIGN.md §7.6): the typed values go to etcd through etcd-client's gRPC
//! API — no client bytes reach etcd — under the same deadline and member failover as `/v1`. On
//! top of etcd, the core adds:
//! - KV, locks and elections are confined to a namespace ([`namespace`]) — with
//!   `--auth-tokens`, one per principal ([`Caller`]);
//! - leases are confined too ([`lease`]): only leases granted through the etcd API can be
//!   revoked, renewed, inspected, listed, or named by a put or a lock (with `--auth-tokens`,
//!   only by the principal that granted them);
//! - keepalives go through the proxy's shared, multiplexed keepalive streams;
//! - a lock answer carries a fencing token in the lock's own token domain ([`lock`]);
//! - watches share the replica's etcd watches and a memory budget ([`watch`]);
//! - per-request limits: ids per keepalive body, operations and nesting per transaction.
//!
//! One file per etcd service, as etcd's `v3rpc` has them: [`kv`], [`lease`], [`lock`],
//! [`election`], [`watch`]; [`request`] holds the typed requests, [`status`] etcd's codes and
//! messages, [`service`] the caller's view and what the long calls share.

mod election;
mod kv;
mod lease;
mod lock;
mod namespace;
mod remembered;
pub(crate) mod request;
mod service;
mod status;
mod watch;

pub(crate) use lease::Judged;
#[cfg(test)]
pub(crate) use namespace::Namespace;
pub(crate) use request::Lock;
pub(crate) use service::{Authorised, Caller, Service, Streams};
pub(crate) use status::{Code, Status, PERMISSION_DENIED, USER_EMPTY};
pub(crate) use watch::{Budgets as WatchBudgets, Requests as WatchRequests, Written};

/// What the core is configured with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Where the markers of the etcd API's leases live (`{etcd-prefix}v3/leases/`).
    pub(crate) lease_markers: String,
    /// The fencing era of lock tokens.
    pub(crate) era: u64,
    /// The namespace every key is confined to (`--v3-namespace`).
    pub(crate) namespace: String,
    /// Per-request limits.
    pub(crate) limits: Limits,
}

/// Per-request limits of the etcd API.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Lease ids (JSON objects) in one keepalive body.
    pub(crate) keepalive_ids: usize,
    /// Compares and operations in one transaction, counted at every depth.
    pub(crate) txn_ops: usize,
    /// Transactions nested inside a transaction.
    pub(crate) txn_depth: usize,
}
