//! The in-database deployment's SQL clients: each leases over `/v1` ([`acquire`]) and writes
//! every row in a transaction of its own that presents its token ([`write`]); the nemesis
//! pauses (before a write, or with the transaction open) and kills them through [`Clients`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::Rng as _;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{CLIENT_SESSIONS, SQL_TIMEOUT, ZOMBIE_WAIT};
use crate::client::TTL_SECONDS;
use crate::history::{outcome, Event, History, Kind, Outcome};
use crate::plan::stream;
/// What the clients share.
pub(super) struct Env {
    pub(super) proxies: Vec<String>,
    pub(super) resources: Vec<String>,
    /// The database as [`super::WRITER`] (each client names its sessions after itself).
    pub(super) database: tokio_postgres::Config,
    pub(super) history: Arc<History>,
    pub(super) ops: AtomicU64,
    /// A paused holder's resource, until when: the others go for it more often.
    pub(super) contended: Mutex<Option<(String, Instant)>>,
}

impl Env {
    fn next_resource(&self, rng: &mut StdRng) -> String {
        let contended = self
            .contended
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .filter(|(_, until)| Instant::now() < *until);
        match contended {
            Some((resource, _)) if rng.random_bool(0.5) => resource,
            _ => self.resources.choose(rng).cloned().unwrap_or_default(),
        }
    }

    fn proxy(&self, rng: &mut StdRng) -> String {
        self.proxies.choose(rng).cloned().unwrap_or_default()
    }

    fn op(&self) -> u64 {
        self.ops.fetch_add(1, Ordering::Relaxed)
    }

    fn record(
        &self,
        me: &Handle,
        kind: Kind,
        grant: &Grant,
        op: u64,
        invoked: Instant,
        o: Outcome,
    ) {
        self.history.record(Event {
            client: me.name.clone(),
            kind,
            resource: grant.resource.clone(),
            revision: Some(grant.revision),
            op,
            invoked,
            completed: Instant::now(),
            outcome: o,
        });
    }
}

/// A client's handle for the nemesis.
pub(super) struct Handle {
    name: String,
    /// A pause armed for the next write: how long, and whether inside its transaction.
    pause: Mutex<Option<(Duration, bool)>>,
    holding: Mutex<Option<String>>,
    in_transaction: AtomicBool,
}

impl Handle {
    fn holding(&self) -> Option<String> {
        self.holding.lock().ok().and_then(|h| h.clone())
    }

    fn set_holding(&self, resource: Option<String>) {
        if let Ok(mut h) = self.holding.lock() {
            *h = resource;
        }
    }

    fn paused(&self) -> bool {
        self.pause.lock().is_ok_and(|p| p.is_some())
    }

    fn take_pause(&self) -> Option<(Duration, bool)> {
        self.pause.lock().ok().and_then(|mut p| p.take())
    }
}

/// The running SQL clients.
pub(super) struct Clients {
    env: Arc<Env>,
    seed: u64,
    next: AtomicU64,
    running: Mutex<Vec<(Arc<Handle>, JoinHandle<()>)>>,
}

impl Clients {
    pub(super) fn start(env: Arc<Env>, seed: u64, n: usize) -> Self {
        let clients = Self {
            env,
            seed,
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
            holding: Mutex::new(None),
            in_transaction: AtomicBool::new(false),
        });
        let rng = stream(self.seed, "sql-client", index);
        let task = tokio::spawn(client(handle.clone(), self.env.clone(), rng));
        if let Ok(mut running) = self.running.lock() {
            running.push((handle, task));
        }
    }

    /// Candidate `choice` among the unpaused clients that pass `eligible`, holders first.
    fn pick(&self, choice: u64, eligible: impl Fn(&Handle) -> bool) -> Option<Arc<Handle>> {
        let running = self.running.lock().ok()?;
        let passing: Vec<&Arc<Handle>> = running
            .iter()
            .map(|(h, _)| h)
            .filter(|h| !h.paused() && eligible(h))
            .collect();
        let holders: Vec<&Arc<Handle>> = passing
            .iter()
            .copied()
            .filter(|h| h.holding().is_some())
            .collect();
        let pool = if holders.is_empty() { passing } else { holders };
        let n = u64::try_from(pool.len()).ok().filter(|n| *n > 0)?;
        pool.get(usize::try_from(choice % n).ok()?)
            .map(|h| (*h).clone())
    }

    /// Arms a pause of `d` (in the transaction or before it) on a holder; its name and resource.
    pub(super) fn pause(
        &self,
        choice: u64,
        d: Duration,
        in_transaction: bool,
    ) -> Option<(String, Option<String>)> {
        let handle = self.pick(choice, |_| true)?;
        if let Ok(mut p) = handle.pause.lock() {
            *p = Some((d, in_transaction));
        }
        let holding = handle.holding();
        if let (Some(resource), Ok(mut c)) = (&holding, self.env.contended.lock()) {
            *c = Some((resource.clone(), Instant::now() + d + ZOMBIE_WAIT));
        }
        Some((handle.name.clone(), holding))
    }

    /// Aborts a client's task (with a transaction open, if `mid_transaction` and one opens
    /// within 2 s) and starts a replacement.
    pub(super) async fn kill(
        &self,
        choice: u64,
        mid_transaction: bool,
    ) -> Option<(String, Option<String>)> {
        let handle = self.pick(choice, |_| true)?;
        let deadline = Instant::now() + Duration::from_secs(2);
        while mid_transaction
            && !handle.in_transaction.load(Ordering::Acquire)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let task = {
            let mut running = self.running.lock().ok()?;
            let i = running.iter().position(|(h, _)| Arc::ptr_eq(h, &handle))?;
            running.swap_remove(i).1
        };
        let holding = handle.holding();
        task.abort();
        self.spawn();
        Some((handle.name.clone(), holding))
    }

    pub(super) fn stop(&self) {
        if let Ok(mut running) = self.running.lock() {
            for (_, task) in running.drain(..) {
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
pub(super) struct Grant {
    resource: String,
    secret: String,
    fencing_token: String,
    revision: u64,
}

/// A client: acquire through a proxy, a few fenced SQL writes (renewing at TTL/3), release or
/// walk away, again.
async fn client(me: Arc<Handle>, env: Arc<Env>, mut rng: StdRng) {
    let Ok(http) = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
    else {
        return;
    };
    let mut db = None;
    loop {
        let Some(grant) = acquire(&me, &env, &http, &mut rng).await else {
            tokio::time::sleep(Duration::from_millis(rng.random_range(10..40))).await;
            continue;
        };
        me.set_holding(Some(grant.resource.clone()));
        let lost = hold(&me, &env, &http, &mut db, &grant, &mut rng).await;
        me.set_holding(None);
        if !lost && rng.random_bool(0.9) {
            let invoked = Instant::now();
            let status = http
                .delete(format!(
                    "{}/v1/leases/{}",
                    env.proxy(&mut rng),
                    grant.resource
                ))
                .header("lease-secret", &grant.secret)
                .send()
                .await
                .ok()
                .map(|r| r.status().as_u16());
            env.record(
                &me,
                Kind::Release,
                &grant,
                env.op(),
                invoked,
                outcome(status),
            );
        }
    }
}

async fn acquire(
    me: &Handle,
    env: &Env,
    http: &reqwest::Client,
    rng: &mut StdRng,
) -> Option<Grant> {
    let resource = env.next_resource(rng);
    let op = env.op();
    let invoked = Instant::now();
    let answer = http
        .post(format!("{}/v1/leases/{resource}", env.proxy(rng)))
        .json(&json!({"holder": me.name, "ttl_seconds": TTL_SECONDS, "wait_ms": 2500}))
        // The wait, then the pre-fence (bounded by the proxy's --forward-timeout).
        .timeout(Duration::from_secs(7))
        .send()
        .await;
    let (status, body) = crate::history::answer(answer).await;
    let result = outcome(status);
    let grant = body.filter(|_| result == Outcome::Ok).and_then(|b| {
        Some(Grant {
            secret: b["secret"].as_str()?.to_owned(),
            fencing_token: b["fencing_token"].as_str()?.to_owned(),
            revision: b["token"].as_str()?.parse().ok()?,
            resource: resource.clone(),
        })
    });
    env.history.record(Event {
        client: me.name.clone(),
        kind: Kind::Acquire,
        resource,
        revision: grant.as_ref().map(|g| g.revision),
        op,
        invoked,
        completed: Instant::now(),
        outcome: result,
    });
    grant
}

/// Writes under `grant`, renewing; `true` when the grant turned out to be lost.
async fn hold(
    me: &Handle,
    env: &Env,
    http: &reqwest::Client,
    db: &mut Option<Db>,
    grant: &Grant,
    rng: &mut StdRng,
) -> bool {
    let mut renewed = Instant::now();
    let mut zombie = false;
    for _ in 0..rng.random_range(5..20) {
        let pause = me.take_pause();
        if let Some((d, false)) = pause {
            tokio::time::sleep(d).await;
            wait_for_newer_holder(env, grant).await;
            zombie = true;
        }
        if !zombie && renewed.elapsed() >= Duration::from_secs(TTL_SECONDS) / 3 {
            let invoked = Instant::now();
            let status = http
                .post(format!(
                    "{}/v1/leases/{}/renew",
                    env.proxy(rng),
                    grant.resource
                ))
                .header("lease-secret", &grant.secret)
                .send()
                .await
                .ok()
                .map(|r| r.status().as_u16());
            let result = outcome(status);
            env.record(me, Kind::Renew, grant, env.op(), invoked, result);
            match result {
                Outcome::Ok => renewed = invoked,
                Outcome::Fail(_) => return true,
                Outcome::Indeterminate => {}
            }
        }
        let in_transaction = match pause {
            Some((d, true)) => Some(d),
            _ => None,
        };
        match write(me, env, db, grant, in_transaction, rng).await {
            Some(Outcome::Fail(_)) | None => return true,
            Some(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(2..12))).await;
    }
    false
}

/// Waits (up to [`ZOMBIE_WAIT`]) until `grant`'s resource has a newer holder: the worst time
/// for the paused client to go on.
async fn wait_for_newer_holder(env: &Env, grant: &Grant) {
    let waking = Instant::now() + ZOMBIE_WAIT;
    while Instant::now() < waking && !env.history.granted_above(&grant.resource, grant.revision) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client's connection; its task ends with it.
pub(super) struct Db {
    pub(super) client: tokio_postgres::Client,
    task: JoinHandle<()>,
}

impl Drop for Db {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One fenced write in a transaction of its own, recorded; `None` when no connection could be
/// had (nothing was attempted). With `pause`, the client stops dead that long (and until its
/// resource has a newer holder, within [`ZOMBIE_WAIT`]) between its insert and its commit.
async fn write(
    me: &Handle,
    env: &Env,
    db: &mut Option<Db>,
    grant: &Grant,
    pause: Option<Duration>,
    rng: &mut StdRng,
) -> Option<Outcome> {
    if db.as_ref().is_none_or(|d| d.client.is_closed()) {
        let mut config = env.database.clone();
        config
            .application_name(format!("{CLIENT_SESSIONS}{}", me.name))
            .connect_timeout(SQL_TIMEOUT);
        *db = connect(&config).await.ok();
    }
    let client = &db.as_ref()?.client;
    let op = env.op();
    let isolation = if rng.random_bool(0.5) {
        "READ COMMITTED"
    } else {
        "SERIALIZABLE"
    };
    let invoked = Instant::now();
    me.in_transaction.store(true, Ordering::Release);
    let admitted = tokio::time::timeout(SQL_TIMEOUT, async {
        client
            .batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}"))
            .await?;
        client
            .execute(
                "SELECT set_config('fencing.token', $1, true)",
                &[&grant.fencing_token],
            )
            .await?;
        client
            .execute(
                "INSERT INTO items (resource, client, op) VALUES ($1, $2, $3)",
                &[
                    &grant.resource,
                    &me.name,
                    &i64::try_from(op).unwrap_or(i64::MAX),
                ],
            )
            .await
    })
    .await;
    let result = match admitted {
        Ok(Ok(_)) => {
            if let Some(d) = pause {
                tokio::time::sleep(d).await;
                wait_for_newer_holder(env, grant).await;
            }
            match tokio::time::timeout(SQL_TIMEOUT, client.batch_execute("COMMIT")).await {
                Ok(Ok(())) => Outcome::Ok,
                // An ERROR (not FATAL: a terminated session may have committed first) is a
                // commit refused: the transaction rolled back.
                Ok(Err(e)) if e.as_db_error().is_some_and(|d| d.severity() == "ERROR") => {
                    Outcome::Fail(status(&e))
                }
                _ => {
                    *db = None;
                    Outcome::Indeterminate
                }
            }
        }
        // Refused before its commit was sent: rolled back, whatever else happens.
        Ok(Err(e)) => {
            let rolled_back =
                tokio::time::timeout(SQL_TIMEOUT, client.batch_execute("ROLLBACK")).await;
            if !matches!(rolled_back, Ok(Ok(()))) {
                *db = None;
            }
            Outcome::Fail(status(&e))
        }
        // No commit sent; the connection goes, and its transaction with it.
        Err(_) => {
            *db = None;
            Outcome::Fail(408)
        }
    };
    me.in_transaction.store(false, Ordering::Release);
    env.record(me, Kind::WriteDirect, grant, op, invoked, result);
    Some(result)
}

/// What a refused write is recorded as: 409 stale (SQLSTATE 23F01), 403 for the other
/// fencing refusals (28F0x), 400 otherwise.
fn status(e: &tokio_postgres::Error) -> u16 {
    match e.code().map(|c| c.code()) {
        Some("23F01") => 409,
        Some(code) if code.starts_with("28F") => 403,
        _ => 400,
    }
}

/// A connection within [`SQL_TIMEOUT`], its task owned by the [`Db`].
pub(super) async fn connect(config: &tokio_postgres::Config) -> anyhow::Result<Db> {
    let (client, connection) =
        tokio::time::timeout(SQL_TIMEOUT, config.connect(tokio_postgres::NoTls))
            .await
            .context("connecting to PostgreSQL timed out")??;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Db { client, task })
}
