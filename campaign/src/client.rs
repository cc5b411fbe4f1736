//! Competing clients: each loops acquire → writes (renewing at TTL/3) → release, on random
//! resources through random proxies, and records everything in the history. Writes go through
//! a proxy's forward route or straight to the enforcer with the signed token.
//!
//! Odd-numbered clients hold their resources under a session (`POST /v1/sessions`): they open
//! one, heartbeat it between holds, acquire under it (one transaction, no lease grant), and open
//! a new one when it has lapsed — so session expiry, session grants' renew/release/forward and
//! group commit of both kinds of acquire meet every fault the others meet.
//!
//! Every client draws its choices (resource, proxy, route, number of writes, pauses between
//! them, release or walk away) from its own stream of the run's seed ([`crate::plan::stream`]).
//!
//! The nemesis kills a client by aborting its task (no release: its lease must lapse) — anywhere,
//! or while one of its writes is in flight (clients are in-process tasks: aborting the task
//! mid-request is this harness's SIGKILL of a client mid-request) — and pauses one by making it
//! stop dead before its next write for longer than its TTL — the process-pause hazard: it wakes
//! up believing it still holds the resource and writes at once, straight to the enforcer (the
//! path no proxy guards). While it sleeps, the other clients go for its resource more often, so
//! that it is likely to have a newer holder when the zombie wakes. It also makes a client's next
//! write give up ([`Quirk`]): socket closed while the body streams, or while the answer is
//! awaited, or a timeout shorter than the storage's processing, or a slow write the client stalls
//! with (its lease lapsing) and then abandons while the storage is still applying it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::belief::{Beliefs, Granted, Signal};
use crate::history::{outcome, Event, History, Kind, Outcome};
use crate::plan::stream;

mod mutex;

/// Lease TTL the clients ask for, in seconds.
pub const TTL_SECONDS: u64 = 3;

/// How long an acquire waits for a held resource, in milliseconds.
const ACQUIRE_WAIT_MS: u64 = 2500;

/// How much longer than its pause a paused client sleeps, at most, waiting for its resource to
/// get a newer holder.
const ZOMBIE_WAIT: Duration = Duration::from_secs(5);

/// What a client needs to know about the deployment.
#[derive(Clone)]
pub struct Env {
    /// Proxy base URLs (through the client→proxy relays).
    pub proxies: Vec<String>,
    /// Where direct writes go (the enforcers, through their relays).
    pub direct: Vec<String>,
    /// Acquires in flight, by proxy index (the nemesis aims proxy kills at them).
    pub acquiring: Arc<Vec<AtomicUsize>>,
    /// Resource names.
    pub resources: Vec<String>,
    /// The shared history.
    pub history: Arc<History>,
    /// Operation ids, unique across clients.
    pub ops: Arc<AtomicU64>,
    /// The resource of a paused holder, until when: other clients go for it more often, so that
    /// the zombie is likely to wake up to a newer holder (the hazard the enforcer exists for).
    pub contended: Arc<Mutex<Option<Contended>>>,
    /// The run's seed: client `cN` draws from stream `("client", N)`.
    pub seed: u64,
    /// The storage's shortest processing time: a [`Quirk::ShortTimeout`] write gives up before.
    pub processing_min: Duration,
    /// The locks the [`mutex`] clients take, by name, with their fencing resources
    /// (`fencing::lock_resource` of the name).
    pub locks: Vec<(String, String)>,
    /// The storage itself (no enforcer in front), for [`Env::unexchanged_locks`].
    pub storage: String,
    /// The [`Control::UnexchangedLocks`](crate::cluster::Control) control: the [`mutex`]
    /// clients write straight to the storage, and client pauses go for them.
    pub unexchanged_locks: bool,
    /// What the leasing clients' leases told them: their holds, for the belief verdict.
    pub beliefs: Arc<Beliefs>,
}

/// Every `MUTEX_EVERY`-th client (from the fifth) locks with etcd's Mutex recipe over gRPC
/// ([`mutex`]) instead of leasing over `/v1`.
const MUTEX_EVERY: u64 = 5;

/// A resource the other clients go for more often, for a while: a paused or stalled holder's,
/// so that it is likely to have a newer holder while the old one's write is still possible.
#[derive(Debug, Clone)]
pub struct Contended {
    /// The resource.
    pub resource: String,
    /// Until when.
    pub until: Instant,
    /// How often a client picks it for its next acquire.
    pub share: f64,
    /// For a stalled write: the enforcer it went to. Contenders then acquire through a proxy
    /// that pre-fences at another one, when there is one — the hard case for shared marks.
    pub gateway: Option<usize>,
}

impl Env {
    /// The resource to go for next (the contended one at its share while it lasts, else any),
    /// and the proxy to acquire it through.
    fn next_acquire(&self, rng: &mut StdRng) -> (String, usize) {
        let contended = self
            .contended
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .filter(|c| Instant::now() < c.until);
        let any_proxy = rng.random_range(0..self.proxies.len().max(1));
        match contended {
            Some(c) if rng.random_bool(c.share) => {
                // Proxy i pre-fences at gateway i mod their number.
                let proxy = match c.gateway {
                    Some(g) if self.direct.len() > 1 => (g + 1) % self.proxies.len().max(1),
                    _ => any_proxy,
                };
                (c.resource, proxy)
            }
            _ => (pick(rng, &self.resources), any_proxy),
        }
    }

    fn contend(&self, contended: Contended) {
        if let Ok(mut c) = self.contended.lock() {
            *c = Some(contended);
        }
    }
}

/// How a client's next write gives up (a client fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quirk {
    /// Send the headers and half the body, wait this long, close the socket.
    GiveUpMidBody(Duration),
    /// Send the whole write, wait this long, close the socket without reading the answer.
    GiveUpAwaitingAnswer(Duration),
    /// Give up after half the storage's shortest processing time.
    ShortTimeout,
    /// Send a write the storage takes [`SLOW_WRITE`] to apply, straight to an enforcer, stall
    /// with it (no renewals: the lease lapses) for the TTL and this much more, then close the
    /// socket before the answer.
    StallMidWrite(Duration),
    /// Send a write the storage takes this long to apply straight to enforcer `gateway`, and
    /// wait for its answer (no renewals meanwhile): the nemesis stops that enforcer between the
    /// write's registration and its answer ([`crate::nemesis::Fault::GatewayPauseMidAdmission`]).
    ThroughPausedGateway {
        /// The enforcer, by index.
        gateway: usize,
        /// The storage's processing time for the write.
        slow: Duration,
    },
}

/// How long the storage takes to apply a stalled client's write: longer than the TTL plus the
/// client's stall, so that it is still being applied when the client gives up and, the lease
/// having lapsed, another client may already be waiting for the resource.
pub const SLOW_WRITE: Duration = Duration::from_secs(TTL_SECONDS + 2);

/// How long a client whose enforcer is paused mid-admission waits for its write's answer:
/// longer than any pause of [`crate::nemesis::Fault::GatewayPauseMidAdmission`] and the write.
const PAUSED_WAIT: Duration = Duration::from_secs(30);

/// A client's handle for the nemesis.
pub struct Handle {
    /// The client's name.
    pub name: String,
    pause: Mutex<Option<Duration>>,
    quirk: Mutex<Option<Quirk>>,
    holding: Mutex<Option<String>>,
    writing: std::sync::atomic::AtomicBool,
    stalling: std::sync::atomic::AtomicBool,
    /// Holds its resources under a session.
    in_session: bool,
    /// Locks with etcd's Mutex recipe over gRPC ([`mutex`]).
    mutex: bool,
    /// Its open hold in [`Env::beliefs`], if any.
    belief: Mutex<Option<usize>>,
    /// Its simulated clock's rate, relative to the host's ([`crate::belief::SKEW`]).
    rate: f64,
}

impl Handle {
    /// Asks the client to stop dead for `d` before its next write.
    pub fn pause(&self, d: Duration) {
        if let Ok(mut p) = self.pause.lock() {
            *p = Some(d);
        }
    }

    /// The resource the client holds (as far as it knows), if any.
    pub fn holding(&self) -> Option<String> {
        self.holding.lock().ok().and_then(|h| h.clone())
    }

    /// Whether another fault already has this client: a pause or a give-up armed, or a stall
    /// under way. Other faults leave it alone, so that the armed one happens.
    fn busy(&self) -> bool {
        self.pause.lock().is_ok_and(|p| p.is_some())
            || self.quirk.lock().is_ok_and(|q| q.is_some())
            || self.stalling.load(Ordering::Acquire)
    }

    /// Arms `quirk` for the client's next write.
    pub fn arm(&self, quirk: Quirk) {
        if let Ok(mut q) = self.quirk.lock() {
            *q = Some(quirk);
        }
    }

    /// Takes back an armed quirk the client has not acted on yet; whether there was one.
    pub fn disarm(&self) -> bool {
        self.take_quirk().is_some()
    }

    fn take_pause(&self) -> Option<Duration> {
        self.pause.lock().ok().and_then(|mut p| p.take())
    }

    fn take_quirk(&self) -> Option<Quirk> {
        self.quirk.lock().ok().and_then(|mut q| q.take())
    }

    fn set_holding(&self, r: Option<String>) {
        if let Ok(mut h) = self.holding.lock() {
            *h = r;
        }
    }

    /// Its open hold's id in [`Env::beliefs`].
    fn belief(&self) -> Option<usize> {
        self.belief.lock().ok().and_then(|b| *b)
    }

    fn set_belief(&self, id: Option<usize>) {
        if let Ok(mut b) = self.belief.lock() {
            *b = id;
        }
    }
}

/// The running clients.
pub struct Clients {
    env: Env,
    next: AtomicU64,
    running: Mutex<Vec<(Arc<Handle>, JoinHandle<()>)>>,
}

impl Clients {
    /// Starts `n` clients.
    pub fn start(env: Env, n: usize) -> Self {
        let clients = Self {
            env,
            next: AtomicU64::new(0),
            running: Mutex::new(Vec::new()),
        };
        for _ in 0..n {
            clients.spawn();
        }
        clients
    }

    fn spawn(&self) {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let handle = Arc::new(Handle {
            name: format!("c{index}"),
            pause: Mutex::new(None),
            quirk: Mutex::new(None),
            holding: Mutex::new(None),
            writing: std::sync::atomic::AtomicBool::new(false),
            stalling: std::sync::atomic::AtomicBool::new(false),
            in_session: index % 2 == 1,
            mutex: index % MUTEX_EVERY == MUTEX_EVERY - 1,
            belief: Mutex::new(None),
            // Its own stream: the client's other draws stay as they were.
            rate: 1.0
                + stream(self.env.seed, "clock-skew", index)
                    .random_range(-crate::belief::SKEW..=crate::belief::SKEW),
        });
        let rng = stream(self.env.seed, "client", index);
        let task = if handle.mutex {
            tokio::spawn(mutex::run(handle.clone(), self.env.clone(), rng))
        } else {
            tokio::spawn(run(handle.clone(), self.env.clone(), rng))
        };
        if let Ok(mut r) = self.running.lock() {
            r.push((handle, task));
        }
    }

    /// Kills client `choice` (modulo the candidates), preferring clients that hold a resource,
    /// and starts a replacement; returns its name and what it held.
    pub fn kill_one(&self, choice: u64) -> Option<(String, Option<String>)> {
        let (handle, task) = {
            let mut running = self.running.lock().ok()?;
            let i = pick_victim(&running, choice, |h| !h.busy())?;
            running.swap_remove(i)
        };
        task.abort();
        self.env
            .beliefs
            .end(handle.belief(), Signal::Killed, Instant::now());
        self.spawn();
        Some((handle.name.clone(), handle.holding()))
    }

    /// Aborts client `choice`'s task while one of its writes is in flight (waiting up to 2 s
    /// for a write to be in flight, then aborting wherever it is) and starts a replacement;
    /// returns its name and what it held. Clients are tasks: this is their SIGKILL mid-request.
    pub async fn abort_mid_request(&self, choice: u64) -> Option<(String, Option<String>)> {
        let handle = {
            let running = self.running.lock().ok()?;
            let i = pick_victim(&running, choice, |h| !h.busy())?;
            running[i].0.clone()
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        while !handle.writing.load(Ordering::Acquire) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let task = {
            let mut running = self.running.lock().ok()?;
            let i = running.iter().position(|(h, _)| Arc::ptr_eq(h, &handle))?;
            running.swap_remove(i).1
        };
        task.abort();
        self.env
            .beliefs
            .end(handle.belief(), Signal::Killed, Instant::now());
        self.spawn();
        Some((handle.name.clone(), handle.holding()))
    }

    /// Pauses client `choice` (modulo the candidates), preferring clients that hold a resource,
    /// for `d` before its next write; returns its name and what it holds now.
    /// In the [`Env::unexchanged_locks`] control, only [`mutex`] clients are paused.
    pub fn pause_one(&self, choice: u64, d: Duration) -> Option<(String, Option<String>)> {
        let running = self.running.lock().ok()?;
        let eligible = |h: &Handle| !h.busy() && (h.mutex || !self.env.unexchanged_locks);
        let (handle, _) = &running[pick_victim(&running, choice, eligible)?];
        handle.pause(d);
        let holding = handle.holding();
        if let Some(resource) = &holding {
            self.env.contend(Contended {
                resource: resource.clone(),
                until: Instant::now() + d,
                share: 0.3,
                gateway: None,
            });
        }
        Some((handle.name.clone(), holding))
    }

    /// A client free of other faults that holds a resource (by `choice`), and that resource.
    /// Not a [`mutex`] client: those take no quirks, and this one is armed with one.
    pub fn holder(&self, choice: u64) -> Option<(Arc<Handle>, String)> {
        let running = self.running.lock().ok()?;
        let (handle, _) = &running[pick_victim(&running, choice, |h| !h.busy() && !h.mutex)?];
        let resource = handle.holding()?;
        Some((handle.clone(), resource))
    }

    /// Makes client `choice`'s next write give up as `quirk` (preferring holders no other fault
    /// has); returns its name and what it holds now. A client stalling mid-write makes its
    /// resource contended, as a paused one does. [`mutex`] clients have no quirks.
    pub fn quirk_one(&self, choice: u64, quirk: Quirk) -> Option<(String, Option<String>)> {
        let running = self.running.lock().ok()?;
        let (handle, _) = &running[pick_victim(&running, choice, |h| !h.busy() && !h.mutex)?];
        if let Ok(mut q) = handle.quirk.lock() {
            *q = Some(quirk);
        }
        let holding = handle.holding();
        if let (Quirk::StallMidWrite(_), Some(resource)) = (quirk, &holding) {
            self.env.contend(Contended {
                resource: resource.clone(),
                until: Instant::now() + SLOW_WRITE * 2,
                share: 0.6,
                gateway: None,
            });
        }
        Some((handle.name.clone(), holding))
    }

    /// Makes the other clients go for `resource` more often for `how_long`, acquiring through a
    /// proxy that pre-fences at another enforcer than `gateway`.
    pub fn contend(&self, resource: &str, how_long: Duration, gateway: usize) {
        self.env.contend(Contended {
            resource: resource.to_owned(),
            until: Instant::now() + how_long,
            share: 0.6,
            gateway: Some(gateway),
        });
    }

    /// Waits up to `within` until an acquire is in flight through proxy `proxy`; whether one was.
    pub async fn acquire_in_flight(&self, proxy: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if self
                .env
                .acquiring
                .get(proxy)
                .is_some_and(|n| n.load(Ordering::Acquire) > 0)
            {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Stops every client.
    pub fn stop(&self) {
        if let Ok(mut r) = self.running.lock() {
            for (_, task) in r.drain(..) {
                task.abort();
            }
        }
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Grant {
    resource: String,
    secret: String,
    fencing_token: String,
    revision: u64,
}

async fn run(me: Arc<Handle>, env: Env, mut rng: StdRng) {
    let http = match reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
    {
        Ok(c) => c,
        Err(_) => return,
    };
    let mut session: Option<Session> = None;
    loop {
        if me.in_session {
            session = keep_session(&me, &env, &http, &mut rng, session.take()).await;
            if session.is_none() {
                tokio::time::sleep(jitter(&mut rng, 10, 40)).await;
                continue;
            }
        }
        let (grant, session_lost) = acquire(&me, &env, &http, &mut rng, session.as_ref()).await;
        if session_lost {
            session = None;
        }
        let Some(grant) = grant else {
            tokio::time::sleep(jitter(&mut rng, 10, 40)).await;
            continue;
        };
        me.set_holding(Some(grant.resource.clone()));
        let lost = hold(&me, &env, &http, &grant, &mut rng).await;
        me.set_holding(None);
        // Released, or walked away from: either way it no longer believes it holds.
        env.beliefs
            .end(me.belief(), Signal::Released, Instant::now());
        me.set_belief(None);
        if !lost && rng.random_bool(0.9) {
            let proxy = pick(&mut rng, &env.proxies);
            let req = http
                .delete(format!("{proxy}/v1/leases/{}", grant.resource))
                .header("lease-secret", &grant.secret);
            call(
                &me,
                &env,
                Kind::Release,
                &grant.resource,
                Some(grant.revision),
                req,
                next_op(&env),
            )
            .await;
        }
    }
}

/// Candidate `choice` (modulo their number) among the clients that pass `eligible` and hold
/// something, else among those that pass it, else among all.
fn pick_victim(
    running: &[(Arc<Handle>, JoinHandle<()>)],
    choice: u64,
    eligible: impl Fn(&Handle) -> bool,
) -> Option<usize> {
    let all: Vec<usize> = (0..running.len()).collect();
    let passing: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| eligible(&running[i].0))
        .collect();
    let holders: Vec<usize> = passing
        .iter()
        .copied()
        .filter(|&i| running[i].0.holding().is_some())
        .collect();
    let pool = [holders, passing, all]
        .into_iter()
        .find(|p| !p.is_empty())?;
    let n = u64::try_from(pool.len()).ok()?;
    pool.get(usize::try_from(choice % n).ok()?).copied()
}

fn pick(rng: &mut StdRng, urls: &[String]) -> String {
    urls.choose(rng).cloned().unwrap_or_default()
}

fn jitter(rng: &mut StdRng, lo_ms: u64, hi_ms: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo_ms..hi_ms))
}

/// A fresh operation id.
fn next_op(env: &Env) -> u64 {
    env.ops.fetch_add(1, Ordering::Relaxed)
}

/// Sends `req` as operation `op` and records it; returns the outcome and the body when there
/// was an answer.
async fn call(
    me: &Handle,
    env: &Env,
    kind: Kind,
    resource: &str,
    revision: Option<u64>,
    req: reqwest::RequestBuilder,
    op: u64,
) -> (Outcome, Option<serde_json::Value>) {
    let invoked = Instant::now();
    let (status, body) = match req.send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let body = resp.json::<serde_json::Value>().await.ok();
            (Some(status), body)
        }
        Err(_) => (None, None),
    };
    let result = outcome(status);
    let revision = match (kind, &body) {
        (Kind::Acquire, Some(b)) if result == Outcome::Ok => {
            b["token"].as_str().and_then(|t| t.parse().ok())
        }
        _ => revision,
    };
    env.history.record(Event {
        client: me.name.clone(),
        kind,
        resource: resource.to_owned(),
        revision,
        op,
        invoked,
        completed: Instant::now(),
        outcome: result,
    });
    (result, body)
}

/// A client's session: its id and secret, and when it was last renewed (at the latest).
struct Session {
    id: String,
    secret: String,
    beat: Instant,
}

/// The session to acquire under next: `current` heartbeaten if a third of its TTL has passed
/// since its last renewal, or a new one if it has ended (or there is none). `None` if no
/// session could be had just now.
async fn keep_session(
    me: &Handle,
    env: &Env,
    http: &reqwest::Client,
    rng: &mut StdRng,
    current: Option<Session>,
) -> Option<Session> {
    let ttl = Duration::from_secs(TTL_SECONDS);
    if let Some(mut s) = current {
        if s.beat.elapsed() < ttl / 3 {
            return Some(s);
        }
        let proxy = pick(rng, &env.proxies);
        let sent = Instant::now();
        let answer = http
            .post(format!("{proxy}/v1/sessions/{}/keepalive", s.id))
            .header("lease-secret", &s.secret)
            .send()
            .await
            .map(|r| r.status().as_u16());
        match answer {
            Ok(200) => {
                s.beat = sent;
                return Some(s);
            }
            // Ended: open another below.
            Ok(410) => {}
            // Unknown: it may still live; try again next time unless it must have lapsed.
            _ if s.beat.elapsed() < ttl => return Some(s),
            _ => {}
        }
    }
    let proxy = pick(rng, &env.proxies);
    let sent = Instant::now();
    let resp = http
        .post(format!("{proxy}/v1/sessions"))
        .json(&json!({"holder": me.name, "ttl_seconds": TTL_SECONDS}))
        .send()
        .await
        .ok()?;
    if resp.status().as_u16() != 201 {
        return None;
    }
    let body = resp.json::<serde_json::Value>().await.ok()?;
    Some(Session {
        id: body["session_id"].as_str()?.to_owned(),
        secret: body["secret"].as_str()?.to_owned(),
        beat: sent,
    })
}

/// One acquire (under `session` if given); also whether the session turned out to have ended.
async fn acquire(
    me: &Handle,
    env: &Env,
    http: &reqwest::Client,
    rng: &mut StdRng,
    session: Option<&Session>,
) -> (Option<Grant>, bool) {
    let (resource, index) = env.next_acquire(rng);
    let proxy = env.proxies.get(index).cloned().unwrap_or_default();
    let body = match session {
        Some(s) => json!({"holder": me.name, "session": s.id, "wait_ms": ACQUIRE_WAIT_MS}),
        None => {
            json!({"holder": me.name, "ttl_seconds": TTL_SECONDS, "wait_ms": ACQUIRE_WAIT_MS})
        }
    };
    let mut req = http
        .post(format!("{proxy}/v1/leases/{resource}"))
        .json(&body)
        // Waiting for the resource, then the pre-fence (which waits for the old holder's writes
        // still in flight): give it that long before calling the outcome unknown.
        .timeout(Duration::from_millis(ACQUIRE_WAIT_MS) + Duration::from_millis(3500));
    if let Some(s) = session {
        req = req.header("lease-secret", &s.secret);
    }
    let counter = env.acquiring.get(index);
    if let Some(n) = counter {
        n.fetch_add(1, Ordering::AcqRel);
    }
    let sent = Instant::now();
    let (result, body) = call(me, env, Kind::Acquire, &resource, None, req, next_op(env)).await;
    if let Some(n) = counter {
        n.fetch_sub(1, Ordering::AcqRel);
    }
    let session_lost = result == Outcome::Fail(410);
    let grant = body.filter(|_| result == Outcome::Ok).and_then(|body| {
        let grant = Grant {
            secret: body["secret"].as_str()?.to_owned(),
            fencing_token: body["fencing_token"].as_str()?.to_owned(),
            revision: body["token"].as_str()?.parse().ok()?,
            resource,
        };
        let wait = Duration::from_millis(ACQUIRE_WAIT_MS);
        if let Some(granted) = Granted::answered(sent, &body, wait) {
            let (name, r) = (&me.name, &grant.resource);
            let id = env.beliefs.open(name, r, grant.revision, me.rate, granted);
            me.set_belief(id);
        }
        Some(grant)
    });
    (grant, session_lost)
}

/// Writes and renews under `grant`; `true` when the grant turned out to be lost.
async fn hold(
    me: &Handle,
    env: &Env,
    http: &reqwest::Client,
    grant: &Grant,
    rng: &mut StdRng,
) -> bool {
    let mut renewed = Instant::now();
    let mut zombie = false;
    let writes = rng.random_range(10..30);
    for _ in 0..writes {
        // Where a program checks its lease before acting: a pause below stops it after the
        // check, before the write (the process-pause hazard).
        let decided = Instant::now();
        if let Some(d) = me.take_pause() {
            tokio::time::sleep(d).await;
            // The worst case for the zombie: it wakes once its resource has a newer holder (if
            // one comes within a few seconds more), so its next write is one fencing must stop.
            let waking = Instant::now() + ZOMBIE_WAIT;
            while Instant::now() < waking
                && !env.history.granted_above(&grant.resource, grant.revision)
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            zombie = true;
        }
        if !zombie && renewed.elapsed() >= Duration::from_secs(TTL_SECONDS) / 3 {
            let proxy = pick(rng, &env.proxies);
            let req = http
                .post(format!("{proxy}/v1/leases/{}/renew", grant.resource))
                .header("lease-secret", &grant.secret);
            let sent = Instant::now();
            let (result, body) = call(
                me,
                env,
                Kind::Renew,
                &grant.resource,
                Some(grant.revision),
                req,
                next_op(env),
            )
            .await;
            match result {
                Outcome::Ok => {
                    renewed = Instant::now();
                    let granted = body.and_then(|b| Granted::answered(sent, &b, Duration::ZERO));
                    if let Some(granted) = granted {
                        env.beliefs.renewed(me.belief(), granted);
                    }
                }
                Outcome::Fail(_) => {
                    env.beliefs.end(me.belief(), Signal::Lost, Instant::now());
                    return true;
                }
                Outcome::Indeterminate => {}
            }
        }
        let mut quirk = if zombie { None } else { me.take_quirk() };
        // A woken zombie writes straight to an enforcer: the path no proxy guards; so does a
        // client about to stall mid-write, or whose enforcer is about to be paused.
        let stall = matches!(quirk, Some(Quirk::StallMidWrite(_)));
        let paused = match quirk {
            Some(Quirk::ThroughPausedGateway { gateway, slow }) => {
                // An ordinary write, slow and to that enforcer: answered by the enforcer.
                quirk = None;
                Some((gateway, slow))
            }
            _ => None,
        };
        let direct = zombie || stall || paused.is_some() || rng.random_bool(0.5);
        let op = next_op(env);
        let body = match (stall, paused) {
            (true, _) => json!({"client": me.name, "op": op, "slow_ms": SLOW_WRITE.as_millis()}),
            (_, Some((_, slow))) => {
                json!({"client": me.name, "op": op, "slow_ms": slow.as_millis()})
            }
            _ => json!({"client": me.name, "op": op}),
        };
        let (kind, url, headers) = if direct {
            let g = match paused {
                Some((gateway, _)) => gateway,
                None => rng.random_range(0..env.direct.len().max(1)),
            };
            let gateway = env.direct.get(g).cloned().unwrap_or_default();
            if stall {
                env.contend(Contended {
                    resource: grant.resource.clone(),
                    until: Instant::now() + SLOW_WRITE * 2,
                    share: 0.6,
                    gateway: Some(g),
                });
            }
            (
                Kind::WriteDirect,
                format!("{gateway}/items/{}", grant.resource),
                vec![
                    (fencing::TOKEN_HEADER, grant.fencing_token.clone()),
                    (fencing::RESOURCE_HEADER, grant.resource.clone()),
                ],
            )
        } else {
            let proxy = pick(rng, &env.proxies);
            (
                Kind::WriteViaProxy,
                format!(
                    "{proxy}/v1/leases/{}/forward/items/{}",
                    grant.resource, grant.resource
                ),
                vec![("lease-secret", grant.secret.clone())],
            )
        };
        let result = match quirk {
            Some(quirk) => give_up(me, env, kind, grant, op, quirk, &url, &headers, &body).await,
            None => {
                let mut req = http.put(&url).json(&body);
                if paused.is_some() {
                    // Waits out the enforcer's pause: a client that gave up would take the
                    // write with it (its enforcer would never send it).
                    req = req.timeout(PAUSED_WAIT);
                }
                for (name, value) in &headers {
                    req = req.header(*name, value);
                }
                me.writing.store(true, Ordering::Release);
                let (result, _) = call(
                    me,
                    env,
                    kind,
                    &grant.resource,
                    Some(grant.revision),
                    req,
                    op,
                )
                .await;
                me.writing.store(false, Ordering::Release);
                result
            }
        };
        env.beliefs.acted(me.belief(), decided);
        if let Outcome::Fail(_) = result {
            env.beliefs.end(me.belief(), Signal::Lost, Instant::now());
            return true;
        }
        tokio::time::sleep(jitter(rng, 2, 12)).await;
    }
    false
}

/// A write that gives up as `quirk`: recorded with an unknown outcome (the client cannot know
/// whether it took effect), unless an answer came in time.
#[allow(clippy::too_many_arguments)]
async fn give_up(
    me: &Handle,
    env: &Env,
    kind: Kind,
    grant: &Grant,
    op: u64,
    quirk: Quirk,
    url: &str,
    headers: &[(&str, String)],
    body: &serde_json::Value,
) -> Outcome {
    let invoked = Instant::now();
    let status = match quirk {
        Quirk::ShortTimeout => {
            let timeout = env.processing_min / 2;
            let mut req = reqwest::Client::new()
                .put(url)
                .json(body)
                .timeout(timeout.max(Duration::from_millis(1)));
            for (name, value) in headers {
                req = req.header(*name, value);
            }
            req.send().await.ok().map(|r| r.status().as_u16())
        }
        Quirk::StallMidWrite(beyond) => {
            // No renewals while it waits: the lease lapses during the stall.
            let wait = Duration::from_secs(TTL_SECONDS) + beyond;
            me.stalling.store(true, Ordering::Release);
            let _ = raw_write(url, headers, body, true, wait).await;
            me.stalling.store(false, Ordering::Release);
            None
        }
        // Sent as an ordinary write by `hold`.
        Quirk::ThroughPausedGateway { .. } => None,
        Quirk::GiveUpMidBody(wait) | Quirk::GiveUpAwaitingAnswer(wait) => {
            let whole = matches!(quirk, Quirk::GiveUpAwaitingAnswer(_));
            // Errors only mean the socket went away sooner: the outcome is unknown either way.
            let _ = raw_write(url, headers, body, whole, wait).await;
            None
        }
    };
    let result = outcome(status);
    env.history.record(Event {
        client: me.name.clone(),
        kind,
        resource: grant.resource.clone(),
        revision: Some(grant.revision),
        op,
        invoked,
        completed: Instant::now(),
        outcome: result,
    });
    result
}

/// Sends a PUT by hand over a fresh connection: the headers (announcing the whole body's
/// length), then the whole body or only its first half, waits `wait`, and closes the socket
/// without reading anything.
async fn raw_write(
    url: &str,
    headers: &[(&str, String)],
    body: &serde_json::Value,
    whole: bool,
    wait: Duration,
) -> std::io::Result<()> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let bytes = serde_json::to_vec(body)?;
    let mut head = format!(
        "PUT {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        bytes.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut socket = tokio::net::TcpStream::connect(host).await?;
    socket.set_nodelay(true)?;
    socket.write_all(head.as_bytes()).await?;
    let sent = if whole { bytes.len() } else { bytes.len() / 2 };
    socket.write_all(&bytes[..sent]).await?;
    tokio::time::sleep(wait).await;
    drop(socket);
    Ok(())
}
