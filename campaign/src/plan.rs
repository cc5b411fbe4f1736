//! A run's schedule, drawn from its seed before anything starts: which fault comes when, on
//! which target, for how long, and every client's random stream. Planning is separate from
//! execution so that a seed reproduces the schedule exactly (a test compares two generations,
//! and the committed data against a fresh one); execution then follows the plan, and only what
//! the deployment does in between (timings, who holds what when a fault fires) varies.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::nemesis::Fault;

mod fleet;

pub use fleet::{FLEET, MAX_MEMBERS, MIN_MEMBERS};

/// An independent random stream of a run: `name` and `index` pick the stream (the nemesis,
/// client 7, the storage), `seed` the run. Same inputs, same stream (rand's `StdRng`, pinned by
/// `Cargo.lock`).
pub fn stream(seed: u64, name: &str, index: u64) -> StdRng {
    // FNV-1a over the name, mixed with the index: distinct streams for distinct parts, so that
    // one part drawing more or less does not shift the others.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain(index.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    StdRng::seed_from_u64(seed ^ h)
}

/// One planned fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// When it is due, in milliseconds after the run started (it may start later if the part
    /// it touches is still busy with an earlier fault; the fault log has the real times).
    pub at_ms: u64,
    /// What.
    pub fault: Fault,
    /// Which proxy replica (path faults, proxy faults), or which client among the candidates
    /// (client faults: taken modulo their number when the fault fires).
    pub target: u64,
    /// How long the fault lasts (hold, pause beyond the TTL, or time down), in milliseconds.
    pub hold_ms: u64,
    /// The delay per chunk for delay faults, in milliseconds; 0 otherwise.
    pub delay_ms: u64,
}

/// Everything a seed decides about a run's faults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The seed.
    pub seed: u64,
    /// Infrastructure faults, in order.
    pub infrastructure: Vec<Step>,
    /// Client faults, in order.
    pub clients: Vec<Step>,
    /// The fleet's member events, in order (none in a run without a fleet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fleet: Vec<Step>,
}

/// The faults of the deployment (client faults run on their own schedule).
pub const INFRASTRUCTURE: [Fault; 17] = [
    Fault::ProxyKill,
    Fault::ProxyKillMidAcquire,
    Fault::ProxyPause,
    Fault::PgTerminateSessions,
    Fault::PgRestart,
    Fault::GatewayKill,
    Fault::LeaderKill,
    Fault::LeaderPause,
    Fault::BlackholeClientProxy,
    Fault::BlackholeProxyGateway,
    Fault::BlackholeProxyEtcd,
    Fault::DelayClientProxy,
    Fault::DelayProxyGateway,
    Fault::DelayProxyEtcd,
    Fault::DelayGatewayStorage,
    Fault::ResetGatewayStorage,
    Fault::BlackholeGatewayStorage,
];

/// The client faults and their weights.
pub const CLIENT: [(Fault, u32); 7] = [
    (Fault::ClientPause, 40),
    (Fault::ClientStallMidWrite, 40),
    (Fault::ClientKill, 12),
    (Fault::ClientAbortMidRequest, 12),
    (Fault::ClientGiveUpMidBody, 12),
    (Fault::ClientGiveUpAwaitingAnswer, 12),
    (Fault::ClientShortTimeout, 12),
];

/// Infrastructure faults at most this many at a time.
pub const MAX_CONCURRENT: usize = 2;

impl Plan {
    /// The plan for a run of `chaos` (the fault phase) with seed `seed` on a deployment of
    /// `parts`.
    pub fn generate(seed: u64, chaos: Duration, parts: Parts) -> Self {
        let until = u64::try_from(chaos.as_millis()).unwrap_or(u64::MAX);
        let (infrastructure, quiet_from) =
            infrastructure(&mut stream(seed, "nemesis", 0), until, parts);
        Self {
            seed,
            infrastructure,
            clients: clients(&mut stream(seed, "client-faults", 0), until, quiet_from),
            fleet: Vec::new(),
        }
    }
}

impl Plan {
    /// The plan of a [`Faults::PausedAdmissions`](crate::cluster::Faults) run: from 2 s on, every
    /// 5–7 s, a gateway paused mid-admission for 3–5 s — around the 4 s its registrations last,
    /// always longer than its store timeout.
    pub fn paused_admissions(seed: u64, chaos: Duration) -> Self {
        let until = u64::try_from(chaos.as_millis()).unwrap_or(u64::MAX);
        let rng = &mut stream(seed, "paused-admissions", 0);
        let mut clients = Vec::new();
        let mut now = 2000;
        while now < until {
            clients.push(Step {
                at_ms: now,
                fault: Fault::GatewayPauseMidAdmission,
                target: rng.random(),
                hold_ms: rng.random_range(3000..5000),
                delay_ms: 0,
            });
            now += rng.random_range(5000..7000);
        }
        Self {
            seed,
            infrastructure: Vec::new(),
            clients,
            fleet: Vec::new(),
        }
    }
}

impl Plan {
    /// The plan of a [`Marks::InDatabase`](crate::cluster::Marks) run ([`crate::indb`]): from
    /// 2–4 s on, every 3–6 s, a database or proxy fault (every client's or every proxy's
    /// sessions terminated, PostgreSQL crashed and restarted, a proxy killed and restarted);
    /// from 0.5–1.5 s on, every 0.6–1.4 s, a client fault — mostly holders stopped dead beyond
    /// their TTL before a write or with one's transaction open.
    pub fn in_database(seed: u64, chaos: Duration) -> Self {
        const INFRASTRUCTURE: [(Fault, u32); 3] = [
            (Fault::PgTerminateSessions, 3),
            (Fault::PgRestart, 2),
            (Fault::ProxyKill, 1),
        ];
        const CLIENT: [(Fault, u32); 4] = [
            (Fault::ClientPause, 3),
            (Fault::ClientPauseInTransaction, 3),
            (Fault::ClientKill, 1),
            (Fault::ClientAbortMidRequest, 1),
        ];
        let until = u64::try_from(chaos.as_millis()).unwrap_or(u64::MAX);
        let schedule =
            |rng: &mut StdRng, kinds: &[(Fault, u32)], first: (u64, u64), gap: (u64, u64)| {
                let mut steps = Vec::new();
                let mut now = rng.random_range(first.0..first.1);
                while now < until {
                    let fault = kinds
                        .choose_weighted(rng, |(_, w)| *w)
                        .map_or(kinds[0].0, |(f, _)| *f);
                    let hold_ms = match fault {
                        Fault::ClientPause | Fault::ClientPauseInTransaction => {
                            crate::client::TTL_SECONDS * 1000 + rng.random_range(500..3000)
                        }
                        Fault::PgRestart => rng.random_range(300..1500),
                        Fault::ProxyKill => rng.random_range(500..1500),
                        _ => 0,
                    };
                    steps.push(Step {
                        at_ms: now,
                        fault,
                        target: rng.random(),
                        hold_ms,
                        delay_ms: 0,
                    });
                    now += rng.random_range(gap.0..gap.1);
                }
                steps
            };
        Self {
            seed,
            infrastructure: schedule(
                &mut stream(seed, "in-database", 0),
                &INFRASTRUCTURE,
                (2000, 4000),
                (3000, 6000),
            ),
            clients: schedule(
                &mut stream(seed, "in-database-clients", 0),
                &CLIENT,
                (500, 1500),
                (600, 1400),
            ),
            fleet: Vec::new(),
        }
    }
}

/// How long the deployment is left alone, once every infrastructure kind has been met, for a
/// client stalling mid-write (its window: the lease lapses within [`crate::client::TTL_SECONDS`],
/// it gives up soon after, its slow write is applied [`crate::client::SLOW_WRITE`] after it was
/// sent). A fault on the storage hop or the path to an enforcer during that window stops the
/// slow write or the new holder's, and the gateway without its fix then behaves like the fixed
/// one (docs/RELIABILITY.md: every stall `release-with-caller` missed overlapped one).
pub const QUIET_MS: u64 = 7_000;

/// When the stall starts within the quiet window: slack for faults that end later than planned.
pub const STALL_AFTER_MS: u64 = 500;

impl Plan {
    /// When the quiet window around the planned stall mid-write ends, in milliseconds after the
    /// start (0 without one): the run goes on at least this long, so that the stall plays out.
    pub fn quiet_until_ms(&self) -> u64 {
        self.clients
            .iter()
            .filter(|s| s.fault == Fault::ClientStallMidWrite)
            .map(|s| s.at_ms + QUIET_MS - STALL_AFTER_MS)
            .max()
            .unwrap_or(0)
    }
}

/// Which parts a deployment has, for the faults that need them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    /// An enforcer (gateway restarts, the gateway→storage hop).
    pub gateway: bool,
    /// Marks in PostgreSQL (session kills, restarts).
    pub postgres: bool,
}

impl Parts {
    /// Everything: gateways sharing PostgreSQL.
    pub const ALL: Parts = Parts {
        gateway: true,
        postgres: true,
    };
}

fn kinds(parts: Parts) -> Vec<Fault> {
    INFRASTRUCTURE
        .iter()
        .copied()
        .filter(|f| parts.gateway || !f.needs_gateway())
        .filter(|f| parts.postgres || !f.needs_postgres())
        .collect()
}

/// Planned length of a fault, for keeping to the concurrency limits while planning: its hold
/// plus what a restart usually takes.
fn planned_length(step: &Step) -> u64 {
    match step.fault {
        Fault::ProxyKill | Fault::ProxyKillMidAcquire | Fault::GatewayKill | Fault::LeaderKill => {
            step.hold_ms + 1000
        }
        Fault::PgRestart => step.hold_ms + 2000,
        Fault::PgTerminateSessions => 500,
        _ => step.hold_ms,
    }
}

/// The infrastructure schedule, and when its quiet window (see [`QUIET_MS`]) starts.
fn infrastructure(rng: &mut StdRng, until: u64, parts: Parts) -> (Vec<Step>, u64) {
    let mut schedule = kinds(parts);
    schedule.shuffle(rng);
    // Popped from the end: the gateway restart (the enforcer's memory) comes first, then every
    // other kind once in random order, then random draws.
    if let Some(i) = schedule.iter().position(|f| *f == Fault::GatewayKill) {
        let f = schedule.remove(i);
        schedule.push(f);
    }
    let all = kinds(parts);
    let mut steps = Vec::new();
    let mut active: Vec<(u64, Fault)> = Vec::new();
    // Two seconds of calm first, so the first faults find grants held and marks to remember.
    let mut now = 2000;
    // Once every kind has been met: when the faults then active end, the quiet window.
    let mut quiet_from = None;
    while now < until {
        active.retain(|(end, _)| *end > now);
        if schedule.is_empty() && quiet_from.is_none() {
            quiet_from = Some(active.iter().map(|(end, _)| *end).fold(now, u64::max));
        }
        // From then on nothing new starts until the window has passed.
        let quiet = quiet_from.is_some_and(|q| now < q + QUIET_MS);
        if active.len() < MAX_CONCURRENT && !quiet {
            // The next kind not yet met whose part is free — the storage hop's and the marks'
            // kinds first, as they all take turns with each other — else a random draw whose
            // part is free (a few tries); a busy part's kind waits for a later turn.
            let free = |f: &Fault| !active.iter().any(|(_, a)| a.conflicts(*f));
            let serial = |f: &Fault| free(f) && f.conflicts(Fault::GatewayKill);
            let unmet = schedule
                .iter()
                .rposition(serial)
                .or_else(|| schedule.iter().rposition(free));
            let fault = match unmet {
                Some(i) => Some(schedule.remove(i)),
                None if schedule.is_empty() => {
                    (0..8).filter_map(|_| all.choose(rng).copied()).find(free)
                }
                None => None,
            };
            if let Some(fault) = fault {
                let step = draw_step(rng, now, fault);
                active.push((now + planned_length(&step), fault));
                steps.push(step);
            }
        }
        // Denser while kinds are still unmet, so that a 30 s run meets every one.
        now += if schedule.is_empty() {
            rng.random_range(500..1500)
        } else {
            rng.random_range(300..900)
        };
    }
    // Kinds still unmet when the fault phase ends: the window opens when the last fault ends.
    let quiet_from = quiet_from.unwrap_or_else(|| {
        steps
            .iter()
            .map(|s| s.at_ms + planned_length(s))
            .fold(until, u64::max)
    });
    (steps, quiet_from)
}

fn draw_step(rng: &mut StdRng, at_ms: u64, fault: Fault) -> Step {
    let target = rng.random_range(0..2);
    let (hold_ms, delay_ms) = match fault {
        Fault::GatewayKill => (rng.random_range(200..1500), 0),
        Fault::PgRestart => (rng.random_range(200..1500), 0),
        Fault::PgTerminateSessions => (0, 0),
        Fault::ResetGatewayStorage => (rng.random_range(100..600), 0),
        Fault::DelayClientProxy
        | Fault::DelayProxyGateway
        | Fault::DelayProxyEtcd
        | Fault::DelayGatewayStorage => (rng.random_range(700..2500), rng.random_range(50..400)),
        _ => (rng.random_range(700..2500), 0),
    };
    Step {
        at_ms,
        fault,
        target,
        hold_ms,
        delay_ms,
    }
}

/// The client faults; a stall mid-write opens the quiet window at `quiet_from`.
fn clients(rng: &mut StdRng, until: u64, quiet_from: u64) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut now = 0;
    let mut stall_planned = false;
    while now < until {
        // The first client fault is a pause: every run has a zombie early. The first fault due
        // in the quiet window is a stall mid-write, moved to its start: every run has a write
        // still being applied when its writer's lease has lapsed, with nothing else in the way.
        let stall = !stall_planned && now >= quiet_from;
        if stall {
            stall_planned = true;
            now = quiet_from + STALL_AFTER_MS;
        }
        let fault = if steps.is_empty() {
            Fault::ClientPause
        } else if stall {
            Fault::ClientStallMidWrite
        } else {
            CLIENT
                .choose_weighted(rng, |(_, w)| *w)
                .map_or(Fault::ClientPause, |(f, _)| *f)
        };
        let hold_ms = match fault {
            // Beyond the TTL: the lease lapses while the client sleeps.
            Fault::ClientPause => crate::client::TTL_SECONDS * 1000 + rng.random_range(1000..4000),
            // How long a client giving up waits before closing its socket.
            Fault::ClientGiveUpMidBody | Fault::ClientGiveUpAwaitingAnswer => {
                rng.random_range(0..40)
            }
            // How long after its lease lapsed the stalled client gives up on its slow write.
            Fault::ClientStallMidWrite => rng.random_range(300..1200),
            _ => 0,
        };
        steps.push(Step {
            at_ms: now,
            fault,
            target: rng.random(),
            hold_ms,
            delay_ms: 0,
        });
        now += rng.random_range(1500..3000);
    }
    if !stall_planned {
        // The quiet window opens as the fault phase ends (the run waits for it).
        steps.push(Step {
            at_ms: quiet_from + STALL_AFTER_MS,
            fault: Fault::ClientStallMidWrite,
            target: rng.random(),
            hold_ms: rng.random_range(300..1200),
            delay_ms: 0,
        });
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_reproduces_its_schedule() {
        let chaos = Duration::from_secs(24);
        for seed in [0, 1, 17, u64::MAX] {
            let a = Plan::generate(seed, chaos, Parts::ALL);
            let b = Plan::generate(seed, chaos, Parts::ALL);
            assert_eq!(a, b);
            assert_eq!(
                serde_json::to_string(&a).ok(),
                serde_json::to_string(&b).ok()
            );
        }
        assert_ne!(
            Plan::generate(1, chaos, Parts::ALL),
            Plan::generate(2, chaos, Parts::ALL)
        );
    }

    #[test]
    fn a_plan_meets_every_kind_and_keeps_the_limits() {
        for seed in 0..500 {
            meets_every_kind_and_keeps_the_limits(seed);
        }
    }

    fn meets_every_kind_and_keeps_the_limits(seed: u64) {
        let plan = Plan::generate(seed, Duration::from_secs(24), Parts::ALL);
        assert_eq!(
            plan.infrastructure.first().map(|s| s.fault),
            Some(Fault::GatewayKill)
        );
        for f in INFRASTRUCTURE {
            assert!(
                plan.infrastructure.iter().any(|s| s.fault == f),
                "seed {seed}: {f:?} never planned"
            );
        }
        assert_eq!(
            plan.clients.first().map(|s| s.fault),
            Some(Fault::ClientPause)
        );
        // The quiet window: a stall mid-write at its start, no infrastructure fault planned to
        // run into it or to start in it.
        let (_, quiet_from) = infrastructure(&mut stream(seed, "nemesis", 0), 24_000, Parts::ALL);
        assert!(
            plan.clients
                .iter()
                .any(|s| s.fault == Fault::ClientStallMidWrite
                    && s.at_ms == quiet_from + STALL_AFTER_MS),
            "seed {seed}: no stall at the quiet window"
        );
        assert!(plan.quiet_until_ms() >= quiet_from + QUIET_MS);
        assert!(
            plan.infrastructure
                .iter()
                .all(|s| s.at_ms + planned_length(s) <= quiet_from
                    || s.at_ms >= quiet_from + QUIET_MS),
            "seed {seed}: a fault in the quiet window"
        );
        for (i, s) in plan.infrastructure.iter().enumerate() {
            let overlapping: Vec<&Step> = plan.infrastructure[..i]
                .iter()
                .filter(|e| e.at_ms + planned_length(e) > s.at_ms)
                .collect();
            assert!(overlapping.len() < MAX_CONCURRENT, "{s:?}");
            assert!(
                overlapping.iter().all(|e| !e.fault.conflicts(s.fault)),
                "{s:?}"
            );
        }
        let without = Plan::generate(
            42,
            Duration::from_secs(24),
            Parts {
                gateway: false,
                postgres: false,
            },
        );
        assert!(without
            .infrastructure
            .iter()
            .all(|s| !s.fault.needs_gateway() && !s.fault.needs_postgres()));
    }

    #[test]
    fn streams_are_independent() {
        let a: u64 = stream(5, "client", 0).random();
        let b: u64 = stream(5, "client", 1).random();
        let c: u64 = stream(5, "client", 0).random();
        assert_ne!(a, b);
        assert_eq!(a, c);
    }
}
