//! Fleet clients: members of one fleet over resources of their own (`fleet-00`, …), which the
//! service assigns them, writing what they are given through the fence-gateways with their
//! tokens ([`member`]), under the same nemesis as every other client, plus events of their own
//! ([`crate::plan::FLEET`]): joins, leaves, deaths (restarted under the same name within the
//! TTL, or never), pauses (the whole member stopped dead, [`freeze`]), drains and evictions by
//! an operator.
//!
//! While they run, [`coverage`] samples who owns each resource, straight from etcd: the share of
//! resource-seconds held by a live member, the longest gap per resource, and whether any grant
//! passed from one member to another without ending first.

pub mod coverage;
mod freeze;
mod member;
mod running;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::history::{Event, History, Kind, Outcome};
use crate::plan::{stream, Step};
pub use freeze::{Freeze, Frozen};
pub use running::{create, FleetReport, LateWrites, Running, Stopped};

/// The fleet's name.
pub const FLEET: &str = "fleet";

/// How long a member has to release a resource moved away from it: shorter than the members'
/// TTL, so that a member stopped mid-hand-off is revoked at its deadline before it lapses.
pub const DRAIN_MS: u64 = 2000;

/// How long a member stopped before a write waits, at most, beyond its pause for its resource's
/// next grant (the worst case for its late write).
const ZOMBIE_WAIT: Duration = Duration::from_secs(5);

/// A fleet's shape in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// Members at the start.
    pub members: usize,
    /// Resources, `fleet-00` …
    pub resources: usize,
}

impl Shape {
    /// The fleet's resource names.
    pub fn resource_names(&self) -> Vec<String> {
        (0..self.resources)
            .map(|i| format!("fleet-{i:02}"))
            .collect()
    }
}

/// What the members need to know about the deployment.
#[derive(Clone)]
pub struct Env {
    /// Proxy base URLs (through the client→proxy relays).
    pub proxies: Vec<String>,
    /// The enforcers, through their relays.
    pub direct: Vec<String>,
    /// The shared history.
    pub history: Arc<History>,
    /// Operation ids, unique across clients.
    pub ops: Arc<AtomicU64>,
    /// The run's seed: member `mN` draws from stream `("member", N)`.
    pub seed: u64,
    counters: Arc<Counters>,
}

impl Env {
    /// The members' environment.
    pub fn new(
        proxies: Vec<String>,
        direct: Vec<String>,
        history: Arc<History>,
        ops: Arc<AtomicU64>,
        seed: u64,
    ) -> Self {
        Self {
            proxies,
            direct,
            history,
            ops,
            seed,
            counters: Arc::default(),
        }
    }

    fn proxy(&self, rng: &mut impl Rng) -> String {
        self.proxies.choose(rng).cloned().unwrap_or_default()
    }

    fn gateway(&self, rng: &mut impl Rng) -> String {
        self.direct.choose(rng).cloned().unwrap_or_default()
    }

    fn op(&self) -> u64 {
        self.ops.fetch_add(1, Ordering::Relaxed)
    }

    /// Records a grant `member` saw in its assignment.
    fn assigned(&self, member: &str, resource: &str, revision: u64, invoked: Instant) {
        self.history.record(Event {
            client: member.to_owned(),
            kind: Kind::Assigned,
            resource: resource.to_owned(),
            revision: Some(revision),
            op: self.op(),
            invoked,
            completed: Instant::now(),
            outcome: Outcome::Ok,
        });
    }

    /// Counts resources a view listed both as held and as releasing.
    fn contradictions(&self, n: usize) {
        self.counters
            .contradictions
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts a late write's outcome.
    fn late(&self, result: Outcome) {
        let counter = match result {
            Outcome::Ok => &self.counters.accepted,
            Outcome::Fail(_) => &self.counters.refused,
            Outcome::Indeterminate => &self.counters.unknown,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Late writes (a member's first write after a pause with the token it had, and an evicted
/// member's parting writes) by outcome, and contradictory views.
#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    refused: AtomicU64,
    unknown: AtomicU64,
    contradictions: AtomicU64,
}

/// A member's handle for the nemesis and the coverage sampler.
pub struct Handle {
    /// Its name in the fleet.
    pub name: String,
    freeze: Arc<Freeze>,
    /// A pause armed: stop dead before the next write.
    pause: AtomicBool,
    /// The write it stopped before: resource and token.
    stopped_before: Mutex<Option<(String, u64)>>,
    leave: AtomicBool,
    /// Drained or evicted: how long its restart takes (until it has restarted).
    restart: Mutex<Option<Duration>>,
    session: Mutex<Option<i64>>,
    held: Mutex<Vec<String>>,
    gone: AtomicBool,
}

impl Handle {
    fn new(name: String) -> Self {
        Self {
            name,
            freeze: Arc::default(),
            pause: AtomicBool::new(false),
            stopped_before: Mutex::new(None),
            leave: AtomicBool::new(false),
            restart: Mutex::new(None),
            session: Mutex::new(None),
            held: Mutex::new(Vec::new()),
            gone: AtomicBool::new(false),
        }
    }

    fn set_session(&self, id: Option<i64>) {
        if let Ok(mut s) = self.session.lock() {
            *s = id;
        }
    }

    fn set_held(&self, held: Vec<String>) {
        if let Ok(mut h) = self.held.lock() {
            *h = held;
        }
    }

    fn held(&self) -> Vec<String> {
        self.held.lock().map(|h| h.clone()).unwrap_or_default()
    }

    fn leaving(&self) -> bool {
        self.leave.load(Ordering::Acquire)
    }

    fn left(&self) {
        self.gone.store(true, Ordering::Release);
    }

    fn restart_after(&self) -> Duration {
        self.restart
            .lock()
            .ok()
            .and_then(|r| *r)
            .unwrap_or(Duration::from_millis(500))
    }

    fn restarted(&self) {
        if let Ok(mut r) = self.restart.lock() {
            *r = None;
        }
    }

    /// Whether a fault already has it (paused, leaving, drained or evicted).
    fn busy(&self) -> bool {
        self.pause.load(Ordering::Acquire)
            || self.freeze.is_frozen()
            || self.leaving()
            || self.restart.lock().is_ok_and(|r| r.is_some())
    }

    /// Before a write of `resource` with `revision`: when a pause is armed, stops the member
    /// dead here until the nemesis thaws it; whether it did (the write is then a late one).
    async fn stop_if_paused(&self, resource: &str, revision: u64) -> bool {
        if !self.pause.swap(false, Ordering::AcqRel) {
            return false;
        }
        if let Ok(mut s) = self.stopped_before.lock() {
            *s = Some((resource.to_owned(), revision));
        }
        self.freeze.freeze();
        // The member's task is not polled again until thawed.
        tokio::task::yield_now().await;
        true
    }

    /// Its session, if it is live: running and not stopped.
    fn live_session(&self) -> Option<i64> {
        if self.freeze.is_frozen() || self.gone.load(Ordering::Acquire) {
            return None;
        }
        self.session.lock().ok().and_then(|s| *s)
    }
}

/// The running members.
pub struct Members {
    env: Env,
    next: AtomicU64,
    running: Mutex<Vec<(Arc<Handle>, JoinHandle<()>)>>,
}

impl Members {
    /// Starts `n` members.
    pub fn start(env: Env, n: usize) -> Self {
        let members = Self {
            env,
            next: AtomicU64::new(0),
            running: Mutex::new(Vec::new()),
        };
        for _ in 0..n {
            members.spawn(None);
        }
        members
    }

    /// Starts a member: a new one, or `name` again (a restart).
    fn spawn(&self, name: Option<String>) -> String {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let name = name.unwrap_or_else(|| format!("m{index}"));
        let handle = Arc::new(Handle::new(name.clone()));
        let rng = stream(self.env.seed, "member", index);
        let task = tokio::spawn(Frozen::new(
            member::run(handle.clone(), self.env.clone(), rng),
            handle.freeze.clone(),
        ));
        if let Ok(mut r) = self.running.lock() {
            r.push((handle, task));
        }
        name
    }

    /// The sessions of the members that are live now: running, not stopped.
    pub fn live_sessions(&self) -> BTreeSet<i64> {
        self.running
            .lock()
            .map(|r| r.iter().filter_map(|(h, _)| h.live_session()).collect())
            .unwrap_or_default()
    }

    /// Late writes so far.
    pub fn late_writes(&self) -> LateWrites {
        let l = &self.env.counters;
        LateWrites {
            accepted: l.accepted.load(Ordering::Relaxed),
            refused: l.refused.load(Ordering::Relaxed),
            unknown: l.unknown.load(Ordering::Relaxed),
        }
    }

    /// Resources the members' views listed both as held and as releasing, so far.
    pub fn contradictions(&self) -> u64 {
        self.env.counters.contradictions.load(Ordering::Relaxed)
    }

    /// Candidate `choice` (modulo their number) among the running members no fault has,
    /// preferring those that hold something.
    fn victim(&self, choice: u64) -> Option<Arc<Handle>> {
        let mut running = self.running.lock().ok()?;
        running.retain(|(h, task)| !task.is_finished() && !h.gone.load(Ordering::Acquire));
        let free: Vec<&Arc<Handle>> = running
            .iter()
            .map(|(h, _)| h)
            .filter(|h| !h.busy())
            .collect();
        let holders: Vec<&Arc<Handle>> = free
            .iter()
            .copied()
            .filter(|h| !h.held().is_empty())
            .collect();
        let pool = if holders.is_empty() { free } else { holders };
        let n = u64::try_from(pool.len()).ok().filter(|&n| n > 0)?;
        pool.get(usize::try_from(choice % n).ok()?)
            .map(|h| (*h).clone())
    }

    /// Aborts `handle`'s task.
    fn kill(&self, handle: &Arc<Handle>) {
        let task = self.running.lock().ok().and_then(|mut r| {
            let i = r.iter().position(|(h, _)| Arc::ptr_eq(h, handle))?;
            Some(r.swap_remove(i).1)
        });
        if let Some(task) = task {
            task.abort();
        }
        handle.gone.store(true, Ordering::Release);
    }

    /// Injects a member event; what it hit, for the fault log.
    pub async fn inject(&self, step: &Step) -> String {
        use crate::nemesis::Fault;
        let hold = Duration::from_millis(step.hold_ms);
        if step.fault == Fault::MemberJoin {
            return self.spawn(None);
        }
        let Some(h) = self.victim(step.target) else {
            return String::new();
        };
        let held = h.held();
        let target = if held.is_empty() {
            h.name.clone()
        } else {
            format!("{} ({})", h.name, held.join(", "))
        };
        match step.fault {
            Fault::MemberLeave => h.leave.store(true, Ordering::Release),
            Fault::MemberDeath => {
                self.kill(&h);
                if !hold.is_zero() {
                    tokio::time::sleep(hold).await;
                    self.spawn(Some(h.name.clone()));
                    return format!("{target}, restarted after {:.1} s", hold.as_secs_f64());
                }
            }
            Fault::MemberPause => return self.pause(&h, hold, target).await,
            Fault::MemberDrain | Fault::MemberEvict => {
                if let Ok(mut r) = h.restart.lock() {
                    *r = Some(hold);
                }
                let drain = step.fault == Fault::MemberDrain;
                if !self.operator(&h.name, drain).await {
                    h.restarted();
                    return format!("{target} (not answered)");
                }
            }
            _ => {}
        }
        target
    }

    /// Stops `h` dead before its next write (or wherever it is, if it writes nothing within a
    /// second) for `hold`, and then until its resource has a newer grant (at most
    /// [`ZOMBIE_WAIT`] more); then lets it go on.
    async fn pause(&self, h: &Arc<Handle>, hold: Duration, target: String) -> String {
        h.pause.store(true, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(1);
        while !h.freeze.is_frozen() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Not taken before a write within the second: stopped wherever it is.
        if h.pause.swap(false, Ordering::AcqRel) {
            h.freeze.freeze();
        }
        tokio::time::sleep(hold).await;
        let before = h.stopped_before.lock().ok().and_then(|mut s| s.take());
        if let Some((resource, revision)) = &before {
            let waking = Instant::now() + ZOMBIE_WAIT;
            while Instant::now() < waking && !self.env.history.granted_above(resource, *revision) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        h.freeze.thaw();
        match before {
            Some((resource, revision)) => {
                format!("{target}, stopped before a write of {resource} with {revision}")
            }
            None => format!("{target}, stopped mid-loop"),
        }
    }

    /// An operator's drain (`drain`) or eviction of `member`, through the proxies for up to 3 s;
    /// whether one answered.
    async fn operator(&self, member: &str, drain: bool) -> bool {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut rng = fresh_rng();
        while Instant::now() < deadline {
            let proxy = self.env.proxy(&mut rng);
            let url = format!("{proxy}/v1/fleets/{FLEET}/members/{member}");
            let req = if drain {
                http.post(format!("{url}/drain"))
            } else {
                http.delete(url)
            };
            if req.send().await.is_ok_and(|r| r.status().is_success()) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Thaws and stops every member.
    pub fn stop(&self) {
        if let Ok(mut r) = self.running.lock() {
            for (h, task) in r.drain(..) {
                h.freeze.thaw();
                task.abort();
            }
        }
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A random stream for choices no plan depends on (which proxy a call goes through).
fn fresh_rng() -> StdRng {
    <StdRng as rand::SeedableRng>::seed_from_u64(rand::random())
}
