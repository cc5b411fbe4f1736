//! Closed-loop measurements of single operations: `in_flight` workers each run their share of
//! `ops` operations back to back; every operation's latency is recorded.
//!
//! - `acquire`: distinct resources (released afterwards, untimed);
//! - `contended`: every worker tries a resource someone already holds (the 409 path);
//! - `release`: resources acquired beforehand, untimed;
//! - `cycle`: acquire → `renewals` renewals → release, timed as one operation;
//! - `renew`: round robin over a set of held leases.
//!
//! The session operations (`session-acquire`, `session-keepalive`, `lock`) have their own drivers in
//! `sessions`, the gRPC ones (`grpc-put`, `grpc-range`, `grpc-keepalive`,
//! `grpc-keepalive-shared`, `grpc-lock`) in `grpc`.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use lease_proxy_benches::stats::Run;
use tokio::time::Instant;

use crate::backend::Backend;

/// TTL of the leases taken by the closed-loop operations (long: nothing expires mid-cell).
const TTL: u64 = 60;

/// An operation to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Op {
    /// Acquire distinct free resources.
    Acquire,
    /// Acquire attempts on a held resource.
    Contended,
    /// Release held resources.
    Release,
    /// Acquire, renew k times, release.
    Cycle,
    /// Renew held leases.
    Renew,
    /// Read who holds a held resource (`GET /v1/leases/{r}`; raw: a linearizable Range).
    Get,
    /// Acquire distinct free resources under a session per worker.
    SessionAcquire,
    /// `cycle` under a session per worker: acquire, renew k times, release.
    SessionCycle,
    /// Keep sessions alive, round robin.
    SessionKeepalive,
    /// etcd gRPC `Put`, each worker overwriting its own key.
    GrpcPut,
    /// etcd gRPC `Range` (linearizable) of one key, each worker its own.
    GrpcRange,
    /// etcd gRPC `LeaseKeepAlive`, each worker renewing its lease on its own bidi stream.
    GrpcKeepalive,
    /// etcd gRPC `LeaseKeepAlive`, every worker on one bidi stream (as Go's clientv3 does).
    GrpcKeepaliveShared,
    /// etcd gRPC `Lock` then `Unlock` of a distinct name, under the worker's lease.
    GrpcLock,
    /// A lock over HTTP: a distinct resource taken and given back under the worker's session
    /// (`POST` then `DELETE /v1/leases/{r}`; a JSON gateway: `/v3/lock/lock` then
    /// `/v3/lock/unlock` under the worker's lease; raw etcd: a create then a delete on it).
    Lock,
}

impl Op {
    /// The operation's name in tables.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Contended => "contended",
            Op::Release => "release",
            Op::Cycle => "cycle",
            Op::Renew => "renew",
            Op::Get => "get",
            Op::SessionAcquire => "session-acquire",
            Op::SessionCycle => "session-cycle",
            Op::SessionKeepalive => "session-keepalive",
            Op::GrpcPut => "grpc-put",
            Op::GrpcRange => "grpc-range",
            Op::GrpcKeepalive => "grpc-keepalive",
            Op::GrpcKeepaliveShared => "grpc-keepalive-shared",
            Op::GrpcLock => "grpc-lock",
            Op::Lock => "lock",
        }
    }

    /// Whether the operation works on leases held before it is measured.
    pub(crate) fn needs_held(self) -> bool {
        matches!(self, Op::Renew | Op::Get)
    }

    /// Whether the operation is etcd's gRPC API (measured by `grpc`, not on a [`Backend`]).
    pub(crate) fn is_grpc(self) -> bool {
        matches!(
            self,
            Op::GrpcPut
                | Op::GrpcRange
                | Op::GrpcKeepalive
                | Op::GrpcKeepaliveShared
                | Op::GrpcLock
        )
    }
}

/// How long a timed loop may run (`--round-deadline`); none: until its operations are done.
static DEADLINE: OnceLock<Duration> = OnceLock::new();

/// Cuts every timed loop from now on at `deadline` after its start.
pub(crate) fn set_deadline(deadline: Duration) {
    let _ = DEADLINE.set(deadline);
}

/// Runs `ops` operations on `in_flight` workers; `f(worker, i)` is one operation. The clock
/// starts once etcd is settled (`settle`). With a deadline set ([`set_deadline`]) the loop
/// stops there, the operations under way dropped: the run counts those done by then, over the
/// time until then, and says it was cut.
pub(crate) async fn closed_loop<F, Fut>(in_flight: usize, ops: usize, f: F) -> anyhow::Result<Run>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let f = Arc::new(f);
    let per_worker = ops.div_ceil(in_flight.max(1));
    crate::settle::etcd().await?;
    let started = Instant::now();
    let deadline = DEADLINE.get().map(|d| started + *d);
    let workers: Vec<_> = (0..in_flight.max(1))
        .map(|w| {
            let f = f.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_worker);
                for i in 0..per_worker {
                    let t = Instant::now();
                    match deadline {
                        Some(d) => match tokio::time::timeout_at(d, f(w, i)).await {
                            Ok(done) => done?,
                            Err(_) => return Ok::<_, anyhow::Error>((latencies, true)),
                        },
                        None => f(w, i).await?,
                    }
                    latencies.push(t.elapsed());
                }
                Ok((latencies, false))
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(ops);
    let mut cut = false;
    for w in futures::future::join_all(workers).await {
        let (done, w_cut) = w.map_err(|e| anyhow!("worker: {e}"))??;
        latencies.extend(done);
        cut |= w_cut;
    }
    let elapsed = match (cut, deadline) {
        (true, Some(d)) => d - started,
        _ => started.elapsed(),
    };
    let mut run = Run::from_latencies(latencies, elapsed);
    run.cut = cut;
    Ok(run)
}

/// Acquires `names` on `in_flight` workers, untimed.
pub(crate) async fn acquire_all<B: Backend>(
    backend: &Arc<B>,
    names: Vec<String>,
    ttl: u64,
    in_flight: usize,
) -> anyhow::Result<Vec<B::Held>> {
    let names = Arc::new(names);
    let held = Arc::new(Mutex::new(Vec::with_capacity(names.len())));
    let n = names.len();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..in_flight.max(1))
        .map(|_| {
            let (backend, names, held, next) =
                (backend.clone(), names.clone(), held.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(name) = names.get(i) else {
                        return Ok::<_, anyhow::Error>(());
                    };
                    let h = backend
                        .acquire(name.clone(), ttl)
                        .await?
                        .with_context(|| format!("{name} is held already"))?;
                    held.lock().map_err(|_| anyhow!("poisoned"))?.push(h);
                }
            })
        })
        .collect();
    for w in futures::future::join_all(workers).await {
        w.map_err(|e| anyhow!("worker: {e}"))??;
    }
    let held = std::mem::take(&mut *held.lock().map_err(|_| anyhow!("poisoned"))?);
    if held.len() != n {
        bail!("acquired {} of {n}", held.len());
    }
    Ok(held)
}

/// Releases everything in `held` on `in_flight` workers, untimed.
pub(crate) async fn release_all<B: Backend>(
    backend: &Arc<B>,
    held: Vec<B::Held>,
    in_flight: usize,
) -> anyhow::Result<()> {
    let held = Arc::new(held);
    let n = held.len();
    closed_loop(in_flight.min(n.max(1)), n, {
        let (backend, held) = (backend.clone(), held.clone());
        move |w, i| {
            let (backend, held) = (backend.clone(), held.clone());
            let per = n.div_ceil(in_flight.min(n.max(1)));
            async move {
                match held.get(w * per + i) {
                    Some(h) => backend.release(h).await,
                    None => Ok(()),
                }
            }
        }
    })
    .await?;
    Ok(())
}

/// Measures `op` once on `backend`. `tag` makes resource names unique to this cell; `renewable`
/// is the held set for `renew`; `renewals` the renewals per `cycle`.
pub(crate) async fn measure<B: Backend>(
    backend: &Arc<B>,
    op: Op,
    in_flight: usize,
    ops: usize,
    tag: &str,
    renewable: &Arc<Vec<B::Held>>,
    renewals: usize,
) -> anyhow::Result<Run> {
    let per = ops.div_ceil(in_flight.max(1));
    let name = {
        let tag = tag.to_owned();
        move |w: usize, i: usize| format!("lb-{tag}-{w}-{i}")
    };
    match op {
        Op::Acquire => {
            let taken = Arc::new(Mutex::new(Vec::new()));
            let run = closed_loop(in_flight, ops, {
                let (backend, taken) = (backend.clone(), taken.clone());
                move |w, i| {
                    let (backend, taken, resource) = (backend.clone(), taken.clone(), name(w, i));
                    async move {
                        let h = backend
                            .acquire(resource, TTL)
                            .await?
                            .context("a fresh resource was held")?;
                        taken.lock().map_err(|_| anyhow!("poisoned"))?.push(h);
                        Ok(())
                    }
                }
            })
            .await?;
            let taken = std::mem::take(&mut *taken.lock().map_err(|_| anyhow!("poisoned"))?);
            release_all(backend, taken, in_flight.max(8)).await?;
            Ok(run)
        }
        Op::Contended => {
            let hot = format!("lb-{tag}-hot");
            let holder = backend
                .acquire(hot.clone(), TTL)
                .await?
                .context("the hot resource was held")?;
            let run = closed_loop(in_flight, ops, {
                let backend = backend.clone();
                move |_, _| {
                    let (backend, hot) = (backend.clone(), hot.clone());
                    async move {
                        if backend.acquire(hot, TTL).await?.is_some() {
                            bail!("a held resource was granted to a second holder");
                        }
                        Ok(())
                    }
                }
            })
            .await?;
            backend.release(&holder).await?;
            Ok(run)
        }
        Op::Release => {
            let names = (0..in_flight.max(1))
                .flat_map(|w| (0..per).map(move |i| (w, i)))
                .map(|(w, i)| name(w, i))
                .collect();
            // Worker w releases entries w*per .. (w+1)*per, whatever order they were taken in.
            let held = Arc::new(acquire_all(backend, names, TTL, in_flight.max(8)).await?);
            closed_loop(in_flight, ops, {
                let (backend, held) = (backend.clone(), held.clone());
                move |w, i| {
                    let (backend, held) = (backend.clone(), held.clone());
                    async move {
                        match held.get(w * per + i) {
                            Some(h) => backend.release(h).await,
                            None => Ok(()),
                        }
                    }
                }
            })
            .await
        }
        Op::Cycle => {
            closed_loop(in_flight, ops, {
                let backend = backend.clone();
                move |w, i| {
                    let (backend, resource) = (backend.clone(), name(w, i));
                    async move {
                        let h = backend
                            .acquire(resource, TTL)
                            .await?
                            .context("a fresh resource was held")?;
                        for _ in 0..renewals {
                            backend.renew(&h).await?;
                        }
                        backend.release(&h).await
                    }
                }
            })
            .await
        }
        Op::SessionAcquire | Op::SessionCycle | Op::SessionKeepalive | Op::Lock => {
            bail!("{} is measured on sessions, not single leases", op.name())
        }
        Op::GrpcPut
        | Op::GrpcRange
        | Op::GrpcKeepalive
        | Op::GrpcKeepaliveShared
        | Op::GrpcLock => {
            bail!(
                "{} is measured over gRPC, not on a lease backend",
                op.name()
            )
        }
        Op::Renew | Op::Get => {
            if renewable.is_empty() {
                bail!("{} needs held leases", op.name());
            }
            closed_loop(in_flight, ops, {
                let (backend, held) = (backend.clone(), renewable.clone());
                move |w, i| {
                    let (backend, held) = (backend.clone(), held.clone());
                    async move {
                        let held = &held[(w + i * in_flight) % held.len()];
                        if op == Op::Renew {
                            backend.renew(held).await
                        } else {
                            backend.read(held).await
                        }
                    }
                }
            })
            .await
        }
    }
}

/// A pause between cells so one cell's tail (lease revocations, compaction) settles.
pub(crate) const SETTLE: Duration = Duration::from_millis(200);
