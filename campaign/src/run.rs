//! One campaign run: start the deployment, let clients compete under the nemesis, heal, run a
//! final fault-free phase, then judge.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng as _;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::checker;
use crate::client::{Clients, Env};
use crate::cluster::{Cluster, Control, Faults, Marks, Shape, IDLE};
use crate::fleet;
use crate::history::{Event, History, Kind, Outcome};
use crate::hostile;
use crate::nemesis::{self, Fault, Injected};

mod idle;

use crate::plan::{Parts, Plan};
pub use idle::IdleProbe;

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
    /// Where the gateways keep their marks.
    pub marks: Marks,
    /// Which faults the run draws from.
    pub faults: Faults,
    /// Write the history and the storage's applied log here, one line each (seconds since the
    /// start: invoked/received, completed/applied; client, kind, resource, token, outcome), for
    /// reading a run's violations.
    pub history_file: Option<std::path::PathBuf>,
    /// Members of a fleet over resources of their own, beside the clients (none without).
    pub fleet: Option<crate::fleet::Shape>,
}

impl Settings {
    /// The deployment's shape.
    pub fn shape(&self) -> Shape {
        Shape {
            control: self.control,
            seed: self.seed,
            processing: self.processing,
            marks: self.marks,
            faults: self.faults,
        }
    }

    /// The fault phase: the whole run less the final phase.
    pub fn chaos(&self) -> Duration {
        self.duration.saturating_sub(self.final_phase)
    }

    /// The plan this run follows.
    pub fn plan(&self) -> Plan {
        let plan = self.plan_without_fleet();
        match self.fleet {
            Some(fleet) => plan.with_fleet(self.chaos(), fleet.members),
            None => plan,
        }
    }

    fn plan_without_fleet(&self) -> Plan {
        let shape = self.shape();
        if self.marks == Marks::InDatabase {
            return Plan::in_database(self.seed, self.chaos());
        }
        match self.faults {
            Faults::All => Plan::generate(
                self.seed,
                self.chaos(),
                Parts {
                    gateway: shape.gateways() > 0,
                    postgres: shape.on_postgres(),
                },
            ),
            Faults::PausedAdmissions => Plan::paused_admissions(self.seed, self.chaos()),
        }
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
    /// Where the gateways kept their marks, and how many gateways there were.
    #[serde(default = "default_marks")]
    pub marks: Marks,
    /// Gateways in the deployment.
    #[serde(default)]
    pub gateways: usize,
    /// Which faults the run drew from.
    #[serde(default)]
    pub faults_drawn: Faults,
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
    /// Locks taken with etcd's Mutex recipe over gRPC and exchanged for a fencing token
    /// (included in `grants`).
    #[serde(default)]
    pub locks_exchanged: usize,
    /// Writes under those locks acknowledged (included in `writes_acknowledged`).
    #[serde(default)]
    pub lock_writes_acknowledged: usize,
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
    /// The replica left idle for 30 s, then used.
    #[serde(default)]
    pub idle: Option<IdleProbe>,
    /// The hostile `/v3` traffic in the background.
    #[serde(default)]
    pub hostile: Option<hostile::Stats>,
    /// The fleet's members and coverage, in a run with a fleet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<crate::fleet::FleetReport>,
    /// How long the leasing clients believed they held at once ([`crate::belief`]); measured,
    /// not bounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub belief: Option<crate::belief::BeliefReport>,
}

fn default_marks() -> Marks {
    Marks::Sqlite
}

/// Runs once.
pub async fn run_once(settings: &Settings) -> anyhow::Result<Report> {
    if settings.marks == Marks::InDatabase {
        return crate::indb::run_once(settings).await;
    }
    let plan = settings.plan();
    eprintln!(
        "campaign run: seed {} ({:?}, {} s)",
        settings.seed,
        settings.control,
        settings.duration.as_secs()
    );
    let shape = settings.shape();
    let cluster = Arc::new(Cluster::start(shape).await?);
    let idle_since = Instant::now();
    let history = Arc::new(History::default());
    let env_ops = Arc::new(AtomicU64::new(1));
    let beliefs = Arc::new(crate::belief::Beliefs::default());
    let env = Env {
        proxies: cluster.proxy_urls(),
        direct: cluster.direct_urls(),
        acquiring: Arc::new(
            (0..cluster.proxies.len())
                .map(|_| std::sync::atomic::AtomicUsize::new(0))
                .collect(),
        ),
        resources: (0..settings.resources)
            .map(|i| format!("shard-{i}"))
            .collect(),
        history: history.clone(),
        ops: env_ops.clone(),
        contended: Arc::default(),
        seed: settings.seed,
        processing_min: settings.processing.0,
        locks: (0..settings.resources.div_ceil(4))
            .map(|i| {
                let name = format!("lock-{i}");
                let resource = fencing::lock_resource(name.as_bytes());
                (name, resource)
            })
            .collect(),
        storage: cluster.storage.url().to_owned(),
        unexchanged_locks: settings.control == Control::UnexchangedLocks,
        beliefs: beliefs.clone(),
    };
    // Hostile /v3 traffic through the proxies' client relays (faults reach it too), aimed at
    // the live /v1 holders' leases; sentinels planted outside the namespace first.
    let etcd_endpoints = cluster.etcd.lock().await.endpoints();
    let sentinels = {
        let mut etcd = cluster.etcd.lock().await.client().await;
        hostile::plant(&mut etcd).await?
    };
    let stop_hostile = tokio_util::sync::CancellationToken::new();
    let hostile_traffic = tokio::spawn(hostile::traffic(
        hostile::Settings::new(
            cluster.proxy_urls(),
            etcd_endpoints.clone(),
            crate::plan::stream(settings.seed, "hostile", 0).random(),
        ),
        stop_hostile.clone(),
    ));
    let fleet = start_fleet(settings, &cluster, &history, &env_ops).await?;
    let clients = Arc::new(Clients::start(env, settings.clients));
    let log = Arc::new(nemesis::Log::default());
    let started = Instant::now();
    nemesis::run(
        &plan,
        cluster.clone(),
        clients.clone(),
        fleet.as_ref().map(fleet::Running::members),
        log.clone(),
        started,
    )
    .await;
    cluster.heal().await?;
    let healed = Instant::now();
    // At least the final phase's half after healing, and until the planned stall mid-write has
    // played out.
    tokio::time::sleep_until(
        (started + settings.duration)
            .max(healed + settings.final_phase / 2)
            .max(started + Duration::from_millis(plan.quiet_until_ms())),
    )
    .await;
    // The idle replica, once idle long enough, serves a holder while the others still work
    // (in runs at least that long: shorter ones, e.g. CI's control runs, skip it).
    let idle = if settings.duration >= IDLE {
        tokio::time::sleep_until(idle_since + IDLE).await;
        Some(idle::idle_probe(&cluster.idle_url, &history, &env_ops, idle_since).await)
    } else {
        None
    };
    clients.stop();
    let holds = beliefs.finish();
    let fleet = fleet.map(fleet::Running::stop);
    stop_hostile.cancel();
    let hostile_stats = hostile_traffic.await.unwrap_or_default();
    let hostile_after = {
        let mut etcd = cluster.etcd.lock().await.client().await;
        hostile::verify(&mut etcd, &sentinels).await
    };
    // Let requests the aborted clients left in flight reach the storage, and every write it
    // received be applied, before reading its log.
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.storage.settle().await;
    let events = history.events();
    if let Some(path) = &settings.history_file {
        let rows: Vec<String> = events
            .iter()
            .map(|e| {
                format!(
                    "{:.3} {:.3} {} {:?} {} {:?} {:?}",
                    e.invoked.duration_since(started).as_secs_f64(),
                    e.completed.duration_since(started).as_secs_f64(),
                    e.client,
                    e.kind,
                    e.resource,
                    e.revision,
                    e.outcome
                )
            })
            .chain(cluster.storage.log().iter().map(|a| {
                format!(
                    "{:.3} {:.3} APPLIED {} {} {} op{}",
                    a.received.duration_since(started).as_secs_f64(),
                    a.at.duration_since(started).as_secs_f64(),
                    a.client,
                    a.resource,
                    a.revision,
                    a.op
                )
            }))
            .collect();
        if let Err(e) = std::fs::write(path, rows.join("\n") + "\n") {
            eprintln!("writing {}: {e}", path.display());
        }
    }
    let applied = cluster.storage.log();
    let faults = log.faults.lock().map(|f| f.clone()).unwrap_or_default();
    let probes = log.probes.lock().map(|p| p.clone()).unwrap_or_default();
    let mut violations = checker::violations(&events, &applied, &probes);
    violations.extend(
        hostile_stats
            .violations
            .iter()
            .chain(&hostile_after)
            .map(|v| format!("v3: {v}")),
    );
    if let Some(idle) = idle
        .as_ref()
        .filter(|i| i.first_acquire_ms.is_none() || i.succeeded < i.operations)
    {
        violations.push(format!(
            "idle: after {:.0} s idle, the replica served {} of {} operations",
            idle.idle_s, idle.succeeded, idle.operations
        ));
    }

    let fleet = fleet.map(|f| {
        let (report, handovers) = f.judge(&events, &applied, started);
        violations.extend(handovers);
        report
    });
    let belief = crate::belief::judge(&holds, &events, &applied);
    let mut report = report(
        settings,
        shape.gateways(),
        Observed {
            plan,
            started,
            healed,
            events,
            applied,
            faults,
            probes,
            violations,
            idle,
            hostile: Some(hostile_stats),
        },
    );
    report.fleet = fleet;
    report.belief = Some(belief);
    Ok(report)
}

/// The run's fleet, made and its members started, if it has one.
async fn start_fleet(
    settings: &Settings,
    cluster: &Cluster,
    history: &Arc<History>,
    ops: &Arc<AtomicU64>,
) -> anyhow::Result<Option<fleet::Running>> {
    let Some(shape) = settings.fleet else {
        anyhow::ensure!(
            settings.control != Control::NoRevokeBeforeGrant,
            "the control {:?} needs a fleet",
            settings.control
        );
        return Ok(None);
    };
    let env = fleet::Env::new(
        cluster.proxy_urls(),
        cluster.direct_urls(),
        history.clone(),
        ops.clone(),
        settings.seed,
    );
    let etcd = cluster.etcd.lock().await.client().await;
    Ok(Some(fleet::Running::start(shape, env, etcd).await?))
}

/// What a run saw, for its [`Report`].
pub(crate) struct Observed {
    pub(crate) plan: Plan,
    pub(crate) started: Instant,
    pub(crate) healed: Instant,
    pub(crate) events: Vec<Event>,
    pub(crate) applied: Vec<crate::storage::Applied>,
    pub(crate) faults: Vec<Injected>,
    pub(crate) probes: Vec<nemesis::Probe>,
    pub(crate) violations: Vec<String>,
    pub(crate) idle: Option<IdleProbe>,
    pub(crate) hostile: Option<hostile::Stats>,
}

/// The report of a run of `settings` on a deployment with `gateways` enforcers.
pub(crate) fn report(settings: &Settings, gateways: usize, seen: Observed) -> Report {
    let Observed {
        plan,
        started,
        healed,
        events,
        applied,
        faults,
        probes,
        violations,
        idle,
        hostile,
    } = seen;
    let writes = || events.iter().filter(|e| e.kind.is_write());
    let (takeover, with_leader) = takeovers(&events, &faults);
    let after: Vec<&Event> = writes().filter(|e| e.invoked >= healed).collect();
    let ok_after = after.iter().filter(|e| e.outcome == Outcome::Ok).count();
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let unanswered: std::collections::HashSet<(&str, u64)> = writes()
        .filter(|e| e.outcome == Outcome::Indeterminate)
        .map(|e| (e.client.as_str(), e.op))
        .collect();
    Report {
        control: settings.control,
        seed: settings.seed,
        duration_ms: ms(settings.duration),
        final_phase_ms: ms(settings.final_phase),
        processing_ms: (ms(settings.processing.0), ms(settings.processing.1)),
        marks: settings.marks,
        gateways,
        faults_drawn: settings.faults,
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
            .filter(|e| e.kind.is_grant() && e.outcome == Outcome::Ok)
            .count(),
        writes_acknowledged: writes().filter(|e| e.outcome == Outcome::Ok).count(),
        locks_exchanged: events
            .iter()
            .filter(|e| e.kind == Kind::Lock && e.outcome == Outcome::Ok)
            .count(),
        lock_writes_acknowledged: writes()
            .filter(|e| e.outcome == Outcome::Ok && e.resource.starts_with("lock/"))
            .count(),
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
        idle,
        hostile,
        fleet: None,
        belief: None,
    }
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
                e.kind.is_grant()
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
