//! Clients that lock as etcd's own recipe does — Go's `concurrency.Mutex`, what `etcdctl lock`
//! runs — over the proxy's gRPC API with an unmodified etcd client library (`etcd-client`),
//! then exchange their lock key for a fencing token at `POST /v3/lock/token` and write straight
//! to an enforcer with it.
//!
//! The recipe, step by step as Go's `Mutex.Lock`: a session lease kept alive over the bidi
//! `LeaseKeepAlive` stream; one transaction puts `{name}/{lease in hex}` (if absent) and reads
//! the oldest key under `{name}/`; the lock is ours when that is our key, else we watch the
//! newest older key until it is deleted, and look again. The token is for the key's create
//! revision, in the lock's own fencing domain (`lock/` + hex of the name), so the storage log
//! and the checker see these holders as `lock/…` resources of their own.
//!
//! The nemesis kills them (their task and, with it, their keepalive: the lease lapses) and
//! pauses them (keepalive included, as a stopped process: the lease lapses, another client takes
//! the lock, and the zombie wakes up and writes at once with its old token). Give-up quirks are
//! for the `/v1` clients; these are never picked for them. With
//! [`Control::UnexchangedLocks`](crate::cluster::Control) they write straight to the storage —
//! a lock that was never exchanged for a token fences nothing — and the zombie's writes land
//! after its successor's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::{call, jitter, next_op, pick, Env, Handle, ACQUIRE_WAIT_MS, TTL_SECONDS, ZOMBIE_WAIT};
use crate::history::{Event, Kind, Outcome};

/// Every etcd call's deadline (the proxy's own `--etcd-timeout` is 2 s).
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// A lock held: its fencing resource, the token, and the key's create revision.
struct Held {
    resource: String,
    fencing_token: String,
    revision: u64,
}

/// A session: its lease, and the keepalive that dies with it (or with the client's task).
struct Session {
    lease: i64,
    lost: Arc<AtomicBool>,
    keepalive: AbortOnDropHandle<()>,
}

/// The client's loop: a session, then lock → exchange → writes → unlock while it lasts.
pub(super) async fn run(me: Arc<Handle>, env: Env, mut rng: StdRng) {
    let Ok(http) = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
    else {
        return;
    };
    loop {
        let proxy = pick(&mut rng, &env.proxies);
        let Some(mut etcd) = connect(&proxy).await else {
            tokio::time::sleep(jitter(&mut rng, 50, 200)).await;
            continue;
        };
        let Some(session) = open_session(&mut etcd).await else {
            tokio::time::sleep(jitter(&mut rng, 50, 200)).await;
            continue;
        };
        while !session.lost.load(Ordering::Acquire) {
            let Some((name, resource)) = next_lock(&env, &mut rng) else {
                return;
            };
            let Some(locked) = lock(&mut etcd, &name, session.lease).await else {
                tokio::time::sleep(jitter(&mut rng, 10, 40)).await;
                continue;
            };
            let Some(held) = exchange(&me, &env, &http, &mut rng, resource, locked).await else {
                unlock(&mut etcd, &name, session.lease).await;
                continue;
            };
            me.set_holding(Some(held.resource.clone()));
            let zombie = hold(&me, &env, &http, &held, &session, &mut rng).await;
            me.set_holding(None);
            if zombie {
                // Its session lapsed while it slept: a new one, as Go's Mutex user would.
                break;
            }
            unlock(&mut etcd, &name, session.lease).await;
        }
    }
}

/// A gRPC client of the proxy at `url` (through the client→proxy relay), with deadlines.
async fn connect(url: &str) -> Option<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(CALL_TIMEOUT)
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
    tokio::time::timeout(CALL_TIMEOUT, Client::connect([url], Some(options)))
        .await
        .ok()?
        .ok()
}

/// A lease of [`TTL_SECONDS`] and its keepalive (every third of the TTL over one bidi stream);
/// `lost` is set once a renewal fails for a whole TTL, or etcd answers that the lease is gone.
async fn open_session(etcd: &mut Client) -> Option<Session> {
    let ttl = i64::try_from(TTL_SECONDS).ok()?;
    let lease = bounded(etcd.lease_grant(ttl, None)).await?.id();
    let (mut keeper, mut stream) = bounded(etcd.lease_keep_alive(lease)).await?;
    let lost = Arc::new(AtomicBool::new(false));
    let flag = lost.clone();
    let keepalive = tokio::spawn(async move {
        let ttl = Duration::from_secs(TTL_SECONDS);
        let mut renewed = Instant::now();
        while renewed.elapsed() < ttl {
            tokio::time::sleep(ttl / 3).await;
            let answer = async {
                keeper.keep_alive().await.ok()?;
                stream.message().await.ok()?
            };
            match tokio::time::timeout(ttl / 3, answer).await {
                Ok(Some(a)) if a.ttl() > 0 => renewed = Instant::now(),
                Ok(Some(_)) => break,
                _ => {}
            }
        }
        flag.store(true, Ordering::Release);
    });
    Some(Session {
        lease,
        lost,
        keepalive: AbortOnDropHandle::new(keepalive),
    })
}

/// The lock to go for next (the contended one, a paused holder's, more often while it lasts),
/// as its name and its fencing resource.
fn next_lock(env: &Env, rng: &mut StdRng) -> Option<(String, String)> {
    let contended = env
        .contended
        .lock()
        .ok()
        .and_then(|c| c.clone())
        .filter(|c| Instant::now() < c.until);
    let any = env.locks.choose(rng)?.clone();
    Some(match contended {
        Some(c) if rng.random_bool(c.share) => env
            .locks
            .iter()
            .find(|(_, resource)| *resource == c.resource)
            .cloned()
            .unwrap_or(any),
        _ => any,
    })
}

/// Go's `Mutex.Lock`, waiting at most [`ACQUIRE_WAIT_MS`]: the lock key once it holds the lock.
/// On giving up (or an error) the key is deleted, as Go's Mutex does when its context ends.
/// The key and its create revision once it holds the lock.
async fn lock(etcd: &mut Client, name: &str, lease: i64) -> Option<(Vec<u8>, u64)> {
    let prefix = format!("{name}/").into_bytes();
    let key = format!("{name}/{lease:x}").into_bytes();
    let deadline = Instant::now() + Duration::from_millis(ACQUIRE_WAIT_MS);
    let held = tokio::time::timeout_at(deadline, async {
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key.clone(), "", Some(PutOptions::new().with_lease(lease))),
                TxnOp::get(prefix.clone(), Some(first.clone())),
            ])
            .or_else([
                TxnOp::get(key.clone(), None),
                TxnOp::get(prefix.clone(), Some(first)),
            ]);
        let resp = bounded(etcd.txn(txn)).await?;
        let ranges: Vec<_> = resp
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(r) => Some(r),
                _ => None,
            })
            .collect();
        let mine = if resp.succeeded() {
            resp.header()?.revision()
        } else {
            ranges.first()?.kvs().first()?.create_revision()
        };
        let owner = ranges.last()?.kvs().first()?.create_revision();
        if owner != mine {
            wait_deletes(etcd, &prefix, mine - 1).await?;
        }
        // Go's Mutex checks that its key is still there (the session may have ended meanwhile).
        let still = bounded(etcd.get(key.clone(), None)).await?;
        (still.kvs().first()?.create_revision() == mine).then_some(u64::try_from(mine).ok()?)
    })
    .await;
    match held {
        Ok(Some(revision)) => Some((key, revision)),
        _ => {
            let _ = bounded(etcd.delete(key, None)).await;
            None
        }
    }
}

/// Go's `waitDeletes`: until no key under `prefix` was created at or below `max_create`, watch
/// the newest such key until it is deleted.
async fn wait_deletes(etcd: &mut Client, prefix: &[u8], max_create: i64) -> Option<()> {
    loop {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_max_create_revision(max_create)
            .with_limit(1);
        let resp = bounded(etcd.get(prefix.to_vec(), Some(options))).await?;
        let Some(last) = resp.kvs().first() else {
            return Some(());
        };
        let from = resp.header()?.revision() + 1;
        let mut events = bounded(etcd.watch(
            last.key().to_vec(),
            Some(WatchOptions::new().with_start_revision(from)),
        ))
        .await?;
        'watch: loop {
            let message = events.message().await.ok()??;
            if message.canceled() {
                return None;
            }
            for e in message.events() {
                if e.event_type() == EventType::Delete {
                    break 'watch;
                }
            }
        }
    }
}

/// Exchanges the lock key for its fencing token through a proxy's `/v3/lock/token`, recorded
/// as a [`Kind::Lock`] event with the key's create revision.
async fn exchange(
    me: &Handle,
    env: &Env,
    http: &reqwest::Client,
    rng: &mut StdRng,
    resource: String,
    (key, revision): (Vec<u8>, u64),
) -> Option<Held> {
    let proxy = pick(rng, &env.proxies);
    let req = http
        .post(format!("{proxy}/v3/lock/token"))
        .json(&json!({"key": base64::engine::general_purpose::STANDARD.encode(&key)}));
    let invoked = Instant::now();
    let resp = req.send().await.ok();
    let status = resp.as_ref().map(|r| r.status().as_u16());
    let token = resp.as_ref().and_then(|r| {
        let token = r.headers().get(fencing::TOKEN_HEADER)?.to_str().ok()?;
        let domain = r.headers().get(fencing::RESOURCE_HEADER)?.to_str().ok()?;
        (domain == resource).then(|| token.to_owned())
    });
    let outcome = match (crate::history::outcome(status), &token) {
        (Outcome::Ok, None) => Outcome::Indeterminate,
        (o, _) => o,
    };
    // The key's create revision, as the lock read it: the storage logs the token's own, so a
    // token for another revision shows as unissued.
    env.history.record(Event {
        client: me.name.clone(),
        kind: Kind::Lock,
        resource: resource.clone(),
        revision: Some(revision),
        op: next_op(env),
        invoked,
        completed: Instant::now(),
        outcome,
    });
    Some(Held {
        resource,
        fencing_token: token?,
        revision,
    })
}

/// Writes under `held` until the session is lost, a write is refused, or its writes are done;
/// `true` when it slept through its session (a zombie: it needs a new one).
async fn hold(
    me: &Handle,
    env: &Env,
    http: &reqwest::Client,
    held: &Held,
    session: &Session,
    rng: &mut StdRng,
) -> bool {
    let mut zombie = false;
    for _ in 0..rng.random_range(10..30) {
        if let Some(d) = me.take_pause() {
            // A stopped process: its keepalive stops too.
            session.keepalive.abort();
            tokio::time::sleep(d).await;
            let waking = Instant::now() + ZOMBIE_WAIT;
            while Instant::now() < waking
                && !env.history.granted_above(&held.resource, held.revision)
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            zombie = true;
        }
        if !zombie && session.lost.load(Ordering::Acquire) {
            return false;
        }
        let target = if env.unexchanged_locks {
            env.storage.clone()
        } else {
            pick(rng, &env.direct)
        };
        let op = next_op(env);
        let req = http
            .put(format!("{target}/items/{}", held.resource))
            .header(fencing::TOKEN_HEADER, &held.fencing_token)
            .header(fencing::RESOURCE_HEADER, &held.resource)
            .json(&json!({"client": me.name, "op": op}));
        me.writing.store(true, Ordering::Release);
        let (result, _) = call(
            me,
            env,
            Kind::WriteDirect,
            &held.resource,
            Some(held.revision),
            req,
            op,
        )
        .await;
        me.writing.store(false, Ordering::Release);
        if let Outcome::Fail(_) = result {
            return zombie;
        }
        tokio::time::sleep(jitter(rng, 2, 12)).await;
    }
    zombie
}

/// Go's `Mutex.Unlock`: deletes the lock key.
async fn unlock(etcd: &mut Client, name: &str, lease: i64) {
    let _ = bounded(etcd.delete(format!("{name}/{lease:x}"), None)).await;
}

/// `call` under [`CALL_TIMEOUT`]; `None` on an error or the deadline.
async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Option<T> {
    tokio::time::timeout(CALL_TIMEOUT, call).await.ok()?.ok()
}
