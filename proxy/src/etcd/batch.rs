//! Group commit: independent transactions that arrive together share one raft proposal.
//!
//! Every create-if-absent (an acquire, with or without a session) and every compare-and-delete
//! of a session grant is a small transaction of its own. Submitted here, it waits in a queue;
//! one batcher task takes what has queued — up to `--batch-max` transactions, after lingering
//! up to `--batch-linger` for more — and sends them as the nested `Txn`s of one outer `Txn`
//! (etcd ≥ 3.3 executes a `Txn` op as a transaction, with its own compares and outcome). While
//! `--batch-in-flight` batches are with etcd, arrivals keep queueing, so batches grow with load
//! and a lone request is sent at once.
//!
//! What keeps each transaction's outcome its own:
//! - etcd evaluates every compare of the outer transaction (the nested ones included) on the
//!   state *before* the batch, and refuses a transaction that writes one key twice. So two
//!   transactions that touch one key (the same resource, or the same principal's quota range)
//!   never share a batch: each declares its keys, and a transaction conflicting with one already
//!   taken waits for the next batch, keeping its place in line.
//! - A batch etcd *rejects* before applying anything (a lease that lapsed meanwhile, a request
//!   too large: `InvalidArgument`, `NotFound`, `FailedPrecondition`) is split: each transaction is
//!   sent again on its own and gets its own answer. Nothing of the batch took effect, so
//!   nothing is done twice. (Each split is counted. Markers guard their lease with a compare,
//!   so a lapsed one fails alone without a split: see `GroupCommit::mark`.)
//! - Any other failure (a timeout, a connection lost mid-request) leaves the outcome of the
//!   whole batch unknown, exactly as it leaves a lone transaction's: every transaction of the
//!   batch is answered with the error, and its caller cleans up as for an unknown outcome. A
//!   batch is sent with [`Etcd::bounded_once`], so it is repeated only after a failure that
//!   shows it never reached etcd (docs/ARCHITECTURE.md, "etcd access and group commit").
//!
//! The batcher and every batch in flight are owned by the server's task tracker; a caller that
//! goes away (its future dropped) leaves its transaction to run to its end, and the answer is
//! dropped. Every transaction carries a deadline: one that has waited in the queue past it is
//! answered with a timeout without being sent.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Txn, TxnOp, TxnOpResponse};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::Etcd;
use crate::{Error, Result};

/// The most transactions etcd accepts as the operations of one transaction
/// (`--max-txn-ops`, default 128).
pub(crate) const ETCD_MAX_TXN_OPS: usize = 128;

/// The most request bytes one batch may carry (etcd refuses requests above
/// `--max-request-bytes`, 1.5 MiB by default); a larger transaction goes alone.
const MAX_BATCH_BYTES: usize = 1024 * 1024;

/// Transactions waiting for a batch, at most.
const QUEUE: usize = 16_384;

/// How batches are formed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Batching {
    /// Most transactions in one batch (1 turns group commit off).
    pub(crate) max: usize,
    /// How long the first transaction of a batch waits for more (0: send what has queued).
    pub(crate) linger: Duration,
    /// Batches with etcd at once; while all are out, transactions queue.
    pub(crate) in_flight: usize,
}

/// A transaction's outcome.
#[derive(Debug)]
pub(crate) struct Committed {
    /// Whether its compares held.
    pub(crate) succeeded: bool,
    /// The responses of the branch that ran.
    pub(crate) responses: Vec<TxnOpResponse>,
    /// The revision of the batch (every write of a batch has it).
    pub(crate) revision: i64,
}

struct Job {
    /// Keys (and key ranges, by their start) the transaction reads or writes.
    keys: Vec<Vec<u8>>,
    txn: Txn,
    bytes: usize,
    deadline: Instant,
    reply: oneshot::Sender<Result<Committed>>,
    /// The submitting request's span: a batch's etcd call joins its first transaction's trace.
    span: tracing::Span,
}

/// Handle on the batcher. Cheap to clone.
#[derive(Clone)]
pub(crate) struct GroupCommit {
    queue: mpsc::Sender<Job>,
    timeout: Duration,
    metrics: Arc<crate::metrics::Metrics>,
}

impl GroupCommit {
    /// Starts the batcher on `tracker`; it stops when `stop` fires (after the drain: requests
    /// still being served keep their batches).
    pub(crate) fn start(
        etcd: &Etcd,
        batching: Batching,
        tracker: &TaskTracker,
        stop: CancellationToken,
    ) -> Self {
        let (queue, jobs) = mpsc::channel(QUEUE);
        let batching = Batching {
            max: batching.max.clamp(1, ETCD_MAX_TXN_OPS),
            in_flight: batching.in_flight.max(1),
            linger: batching.linger,
        };
        tracker.spawn(run(etcd.clone(), jobs, batching, tracker.clone(), stop));
        Self {
            queue,
            timeout: etcd.timeout(),
            metrics: etcd.metrics().clone(),
        }
    }

    /// Runs `txn`, which touches only `keys` (exact keys, or the start of a range it compares),
    /// in the next batch that has none of them. `bytes` is its approximate size; `op` names it
    /// in traces and in the etcd request histogram (its time there includes the wait for its
    /// batch). Answers the transaction's own outcome; an error leaves the outcome unknown unless
    /// the caller can tell otherwise from the error.
    pub(crate) async fn commit(
        &self,
        op: &'static str,
        keys: Vec<Vec<u8>>,
        txn: Txn,
        bytes: usize,
    ) -> Result<Committed> {
        let started = Instant::now();
        let span = tracing::debug_span!("etcd", otel.name = %format_args!("etcd {op}"), otel.kind = "client", op);
        let (reply, answer) = oneshot::channel();
        let job = Job {
            keys,
            txn,
            bytes,
            deadline: started + self.timeout,
            reply,
            span: span.clone(),
        };
        let result = async {
            self.queue
                .send(job)
                .await
                .map_err(|_| Error::ShuttingDown)?;
            // The batch answers within its own deadline; this bound only guards against a
            // batcher that is gone.
            match tokio::time::timeout(self.timeout * 3, answer).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(Error::ShuttingDown),
                Err(_) => Err(Error::EtcdTimeout(self.timeout)),
            }
        }
        .instrument(span)
        .await;
        self.metrics.etcd_request(op, started);
        result
    }
}

/// The batcher: forms batches and hands each to a task of its own.
async fn run(
    etcd: Etcd,
    mut jobs: mpsc::Receiver<Job>,
    batching: Batching,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(batching.in_flight));
    // Transactions passed over for conflicting with a batch, oldest first.
    let mut waiting: VecDeque<Job> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            tokio::select! {
                () = stop.cancelled() => return,
                job = jobs.recv() => match job {
                    Some(job) => waiting.push_back(job),
                    None => return,
                },
            }
        }
        let slot = tokio::select! {
            () = stop.cancelled() => return,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
        };
        let linger_until = Instant::now() + batching.linger;
        let mut batch = Batch::default();
        let mut passed_over = VecDeque::new();
        // Those that waited first, then what queued meanwhile, then (lingering) what comes.
        while let Some(job) = waiting.pop_front() {
            if let Some(job) = batch.add(job, batching.max) {
                passed_over.push_back(job);
            }
        }
        while batch.jobs.len() < batching.max {
            let job = match jobs.try_recv() {
                Ok(job) => job,
                Err(_) if batching.linger.is_zero() || batch.jobs.is_empty() => break,
                Err(_) => tokio::select! {
                    () = tokio::time::sleep_until(linger_until) => break,
                    job = jobs.recv() => match job {
                        Some(job) => job,
                        None => break,
                    },
                },
            };
            if let Some(job) = batch.add(job, batching.max) {
                passed_over.push_back(job);
            }
        }
        waiting = passed_over;
        if batch.jobs.is_empty() {
            continue;
        }
        tracker.spawn(execute(etcd.clone(), batch.jobs, slot));
    }
}

#[derive(Default)]
struct Batch {
    jobs: Vec<Job>,
    keys: HashSet<Vec<u8>>,
    bytes: usize,
}

impl Batch {
    /// Takes `job` unless it conflicts with the batch or the batch is full (then it is given
    /// back); expired jobs are answered here.
    fn add(&mut self, job: Job, max: usize) -> Option<Job> {
        if job.deadline <= Instant::now() {
            let _ = job.reply.send(Err(Error::EtcdTimeout(Duration::ZERO)));
            return None;
        }
        let full = self.jobs.len() >= max
            || (!self.jobs.is_empty() && self.bytes + job.bytes > MAX_BATCH_BYTES);
        if full || job.keys.iter().any(|k| self.keys.contains(k)) {
            return Some(job);
        }
        self.keys.extend(job.keys.iter().cloned());
        self.bytes += job.bytes;
        self.jobs.push(job);
        None
    }
}

/// Sends one batch and answers each of its transactions; the slot is freed when it is done.
async fn execute(etcd: Etcd, jobs: Vec<Job>, slot: OwnedSemaphorePermit) {
    let span = jobs
        .first()
        .map_or_else(tracing::Span::none, |j| j.span.clone());
    send(etcd, jobs, slot).instrument(span).await;
}

async fn send(etcd: Etcd, jobs: Vec<Job>, slot: OwnedSemaphorePermit) {
    let n = jobs.len();
    etcd.metrics().batch_size(n);
    if n == 1 {
        let mut jobs = jobs;
        if let Some(job) = jobs.pop() {
            let result = alone(&etcd, &job.txn).await;
            let _ = job.reply.send(result);
        }
        drop(slot);
        return;
    }
    let outer = Txn::new().and_then(
        jobs.iter()
            .map(|j| TxnOp::txn(j.txn.clone()))
            .collect::<Vec<_>>(),
    );
    let result = etcd
        .bounded_once("batch", |c| {
            let outer = outer.clone();
            async move { c.kv_client().txn(outer).await }
        })
        .await;
    match result {
        Ok(resp) => {
            let revision = resp.header().map(|h| h.revision()).unwrap_or_default();
            let mut inner = resp.op_responses().into_iter();
            for job in jobs {
                let outcome = match inner.next() {
                    Some(TxnOpResponse::Txn(t)) => Ok(Committed {
                        succeeded: t.succeeded(),
                        responses: t.op_responses(),
                        revision,
                    }),
                    _ => Err(Error::CorruptRecord {
                        key: String::new(),
                        reason: "etcd answered a batch without one response per transaction".into(),
                    }),
                };
                let _ = job.reply.send(outcome);
            }
            drop(slot);
        }
        Err(Error::Etcd(e)) if is_rejected(&e) => {
            // Nothing of the batch was applied: each transaction on its own.
            tracing::debug!(error = %e, transactions = n, "batch refused by etcd; sending each transaction alone");
            etcd.metrics().batch_splits.add(1, &[]);
            drop(slot);
            let singles = jobs.into_iter().map(|job| {
                let etcd = etcd.clone();
                let span = job.span.clone();
                async move {
                    let result = alone(&etcd, &job.txn).await;
                    let _ = job.reply.send(result);
                }
                .instrument(span)
            });
            futures::future::join_all(singles).await;
        }
        Err(e) => {
            drop(slot);
            for job in jobs {
                let _ = job.reply.send(Err(share(&e)));
            }
        }
    }
}

/// One transaction, not nested.
async fn alone(etcd: &Etcd, txn: &Txn) -> Result<Committed> {
    let resp = etcd
        .bounded_once("batch", |c| {
            let txn = txn.clone();
            async move { c.kv_client().txn(txn).await }
        })
        .await?;
    Ok(Committed {
        succeeded: resp.succeeded(),
        revision: resp.header().map(|h| h.revision()).unwrap_or_default(),
        responses: resp.op_responses(),
    })
}

/// Whether etcd refused the request as a whole before applying any of it: a malformed or
/// oversized request, or a put naming a lease that no longer exists (checked before any write
/// of the transaction is made).
fn is_rejected(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            tonic::Code::InvalidArgument | tonic::Code::NotFound | tonic::Code::FailedPrecondition
        ),
        _ => false,
    }
}

/// The error of a batch, for each of its transactions.
fn share(e: &Error) -> Error {
    match e {
        Error::EtcdTimeout(d) => Error::EtcdTimeout(*d),
        Error::ShuttingDown => Error::ShuttingDown,
        other => Error::EtcdBatch(other.to_string()),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;

    use etcd_client::{Compare, CompareOp, PutOptions};
    use lease_proxy_testkit::Etcd as TestEtcd;

    use super::*;
    use crate::metrics::Metrics;

    /// A single-member etcd and the proxy's handle on it.
    pub(in crate::etcd) async fn etcd() -> (TestEtcd, Etcd) {
        let cluster = TestEtcd::single().await;
        let metrics = Arc::new(Metrics::new().unwrap());
        let etcd = Etcd::connect(
            &cluster.endpoints(),
            Duration::from_secs(3),
            metrics,
            &super::super::Access::default(),
            &TaskTracker::new(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        (cluster, etcd)
    }

    /// A batcher lingering 300 ms (what is submitted together shares as few batches as
    /// allowed), its tracker and its stop token.
    pub(in crate::etcd) fn lingering(
        etcd: &Etcd,
        in_flight: usize,
    ) -> (GroupCommit, TaskTracker, CancellationToken) {
        let tracker = TaskTracker::new();
        let stop = CancellationToken::new();
        let batching = Batching {
            max: 64,
            linger: Duration::from_millis(300),
            in_flight,
        };
        let commit = GroupCommit::start(etcd, batching, &tracker, stop.clone());
        (commit, tracker, stop)
    }

    pub(in crate::etcd) fn create(key: &str, lease: i64) -> (Vec<Vec<u8>>, Txn) {
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(
                key,
                "v",
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else(vec![TxnOp::get(key, None)]);
        (vec![key.as_bytes().to_vec()], txn)
    }

    /// Free, same-key and doomed transactions submitted together: each gets its own outcome.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_transaction_of_a_batch_gets_its_own_outcome() {
        let (cluster, etcd) = etcd().await;
        // A long linger puts everything submitted together into as few batches as allowed.
        let (commit, tracker, stop) = lingering(&etcd, 1);
        let submit = |jobs: Vec<(Vec<Vec<u8>>, Txn)>| {
            futures::future::join_all(
                jobs.into_iter()
                    .map(|(keys, txn)| commit.commit("txn_test", keys, txn, 64)),
            )
        };
        let succeeded = |outcomes: &[Result<Committed>]| -> Vec<Option<bool>> {
            outcomes
                .iter()
                .map(|o| o.as_ref().ok().map(|c| c.succeeded))
                .collect()
        };
        // Free keys share one proposal; the same key goes to the next batch, in order.
        let outcomes = submit(vec![
            create("/t/a", 0),
            create("/t/a", 0),
            create("/t/b", 0),
            create("/t/c", 0),
            create("/t/a", 0),
        ])
        .await;
        assert_eq!(
            succeeded(&outcomes),
            vec![Some(true), Some(false), Some(true), Some(true), Some(false)],
            "{outcomes:?}"
        );
        let revision = |o: &Result<Committed>| o.as_ref().map(|c| c.revision).unwrap_or(0);
        assert_eq!(revision(&outcomes[0]), revision(&outcomes[2]));
        assert_eq!(revision(&outcomes[0]), revision(&outcomes[3]));
        let mut client = cluster.client().await;
        let a = client.get("/t/a", None).await.unwrap();
        assert_eq!(a.kvs()[0].create_revision(), revision(&outcomes[0]));
        // A lease nobody granted: etcd refuses the whole request it is in; the others of its
        // batch are sent again alone and succeed, and it gets its own error.
        let outcomes = submit(vec![
            create("/t/d", 0),
            create("/t/doomed", 0x7ead_beef),
            create("/t/e", 0),
        ])
        .await;
        assert_eq!(
            succeeded(&outcomes),
            vec![Some(true), None, Some(true)],
            "{outcomes:?}"
        );
        let doomed = client.get("/t/doomed", None).await.unwrap();
        assert!(doomed.kvs().is_empty());
        stop.cancel();
        tracker.close();
        tracker.wait().await;
    }

    /// Transactions declaring one key (a quota range, say) never share a batch: etcd would
    /// evaluate both compares before either write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transactions_on_one_key_never_share_a_batch() {
        let (_cluster, etcd) = etcd().await;
        let (commit, tracker, stop) = lingering(&etcd, 4);
        // "At most one key under /q/": each transaction checks the range is empty and writes a
        // key of its own in it, declaring the range as its key.
        let slot = |name: &str| {
            let txn = Txn::new()
                .when(vec![
                    Compare::create_revision("/q/", CompareOp::Equal, 0).with_range("/q0")
                ])
                .and_then(vec![TxnOp::put(format!("/q/{name}"), "", None)]);
            (vec![b"/q/".to_vec()], txn)
        };
        let outcomes = futures::future::join_all(["x", "y", "z"].into_iter().map(|n| {
            let (keys, txn) = slot(n);
            commit.commit("txn_test", keys, txn, 64)
        }))
        .await;
        let won = outcomes
            .iter()
            .filter(|o| o.as_ref().is_ok_and(|c| c.succeeded))
            .count();
        assert_eq!(won, 1, "{outcomes:?}");
        stop.cancel();
        tracker.close();
        tracker.wait().await;
    }
}
