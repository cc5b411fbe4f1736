//! One campaign run: start the deployment, let clients compete under the nemesis, heal, run a
//! final fault-free phase, then judge.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::checker;
use crate::client::{Clients, Env};
use crate::cluster::{Cluster, Control, Shape};
use crate::history::{Event, History, Kind, Outcome};
use crate::nemesis::{self, Fault, Injected};
use crate::plan::Plan;

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
    /// The seed: it decides the fault schedule, every client's choices and the storage's
    /// processing times.
    pub seed: u64,
    /// The storage's processing time per write: shortest and longest.
    pub processing: (Duration, Duration),
}

impl Settings {
    /// The fault phase: the whole run less the final phase.
    pub fn chaos(&self) -> Duration {
        self.duration.saturating_sub(self.final_phase)
    }

    /// The plan this run follows.
    pub fn plan(&self) -> Plan {
        Plan::generate(self.seed, self.chaos(), self.control != Control::NoFencing)
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The control (or `none`).
    pub control: Control,
    /// The seed (`campaign --seed S --runs 1` with the same settings replays the plan).
    pub seed: u64,
    /// The run's configured length, in milliseconds.
    pub duration_ms: u64,
    /// Its fault-free final phase, in milliseconds.
    pub final_phase_ms: u64,
    /// The storage's processing time per write, shortest and longest, in milliseconds.
    pub processing_ms: (u64, u64),
    /// Clients and resources.
    pub clients: usize,
    /// Resources.
    pub resources: usize,
    /// The fault schedule the seed decided.
    pub plan: Plan,
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
    /// Writes refused with another 4xx.
    pub refused_otherwise: usize,
    /// Writes the storage applied whose client saw no answer (a timeout, a reset, gave up).
    pub applied_unanswered: usize,
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
    let plan = settings.plan();
    eprintln!(
        "campaign run: seed {} ({:?}, {} s)",
        settings.seed,
        settings.control,
        settings.duration.as_secs()
    );
    let cluster = Arc::new(
        Cluster::start(Shape {
            control: settings.control,
            seed: settings.seed,
            processing: settings.processing,
        })
        .await?,
    );
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
        seed: settings.seed,
        processing_min: settings.processing.0,
    };
    let clients = Arc::new(Clients::start(env, settings.clients));
    let log = Arc::new(nemesis::Log::default());
    let started = Instant::now();
    nemesis::run(
        &plan,
        cluster.clone(),
        clients.clone(),
        log.clone(),
        started,
    )
    .await;
    cluster.heal().await?;
    let healed = Instant::now();
    tokio::time::sleep_until((started + settings.duration).max(healed + settings.final_phase / 2))
        .await;
    clients.stop();
    // Let requests the aborted clients left in flight reach the storage, and every write it
    // received be applied, before reading its log.
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.storage.settle().await;
    let events = history.events();
    let applied = cluster.storage.log();
    let faults = log.faults.lock().map(|f| f.clone()).unwrap_or_default();
    let probes = log.probes.lock().map(|p| p.clone()).unwrap_or_default();
    let violations = checker::violations(&events, &applied, &probes);

    let writes = || events.iter().filter(|e| e.kind.is_write());
    let (takeover, with_leader) = takeovers(&events, &faults);
    let after: Vec<&Event> = writes().filter(|e| e.invoked >= healed).collect();
    let ok_after = after.iter().filter(|e| e.outcome == Outcome::Ok).count();
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let unanswered: std::collections::HashSet<(&str, u64)> = writes()
        .filter(|e| e.outcome == Outcome::Indeterminate)
        .map(|e| (e.client.as_str(), e.op))
        .collect();
    Ok(Report {
        control: settings.control,
        seed: settings.seed,
        duration_ms: ms(settings.duration),
        final_phase_ms: ms(settings.final_phase),
        processing_ms: (ms(settings.processing.0), ms(settings.processing.1)),
        clients: settings.clients,
        resources: settings.resources,
        plan,
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
        refused_otherwise: writes()
            .filter(|e| matches!(e.outcome, Outcome::Fail(s) if s != 409 && s != 410))
            .count(),
        applied_unanswered: applied
            .iter()
            .filter(|a| unanswered.contains(&(a.client.as_str(), a.op)))
            .count(),
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
