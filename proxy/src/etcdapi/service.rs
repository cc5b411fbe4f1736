//! The etcd-compatible core, one interface for every etcd front: typed etcd requests in, typed
//! etcd answers out (etcd-client's protobuf messages, as etcd's gRPC API has them), each method
//! taking the [`Caller`] — its namespace and principal. Here are the checks etcd makes, the
//! proxy's limits, the namespace rewriting ([`super::namespace`]) both ways and the lease
//! confinement ([`super::lease`]); the methods are in one file per etcd service, as etcd's
//! `v3rpc` has them: `kv.rs` (range, put, delete_range, txn), `lease.rs` (lease_grant,
//! lease_revoke, lease_time_to_live, lease_leases, lease_keep_alive), `lock.rs` (lock, unlock,
//! lock_token), `watch.rs` (watch: a stream in, a stream out).
//!
//! The `/v3` JSON gateway (`crate::v3`) is JSON ↔ this interface, as etcd's gateway is JSON ↔
//! its gRPC server; the gRPC front (`crate::grpc`) calls the same methods with the messages
//! tonic decoded, and maps [`Status`] (etcd's code and message) to a `tonic::Status`.

use std::sync::Arc;
use std::time::Duration;

use fencing::Keys;
use futures::stream::{BoxStream, Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use super::lease::Markers;
use super::namespace::Namespace;
use super::status::Status;
use super::{Limits, Settings};
use crate::etcd::{Etcd, KeepAlive};
use crate::lease::{Recheck, WatchSlots};

/// The etcd-compatible service: confined, typed, front-agnostic.
pub(crate) struct Service {
    pub(super) etcd: Etcd,
    pub(super) keepalive: KeepAlive,
    /// The keyring in force (reloaded with the key file): lock answers' tokens.
    pub(super) keys: Keys,
    pub(super) era: u64,
    /// The shared namespace (`--v3-namespace`); a principal's is inside it.
    pub(super) namespace: Namespace,
    pub(super) leases: Markers,
    pub(super) limits: Limits,
    pub(super) streams: Streams,
}

/// Sleeps until `at`; never with none (a stream's `--v3-watch-max-duration` unset).
pub(crate) async fn until_or_never(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What the core's long calls — watch streams, waiting locks and campaigns, leader observers —
/// share with the proxy's other streams.
pub(crate) struct Streams {
    /// The replica's event-stream slots: each long call that holds an etcd watch takes one.
    pub(crate) slots: Arc<WatchSlots>,
    /// Fires when the proxy starts draining: long calls end Unavailable.
    pub(crate) stopping: CancellationToken,
    /// Longest life of a watch stream or an observer (`--v3-watch-max-duration`; `None`: as
    /// long as its client).
    pub(crate) max_duration: Option<Duration>,
    /// What watch answers hold until written, per principal and over every stream.
    pub(crate) budgets: Arc<super::watch::Budgets>,
    /// The replica's shared etcd watches.
    pub(crate) hubs: Arc<super::watch::Hubs>,
    /// Bounds the gRPC keepalive streams that renew on an etcd stream of their own, per
    /// principal too.
    pub(crate) own_keepalives: WatchSlots,
}

/// What a front learnt of who calls: the principal (`None` with authentication off), and its
/// right to the etcd API judged again on demand (`None` with authentication off).
#[derive(Clone, Default)]
pub(crate) struct Authorised {
    pub(crate) principal: Option<String>,
    pub(crate) recheck: Option<Recheck>,
}

/// The caller context every method of the core takes — whose view of etcd a request gets: the shared namespace with authentication off; with it
/// on, the principal's own namespace `{--v3-namespace}{principal}/` and only the leases it
/// granted through `/v3`. Principal names are `[A-Za-z0-9._-]{1,64}` (checked when the token
/// file is read) and contain no `/`, so no principal's namespace is inside another's.
pub(crate) struct Caller {
    pub(super) namespace: Namespace,
    /// The principal, `None` with authentication off.
    pub(super) owner: Option<String>,
    /// The principal's right to `/v3`, judged again while a lock waits (a removed or narrowed
    /// principal gets no lock); `None` with authentication off.
    pub(super) recheck: Option<Recheck>,
}

impl Caller {
    /// Whether the caller may still use the etcd API, judged against the token file in force
    /// (always, with authentication off): for what a long call does after it was authorised —
    /// each renewal on a keepalive stream, a lock that waited.
    pub(super) fn still_authorised(&self) -> Result<(), Status> {
        Recheck::check_if_any(self.recheck.as_ref()).map_err(Status::from)
    }

    /// `requests` — a long call's, such as a keepalive stream's — until a reload of the token
    /// file no longer lets the caller in: then the refusal (made by `refused`) and nothing more,
    /// so a removed principal's stream ends even if it sends nothing (and its connection goes
    /// idle). As they are with authentication off.
    pub(crate) fn while_authorised<T, E>(
        &self,
        requests: impl Stream<Item = Result<T, E>> + Send + 'static,
        refused: fn(Status) -> E,
    ) -> BoxStream<'static, Result<T, E>>
    where
        T: Send + 'static,
        E: Send + 'static,
    {
        let Some(recheck) = self.recheck.clone() else {
            return requests.boxed();
        };
        let state = (requests.boxed(), Some(recheck));
        futures::stream::unfold(state, move |(mut requests, recheck)| async move {
            let mut recheck = recheck?;
            loop {
                tokio::select! {
                    next = requests.next() => {
                        return next.map(|item| (item, (requests, Some(recheck))));
                    }
                    () = recheck.changed() => {
                        if let Err(e) = recheck.check() {
                            return Some((Err(refused(Status::from(e))), (requests, None)));
                        }
                    }
                }
            }
        })
        .boxed()
    }

    /// Whether a lease marker with `value` belongs to this scope: any marker with
    /// authentication off (one shared namespace), only the principal's own with it on.
    pub(super) fn owns(&self, value: &[u8]) -> bool {
        match &self.owner {
            None => true,
            Some(owner) => value == owner.as_bytes(),
        }
    }

    /// The name whose fencing domain a lock `name` gets: the name itself with authentication
    /// off, `{principal}/{name}` with it on.
    pub(super) fn lock_domain(&self, name: &[u8]) -> Vec<u8> {
        match &self.owner {
            None => name.to_vec(),
            Some(owner) => [owner.as_bytes(), b"/", name].concat(),
        }
    }
}

impl Service {
    /// The core as `settings` say (its namespace, lease markers and limits), calling `etcd`.
    pub(crate) fn new(
        etcd: Etcd,
        keepalive: KeepAlive,
        keys: Keys,
        settings: Settings,
        streams: Streams,
    ) -> Self {
        Self {
            leases: Markers::new(etcd.clone(), settings.lease_markers),
            etcd,
            keepalive,
            keys,
            era: settings.era,
            namespace: Namespace::new(settings.namespace.into_bytes()),
            limits: settings.limits,
            streams,
        }
    }

    /// The core's per-request limits.
    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    /// The view of etcd for the request `who` was authorised as.
    pub(crate) fn caller(&self, who: &Authorised) -> Caller {
        let recheck = who.recheck.clone();
        match who.principal.as_deref() {
            None => Caller {
                namespace: self.namespace.clone(),
                owner: None,
                recheck,
            },
            Some(p) => {
                let mut prefix = self.namespace.key(p.as_bytes());
                prefix.push(b'/');
                Caller {
                    namespace: Namespace::new(prefix),
                    owner: Some(p.to_owned()),
                    recheck,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principals_scope_owns_only_its_markers_and_lock_domains() {
        let shared = Caller {
            namespace: Namespace::new(b"/ns/".to_vec()),
            owner: None,
            recheck: None,
        };
        let acme = Caller {
            namespace: Namespace::new(b"/ns/acme/".to_vec()),
            owner: Some("acme".into()),
            recheck: None,
        };
        // With authentication off every marker is ours, whoever granted it.
        assert!(shared.owns(b"") && shared.owns(b"acme"));
        assert!(acme.owns(b"acme"));
        for other in [b"".as_slice(), b"acm", b"acme2", b"globex", b"ACME"] {
            assert!(!acme.owns(other), "{other:?}");
        }
        assert_eq!(shared.lock_domain(b"L"), b"L");
        assert_eq!(acme.lock_domain(b"L"), b"acme/L");
    }
}
