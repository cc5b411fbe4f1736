//! Lease renewals multiplexed over a few long-lived etcd keepalive streams.
//!
//! etcd-client opens one bidirectional stream per `keep_alive(id)` call, and a stream per lease
//! collapses at thousands of leases (etcd#13536). Here a fixed number of shard tasks each own
//! one stream; a renewal for lease `id` goes to shard `id % n`, is written on that shard's
//! stream, and is answered when etcd's response for `id` comes back. A stream that fails or
//! stops answering is re-opened and every outstanding renewal is sent again — keepalives are
//! idempotent, so resending is always safe.
//!
//! Timing guarantee: a caller's answer always comes from a keepalive *sent after the caller
//! asked*. Callers that arrive while a keepalive for the same lease is already on the wire wait
//! for the next one, so a TTL reported to a client is never measured from before its request.
//!
//! A gRPC `LeaseKeepAlive` stream with several renewals under way renews on an etcd stream of
//! its own instead ([`Own`]): each renewal is then one message on each side, with no hand-off to
//! a shard task and back. The shards stay what every other renewal uses, and where such a
//! stream's renewals go once its own etcd stream is lost.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use runtime::backoff::Backoff;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::own::{Opened, Own};
use super::{Etcd, Header, Pinned};
use crate::metrics::Metrics;
use crate::{Error, Result};

const QUEUE: usize = 4096;
/// Pauses between re-opening a failed stream.
const REOPEN: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));

/// Handle for renewing leases over the shared streams. Cheap to clone.
#[derive(Clone)]
pub(crate) struct KeepAlive {
    shards: Vec<mpsc::Sender<Request>>,
    etcd: Etcd,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

struct Request {
    id: i64,
    reply: oneshot::Sender<Renewed>,
}

/// etcd's answer to one keepalive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewed {
    /// The TTL the lease was renewed to; `0` when etcd no longer knows the lease.
    pub(crate) ttl: i64,
    /// The response header, when etcd sent one.
    pub(crate) header: Option<Header>,
}

impl KeepAlive {
    /// Starts `streams` shard tasks (at least one) on `tracker`; they stop when `cancel` fires.
    pub(crate) fn start(
        etcd: &Etcd,
        streams: usize,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let shards = (0..streams.max(1))
            .map(|shard| {
                let (tx, rx) = mpsc::channel(QUEUE);
                let task = Shard::new(etcd.clone(), rx);
                tracker.spawn(task.run(shard, cancel.clone()));
                tx
            })
            .collect();
        Self {
            shards,
            etcd: etcd.clone(),
            timeout: etcd.timeout(),
            metrics: etcd.metrics().clone(),
        }
    }

    /// Opens an etcd keepalive stream of one caller's own, renewing lease `id` to open it (as
    /// etcd-client opens one). That first renewal's answer is consumed opening it.
    pub(crate) async fn open_own(&self, id: i64) -> Opened {
        let Pinned { index, client } = self.etcd.pinned();
        let mut lease = client.lease_client();
        match tokio::time::timeout(self.timeout / 3, lease.keep_alive(id)).await {
            Ok(Ok((keeper, responses))) => Opened::Stream(Box::new(Own::new(
                self.etcd.clone(),
                index,
                (keeper, responses),
                self.timeout / 3,
            ))),
            Ok(Err(e)) if super::is_lease_not_found(&e) => Opened::Gone,
            Ok(Err(e)) => {
                tracing::warn!(member = index, error = %e, "own keepalive stream unavailable");
                self.etcd.unpin(index);
                Opened::Failed
            }
            Err(_) => {
                tracing::warn!(member = index, "own keepalive stream: timed out opening");
                self.etcd.unpin(index);
                Opened::Failed
            }
        }
    }

    /// Renews lease `id` once. Returns the TTL etcd granted, in seconds; `0` means etcd no longer
    /// knows the lease (expired or revoked).
    pub(crate) async fn renew(&self, id: i64) -> Result<i64> {
        Ok(self.renew_with_header(id).await?.ttl)
    }

    /// Like [`KeepAlive::renew`], with etcd's response header.
    pub(crate) async fn renew_with_header(&self, id: i64) -> Result<Renewed> {
        let started = Instant::now();
        let span = tracing::debug_span!(
            "etcd",
            otel.name = "etcd keepalive",
            otel.kind = "client",
            op = "keepalive"
        );
        let renewed = self.renew_on_stream(id).instrument(span).await;
        self.metrics.etcd_request("keepalive", started);
        renewed
    }

    async fn renew_on_stream(&self, id: i64) -> Result<Renewed> {
        let shard = &self.shards[(id.unsigned_abs() % self.shards.len() as u64) as usize];
        let (reply, answer) = oneshot::channel();
        shard
            .send(Request { id, reply })
            .await
            .map_err(|_| Error::ShuttingDown)?;
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(ttl)) => Ok(ttl),
            Ok(Err(_)) => Err(Error::ShuttingDown),
            Err(_) => Err(Error::EtcdTimeout(self.timeout)),
        }
    }
}

/// Renewals waiting for one lease.
#[derive(Default)]
struct Pending {
    /// Answered by the response to the keepalive on the wire (or the next one sent, if none is).
    current: Vec<oneshot::Sender<Renewed>>,
    /// Arrived after `current`'s keepalive was sent; answered by a later one.
    next: Vec<oneshot::Sender<Renewed>>,
    /// When the keepalive for `current` was written on the live stream, if it was.
    sent_at: Option<Instant>,
}

impl Pending {
    fn abandoned(&self) -> bool {
        self.current.iter().chain(&self.next).all(|w| w.is_closed())
    }
}

struct Shard {
    etcd: Etcd,
    timeout: Duration,
    rx: mpsc::Receiver<Request>,
    pending: HashMap<i64, Pending>,
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    /// The etcd member the stream is on.
    member: usize,
    backoff: Backoff,
    retry_at: Instant,
}

impl Shard {
    fn new(etcd: Etcd, rx: mpsc::Receiver<Request>) -> Self {
        Self {
            timeout: etcd.timeout(),
            etcd,
            member: 0,
            rx,
            pending: HashMap::new(),
            stream: None,
            backoff: REOPEN,
            retry_at: Instant::now(),
        }
    }

    async fn run(mut self, shard: usize, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.timeout / 10);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if self.stream.is_none() && !self.pending.is_empty() && Instant::now() >= self.retry_at
            {
                self.open(shard).await;
            }
            let waiting_to_retry = self.stream.is_none() && !self.pending.is_empty();
            tokio::select! {
                _ = cancel.cancelled() => break,
                request = self.rx.recv() => match request {
                    Some(request) => self.enqueue(request).await,
                    None => break,
                },
                message = next_message(&mut self.stream) => match message {
                    Ok(Some((id, renewed))) => {
                        self.backoff.reset();
                        self.answer(id, renewed).await;
                    }
                    Ok(None) => self.lose_stream(shard, "closed by etcd"),
                    Err(e) => self.lose_stream(shard, &e.to_string()),
                },
                _ = tokio::time::sleep_until(self.retry_at), if waiting_to_retry => {}
                _ = tick.tick() => self.check_stalled(shard),
            }
        }
        self.set_stream(None);
    }

    /// Opens a stream, using an outstanding renewal as the first request: etcd-client needs a live
    /// lease to open one. A lease etcd does not know is answered as lost and another is tried.
    async fn open(&mut self, shard: usize) {
        let ids: Vec<i64> = self.pending.keys().copied().collect();
        for id in ids {
            let Pinned { index, client } = self.etcd.pinned();
            self.member = index;
            let mut lease = client.lease_client();
            match tokio::time::timeout(self.timeout / 3, lease.keep_alive(id)).await {
                Ok(Ok(stream)) => {
                    tracing::debug!(shard, member = index, "keepalive stream opened");
                    self.set_stream(Some(stream));
                    // The opening response was consumed by etcd-client; send every outstanding
                    // renewal (the opener included) again on the new stream.
                    let all: Vec<i64> = self.pending.keys().copied().collect();
                    for id in all {
                        if let Some(p) = self.pending.get_mut(&id) {
                            let later = std::mem::take(&mut p.next);
                            p.current.extend(later);
                            p.sent_at = None;
                        }
                        self.send(id).await;
                    }
                    return;
                }
                Ok(Err(e)) if super::is_lease_not_found(&e) => {
                    if let Some(p) = self.pending.remove(&id) {
                        reply_all(
                            p,
                            Renewed {
                                ttl: 0,
                                header: None,
                            },
                        );
                    }
                }
                Ok(Err(e)) => return self.retry_later(shard, &e.to_string()),
                Err(_) => return self.retry_later(shard, "timed out opening"),
            }
        }
    }

    /// Replaces the stream, keeping the count of open streams.
    fn set_stream(&mut self, stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>) {
        let change = i64::from(stream.is_some()) - i64::from(self.stream.is_some());
        self.etcd
            .metrics()
            .keepalive_streams
            .fetch_add(change, Ordering::Relaxed);
        self.stream = stream;
    }

    fn retry_later(&mut self, shard: usize, why: &str) {
        tracing::warn!(shard, reason = why, backoff = ?self.backoff.peek(), "keepalive stream unavailable");
        self.etcd.unpin(self.member);
        self.set_stream(None);
        self.retry_at = Instant::now() + self.backoff.pause();
    }

    fn lose_stream(&mut self, shard: usize, why: &str) {
        for p in self.pending.values_mut() {
            p.sent_at = None;
        }
        self.retry_later(shard, why);
    }

    async fn enqueue(&mut self, request: Request) {
        let entry = self.pending.entry(request.id).or_default();
        if entry.sent_at.is_some() {
            entry.next.push(request.reply);
        } else {
            entry.current.push(request.reply);
            self.send(request.id).await;
        }
    }

    /// Writes a keepalive for `id` on the live stream, if there is one.
    async fn send(&mut self, id: i64) {
        let Some((keeper, _)) = self.stream.as_mut() else {
            return;
        };
        keeper.id = id;
        if keeper.keep_alive().await.is_ok() {
            if let Some(p) = self.pending.get_mut(&id) {
                p.sent_at = Some(Instant::now());
            }
        } else {
            self.set_stream(None);
            for p in self.pending.values_mut() {
                p.sent_at = None;
            }
        }
    }

    async fn answer(&mut self, id: i64, renewed: Renewed) {
        let Some(p) = self.pending.get_mut(&id) else {
            return;
        };
        let renewed = Renewed {
            ttl: renewed.ttl.max(0),
            ..renewed
        };
        for waiter in p.current.drain(..) {
            let _ = waiter.send(renewed);
        }
        p.sent_at = None;
        if renewed.ttl == 0 || p.next.iter().all(|w| w.is_closed()) {
            if let Some(p) = self.pending.remove(&id) {
                reply_all(p, renewed);
            }
        } else {
            p.current = std::mem::take(&mut p.next);
            self.send(id).await;
        }
    }

    /// A stream that leaves a keepalive unanswered past the deadline is presumed dead (a
    /// partitioned member answers nothing): drop it, so the next turn re-opens and resends.
    fn check_stalled(&mut self, shard: usize) {
        self.pending.retain(|_, p| !p.abandoned());
        let stalled = self
            .pending
            .values()
            .filter_map(|p| p.sent_at)
            .any(|sent| sent.elapsed() > self.timeout / 3);
        if stalled && self.stream.is_some() {
            self.lose_stream(shard, "keepalive unanswered");
        }
    }
}

fn reply_all(p: Pending, renewed: Renewed) {
    for waiter in p.current.into_iter().chain(p.next) {
        let _ = waiter.send(renewed);
    }
}

async fn next_message(
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
) -> Result<Option<(i64, Renewed)>, etcd_client::Error> {
    match stream {
        Some((_, responses)) => Ok(responses.message().await?.map(|r| {
            (
                r.id(),
                Renewed {
                    ttl: r.ttl(),
                    header: r.header().map(Header::from),
                },
            )
        })),
        None => std::future::pending().await,
    }
}
