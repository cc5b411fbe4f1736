//! Sustained renewal of many held leases, open loop: lease `i` of `n` is renewed at
//! `offset_i + k·period` (offsets spread evenly over one period), whatever the backend's
//! answers do. Latency is measured from the *scheduled* time, so a backend that falls behind
//! shows it in p99 instead of silently lowering the offered load (no coordinated omission).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::anyhow;
use lease_proxy_benches::stats::Run;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;

/// The outcome of one sustained run.
pub(crate) struct Sustained {
    /// Renewals completed in time, with latency from their scheduled time.
    pub(crate) run: Run,
    /// Renewals offered (scheduled) during the run.
    pub(crate) offered: usize,
    /// Renewals that failed (lease lost or request error).
    pub(crate) failed: usize,
    /// Renewals answered later than one period after their scheduled time (the next one was
    /// already due).
    pub(crate) late: usize,
    /// The first failure, for the report.
    pub(crate) first_failure: Option<String>,
}

/// Renews every lease in `held` once per `period` for `duration`, at most `max_in_flight`
/// renewals outstanding.
pub(crate) async fn sustain<B: Backend>(
    backend: &Arc<B>,
    held: Arc<Vec<B::Held>>,
    period: Duration,
    duration: Duration,
    max_in_flight: usize,
) -> anyhow::Result<Sustained> {
    let never = CancellationToken::new();
    sustain_until(backend, held, period, duration, max_in_flight, &never).await
}

/// [`sustain`] that also stops scheduling renewals once `stop` is cancelled (those issued
/// are waited for).
pub(crate) async fn sustain_until<B: Backend>(
    backend: &Arc<B>,
    held: Arc<Vec<B::Held>>,
    period: Duration,
    duration: Duration,
    max_in_flight: usize,
    stop: &CancellationToken,
) -> anyhow::Result<Sustained> {
    let n = held.len();
    if n == 0 {
        return Err(anyhow!("nothing held"));
    }
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let failed = Arc::new(AtomicUsize::new(0));
    let first_failure = Arc::new(Mutex::new(None::<String>));
    let slots = Arc::new(Semaphore::new(max_in_flight.max(1)));
    let started = Instant::now();
    let mut issued = 0usize;
    let mut tasks = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    loop {
        tick.tick().await;
        let elapsed = started.elapsed().min(duration);
        // Renewal k is scheduled at k·period/n: those at or before `elapsed` are due.
        let due = (elapsed.as_secs_f64() / period.as_secs_f64() * n as f64) as usize + 1;
        while issued < due {
            let scheduled = started + period.mul_f64(issued as f64 / n as f64);
            let index = issued % n;
            issued += 1;
            let permit = slots.clone().acquire_owned().await?;
            let (backend, held, latencies, failed, first_failure) = (
                backend.clone(),
                held.clone(),
                latencies.clone(),
                failed.clone(),
                first_failure.clone(),
            );
            tasks.spawn(async move {
                let outcome = backend.renew(&held[index]).await;
                let latency = scheduled.elapsed();
                drop(permit);
                match outcome {
                    Ok(()) => {
                        if let Ok(mut l) = latencies.lock() {
                            l.push(latency);
                        }
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut f) = first_failure.lock() {
                            f.get_or_insert_with(|| e.to_string());
                        }
                    }
                }
            });
            // Reap finished tasks as we go, so the set stays small.
            while tasks.try_join_next().is_some() {}
        }
        if elapsed >= duration || stop.is_cancelled() {
            break;
        }
    }
    while tasks.join_next().await.is_some() {}
    let latencies = std::mem::take(&mut *latencies.lock().map_err(|_| anyhow!("poisoned"))?);
    let first_failure = first_failure
        .lock()
        .map_err(|_| anyhow!("poisoned"))?
        .take();
    let late = latencies.iter().filter(|l| **l > period).count();
    Ok(Sustained {
        late,
        run: Run::from_latencies(latencies, started.elapsed()),
        offered: issued,
        failed: failed.load(Ordering::Relaxed),
        first_failure,
    })
}
