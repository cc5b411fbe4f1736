//! The proxy's use of etcd: a handful of calls, each bounded by a timeout, plus the long-lived
//! streams (keepalive, watch) in the submodules.

mod batch;
mod create;
mod deletions;
mod fleet;
mod keepalive;
mod own;
mod rewatch;

pub(crate) use batch::{Batching, GroupCommit, ETCD_MAX_TXN_OPS};
pub(crate) use create::{Companion, Counted, Create, Creation, Quota};
pub(crate) use deletions::{Deleted, Deletions};
pub(crate) use fleet::{Guarded, Listed, Unchanged};
pub(crate) use keepalive::{KeepAlive, Renewed};
pub(crate) use own::{Opened, Own};
pub(crate) use rewatch::reopening;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use etcd_client::{
    Client, ConnectOptions, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget,
};

use runtime::backoff::Backoff;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::metrics::Metrics;
use crate::{Error, Result};

/// etcd's smallest lease TTL with default election timing; shorter TTLs are silently raised by
/// etcd, so the proxy refuses them instead.
pub(crate) const ETCD_MIN_TTL: u64 = 2;

/// How often the gRPC connection to etcd is pinged while streams are open: twice etcd's default
/// `--grpc-keepalive-min-time`, so timer jitter never makes two pings look too close.
const KEEPALIVE_PING_INTERVAL: Duration = Duration::from_secs(10);

/// How long a background revoke of a lease nobody may use is retried.
const REVOKE_RETRIES_FOR: Duration = Duration::from_secs(30);

/// Largest watch response accepted (etcd-client's default is 4 MiB). A watch that falls behind
/// gets up to 1,000 revisions per response, and a revoked session deletes all of its keys in one
/// revision; the event stream asks etcd to fragment responses, the holder and deletion watches
/// re-list when a response is refused.
const MAX_WATCH_MESSAGE: usize = 64 * 1024 * 1024;

/// Largest answer to a client's own KV call (`/v3` and gRPC: Range, DeleteRange with
/// `prev_kv`, Txn) read from etcd: what etcd sends (its gRPC server's send limit) and Go's
/// clientv3 reads (`MaxCallRecvMsgSize`), both `math.MaxInt32`, where etcd-client's default is
/// tonic's 4 MiB — so a Range that works against etcd works through the proxy.
pub(crate) const MAX_KV_ANSWER: usize = i32::MAX as usize;

/// `client`'s KV service, reading answers up to [`MAX_KV_ANSWER`]: for the calls a client
/// makes, whose answers are as large as the client's own keys.
pub(crate) fn client_kv(client: &Client) -> etcd_client::KvClient {
    client.kv_client().max_decoding_message_size(MAX_KV_ANSWER)
}

/// A lease etcd granted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Granted {
    pub(crate) id: i64,
    /// The TTL etcd granted, in seconds (it may raise a short one).
    pub(crate) ttl: i64,
}

/// How many keys a range holds, read at `revision`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RangeCount {
    pub(crate) count: i64,
    pub(crate) revision: i64,
}

/// One page of a range read.
#[derive(Debug)]
pub(crate) struct RangePage {
    /// The keys, in key order.
    pub(crate) kvs: Vec<KeyValue>,
    /// Whether more keys follow the last one.
    pub(crate) more: bool,
    /// The revision read at.
    pub(crate) revision: i64,
}

/// A cheap-to-clone handle on the etcd cluster with a per-call deadline.
///
/// One client per endpoint, one of them *pinned* at a time (as etcd's own clientv3 does). A call
/// that fails because the member is gone, partitioned or without a leader unpins it and is
/// retried on the next member within the same deadline. (tonic's balancer keeps sending a share
/// of calls to a dead member, so the proxy does its own failover.)
#[derive(Clone)]
pub(crate) struct Etcd {
    inner: Arc<Inner>,
}

struct Inner {
    clients: Vec<Arc<Client>>,
    endpoints: Vec<String>,
    pinned: AtomicUsize,
    timeout: Duration,
    metrics: Arc<Metrics>,
    /// Where background clean-ups run (tracked, joined at shutdown), and what stops them.
    tracker: TaskTracker,
    stopping: CancellationToken,
}

/// An etcd response header, as etcd's JSON gateway prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) cluster_id: u64,
    pub(crate) member_id: u64,
    pub(crate) revision: i64,
    pub(crate) raft_term: u64,
}

impl From<&etcd_client::ResponseHeader> for Header {
    fn from(h: &etcd_client::ResponseHeader) -> Self {
        Self {
            cluster_id: h.cluster_id(),
            member_id: h.member_id(),
            revision: h.revision(),
            raft_term: h.raft_term(),
        }
    }
}

impl From<Header> for etcd_client::proto::PbResponseHeader {
    fn from(h: Header) -> Self {
        Self {
            cluster_id: h.cluster_id,
            member_id: h.member_id,
            revision: h.revision,
            raft_term: h.raft_term,
        }
    }
}

impl Header {
    /// The gateway's JSON form: 64-bit numbers as strings, zero fields omitted.
    pub(crate) fn to_json(self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (name, value, zero) in [
            (
                "cluster_id",
                self.cluster_id.to_string(),
                self.cluster_id == 0,
            ),
            ("member_id", self.member_id.to_string(), self.member_id == 0),
            ("revision", self.revision.to_string(), self.revision == 0),
            ("raft_term", self.raft_term.to_string(), self.raft_term == 0),
        ] {
            if !zero {
                m.insert(name.to_owned(), serde_json::Value::String(value));
            }
        }
        serde_json::Value::Object(m)
    }
}

/// The client of the pinned member, with its index so a failure can unpin exactly it.
pub(crate) struct Pinned {
    pub(crate) index: usize,
    /// Shared, not cloned: a `Client` is a dozen service handles, each cloned with it.
    pub(crate) client: Arc<Client>,
}

/// How the proxy proves itself to etcd and verifies it: TLS (`https://` endpoints) and etcd's
/// own authentication.
#[derive(Debug, Clone, Default)]
pub(crate) struct Access {
    /// TLS options for `https://` endpoints.
    pub(crate) tls: Option<etcd_client::TlsOptions>,
    /// User and password, when etcd's authentication is on.
    pub(crate) user: Option<(String, String)>,
}

impl Access {
    /// From the (validated) settings: TLS for `endpoints` that are `https://`, verified and
    /// presented as `files` say, and etcd's user and password.
    pub(crate) fn new(
        endpoints: &[String],
        files: &runtime::tls::ClientFiles,
        user: Option<(String, String)>,
    ) -> std::result::Result<Self, String> {
        let https = endpoints.iter().any(|e| e.starts_with("https://"));
        let tls = if https {
            let read =
                |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
            let mut tls = etcd_client::TlsOptions::new();
            tls = match &files.ca {
                Some(ca) => tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?)),
                None => tls.with_native_roots(),
            };
            if let (Some(cert), Some(key)) = (&files.cert, &files.key) {
                tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
            }
            Some(tls)
        } else {
            None
        };
        Ok(Self { tls, user })
    }
}

impl Etcd {
    /// Prepares clients for the given endpoints (connections are made lazily). Calls fail with
    /// [`Error::EtcdTimeout`] after `timeout`; a member that has lost its leader refuses at once
    /// (require-leader), so the call moves on to another member. Background clean-ups (a
    /// revoke nobody waits for) run on `tracker` and stop retrying once `stopping` fires.
    pub(crate) async fn connect(
        endpoints: &[String],
        timeout: Duration,
        metrics: Arc<Metrics>,
        access: &Access,
        tracker: &TaskTracker,
        stopping: CancellationToken,
    ) -> Result<Self> {
        // HTTP/2 pings within what etcd's defaults accept: a member closes the connection
        // (GOAWAY "too_many_pings") after a few pings less than `--grpc-keepalive-min-time`
        // (5 s) apart, or any ping with no stream open (`--grpc-keepalive-permit-without-stream`
        // off). Every ping it refuses cost the watch and every keepalive stream.
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout / 3)
            .with_keep_alive(KEEPALIVE_PING_INTERVAL, timeout / 3)
            .with_keep_alive_while_idle(false)
            .with_require_leader(true);
        let options = match &access.tls {
            Some(tls) => options.with_tls(tls.clone()),
            None => options,
        };
        // etcd's auth tokens expire (simple tokens after 5 idle minutes, JWTs at their `exp`):
        // an expired one is renewed once and the request retried.
        let options = match &access.user {
            Some((user, password)) => options
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true),
            None => options,
        };
        let mut clients = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            clients.push(Arc::new(
                Client::connect([endpoint], Some(options.clone())).await?,
            ));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                clients,
                endpoints: endpoints.to_vec(),
                pinned: AtomicUsize::new(0),
                timeout,
                metrics,
                tracker: tracker.clone(),
                stopping,
            }),
        })
    }

    /// The pinned member's client, for the stream tasks.
    pub(crate) fn pinned(&self) -> Pinned {
        let index = self.inner.pinned.load(Ordering::Relaxed) % self.inner.clients.len();
        Pinned {
            index,
            client: self.inner.clients[index].clone(),
        }
    }

    /// The client URL of member `index`.
    pub(crate) fn endpoint(&self, index: usize) -> &str {
        &self.inner.endpoints[index % self.inner.endpoints.len()]
    }

    /// Moves away from member `index` if it is still the pinned one.
    pub(crate) fn unpin(&self, index: usize) {
        let next = (index + 1) % self.inner.clients.len();
        if self
            .inner
            .pinned
            .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && self.inner.clients.len() > 1
        {
            tracing::info!(from = index, to = next, "etcd endpoint failed over");
        }
    }

    /// Opens a watch of `prefix` on the pinned member within the call deadline (its responses up
    /// to [`MAX_WATCH_MESSAGE`]); on failure the
    /// member is unpinned and `None` returned (`what` names the watch in the log). Gives the
    /// member's index too, to unpin it when the stream fails later.
    pub(crate) async fn open_watch(
        &self,
        prefix: impl Into<Vec<u8>>,
        options: etcd_client::WatchOptions,
        what: &str,
    ) -> Option<(usize, etcd_client::WatchStream)> {
        let Pinned { index, client } = self.pinned();
        let mut watch = client
            .watch_client()
            .max_decoding_message_size(MAX_WATCH_MESSAGE);
        match tokio::time::timeout(self.timeout(), watch.watch(prefix, Some(options))).await {
            Ok(Ok(stream)) => Some((index, stream)),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot open the {what} watch");
                self.unpin(index);
                None
            }
            Err(_) => {
                tracing::warn!("opening the {what} watch timed out");
                self.unpin(index);
                None
            }
        }
    }

    /// The per-call deadline.
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The proxy's metrics.
    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// [`Etcd::attempts`] of the etcd request `op`, in a span of its own, its duration recorded
    /// whatever the outcome. For calls that are safe to repeat.
    pub(crate) async fn bounded<T, F, Fut>(&self, op: &'static str, call: F) -> Result<T>
    where
        F: FnMut(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let started = Instant::now();
        let span = tracing::debug_span!("etcd", otel.name = %format_args!("etcd {op}"), otel.kind = "client", op);
        let result = self.attempts(call).instrument(span).await;
        self.inner.metrics.etcd_request(op, started);
        result
    }

    /// Like [`Etcd::bounded`], for a call that must not take effect twice (a write whose outcome
    /// a timeout leaves unknown, as etcd's own client treats mutations): it is tried on another
    /// member only after a failure that shows it never reached etcd (no connection, no leader).
    /// An attempt that times out or fails otherwise unpins its member and ends the call, with
    /// the whole deadline as its budget.
    pub(crate) async fn bounded_once<T, F, Fut>(&self, op: &'static str, mut call: F) -> Result<T>
    where
        F: FnMut(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let started = Instant::now();
        let span = tracing::debug_span!("etcd", otel.name = %format_args!("etcd {op}"), otel.kind = "client", op);
        let timeout = self.inner.timeout;
        let deadline = started + timeout;
        let result = async {
            let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(200));
            loop {
                let Pinned { index, client } = self.pinned();
                match tokio::time::timeout_at(deadline, call(client)).await {
                    Ok(Ok(value)) => return Ok(value),
                    Ok(Err(e)) if is_undelivered(&e) => {
                        self.unpin(index);
                        if Instant::now() + backoff.peek() >= deadline {
                            return Err(Error::Etcd(e));
                        }
                    }
                    Ok(Err(e)) => {
                        if is_member_failure(&e) {
                            self.unpin(index);
                        }
                        return Err(Error::Etcd(e));
                    }
                    Err(_) => {
                        self.unpin(index);
                        return Err(Error::EtcdTimeout(timeout));
                    }
                }
                tokio::time::sleep(backoff.pause()).await;
            }
        }
        .instrument(span)
        .await;
        self.inner.metrics.etcd_request(op, started);
        result
    }

    /// Runs `call` on the pinned member; on a failure that another member may not have, unpins
    /// and retries until the deadline. Every call passed here is safe to repeat.
    async fn attempts<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let timeout = self.inner.timeout;
        let deadline = Instant::now() + timeout;
        // Each attempt gets a share of the deadline, so a hung member leaves time for another.
        let attempt_budget = timeout / 3;
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(200));
        loop {
            let Pinned { index, client } = self.pinned();
            let attempt_deadline = (Instant::now() + attempt_budget).min(deadline);
            match tokio::time::timeout_at(attempt_deadline, call(client)).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if !is_member_failure(&e) => return Err(Error::Etcd(e)),
                Ok(Err(e)) => {
                    self.unpin(index);
                    if Instant::now() + backoff.peek() >= deadline {
                        return Err(Error::Etcd(e));
                    }
                    tracing::debug!(error = %e, "etcd call failed; retrying on another member");
                }
                Err(_) => {
                    self.unpin(index);
                    if Instant::now() + backoff.peek() >= deadline {
                        return Err(Error::EtcdTimeout(timeout));
                    }
                }
            }
            tokio::time::sleep(backoff.pause()).await;
        }
    }

    /// Grants a lease of `ttl` seconds.
    pub(crate) async fn grant(&self, ttl: u64) -> Result<Granted> {
        let ttl = i64::try_from(ttl).unwrap_or(i64::MAX);
        let resp = self
            .bounded("grant", |c| async move {
                c.lease_client().grant(ttl, None).await
            })
            .await?;
        Ok(Granted {
            id: resp.id(),
            ttl: resp.ttl(),
        })
    }

    /// Revokes a lease, deleting every key attached to it. A lease that is already gone is not
    /// an error: revocation is idempotent.
    pub(crate) async fn revoke(&self, id: i64) -> Result<()> {
        self.revoke_existing(id).await.map(|_| ())
    }

    /// Like [`Etcd::revoke`]; `true` when the lease still existed (this call ended it, or a
    /// concurrent one did while it was retried).
    pub(crate) async fn revoke_existing(&self, id: i64) -> Result<bool> {
        match self
            .bounded(
                "revoke",
                |c| async move { c.lease_client().revoke(id).await },
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(Error::Etcd(e)) if is_lease_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Runs `task` on the proxy's task tracker, so shutdown waits for it: it must end soon once
    /// the proxy stops (see [`Etcd::connect`]).
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.inner.tracker.spawn(task);
    }

    /// Revokes a lease without waiting, used to clean up after a failed acquire (the lease may
    /// carry a key nobody was told of). Retried while etcd is unreachable, for up to
    /// [`REVOKE_RETRIES_FOR`]; if every try fails the lease lapses by its TTL.
    pub(crate) fn revoke_in_background(&self, id: i64) {
        let etcd = self.clone();
        self.spawn(async move {
            let give_up = Instant::now() + REVOKE_RETRIES_FOR;
            let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
            loop {
                match etcd.revoke(id).await {
                    Ok(()) => return,
                    Err(e) if Instant::now() + backoff.peek() >= give_up => {
                        tracing::debug!(lease_id = id, error = %e, "revoking an unused lease failed; it will lapse");
                        return;
                    }
                    Err(_) => {}
                }
                tokio::select! {
                    () = etcd.inner.stopping.cancelled() => return,
                    () = tokio::time::sleep(backoff.pause()) => {}
                }
            }
        });
    }

    /// Remaining whole seconds of a lease, or `None` if it no longer exists.
    pub(crate) async fn time_to_live(&self, id: i64) -> Result<Option<i64>> {
        let resp = self
            .bounded("time_to_live", |c| async move {
                c.lease_client().time_to_live(id, None).await
            })
            .await?;
        Ok((resp.ttl() >= 0).then_some(resp.ttl()))
    }

    /// Remaining whole seconds of a lease and the keys attached to it, or `None` if it no
    /// longer exists.
    pub(crate) async fn lease_keys(&self, id: i64) -> Result<Option<(i64, Vec<Vec<u8>>)>> {
        let resp = self
            .bounded("time_to_live", |c| async move {
                let options = etcd_client::LeaseTimeToLiveOptions::new().with_keys();
                c.lease_client().time_to_live(id, Some(options)).await
            })
            .await?;
        Ok((resp.ttl() >= 0).then(|| (resp.ttl(), resp.keys().to_vec())))
    }

    /// A fresh response header (a linearizable read of a key nobody writes).
    pub(crate) async fn header(&self) -> Result<Header> {
        let resp = self
            .bounded("get", |c| async move {
                c.kv_client().get("\0lease-proxy-header", None).await
            })
            .await?;
        resp.header()
            .map(Header::from)
            .ok_or_else(|| Error::CorruptRecord {
                key: String::new(),
                reason: "etcd answered without a header".into(),
            })
    }

    /// How many keys lie in `start..end` (a linearizable read).
    pub(crate) async fn count(&self, start: &[u8], end: &[u8]) -> Result<RangeCount> {
        let options = GetOptions::new().with_range(end).with_count_only();
        let resp = self
            .bounded("count", |c| {
                let options = options.clone();
                async move { c.kv_client().get(start, Some(options)).await }
            })
            .await?;
        let revision = resp
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| Error::CorruptRecord {
                key: String::new(),
                reason: "etcd answered without a header".into(),
            })?;
        Ok(RangeCount {
            count: resp.count(),
            revision,
        })
    }

    /// Puts `value` at `key`, attached to `lease`.
    pub(crate) async fn put_value_with_lease(
        &self,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<()> {
        self.bounded("put", |c| async move {
            c.kv_client()
                .put(key, value, Some(PutOptions::new().with_lease(lease)))
                .await
        })
        .await?;
        Ok(())
    }

    /// Puts an empty value at `key` (a name nobody else uses) attached to `lease`, and returns
    /// the key's create revision. Safe to repeat: a retry that finds the key already written by
    /// its first attempt reports that attempt's create revision (etcd's previous value).
    pub(crate) async fn put_unique(&self, key: &str, lease: i64) -> Result<i64> {
        let resp = self
            .bounded("put", |c| async move {
                let options = PutOptions::new().with_lease(lease).with_prev_key();
                c.kv_client().put(key, "", Some(options)).await
            })
            .await?;
        match (resp.prev_key(), resp.header()) {
            (Some(prev), _) => Ok(prev.create_revision()),
            (None, Some(header)) => Ok(header.revision()),
            (None, None) => Err(Error::CorruptRecord {
                key: key.to_owned(),
                reason: "etcd answered a put without a header".into(),
            }),
        }
    }

    /// Deletes `key` (nothing if it does not exist). Safe to repeat.
    pub(crate) async fn delete(&self, key: &str) -> Result<()> {
        self.bounded("delete", |c| async move {
            c.kv_client().delete(key, None).await
        })
        .await?;
        Ok(())
    }

    /// The key under `prefix` created last before `before` (create revision below it), if any
    /// — etcd's `concurrency.Mutex` way of finding the waiter just ahead. Linearizable.
    pub(crate) async fn last_created_before(
        &self,
        prefix: &str,
        before: i64,
    ) -> Result<Option<Vec<u8>>> {
        // etcd reads a maximum of 0 as "no bound"; no key has a create revision below 2.
        if before <= 1 {
            return Ok(None);
        }
        let end = prefix_end(prefix.as_bytes());
        let mut resp = self
            .bounded("range", |c| {
                let end = end.clone();
                async move {
                    let options = GetOptions::new()
                        .with_range(end)
                        .with_max_create_revision(before - 1)
                        .with_sort(SortTarget::Create, SortOrder::Descend)
                        .with_limit(1)
                        .with_keys_only();
                    c.kv_client().get(prefix, Some(options)).await
                }
            })
            .await?;
        Ok(resp
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| kv.key().to_vec()))
    }

    /// A key's current value by raw bytes, linearizably.
    pub(crate) async fn get_bytes(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        let mut resp = self
            .bounded("get", |c| async move { c.kv_client().get(key, None).await })
            .await?;
        Ok(resp.take_kvs().into_iter().next())
    }

    /// The key's current value, linearizably, and the header of that read.
    pub(crate) async fn get_with_header(&self, key: &str) -> Result<(Option<KeyValue>, Header)> {
        let mut resp = self
            .bounded("get", |c| async move { c.kv_client().get(key, None).await })
            .await?;
        let header = resp
            .header()
            .map(Header::from)
            .ok_or_else(|| Error::CorruptRecord {
                key: String::new(),
                reason: "etcd answered without a header".into(),
            })?;
        Ok((resp.take_kvs().into_iter().next(), header))
    }

    /// The key's current value, linearizably.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let mut resp = self
            .bounded("get", |c| async move { c.kv_client().get(key, None).await })
            .await?;
        Ok(resp.take_kvs().into_iter().next())
    }

    /// Keys in `[start, end)` at `revision` (0: the latest), at most `limit`.
    pub(crate) async fn range_at(
        &self,
        start: &[u8],
        end: &[u8],
        limit: i64,
        revision: i64,
    ) -> Result<RangePage> {
        let mut resp = self
            .bounded("range", |c| async move {
                let options = GetOptions::new()
                    .with_range(end)
                    .with_limit(limit)
                    .with_revision(revision);
                c.kv_client().get(start, Some(options)).await
            })
            .await?;
        let at = resp.header().map(|h| h.revision()).unwrap_or(revision);
        Ok(RangePage {
            more: resp.more(),
            kvs: resp.take_kvs(),
            revision: at,
        })
    }

    /// Keys in `[start, end)` in key order, at most `limit`, at the latest revision.
    pub(crate) async fn range(&self, start: &[u8], end: &[u8], limit: i64) -> Result<RangePage> {
        self.range_at(start, end, limit, 0).await
    }
}

/// Whether another member might succeed where this one failed: the member is unreachable,
/// has no leader, or lost its leader mid-request (etcd answers all of those as Unavailable).
fn is_member_failure(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        _ => false,
    }
}

/// Whether a failed call certainly never reached etcd's state machine, so that trying it on
/// another member cannot make it take effect twice: the connection could not be made, or the
/// member refused it for want of a leader (require-leader) before proposing anything.
fn is_undelivered(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::Unavailable && {
                let message = status.message();
                message.contains("no leader")
                    || message.contains("error trying to connect")
                    || message.contains("tcp connect error")
            }
        }
        _ => false,
    }
}

/// etcd's answer for a lease id it does not know.
fn is_lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => status.code() == tonic::Code::NotFound,
        etcd_client::Error::LeaseKeepAliveError(msg) => msg.contains("not found"),
        _ => false,
    }
}

/// The end of the key range holding every key that starts with `prefix` (etcd's prefix end).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): the range runs to the end of the keyspace.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
