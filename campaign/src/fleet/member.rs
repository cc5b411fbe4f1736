//! One member's loop, as docs/API.md describes a member: join; keep the session alive at a third
//! of its TTL; long-poll the assignment; write what appears in `held` — through a proxy's
//! forward route with the session's secret, or straight to an enforcer with the grant's
//! fencing token — and release what appears in `releasing` once no write of it is in flight;
//! join again when the session has ended.
//!
//! Every grant the member sees appear in `held` (a resource with a token it had not seen) is a
//! grant in the history ([`Kind::Assigned`]), at the moment the view came back; every write is
//! recorded as the other clients' are. The nemesis stops a member dead before a write (it then
//! goes on with the token it had: a late write), makes it leave, or drains or evicts it as an
//! operator; the member answers a drain by handing everything off and restarting, an eviction
//! by writing once more with each token it held (a worker that has not noticed) and restarting.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::{fresh_rng, Env, Handle, FLEET};
use crate::client::TTL_SECONDS;
use crate::history::{outcome, Event, Kind, Outcome};

/// How long a long poll of the assignment waits for a change.
const WAIT_MS: u64 = 1500;

/// A member's session.
pub(super) struct Session {
    pub(super) id: String,
    secret: String,
}

/// A grant the member holds: its token, and whether a write with it was refused (it is not
/// written again until the assignment shows a new token).
#[derive(Debug, Clone)]
struct Grant {
    revision: u64,
    fencing_token: String,
    refused: bool,
}

/// What the member knows of its assignment.
#[derive(Debug, Default)]
struct Assignment {
    held: BTreeMap<String, Grant>,
    /// Resources moved away from it, with the token it held them by (if it ever saw one).
    releasing: BTreeMap<String, Option<u64>>,
    /// Every token it has seen per resource: a grant is new when its token is.
    seen: BTreeSet<(String, u64)>,
    state: String,
    revision: Option<String>,
}

/// How an incarnation ended.
enum End {
    /// Its session ended (lapsed, or replaced): join again at once.
    Lost,
    /// Asked to leave: close the session, and stop.
    Leave,
    /// Drained or evicted: close the session, and join again after this (a restart).
    Restart(Duration),
}

/// The member's life: incarnations (a session each) until it leaves.
pub(super) async fn run(me: Arc<Handle>, env: Env, mut rng: StdRng) {
    let Ok(http) = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
    else {
        return;
    };
    loop {
        let Some(session) = join(&me, &env, &http, &mut rng).await else {
            tokio::time::sleep(jitter(&mut rng, 50, 200)).await;
            continue;
        };
        me.set_session(session.id.parse().ok());
        let state = Mutex::new(Assignment::default());
        let end = tokio::select! {
            end = keepalive(&env, &http, &session, rng.random()) => end,
            end = follow(&me, &env, &http, &session, &state) => end,
            end = work(&me, &env, &http, &session, &state, rng.random()) => end,
        };
        me.set_session(None);
        me.set_held(Vec::new());
        match end {
            End::Lost => {}
            End::Leave => {
                close(&env, &http, &session).await;
                me.left();
                return;
            }
            End::Restart(after) => {
                close(&env, &http, &session).await;
                tokio::time::sleep(after).await;
                me.restarted();
            }
        }
    }
}

/// `POST /v1/fleets/{fleet}/members` through a random proxy.
async fn join(me: &Handle, env: &Env, http: &reqwest::Client, rng: &mut StdRng) -> Option<Session> {
    let proxy = env.proxy(rng);
    let resp = http
        .post(format!("{proxy}/v1/fleets/{FLEET}/members"))
        .json(&json!({"member": me.name, "ttl_seconds": TTL_SECONDS}))
        .send()
        .await
        .ok()?;
    if resp.status().as_u16() != 201 {
        return None;
    }
    let body = resp.json::<Value>().await.ok()?;
    Some(Session {
        id: body["session_id"].as_str()?.to_owned(),
        secret: body["secret"].as_str()?.to_owned(),
    })
}

/// `DELETE /v1/sessions/{id}`: every grant of the session ends at once.
async fn close(env: &Env, http: &reqwest::Client, session: &Session) {
    let mut rng = fresh_rng();
    for _ in 0..3 {
        let proxy = env.proxy(&mut rng);
        let closed = http
            .delete(format!("{proxy}/v1/sessions/{}", session.id))
            .header("lease-secret", &session.secret)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if closed {
            return;
        }
    }
}

/// Heartbeats every third of the TTL until the session has ended (an answer says so, or no
/// heartbeat has been answered for a whole TTL).
async fn keepalive(env: &Env, http: &reqwest::Client, session: &Session, seed: u64) -> End {
    let ttl = Duration::from_secs(TTL_SECONDS);
    let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let mut renewed = Instant::now();
    loop {
        tokio::time::sleep(ttl / 3).await;
        let proxy = env.proxy(&mut rng);
        let sent = Instant::now();
        let answer = http
            .post(format!("{proxy}/v1/sessions/{}/keepalive", session.id))
            .header("lease-secret", &session.secret)
            .timeout(ttl / 3)
            .send()
            .await
            .map(|r| r.status().as_u16());
        match answer {
            Ok(200) => renewed = sent,
            Ok(404 | 410) => return End::Lost,
            _ if renewed.elapsed() >= ttl => return End::Lost,
            _ => {}
        }
    }
}

/// Follows the assignment (long polls) until the session has ended, or the member is drained
/// and holds nothing, or it is evicted (after its parting writes).
async fn follow(
    me: &Handle,
    env: &Env,
    http: &reqwest::Client,
    session: &Session,
    state: &Mutex<Assignment>,
) -> End {
    let mut rng = fresh_rng();
    loop {
        let after = lock(state).revision.clone().unwrap_or_else(|| "0".into());
        let proxy = env.proxy(&mut rng);
        let invoked = Instant::now();
        let answer = http
            .get(format!(
                "{proxy}/v1/fleets/{FLEET}/members/{}?after={after}&wait_ms={WAIT_MS}",
                me.name
            ))
            .header("lease-secret", &session.secret)
            .send()
            .await;
        let (status, body) = crate::history::answer(answer).await;
        match (status, body) {
            (Some(200), Some(view)) => {
                let before = lock(state).held.clone();
                let (fresh, both) = update(&mut lock(state), &view);
                env.contradictions(both);
                for (resource, revision) in fresh {
                    env.assigned(&me.name, &resource, revision, invoked);
                }
                me.set_held(lock(state).held.keys().cloned().collect());
                let st = lock(state).state.clone();
                if st == "evicted" {
                    parting_writes(me, env, http, before).await;
                    return End::Restart(me.restart_after());
                }
                let idle = {
                    let s = lock(state);
                    s.held.is_empty() && s.releasing.is_empty()
                };
                if st == "draining" && idle {
                    return End::Restart(me.restart_after());
                }
            }
            // The session ended (no-member), or another session has the name (not-member).
            (Some(403 | 404), _) => return End::Lost,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Takes a member view into `s`; the grants it shows for the first time, and how many of its
/// resources it lists both as held and as releasing.
fn update(s: &mut Assignment, view: &Value) -> (Vec<(String, u64)>, usize) {
    let mut fresh = Vec::new();
    let mut held = BTreeMap::new();
    for h in view["held"].as_array().into_iter().flatten() {
        let (Some(resource), Some(revision), Some(token)) = (
            h["resource"].as_str(),
            h["token"].as_str().and_then(|t| t.parse::<u64>().ok()),
            h["fencing_token"].as_str(),
        ) else {
            continue;
        };
        if s.seen.insert((resource.to_owned(), revision)) {
            fresh.push((resource.to_owned(), revision));
        }
        let refused = s
            .held
            .get(resource)
            .is_some_and(|g| g.revision == revision && g.refused);
        held.insert(
            resource.to_owned(),
            Grant {
                revision,
                fencing_token: token.to_owned(),
                refused,
            },
        );
    }
    let mut releasing = BTreeMap::new();
    for r in view["releasing"].as_array().into_iter().flatten() {
        if let Some(resource) = r["resource"].as_str() {
            let token = s.held.get(resource).map(|g| g.revision);
            let known = s.releasing.get(resource).copied().flatten();
            releasing.insert(resource.to_owned(), token.or(known));
        }
    }
    let both = releasing.keys().filter(|r| held.contains_key(*r)).count();
    s.held = held;
    s.releasing = releasing;
    s.state = view["state"].as_str().unwrap_or_default().to_owned();
    s.revision = view["revision"].as_str().map(str::to_owned);
    (fresh, both)
}

/// Writes what it holds, one resource after another, releasing what it must give up between
/// two writes; stops the member dead before a write when a pause is armed; leaves when asked.
async fn work(
    me: &Handle,
    env: &Env,
    http: &reqwest::Client,
    session: &Session,
    state: &Mutex<Assignment>,
    seed: u64,
) -> End {
    let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let mut turn = 0usize;
    loop {
        if me.leaving() {
            return End::Leave;
        }
        let releasing: Vec<(String, Option<u64>)> = lock(state)
            .releasing
            .iter()
            .map(|(r, t)| (r.clone(), *t))
            .collect();
        for (resource, token) in releasing {
            release(me, env, http, session, &resource, token).await;
            // Released: not written again, even where the view listed it as held too.
            let mut s = lock(state);
            s.releasing.remove(&resource);
            s.held.remove(&resource);
        }
        let next = {
            let s = lock(state);
            let writable: Vec<(&String, &Grant)> =
                s.held.iter().filter(|(_, g)| !g.refused).collect();
            turn = turn.wrapping_add(1);
            writable
                .get(turn % writable.len().max(1))
                .map(|(r, g)| ((*r).clone(), (*g).clone()))
        };
        let Some((resource, grant)) = next else {
            tokio::time::sleep(Duration::from_millis(30)).await;
            continue;
        };
        let late = me.stop_if_paused(&resource, grant.revision).await;
        let direct = late || rng.random_bool(0.5);
        let result = write(me, env, http, session, &resource, &grant, direct, &mut rng).await;
        if late {
            env.late(result);
        }
        if let Outcome::Fail(_) = result {
            if let Some(g) = lock(state).held.get_mut(&resource) {
                if g.revision == grant.revision {
                    g.refused = true;
                }
            }
        }
        tokio::time::sleep(jitter(&mut rng, 30, 80)).await;
    }
}

/// An evicted member's last writes: once more with each token it held (`held`, before it
/// learnt of its eviction), straight to an enforcer.
async fn parting_writes(
    me: &Handle,
    env: &Env,
    http: &reqwest::Client,
    held: BTreeMap<String, Grant>,
) {
    let mut rng = fresh_rng();
    let direct_only = Session {
        id: String::new(),
        secret: String::new(),
    };
    for (resource, grant) in held {
        let result = write(
            me,
            env,
            http,
            &direct_only,
            &resource,
            &grant,
            true,
            &mut rng,
        )
        .await;
        env.late(result);
    }
}

/// One write of `resource` under `grant`, recorded.
#[allow(clippy::too_many_arguments)]
async fn write(
    me: &Handle,
    env: &Env,
    http: &reqwest::Client,
    session: &Session,
    resource: &str,
    grant: &Grant,
    direct: bool,
    rng: &mut impl Rng,
) -> Outcome {
    let op = env.op();
    let body = json!({"client": me.name, "op": op});
    let (kind, req) = if direct {
        let gateway = env.gateway(rng);
        let req = http
            .put(format!("{gateway}/items/{resource}"))
            .header(fencing::TOKEN_HEADER, &grant.fencing_token)
            .header(fencing::RESOURCE_HEADER, resource);
        (Kind::WriteDirect, req)
    } else {
        let proxy = env.proxy(rng);
        let req = http
            .put(format!(
                "{proxy}/v1/leases/{resource}/forward/items/{resource}"
            ))
            .header("lease-secret", &session.secret);
        (Kind::WriteViaProxy, req)
    };
    let invoked = Instant::now();
    let status = req
        .json(&body)
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16());
    let result = outcome(status);
    env.history.record(Event {
        client: me.name.clone(),
        kind,
        resource: resource.to_owned(),
        revision: Some(grant.revision),
        op,
        invoked,
        completed: Instant::now(),
        outcome: result,
    });
    result
}

/// `DELETE /v1/leases/{resource}` with the session's secret, recorded.
async fn release(
    me: &Handle,
    env: &Env,
    http: &reqwest::Client,
    session: &Session,
    resource: &str,
    token: Option<u64>,
) {
    let proxy = env.proxy(&mut fresh_rng());
    let invoked = Instant::now();
    let status = http
        .delete(format!("{proxy}/v1/leases/{resource}"))
        .header("lease-secret", &session.secret)
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16());
    env.history.record(Event {
        client: me.name.clone(),
        kind: Kind::Release,
        resource: resource.to_owned(),
        revision: token,
        op: env.op(),
        invoked,
        completed: Instant::now(),
        outcome: outcome(status),
    });
}

fn lock(state: &Mutex<Assignment>) -> std::sync::MutexGuard<'_, Assignment> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn jitter(rng: &mut impl Rng, lo_ms: u64, hi_ms: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo_ms..hi_ms))
}
