//! The nemesis: injects faults at random, each healed by the task that injected it.
//! Infrastructure faults (proxies, gateway, etcd leader, relays) come one or two at a time: a
//! run opens with a gateway restart, meets every other kind once in random order, then draws
//! at random. Client faults (kills, pauses beyond the TTL) come on their own every 1.5–3 s, a
//! pause first — clients die independently of the infrastructure, and they are what fencing
//! exists for.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;
use serde::Serialize;
use tokio::time::Instant;

use crate::client::{Clients, TTL_SECONDS};
use crate::cluster::Cluster;
use crate::relay::Mode;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL-equivalent of a client: it vanishes without releasing.
    ClientKill,
    /// A client stops dead beyond its TTL, then writes.
    ClientPause,
    /// SIGKILL of a proxy, restarted after a moment.
    ProxyKill,
    /// SIGSTOP of a proxy while writes are in flight, then SIGCONT.
    ProxyPause,
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
}

/// The faults of the deployment (client faults run on their own schedule).
const INFRASTRUCTURE: [Fault; 11] = [
    Fault::ProxyKill,
    Fault::ProxyPause,
    Fault::GatewayKill,
    Fault::LeaderKill,
    Fault::LeaderPause,
    Fault::BlackholeClientProxy,
    Fault::BlackholeProxyGateway,
    Fault::BlackholeProxyEtcd,
    Fault::DelayClientProxy,
    Fault::DelayProxyGateway,
    Fault::DelayProxyEtcd,
];

impl Fault {
    fn touches_etcd(self) -> bool {
        matches!(self, Fault::LeaderKill | Fault::LeaderPause)
    }

    fn touches_gateway_paths(self) -> bool {
        matches!(
            self,
            Fault::GatewayKill | Fault::BlackholeProxyGateway | Fault::DelayProxyGateway
        )
    }
}

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct Injected {
    /// What.
    pub fault: Fault,
    /// When it began and ended, in seconds since the run started.
    pub from_s: f64,
    /// End of the fault, in seconds since the run started.
    pub to_s: f64,
    /// For client faults on a holder: the resource it held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    #[serde(skip)]
    pub(crate) from: Option<Instant>,
    #[serde(skip)]
    pub(crate) to: Option<Instant>,
}

/// A mark-regression probe after a gateway restart.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    /// The resource probed.
    pub resource: String,
    /// The stale revision presented (one below the highest applied).
    pub revision: u64,
    /// The gateway's answer.
    pub status: u16,
}

/// What the nemesis did.
#[derive(Default)]
pub struct Log {
    /// Faults, in injection order.
    pub faults: Mutex<Vec<Injected>>,
    /// Probes after gateway restarts.
    pub probes: Mutex<Vec<Probe>>,
}

/// Runs faults until `until`, then waits for all of them to heal. Infrastructure faults come
/// one or two at a time; client faults (kills and pauses, clients dying independently of the
/// infrastructure) come on their own every 1.5–3 s.
pub async fn run(
    cluster: Arc<Cluster>,
    clients: Arc<Clients>,
    log: Arc<Log>,
    started: Instant,
    until: Instant,
) {
    let infrastructure = infrastructure(
        cluster.clone(),
        clients.clone(),
        log.clone(),
        started,
        until,
    );
    let clients_fail = async {
        let mut active = tokio::task::JoinSet::new();
        let mut first = true;
        while Instant::now() < until {
            // The first client fault is a pause: every run has a zombie early.
            let fault = if first || rand::rng().random_bool(0.6) {
                Fault::ClientPause
            } else {
                Fault::ClientKill
            };
            first = false;
            let (cluster, clients, log) = (cluster.clone(), clients.clone(), log.clone());
            active.spawn(async move { inject(fault, &cluster, &clients, &log, started).await });
            let pause = Duration::from_millis(rand::rng().random_range(1500..3000));
            tokio::time::sleep(pause).await;
        }
        while active.join_next().await.is_some() {}
    };
    tokio::join!(infrastructure, clients_fail);
}

async fn infrastructure(
    cluster: Arc<Cluster>,
    clients: Arc<Clients>,
    log: Arc<Log>,
    started: Instant,
    until: Instant,
) {
    let with_gateway = cluster.gateway.is_some();
    let mut schedule: Vec<Fault> = INFRASTRUCTURE
        .iter()
        .copied()
        .filter(|f| with_gateway || *f != Fault::GatewayKill)
        .collect();
    schedule.shuffle(&mut rand::rng());
    // Popped from the end: the gateway restart (the enforcer's memory) comes first, then every
    // other kind once in random order, then random draws.
    if let Some(i) = schedule.iter().position(|f| *f == Fault::GatewayKill) {
        let f = schedule.remove(i);
        schedule.push(f);
    }
    // Faults on one part take turns: etcd's leader, and the paths to the gateway (a restart
    // probes the marks with every path to the gateway shut, so no write re-raises them first).
    // Two seconds of calm first, so the first faults find grants held and marks to remember.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let etcd_busy = Arc::new(tokio::sync::Mutex::new(()));
    let gateway_busy = Arc::new(tokio::sync::Mutex::new(()));
    let mut active = tokio::task::JoinSet::new();
    while Instant::now() < until {
        while active.try_join_next().is_some() {}
        if active.len() < 2 {
            let fault = schedule.pop().unwrap_or_else(|| draw(with_gateway));
            let busy = if fault.touches_etcd() {
                Some(&etcd_busy)
            } else if fault.touches_gateway_paths() {
                Some(&gateway_busy)
            } else {
                None
            };
            let guard = match busy.map(|b| b.clone().try_lock_owned()) {
                Some(Ok(g)) => Some(g),
                Some(Err(_)) => continue,
                None => None,
            };
            let (cluster, clients, log) = (cluster.clone(), clients.clone(), log.clone());
            active.spawn(async move {
                let _guard = guard;
                inject(fault, &cluster, &clients, &log, started).await;
            });
        }
        let pause = Duration::from_millis(rand::rng().random_range(500..1500));
        tokio::time::sleep(pause).await;
    }
    while active.join_next().await.is_some() {}
}

fn draw(with_gateway: bool) -> Fault {
    let kinds: Vec<Fault> = INFRASTRUCTURE
        .iter()
        .copied()
        .filter(|f| with_gateway || *f != Fault::GatewayKill)
        .collect();
    kinds
        .choose(&mut rand::rng())
        .copied()
        .unwrap_or(Fault::ProxyKill)
}

fn hold() -> Duration {
    Duration::from_millis(rand::rng().random_range(1000..3500))
}

async fn inject(fault: Fault, cluster: &Cluster, clients: &Clients, log: &Log, started: Instant) {
    let from = Instant::now();
    let mut resource = None;
    let proxy = rand::rng().random_range(0..cluster.proxies.len());
    match fault {
        Fault::ClientKill => resource = clients.kill_one(),
        Fault::ClientPause => {
            let beyond = Duration::from_secs(TTL_SECONDS)
                + Duration::from_millis(rand::rng().random_range(1000..4000));
            resource = clients.pause_one(beyond);
            tokio::time::sleep(beyond).await;
        }
        Fault::ProxyKill => {
            let p = &cluster.proxies[proxy];
            p.kill();
            tokio::time::sleep(hold()).await;
            if let Err(e) = p.start().await {
                eprintln!("nemesis: restarting {}: {e:#}", p.name());
            }
        }
        Fault::ProxyPause => {
            let p = &cluster.proxies[proxy];
            p.signal("STOP");
            tokio::time::sleep(hold()).await;
            p.signal("CONT");
        }
        Fault::GatewayKill => {
            if let Some(g) = &cluster.gateway {
                // Every path to the gateway is shut while it restarts and is probed, so that
                // no write re-raises a forgotten mark before the probe sees it.
                let paths: Vec<&crate::relay::Relay> = cluster
                    .paths
                    .iter()
                    .map(|p| &p.gateway)
                    .chain([&cluster.direct])
                    .collect();
                for r in &paths {
                    r.set(Mode::Blackhole);
                }
                let before = highest_applied(cluster);
                g.kill();
                let down = Duration::from_millis(rand::rng().random_range(200..1500));
                tokio::time::sleep(down).await;
                if let Err(e) = g.start().await {
                    eprintln!("nemesis: restarting the gateway: {e:#}");
                }
                probe(cluster, log, before).await;
                for r in &paths {
                    r.set(Mode::Pass);
                }
            }
        }
        Fault::LeaderKill => {
            let leader = cluster.etcd.lock().await.leader().await;
            if let Some(i) = leader {
                cluster.etcd.lock().await.kill(i);
                tokio::time::sleep(hold()).await;
                cluster.etcd.lock().await.restart(i).await;
            }
        }
        Fault::LeaderPause => {
            let leader = cluster.etcd.lock().await.leader().await;
            if let Some(i) = leader {
                cluster.etcd.lock().await.signal(i, "STOP");
                tokio::time::sleep(hold()).await;
                cluster.etcd.lock().await.signal(i, "CONT");
            }
        }
        Fault::BlackholeClientProxy
        | Fault::BlackholeProxyGateway
        | Fault::BlackholeProxyEtcd
        | Fault::DelayClientProxy
        | Fault::DelayProxyGateway
        | Fault::DelayProxyEtcd => {
            let paths = &cluster.paths[proxy];
            let relays: Vec<&crate::relay::Relay> = match fault {
                Fault::BlackholeClientProxy | Fault::DelayClientProxy => vec![&paths.clients],
                Fault::BlackholeProxyGateway | Fault::DelayProxyGateway => vec![&paths.gateway],
                _ => paths.etcd.iter().collect(),
            };
            let mode = match fault {
                Fault::DelayClientProxy | Fault::DelayProxyGateway | Fault::DelayProxyEtcd => {
                    Mode::Delay(Duration::from_millis(rand::rng().random_range(50..400)))
                }
                _ => Mode::Blackhole,
            };
            for r in &relays {
                r.set(mode);
            }
            tokio::time::sleep(hold()).await;
            for r in &relays {
                r.set(Mode::Pass);
            }
        }
    }
    let to = Instant::now();
    if let Ok(mut f) = log.faults.lock() {
        f.push(Injected {
            fault,
            from_s: from.duration_since(started).as_secs_f64(),
            to_s: to.duration_since(started).as_secs_f64(),
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

/// After a gateway restart: for every resource written before it, a write with a token one
/// below the highest applied must be refused — the mark survived the restart.
async fn probe(cluster: &Cluster, log: &Log, before: std::collections::BTreeMap<String, u64>) {
    let http = reqwest::Client::new();
    for (resource, revision) in before {
        if revision < 2 {
            continue;
        }
        let stale = revision - 1;
        let token = cluster.keys.mint(&resource, fencing::Token::new(0, stale));
        let status = http
            .put(format!("{}/items/{resource}", cluster.gateway_url))
            .header(fencing::TOKEN_HEADER, token)
            .header(fencing::RESOURCE_HEADER, &resource)
            .json(&serde_json::json!({"client": crate::checker::PROBE_CLIENT, "op": u64::MAX}))
            .send()
            .await
            .map_or(0, |r| r.status().as_u16());
        if let Ok(mut p) = log.probes.lock() {
            p.push(Probe {
                resource,
                revision: stale,
                status,
            });
        }
    }
}
