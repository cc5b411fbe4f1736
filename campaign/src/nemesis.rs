//! The nemesis: executes a run's [`Plan`](crate::plan::Plan), each fault healed by the task
//! that injected it and logged with its time and target. Infrastructure faults (proxies,
//! gateway, etcd leader, relays, the gateway→storage hop) come one or two at a time: a run opens
//! with a gateway restart, meets every other kind once in random order, then draws at random.
//! Client faults (kills, pauses beyond the TTL, aborts and give-ups mid-request, timeouts
//! shorter than the storage's processing) come on their own every 1.5–3 s, a pause first —
//! clients die independently of the infrastructure, and they are what fencing exists for.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::client::{Clients, Quirk};
use crate::cluster::Cluster;
use crate::plan::{Plan, Step, MAX_CONCURRENT};
use crate::relay::Mode;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL-equivalent of a client: its task is aborted wherever it is, without releasing.
    ClientKill,
    /// A client stops dead beyond its TTL, then writes.
    ClientPause,
    /// A SQL client stops dead beyond its TTL with its write's transaction open (the row
    /// written, the token admitted), then commits ([`crate::indb`]; elsewhere, a
    /// [`Fault::ClientPause`]).
    ClientPauseInTransaction,
    /// SIGKILL-equivalent of a client mid-request: its task (clients are in-process tasks) is
    /// aborted while one of its writes is in flight.
    ClientAbortMidRequest,
    /// A client closes its socket while its write's body is still streaming.
    ClientGiveUpMidBody,
    /// A client sends a whole write, then closes its socket before the answer.
    ClientGiveUpAwaitingAnswer,
    /// A client's next write has a timeout shorter than the storage's processing time.
    ClientShortTimeout,
    /// A client sends a write the storage takes longer than the TTL to apply, stalls with it
    /// in flight (no renewals: its lease lapses, and its resource is contended), then gives up
    /// on the answer while the storage is still applying it.
    ClientStallMidWrite,
    /// SIGKILL of a proxy, restarted after a moment.
    ProxyKill,
    /// SIGSTOP of a proxy while writes are in flight, then SIGCONT.
    ProxyPause,
    /// SIGKILL of a proxy while an acquire is in flight through it, restarted after a moment.
    ProxyKillMidAcquire,
    /// `pg_terminate_backend` of every gateway session in the mark store's PostgreSQL.
    PgTerminateSessions,
    /// SIGKILL of the mark store's PostgreSQL, restarted after a moment (crash recovery).
    PgRestart,
    /// SIGKILL of the gateway, restarted after a moment.
    GatewayKill,
    /// SIGKILL of the etcd leader, restarted after a moment.
    LeaderKill,
    /// SIGSTOP of the etcd leader, then SIGCONT.
    LeaderPause,
    /// Clients → one proxy: nothing moves.
    BlackholeClientProxy,
    /// One proxy → the gateway: nothing moves.
    BlackholeProxyGateway,
    /// One proxy → etcd: nothing moves.
    BlackholeProxyEtcd,
    /// Clients → one proxy: delayed.
    DelayClientProxy,
    /// One proxy → the gateway: delayed.
    DelayProxyGateway,
    /// One proxy → etcd: delayed.
    DelayProxyEtcd,
    /// The gateway → the storage: every chunk delayed.
    DelayGatewayStorage,
    /// The gateway → the storage: every connection reset (RST), new ones too.
    ResetGatewayStorage,
    /// The gateway → the storage: nothing moves (a partition TCP rides out).
    BlackholeGatewayStorage,
    /// A holder sends a slow write straight to one of the gateways sharing PostgreSQL, whose
    /// registration is made to wait on the mark row; the gateway is SIGSTOPped while it waits,
    /// the row let go (the registration commits, its answer waits in the stopped gateway's
    /// socket), and SIGCONT comes after the hold — the holder's lease has lapsed meanwhile and
    /// its resource is contended through the other gateway.
    GatewayPauseMidAdmission,
}

impl Fault {
    /// Whether the fault exists only with an enforcer (a restart of it, or its storage hop).
    pub fn needs_gateway(self) -> bool {
        matches!(self, Fault::GatewayKill) || self.touches_storage_path()
    }

    /// Whether the fault exists only with the marks in PostgreSQL.
    pub fn needs_postgres(self) -> bool {
        matches!(
            self,
            Fault::PgTerminateSessions | Fault::PgRestart | Fault::GatewayPauseMidAdmission
        )
    }

    fn touches_etcd(self) -> bool {
        matches!(self, Fault::LeaderKill | Fault::LeaderPause)
    }

    fn touches_gateway_paths(self) -> bool {
        matches!(
            self,
            Fault::GatewayKill
                | Fault::BlackholeProxyGateway
                | Fault::DelayProxyGateway
                | Fault::PgRestart
        )
    }

    /// Faults on the marks' store and on the gateways take turns: the probes after a gateway
    /// or PostgreSQL restart need the store up and every path to the gateways shut.
    fn touches_marks(self) -> bool {
        matches!(
            self,
            Fault::GatewayKill | Fault::PgTerminateSessions | Fault::PgRestart
        )
    }

    fn touches_storage_path(self) -> bool {
        matches!(
            self,
            Fault::DelayGatewayStorage
                | Fault::ResetGatewayStorage
                | Fault::BlackholeGatewayStorage
        )
    }

    /// Whether two faults must take turns: faults on etcd's leader; faults on the paths to the
    /// gateway (a restart probes the marks with every path to it shut, so that no write
    /// re-raises a forgotten mark first); faults on the storage hop, and a gateway restart with
    /// them (a probe stalled on the storage hop would show nothing).
    pub fn conflicts(self, other: Fault) -> bool {
        let storage = |f: Fault| f.touches_storage_path() || f.touches_marks();
        (self.touches_etcd() && other.touches_etcd())
            || (self.touches_gateway_paths() && other.touches_gateway_paths())
            || (storage(self) && storage(other))
    }
}

/// One injected fault.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Injected {
    /// What.
    pub fault: Fault,
    /// When the plan had it due, in seconds since the run started.
    pub planned_s: f64,
    /// When it began, in seconds since the run started.
    pub from_s: f64,
    /// When it ended (healed), in seconds since the run started.
    pub to_s: f64,
    /// What it hit: a process (`lease-proxy-1`, `etcd-2`, `fence-gateway`), a relay
    /// (`lease-proxy-0→etcd`, `gateway→storage`) or a client (`c7`); empty when nothing was
    /// there to hit (no etcd leader, no client with a write in flight).
    pub target: String,
    /// For client faults on a holder: the resource it held.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub resource: Option<String>,
    #[serde(skip)]
    pub(crate) from: Option<Instant>,
    #[serde(skip)]
    pub(crate) to: Option<Instant>,
}

/// A mark-regression probe after a gateway or mark-store restart.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    /// The resource probed.
    pub resource: String,
    /// The stale revision presented (one below the highest applied).
    pub revision: u64,
    /// The gateway's answer.
    pub status: u16,
    /// The mark's revision read from the gateways' store itself right after the restart
    /// (`None`: no mark; not checked when the deployment keeps no readable marks).
    pub stored: Option<u64>,
    /// Whether `stored` was read (the store is readable and answered).
    pub verified: bool,
}

/// What the nemesis did.
#[derive(Default)]
pub struct Log {
    /// Faults, in injection order.
    pub faults: Mutex<Vec<Injected>>,
    /// Probes after gateway restarts.
    pub probes: Mutex<Vec<Probe>>,
}

/// Executes `plan`, then waits for every fault to heal. Each infrastructure fault starts when
/// due, or once the part it touches is free and fewer than two others are active (the plan
/// keeps to that with planned lengths; real restarts may take longer). Client faults start
/// when due.
pub async fn run(
    plan: &Plan,
    cluster: Arc<Cluster>,
    clients: Arc<Clients>,
    log: Arc<Log>,
    started: Instant,
) {
    let etcd_busy = Arc::new(tokio::sync::Mutex::new(()));
    let marks_busy = Arc::new(tokio::sync::Mutex::new(()));
    let gateway_busy = Arc::new(tokio::sync::Mutex::new(()));
    let storage_busy = Arc::new(tokio::sync::Mutex::new(()));
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT));
    let mut active = tokio::task::JoinSet::new();
    let mut infrastructure = plan.infrastructure.iter().peekable();
    let mut client_faults = plan.clients.iter().peekable();
    loop {
        // The next due step of either schedule, in time order.
        let next = match (infrastructure.peek(), client_faults.peek()) {
            (Some(i), Some(c)) if i.at_ms <= c.at_ms => infrastructure.next(),
            (Some(_), Some(_)) => client_faults.next(),
            (Some(_), None) => infrastructure.next(),
            (None, Some(_)) => client_faults.next(),
            (None, None) => break,
        };
        let Some(step) = next.cloned() else { break };
        tokio::time::sleep_until(started + Duration::from_millis(step.at_ms)).await;
        let (cluster, clients, log) = (cluster.clone(), clients.clone(), log.clone());
        if step.fault.is_client() {
            active.spawn(async move { inject(&step, &cluster, &clients, &log, started).await });
            continue;
        }
        let slots = slots.clone();
        let locks: Vec<Arc<tokio::sync::Mutex<()>>> = [
            (step.fault.touches_etcd(), &etcd_busy),
            (step.fault.touches_gateway_paths(), &gateway_busy),
            (
                step.fault.touches_storage_path() || step.fault.touches_marks(),
                &storage_busy,
            ),
            (step.fault.touches_marks(), &marks_busy),
        ]
        .into_iter()
        .filter(|(takes, _)| *takes)
        .map(|(_, lock)| lock.clone())
        .collect();
        active.spawn(async move {
            // Always in the same order (etcd, gateway, storage, marks, then a slot): no deadlock.
            let mut guards = Vec::new();
            for lock in locks {
                guards.push(lock.lock_owned().await);
            }
            let _slot = slots.acquire_owned().await;
            inject(&step, &cluster, &clients, &log, started).await;
        });
        while active.try_join_next().is_some() {}
    }
    while active.join_next().await.is_some() {}
}

impl Fault {
    fn is_client(self) -> bool {
        matches!(
            self,
            Fault::ClientKill
                | Fault::ClientPause
                | Fault::ClientPauseInTransaction
                | Fault::ClientAbortMidRequest
                | Fault::ClientGiveUpMidBody
                | Fault::ClientGiveUpAwaitingAnswer
                | Fault::ClientShortTimeout
                | Fault::ClientStallMidWrite
                | Fault::GatewayPauseMidAdmission
        )
    }
}

async fn inject(step: &Step, cluster: &Cluster, clients: &Clients, log: &Log, started: Instant) {
    let fault = step.fault;
    let from = Instant::now();
    let hold = Duration::from_millis(step.hold_ms);
    let mut hit = None;
    let proxy = usize::try_from(step.target).unwrap_or(0) % cluster.proxies.len().max(1);
    let mut target = String::new();
    match fault {
        Fault::ClientKill => hit = clients.kill_one(step.target),
        Fault::ClientAbortMidRequest => hit = clients.abort_mid_request(step.target).await,
        Fault::ClientPause | Fault::ClientPauseInTransaction => {
            hit = clients.pause_one(step.target, hold);
            tokio::time::sleep(hold).await;
        }
        Fault::ClientGiveUpMidBody => {
            hit = clients.quirk_one(step.target, Quirk::GiveUpMidBody(hold));
        }
        Fault::ClientGiveUpAwaitingAnswer => {
            hit = clients.quirk_one(step.target, Quirk::GiveUpAwaitingAnswer(hold));
        }
        Fault::ClientShortTimeout => {
            hit = clients.quirk_one(step.target, Quirk::ShortTimeout);
        }
        Fault::GatewayPauseMidAdmission => {
            hit = pause_mid_admission(step, cluster, clients, hold).await;
        }
        Fault::ClientStallMidWrite => {
            hit = clients.quirk_one(step.target, Quirk::StallMidWrite(hold));
        }
        Fault::ProxyKillMidAcquire => {
            let p = &cluster.proxies[proxy];
            // Aimed at an acquire: wait (up to 2 s) until one is in flight through it.
            let mid = clients
                .acquire_in_flight(proxy, Duration::from_secs(2))
                .await;
            target = format!("{}{}", p.name(), if mid { " (mid-acquire)" } else { "" });
            p.kill();
            tokio::time::sleep(hold).await;
            if let Err(e) = p.start().await {
                eprintln!("nemesis: restarting {}: {e:#}", p.name());
            }
        }
        Fault::PgTerminateSessions => {
            if let Some(pg) = &cluster.postgres {
                match pg.terminate_sessions("fence-gateway-").await {
                    Ok(n) => target = format!("postgres: {n} gateway sessions"),
                    Err(e) => eprintln!("nemesis: terminating sessions: {e:#}"),
                }
            }
        }
        Fault::PgRestart => {
            if let Some(pg) = &cluster.postgres {
                target = "postgres".to_owned();
                // Every path to the gateways is shut while the store restarts and is probed,
                // so that the probes judge what the store kept, not what a write re-raised.
                let paths = gateway_paths(cluster, None);
                for r in &paths {
                    r.set(Mode::Blackhole);
                }
                let before = highest_applied(cluster);
                if let Err(e) = pg.crash_and_restart(hold).await {
                    eprintln!("nemesis: restarting PostgreSQL: {e:#}");
                }
                // The gateways reconnect on their own; give them the moment it takes.
                for url in &cluster.gateway_urls {
                    let _ = crate::cluster::wait_ready(
                        &format!("{url}/readyz"),
                        Duration::from_secs(10),
                    )
                    .await;
                }
                probe(cluster, log, before, None).await;
                for r in &paths {
                    r.set(Mode::Pass);
                }
            }
        }
        Fault::ProxyKill => {
            let p = &cluster.proxies[proxy];
            target = p.name().to_owned();
            p.kill();
            tokio::time::sleep(hold).await;
            if let Err(e) = p.start().await {
                eprintln!("nemesis: restarting {}: {e:#}", p.name());
            }
        }
        Fault::ProxyPause => {
            let p = &cluster.proxies[proxy];
            target = p.name().to_owned();
            p.signal("STOP");
            tokio::time::sleep(hold).await;
            p.signal("CONT");
        }
        Fault::GatewayKill => {
            let n = cluster.gateways.len();
            if n > 0 {
                let i = usize::try_from(step.target).unwrap_or(0) % n;
                let g = &cluster.gateways[i];
                target = g.name().to_owned();
                // Every path to the gateway is shut while it restarts and is probed, so that
                // no write re-raises a forgotten mark before the probe sees it.
                let paths = gateway_paths(cluster, Some(i));
                for r in &paths {
                    r.set(Mode::Blackhole);
                }
                let before = highest_applied(cluster);
                g.kill();
                tokio::time::sleep(hold).await;
                if let Err(e) = g.start().await {
                    eprintln!("nemesis: restarting the gateway: {e:#}");
                }
                probe(cluster, log, before, Some(i)).await;
                for r in &paths {
                    r.set(Mode::Pass);
                }
            }
        }
        Fault::LeaderKill => {
            let leader = cluster.etcd.lock().await.leader().await;
            if let Some(i) = leader {
                target = format!("etcd-{i}");
                cluster.etcd.lock().await.kill(i);
                tokio::time::sleep(hold).await;
                cluster.etcd.lock().await.restart(i).await;
            }
        }
        Fault::LeaderPause => {
            let leader = cluster.etcd.lock().await.leader().await;
            if let Some(i) = leader {
                target = format!("etcd-{i}");
                cluster.etcd.lock().await.signal(i, "STOP");
                tokio::time::sleep(hold).await;
                cluster.etcd.lock().await.signal(i, "CONT");
            }
        }
        Fault::DelayGatewayStorage
        | Fault::ResetGatewayStorage
        | Fault::BlackholeGatewayStorage => {
            target = "gateway→storage".to_owned();
            let mode = match fault {
                Fault::DelayGatewayStorage => Mode::Delay(Duration::from_millis(step.delay_ms)),
                Fault::ResetGatewayStorage => Mode::Reset,
                _ => Mode::Blackhole,
            };
            cluster.storage_path.set(mode);
            tokio::time::sleep(hold).await;
            cluster.storage_path.set(Mode::Pass);
        }
        Fault::BlackholeClientProxy
        | Fault::BlackholeProxyGateway
        | Fault::BlackholeProxyEtcd
        | Fault::DelayClientProxy
        | Fault::DelayProxyGateway
        | Fault::DelayProxyEtcd => {
            let paths = &cluster.paths[proxy];
            let name = cluster.proxies[proxy].name();
            let (relays, to): (Vec<&crate::relay::Relay>, &str) = match fault {
                Fault::BlackholeClientProxy | Fault::DelayClientProxy => {
                    (vec![&paths.clients], "clients→")
                }
                Fault::BlackholeProxyGateway | Fault::DelayProxyGateway => {
                    (vec![&paths.gateway], "→gateway")
                }
                _ => (paths.etcd.iter().collect(), "→etcd"),
            };
            target = match to.strip_suffix('→') {
                Some(from) => format!("{from}→{name}"),
                None => format!("{name}{to}"),
            };
            let mode = match fault {
                Fault::DelayClientProxy | Fault::DelayProxyGateway | Fault::DelayProxyEtcd => {
                    Mode::Delay(Duration::from_millis(step.delay_ms))
                }
                _ => Mode::Blackhole,
            };
            for r in &relays {
                r.set(mode);
            }
            tokio::time::sleep(hold).await;
            for r in &relays {
                r.set(Mode::Pass);
            }
        }
    }
    let resource = match hit {
        Some((client, resource)) => {
            target = client;
            resource
        }
        None => None,
    };
    let to = Instant::now();
    if let Ok(mut f) = log.faults.lock() {
        f.push(Injected {
            fault,
            planned_s: step.at_ms as f64 / 1e3,
            from_s: from.duration_since(started).as_secs_f64(),
            to_s: to.duration_since(started).as_secs_f64(),
            target,
            resource,
            from: Some(from),
            to: Some(to),
        });
    }
}

/// The highest token revision applied so far, per resource.
fn highest_applied(cluster: &Cluster) -> std::collections::BTreeMap<String, u64> {
    let mut highest: std::collections::BTreeMap<String, u64> = Default::default();
    for a in cluster.storage.log() {
        let h = highest.entry(a.resource).or_default();
        *h = (*h).max(a.revision);
    }
    highest
}

/// The relays through which writes reach gateway `which` (every gateway when `None`): its
/// proxies' paths and the clients' direct path.
fn gateway_paths(cluster: &Cluster, which: Option<usize>) -> Vec<&crate::relay::Relay> {
    let n = cluster.gateways.len().max(1);
    let reaches = |g: usize| which.is_none_or(|w| w == g);
    cluster
        .paths
        .iter()
        .enumerate()
        .filter(|(i, _)| reaches(i % n))
        .map(|(_, p)| &p.gateway)
        .chain(
            cluster
                .direct
                .iter()
                .enumerate()
                .filter(|(g, _)| reaches(*g))
                .map(|(_, r)| r),
        )
        .collect()
}

/// After a gateway (or mark store) restart: for every resource written before it, the mark read
/// from the store itself must be at least the highest token applied, and a write with a token
/// one below that, sent to the restarted gateway (every gateway when `which` is `None`), must
/// be refused — the mark survived the restart.
async fn probe(
    cluster: &Cluster,
    log: &Log,
    before: std::collections::BTreeMap<String, u64>,
    which: Option<usize>,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default();
    let urls: Vec<&String> = cluster
        .gateway_urls
        .iter()
        .enumerate()
        .filter(|(g, _)| which.is_none_or(|w| w == *g))
        .map(|(_, u)| u)
        .collect();
    for (resource, revision) in before {
        if revision < 2 {
            continue;
        }
        let (stored, verified) = if cluster.marks_readable() {
            match cluster.stored_mark(&resource).await {
                Ok(mark) => (mark.map(|t| t.revision), true),
                Err(e) => {
                    eprintln!("nemesis: reading the mark of {resource}: {e:#}");
                    (None, false)
                }
            }
        } else {
            (None, false)
        };
        let stale = revision - 1;
        for url in &urls {
            let token = cluster.keys.mint(&resource, fencing::Token::new(0, stale));
            let status = http
                .put(format!("{url}/items/{resource}"))
                .header(fencing::TOKEN_HEADER, token)
                .header(fencing::RESOURCE_HEADER, &resource)
                .json(&serde_json::json!({"client": crate::checker::PROBE_CLIENT, "op": u64::MAX}))
                .send()
                .await
                .map_or(0, |r| r.status().as_u16());
            if let Ok(mut p) = log.probes.lock() {
                p.push(Probe {
                    resource: resource.clone(),
                    revision: stale,
                    status,
                    stored,
                    verified,
                });
            }
        }
    }
}

/// [`Fault::GatewayPauseMidAdmission`]: the client hit, named with the gateway it stopped
/// (`c7 → fence-gateway-1 mid-admission`) or why none was (no mark yet, the write did not
/// come), and the resource it held; `None` when no client held anything.
async fn pause_mid_admission(
    step: &Step,
    cluster: &Cluster,
    clients: &Clients,
    pause: Duration,
) -> Option<(String, Option<String>)> {
    let (pg, (holder, resource)) = (cluster.postgres.as_ref()?, clients.holder(step.target)?);
    let missed = |why: &str| Some((format!("{} ({why})", holder.name), Some(resource.clone())));
    let g = usize::try_from(step.target).unwrap_or(0) % cluster.gateways.len().max(1);
    let Some(gateway) = cluster.gateways.get(g) else {
        return missed("no gateway");
    };
    let Ok(Some(row)) = pg.hold_mark(&resource).await else {
        return missed("no mark yet");
    };
    holder.arm(Quirk::ThroughPausedGateway {
        gateway: g,
        slow: cluster.shape.paused_write(),
    });
    // Well within the gateway's lock timeout (its store timeout).
    let waited = row
        .until_waited_for(&crate::cluster::gateway_app(g), Duration::from_millis(700))
        .await;
    if !waited {
        holder.disarm();
        row.release().await;
        return missed("no registration waited");
    }
    gateway.signal("STOP");
    row.release().await;
    clients.contend(&resource, pause * 3, g);
    tokio::time::sleep(pause).await;
    gateway.signal("CONT");
    Some((
        format!("{} → {} mid-admission", holder.name, gateway.name()),
        Some(resource),
    ))
}
