//! Competing clients: each loops acquire → writes (renewing at TTL/3) → release, on random
//! resources through random proxies, and records everything in the history. Writes go through
//! a proxy's forward route or straight to the enforcer with the signed token.
//!
//! The nemesis kills a client by aborting its task (no release: its lease must lapse) and
//! pauses one by making it stop dead before its next write for longer than its TTL — the
//! process-pause hazard: it wakes up believing it still holds the resource and writes at once,
//! straight to the enforcer (the path no proxy guards). While it sleeps, the other clients go for
//! its resource more often, so that it is likely to have a newer holder when the zombie wakes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::seq::IndexedRandom;
use rand::Rng;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::history::{outcome, Event, History, Kind, Outcome};

/// Lease TTL the clients ask for, in seconds.
pub const TTL_SECONDS: u64 = 3;

/// How much longer than its pause a paused client sleeps, at most, waiting for its resource to
/// get a newer holder.
const ZOMBIE_WAIT: Duration = Duration::from_secs(5);

/// What a client needs to know about the deployment.
#[derive(Clone)]
pub struct Env {
    /// Proxy base URLs (through the client→proxy relays).
    pub proxies: Vec<String>,
    /// Where direct writes go (the enforcer).
    pub direct: String,
    /// Resource names.
    pub resources: Vec<String>,
    /// The shared history.
    pub history: Arc<History>,
    /// Operation ids, unique across clients.
    pub ops: Arc<AtomicU64>,
    /// The resource of a paused holder, until when: other clients go for it more often, so that
    /// the zombie is likely to wake up to a newer holder (the hazard the enforcer exists for).
    pub contended: Arc<Mutex<Option<(String, Instant)>>>,
}

impl Env {
    /// The resource to go for next: the contended one 30 % of the time while it lasts, else any.
    fn next_resource(&self) -> String {
        let contended = self
            .contended
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .filter(|(_, until)| Instant::now() < *until);
        match contended {
            Some((resource, _)) if rand::rng().random_bool(0.3) => resource,
            _ => pick(&self.resources),
        }
    }
}

/// A client's handle for the nemesis.
pub struct Handle {
    /// The client's name.
    pub name: String,
    pause: Mutex<Option<Duration>>,
    holding: Mutex<Option<String>>,
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

    fn take_pause(&self) -> Option<Duration> {
        self.pause.lock().ok().and_then(|mut p| p.take())
    }

    fn set_holding(&self, r: Option<String>) {
        if let Ok(mut h) = self.holding.lock() {
            *h = r;
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
        let handle = Arc::new(Handle {
            name: format!("c{}", self.next.fetch_add(1, Ordering::Relaxed)),
            pause: Mutex::new(None),
            holding: Mutex::new(None),
        });
        let task = tokio::spawn(run(handle.clone(), self.env.clone()));
        if let Ok(mut r) = self.running.lock() {
            r.push((handle, task));
        }
    }

    /// Kills a random client, preferring one that holds a resource (and starts a
    /// replacement); returns what it held.
    pub fn kill_one(&self) -> Option<String> {
        let (handle, task) = {
            let mut running = self.running.lock().ok()?;
            let i = pick_victim(&running)?;
            running.swap_remove(i)
        };
        task.abort();
        self.spawn();
        handle.holding()
    }

    /// Pauses a random client, preferring one that holds a resource, for `d` before its next
    /// write; returns what it holds now.
    pub fn pause_one(&self, d: Duration) -> Option<String> {
        let running = self.running.lock().ok()?;
        let (handle, _) = &running[pick_victim(&running)?];
        handle.pause(d);
        let holding = handle.holding();
        if let (Some(resource), Ok(mut contended)) = (&holding, self.env.contended.lock()) {
            *contended = Some((resource.clone(), Instant::now() + d));
        }
        holding
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

async fn run(me: Arc<Handle>, env: Env) {
    let http = match reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
    {
        Ok(c) => c,
        Err(_) => return,
    };
    loop {
        let Some(grant) = acquire(&me, &env, &http).await else {
            tokio::time::sleep(jitter(10, 40)).await;
            continue;
        };
        me.set_holding(Some(grant.resource.clone()));
        let lost = hold(&me, &env, &http, &grant).await;
        me.set_holding(None);
        if !lost && rand::rng().random_bool(0.9) {
            let proxy = pick(&env.proxies);
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

/// A random holder if any client holds something, else any client.
fn pick_victim(running: &[(Arc<Handle>, JoinHandle<()>)]) -> Option<usize> {
    let holders: Vec<usize> = (0..running.len())
        .filter(|&i| running[i].0.holding().is_some())
        .collect();
    let pool: Vec<usize> = if holders.is_empty() {
        (0..running.len()).collect()
    } else {
        holders
    };
    pool.choose(&mut rand::rng()).copied()
}

fn pick(urls: &[String]) -> String {
    urls.choose(&mut rand::rng()).cloned().unwrap_or_default()
}

fn jitter(lo_ms: u64, hi_ms: u64) -> Duration {
    Duration::from_millis(rand::rng().random_range(lo_ms..hi_ms))
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

async fn acquire(me: &Handle, env: &Env, http: &reqwest::Client) -> Option<Grant> {
    let resource = env.next_resource();
    let proxy = pick(&env.proxies);
    let req = http
        .post(format!("{proxy}/v1/leases/{resource}"))
        .json(&json!({"holder": me.name, "ttl_seconds": TTL_SECONDS, "wait_ms": 2500}));
    let (result, body) = call(me, env, Kind::Acquire, &resource, None, req, next_op(env)).await;
    let body = body.filter(|_| result == Outcome::Ok)?;
    Some(Grant {
        secret: body["secret"].as_str()?.to_owned(),
        fencing_token: body["fencing_token"].as_str()?.to_owned(),
        revision: body["token"].as_str()?.parse().ok()?,
        resource,
    })
}

/// Writes and renews under `grant`; `true` when the grant turned out to be lost.
async fn hold(me: &Handle, env: &Env, http: &reqwest::Client, grant: &Grant) -> bool {
    let mut renewed = Instant::now();
    let mut zombie = false;
    let writes = rand::rng().random_range(10..30);
    for _ in 0..writes {
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
            let proxy = pick(&env.proxies);
            let req = http
                .post(format!("{proxy}/v1/leases/{}/renew", grant.resource))
                .header("lease-secret", &grant.secret);
            match call(
                me,
                env,
                Kind::Renew,
                &grant.resource,
                Some(grant.revision),
                req,
                next_op(env),
            )
            .await
            .0
            {
                Outcome::Ok => renewed = Instant::now(),
                Outcome::Fail(_) => return true,
                Outcome::Indeterminate => {}
            }
        }
        // A woken zombie writes straight to the enforcer: the path no proxy guards.
        let direct = zombie || rand::rng().random_bool(0.5);
        let op = next_op(env);
        let body = json!({"client": me.name, "op": op});
        let (kind, req) = if direct {
            (
                Kind::WriteDirect,
                http.put(format!("{}/items/{}", env.direct, grant.resource))
                    .header(fencing::TOKEN_HEADER, &grant.fencing_token)
                    .header(fencing::RESOURCE_HEADER, &grant.resource)
                    .json(&body),
            )
        } else {
            let proxy = pick(&env.proxies);
            (
                Kind::WriteViaProxy,
                http.put(format!(
                    "{proxy}/v1/leases/{}/forward/items/{}",
                    grant.resource, grant.resource
                ))
                .header("lease-secret", &grant.secret)
                .json(&body),
            )
        };
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
        if let Outcome::Fail(_) = result {
            return true;
        }
        tokio::time::sleep(jitter(2, 12)).await;
    }
    false
}
