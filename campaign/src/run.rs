//! One campaign run: start the deployment, let clients compete under the nemesis, heal, run a
//! final fault-free phase, then judge.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::checker;
use crate::client::{Clients, Env};
use crate::cluster::{Cluster, Control};
use crate::history::{Event, History, Kind, Outcome};
use crate::nemesis::{self, Fault, Injected};

/// How a run is shaped.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Whole run, chaos and final phase together.
    pub duration: Duration,
    /// The fault-free phase at the end, after everything is healed.
    pub final_phase: Duration,
    /// Competing clients.
    pub clients: usize,
    /// Resources they compete for.
    pub resources: usize,
    /// A negative control, or the real deployment.
    pub control: Control,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Percentiles {
    /// Of `samples` (ms).
    pub fn of(mut samples: Vec<f64>) -> Self {
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| {
            samples
                .get(((samples.len() as f64 * q) as usize).min(samples.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        Self {
            n: samples.len(),
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: samples.last().copied().unwrap_or_default(),
        }
    }
}

/// Everything a run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The control (or `none`).
    pub control: Control,
    /// Run length in seconds.
    pub seconds: f64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<Fault, usize>,
    /// Every fault with its timing.
    pub fault_log: Vec<Injected>,
    /// Acquires granted.
    pub grants: usize,
    /// Writes acknowledged to clients.
    pub writes_acknowledged: usize,
    /// Writes the storage applied.
    pub writes_applied: usize,
    /// Writes refused by the enforcer as stale (409).
    pub stale_rejected_by_enforcer: usize,
    /// Writes refused by a proxy because the lease was lost (410).
    pub stale_rejected_by_proxy: usize,
    /// Writes with an unknown outcome.
    pub writes_indeterminate: usize,
    /// Mark probes after gateway restarts (all must be refused).
    pub probes: usize,
    /// Safety violations (empty is the only acceptable answer).
    pub violations: Vec<String>,
    /// Time from a holder's death (kill or pause) to the next grant of its resource, when no
    /// etcd leader fault overlapped.
    pub takeover: Percentiles,
    /// The same, when an etcd leader fault overlapped.
    pub takeover_with_leader_fault: Percentiles,
    /// After healing: time to the first acknowledged write.
    pub first_write_after_heal_ms: Option<f64>,
    /// After healing: share of writes acknowledged.
    pub write_success_after_heal: f64,
}

/// Runs once.
pub async fn run_once(settings: &Settings) -> anyhow::Result<Report> {
    let cluster = Arc::new(Cluster::start(settings.control).await?);
    let history = Arc::new(History::default());
    let env = Env {
        proxies: cluster.proxy_urls(),
        direct: cluster.direct.url(),
        resources: (0..settings.resources)
            .map(|i| format!("shard-{i}"))
            .collect(),
        history: history.clone(),
        ops: Arc::new(AtomicU64::new(1)),
        contended: Arc::default(),
    };
    let clients = Arc::new(Clients::start(env, settings.clients));
    let log = Arc::new(nemesis::Log::default());
    let started = Instant::now();
    let chaos_until = started + settings.duration.saturating_sub(settings.final_phase);
    nemesis::run(
        cluster.clone(),
        clients.clone(),
        log.clone(),
        started,
        chaos_until,
    )
    .await;
    cluster.heal().await?;
    let healed = Instant::now();
    tokio::time::sleep_until((started + settings.duration).max(healed + settings.final_phase / 2))
        .await;
    clients.stop();
    // Let requests the aborted clients left in flight land before reading the log.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = history.events();
    let applied = cluster.storage.log();
    let faults = log.faults.lock().map(|f| f.clone()).unwrap_or_default();
    let probes = log.probes.lock().map(|p| p.clone()).unwrap_or_default();
    let violations = checker::violations(&events, &applied, &probes);

    let writes = || events.iter().filter(|e| e.kind.is_write());
    let (takeover, with_leader) = takeovers(&events, &faults);
    let after: Vec<&Event> = writes().filter(|e| e.invoked >= healed).collect();
    let ok_after = after.iter().filter(|e| e.outcome == Outcome::Ok).count();
    Ok(Report {
        control: settings.control,
        seconds: started.elapsed().as_secs_f64(),
        faults: faults.iter().fold(BTreeMap::new(), |mut m, f| {
            *m.entry(f.fault).or_default() += 1;
            m
        }),
        fault_log: faults,
        grants: events
            .iter()
            .filter(|e| e.kind == Kind::Acquire && e.outcome == Outcome::Ok)
            .count(),
        writes_acknowledged: writes().filter(|e| e.outcome == Outcome::Ok).count(),
        writes_applied: applied
            .iter()
            .filter(|a| a.client != checker::PROBE_CLIENT)
            .count(),
        stale_rejected_by_enforcer: writes().filter(|e| e.outcome == Outcome::Fail(409)).count(),
        stale_rejected_by_proxy: writes().filter(|e| e.outcome == Outcome::Fail(410)).count(),
        writes_indeterminate: writes()
            .filter(|e| e.outcome == Outcome::Indeterminate)
            .count(),
        probes: probes.len(),
        violations,
        takeover: Percentiles::of(takeover),
        takeover_with_leader_fault: Percentiles::of(with_leader),
        first_write_after_heal_ms: after
            .iter()
            .filter(|e| e.outcome == Outcome::Ok)
            .map(|e| e.completed.duration_since(healed).as_secs_f64() * 1e3)
            .reduce(f64::min),
        write_success_after_heal: if after.is_empty() {
            0.0
        } else {
            ok_after as f64 / after.len() as f64
        },
    })
}

/// Takeover latencies (ms) after holders died: without and with an overlapping leader fault.
fn takeovers(events: &[Event], faults: &[Injected]) -> (Vec<f64>, Vec<f64>) {
    let mut plain = Vec::new();
    let mut with_leader = Vec::new();
    for f in faults {
        let (Some(resource), Some(died)) = (&f.resource, f.from) else {
            continue;
        };
        let next = events
            .iter()
            .filter(|e| {
                e.kind == Kind::Acquire
                    && e.outcome == Outcome::Ok
                    && &e.resource == resource
                    && e.completed > died
            })
            .map(|e| e.completed)
            .min();
        let Some(next) = next else {
            continue;
        };
        let overlaps = faults.iter().any(|g| {
            matches!(g.fault, Fault::LeaderKill | Fault::LeaderPause)
                && g.from.is_some_and(|from| from < next)
                && g.to.is_some_and(|to| to > died)
        });
        let ms = next.duration_since(died).as_secs_f64() * 1e3;
        if overlaps {
            with_leader.push(ms);
        } else {
            plain.push(ms);
        }
    }
    (plain, with_leader)
}
