//! The in-database deployment (issue 30, `--marks in-database`): the protected storage is a
//! private PostgreSQL ([`Postgres`]) fenced inside itself, and no gateway is anywhere. A table
//! protected with fencing's trigger (`fencing.protect`) is written by SQL clients, each write a
//! transaction of its own that presents the holder's signed token (`SET LOCAL fencing.token`,
//! READ COMMITTED or SERIALIZABLE at random); two lease-proxy replicas pre-fence every grant by
//! raising the mark in the same database (`--prefence-database-url`). The package, the keys
//! and the table are installed by fencing's own `install`/`sync_keys`, as `fence-gateway pg`
//! does.
//!
//! The clients lease over `/v1` like the others ([`crate::client`]), and the faults are the
//! database's: holders stopped dead beyond their TTL before a write or with its transaction
//! open (the row written and admitted, the commit not yet sent), clients killed anywhere or
//! with a transaction open, every client's or every proxy's sessions terminated, PostgreSQL
//! crashed and restarted, a proxy killed ([`Plan::in_database`]).
//!
//! The ground truth is the table itself in commit order: the server tracks commit timestamps
//! (`track_commit_timestamp`), and a row's time is its transaction's commit, mapped onto the
//! run's clock between two anchors read at its start and end. Each row records the token its
//! transaction presented (a column defaulting to the `fencing.token` setting), read back with
//! the proxies' keys. The checker ([`checker::violations`]) judges that log like the recording
//! storage's; the control [`Control::TriggerRemoved`] leaves the table unprotected.
//!
//! Over 500 lines for now: the deployment, its SQL clients and their nemesis were written as one
//! unit; the clients (from `struct Env` on) are to move to a module of their own, as
//! [`crate::client`] is for the HTTP deployment.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use fencing::indb::InstallOptions;
use fencing::{KeyId, Keyring};
use lease_proxy_testkit::{free_port, workspace_binary, Etcd};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::Rng as _;
use serde_json::json;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::checker;
use crate::client::TTL_SECONDS;
use crate::cluster::{wait_ready, Control, Proc};
use crate::history::{outcome, Event, History, Kind, Outcome};
use crate::nemesis::{Fault, Injected};
use crate::plan::{stream, Step};
use crate::postgres::Postgres;
use crate::run::{report, Observed, Report, Settings};
use crate::storage::Applied;

/// The role the clients and the proxies' pre-fence write as: a writer of the package, with
/// `INSERT` on the table and nothing else.
const WRITER: &str = "writer";
/// The package's schema.
const SCHEMA: &str = "fencing";
/// The bound on every SQL call of a client (connect, each statement, the commit).
const SQL_TIMEOUT: Duration = Duration::from_secs(3);
/// How much longer than its pause a paused client waits, at most, for its resource to get a
/// newer holder before it goes on (the hazard: waking up to one).
const ZOMBIE_WAIT: Duration = Duration::from_secs(5);
/// Application-name prefixes of the clients' and the proxies' sessions.
const CLIENT_SESSIONS: &str = "client-";
const PROXY_SESSIONS: &str = "proxy-";

/// Runs once on the in-database deployment.
pub async fn run_once(settings: &Settings) -> anyhow::Result<Report> {
    let plan = settings.plan();
    eprintln!(
        "campaign run: seed {} ({:?}, in the database, {} s)",
        settings.seed,
        settings.control,
        settings.duration.as_secs()
    );
    let deployment = Arc::new(Deployment::start(settings.control).await?);
    let clock = Anchor::now();
    let env = Arc::new(Env {
        proxies: deployment.proxy_urls.clone(),
        resources: (0..settings.resources)
            .map(|i| format!("shard-{i}"))
            .collect(),
        database: deployment
            .postgres
            .url_as(WRITER, CLIENT_SESSIONS)
            .parse()?,
        history: Arc::new(History::default()),
        ops: AtomicU64::new(1),
        contended: Mutex::new(None),
    });
    let clients = Arc::new(Clients::start(env.clone(), settings.seed, settings.clients));
    let started = Instant::now();
    let faults = nemesis(&plan, &deployment, &clients, started).await;
    deployment.heal().await?;
    let healed = Instant::now();
    tokio::time::sleep_until((started + settings.duration).max(healed + settings.final_phase / 2))
        .await;
    clients.stop();
    let applied = deployment.applied(&clock, Anchor::now()).await?;
    let events = env.history.events();
    let violations = checker::violations(&events, &applied, &[]);
    Ok(report(
        settings,
        0,
        Observed {
            plan,
            started,
            healed,
            events,
            applied,
            faults,
            probes: Vec::new(),
            violations,
            idle: None,
            hostile: None,
        },
    ))
}

/// etcd, the database with the package and the table, two proxies pre-fencing into it.
struct Deployment {
    _etcd: Etcd,
    postgres: Postgres,
    proxies: Vec<Proc>,
    proxy_urls: Vec<String>,
    keys: Keyring,
    _dir: tempfile::TempDir,
}

impl Deployment {
    async fn start(control: Control) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("campaign-indb-")
            .tempdir()?;
        let key_file = dir.path().join("fencing.key");
        Keyring::create_file(&key_file, &KeyId::parse("c1").context("key id")?)?;
        let keys = Keyring::load(&key_file)?;
        let etcd = Etcd::single().await;
        let postgres = Postgres::start().await?;
        prepare(&postgres.superuser_url(), &key_file, control).await?;
        let mut proxies = Vec::new();
        let mut proxy_urls = Vec::new();
        for i in 0..2 {
            let port = free_port();
            let url = format!("http://127.0.0.1:{port}");
            let args = [
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--etcd-endpoints",
                &etcd.endpoints().join(","),
                "--key-file",
                &key_file.display().to_string(),
                "--data-dir",
                &dir.path().join(format!("proxy-{i}")).display().to_string(),
                "--etcd-timeout",
                "2s",
                "--forward-timeout",
                "3s",
                "--drain-timeout",
                "1s",
                "--prefence-database-url",
                &postgres.url_as(WRITER, &format!("{PROXY_SESSIONS}{i}")),
            ]
            .map(str::to_owned);
            let p = Proc::new(
                &format!("lease-proxy-{i}"),
                workspace_binary("lease-proxy"),
                args.to_vec(),
                dir.path(),
                format!("{url}/readyz"),
            );
            p.start().await?;
            proxies.push(p);
            proxy_urls.push(url);
        }
        Ok(Self {
            _etcd: etcd,
            postgres,
            proxies,
            proxy_urls,
            keys,
            _dir: dir,
        })
    }

    /// Every proxy running and ready (a restart of PostgreSQL heals itself).
    async fn heal(&self) -> anyhow::Result<()> {
        for (p, url) in self.proxies.iter().zip(&self.proxy_urls) {
            if wait_ready(&format!("{url}/readyz"), Duration::from_secs(1))
                .await
                .is_err()
            {
                p.start().await?;
            }
        }
        Ok(())
    }

    /// The table in commit order, each row's commit time on the run's clock.
    async fn applied(&self, start: &Anchor, end: Anchor) -> anyhow::Result<Vec<Applied>> {
        let admin = connect(&self.postgres.superuser_url().parse()?).await?;
        let rows = tokio::time::timeout(
            SQL_TIMEOUT * 10,
            admin.client.query(
                "SELECT resource, client, op, coalesce(token, ''), \
                     extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 AS committed \
                 FROM items ORDER BY committed, id",
                &[],
            ),
        )
        .await
        .context("reading the table timed out")??;
        let mut applied = Vec::with_capacity(rows.len());
        for row in rows {
            let resource: String = row.get(0);
            let token: String = row.get(3);
            let committed: Option<f64> = row.get(4);
            let at = start.instant(&end, committed.context("a row without a commit time")?);
            applied.push(Applied {
                revision: self
                    .keys
                    .verify(&resource, &token)
                    .map_or(0, |t| t.revision),
                client: row.get(1),
                op: u64::try_from(row.get::<_, i64>(2)).unwrap_or_default(),
                resource,
                received: at,
                at,
            });
        }
        Ok(applied)
    }
}

/// Installs the package (writers: [`WRITER`]), loads the keys and creates the table, protected
/// unless the control says otherwise, as the superuser.
async fn prepare(url: &str, key_file: &std::path::Path, control: Control) -> anyhow::Result<()> {
    let admin = connect(&url.parse()?).await?;
    admin
        .client
        .batch_execute(&format!("CREATE ROLE {WRITER} LOGIN"))
        .await?;
    let options = InstallOptions {
        schema: SCHEMA.into(),
        owner: None,
        writers: vec![WRITER.into()],
        gateway_roles: Vec::new(),
    };
    fencing::indb::install(url, &options).await?;
    fencing::indb::sync_keys(url, SCHEMA, key_file).await?;
    admin
        .client
        .batch_execute(&format!(
            "CREATE TABLE items (id bigserial PRIMARY KEY, resource text NOT NULL, \
                 client text NOT NULL, op bigint NOT NULL, \
                 token text DEFAULT current_setting('fencing.token', true)); \
             GRANT INSERT ON items TO {WRITER}; \
             GRANT USAGE ON SEQUENCE items_id_seq TO {WRITER}"
        ))
        .await?;
    if control != Control::TriggerRemoved {
        admin
            .client
            .batch_execute(&format!("SELECT {SCHEMA}.protect('items', 'resource')"))
            .await?;
    }
    Ok(())
}

/// The run's monotonic clock and the wall clock PostgreSQL stamps commits with, read together.
struct Anchor {
    instant: Instant,
    epoch: f64,
}

impl Anchor {
    fn now() -> Self {
        Self {
            instant: Instant::now(),
            epoch: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        }
    }

    /// The instant of wall-clock time `epoch`, interpolated between this anchor and `end` (so
    /// that a wall clock slewed during the run shifts nothing by more than its slew between
    /// two of its readings).
    fn instant(&self, end: &Anchor, epoch: f64) -> Instant {
        let wall = (end.epoch - self.epoch).max(f64::EPSILON);
        let mono = end.instant.duration_since(self.instant).as_secs_f64();
        let offset = (epoch - self.epoch) * mono / wall;
        if offset >= 0.0 {
            self.instant + Duration::from_secs_f64(offset)
        } else {
            self.instant
                .checked_sub(Duration::from_secs_f64(-offset))
                .unwrap_or(self.instant)
        }
    }
}

/// What the clients share.
struct Env {
    proxies: Vec<String>,
    resources: Vec<String>,
    /// The database as [`WRITER`] (each client names its sessions after itself).
    database: tokio_postgres::Config,
    history: Arc<History>,
    ops: AtomicU64,
    /// A paused holder's resource, until when: the others go for it more often.
    contended: Mutex<Option<(String, Instant)>>,
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
struct Handle {
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
struct Clients {
    env: Arc<Env>,
    seed: u64,
    next: AtomicU64,
    running: Mutex<Vec<(Arc<Handle>, JoinHandle<()>)>>,
}

impl Clients {
    fn start(env: Arc<Env>, seed: u64, n: usize) -> Self {
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
    fn pause(
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
    async fn kill(&self, choice: u64, mid_transaction: bool) -> Option<(String, Option<String>)> {
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

    fn stop(&self) {
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

/// Executes `plan`: client faults when due, each on its own; database and proxy faults when
/// due, one at a time. Returns the fault log.
async fn nemesis(
    plan: &crate::plan::Plan,
    deployment: &Arc<Deployment>,
    clients: &Arc<Clients>,
    started: Instant,
) -> Vec<Injected> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut client_faults = JoinSet::new();
    let client_steps = plan.clients.clone();
    let (c, l) = (clients.clone(), log.clone());
    client_faults.spawn(async move {
        let mut each = JoinSet::new();
        for step in client_steps {
            tokio::time::sleep_until(started + Duration::from_millis(step.at_ms)).await;
            let (c, l) = (c.clone(), l.clone());
            each.spawn(async move { inject(&step, None, &c, &l, started).await });
        }
        while each.join_next().await.is_some() {}
    });
    for step in &plan.infrastructure {
        tokio::time::sleep_until(started + Duration::from_millis(step.at_ms)).await;
        inject(step, Some(deployment), clients, &log, started).await;
    }
    while client_faults.join_next().await.is_some() {}
    let mut faults = log.lock().map(|l| l.clone()).unwrap_or_default();
    faults.sort_by(|a, b| a.from_s.total_cmp(&b.from_s));
    faults
}

async fn inject(
    step: &Step,
    deployment: Option<&Arc<Deployment>>,
    clients: &Clients,
    log: &Mutex<Vec<Injected>>,
    started: Instant,
) {
    let from = Instant::now();
    let hold = Duration::from_millis(step.hold_ms);
    let mut target = String::new();
    let mut resource = None;
    let mut hit = |h: Option<(String, Option<String>)>| {
        if let Some((name, held)) = h {
            target = name;
            resource = held;
        }
    };
    match (step.fault, deployment) {
        (Fault::ClientPause, _) => {
            hit(clients.pause(step.target, hold, false));
            tokio::time::sleep(hold).await;
        }
        (Fault::ClientPauseInTransaction, _) => {
            hit(clients.pause(step.target, hold, true));
            tokio::time::sleep(hold).await;
        }
        (Fault::ClientKill, _) => hit(clients.kill(step.target, false).await),
        (Fault::ClientAbortMidRequest, _) => hit(clients.kill(step.target, true).await),
        (Fault::PgTerminateSessions, Some(d)) => {
            let prefix = if step.target.is_multiple_of(2) {
                CLIENT_SESSIONS
            } else {
                PROXY_SESSIONS
            };
            match d.postgres.terminate_sessions(prefix).await {
                Ok(n) => target = format!("postgres: {n} {prefix}* sessions"),
                Err(e) => eprintln!("nemesis: terminating sessions: {e:#}"),
            }
        }
        (Fault::PgRestart, Some(d)) => {
            target = "postgres".into();
            if let Err(e) = d.postgres.crash_and_restart(hold).await {
                eprintln!("nemesis: restarting PostgreSQL: {e:#}");
            }
        }
        (Fault::ProxyKill, Some(d)) => {
            let i = usize::try_from(step.target % 2).unwrap_or(0);
            if let Some(p) = d.proxies.get(i) {
                target = p.name().to_owned();
                p.kill();
                tokio::time::sleep(hold).await;
                if let Err(e) = p.start().await {
                    eprintln!("nemesis: restarting {}: {e:#}", p.name());
                }
            }
        }
        (fault, _) => eprintln!("nemesis: {fault:?} is not a fault of this deployment"),
    }
    let to = Instant::now();
    let secs = |t: Instant| t.duration_since(started).as_secs_f64();
    if let Ok(mut log) = log.lock() {
        log.push(Injected {
            fault: step.fault,
            planned_s: step.at_ms as f64 / 1e3,
            from_s: secs(from),
            to_s: secs(to),
            target,
            resource,
            from: Some(from),
            to: Some(to),
        });
    }
}

struct Grant {
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
    let (status, body) = match answer {
        Ok(r) => {
            let status = r.status().as_u16();
            (Some(status), r.json::<serde_json::Value>().await.ok())
        }
        Err(_) => (None, None),
    };
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
struct Db {
    client: tokio_postgres::Client,
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
async fn connect(config: &tokio_postgres::Config) -> anyhow::Result<Db> {
    let (client, connection) =
        tokio::time::timeout(SQL_TIMEOUT, config.connect(tokio_postgres::NoTls))
            .await
            .context("connecting to PostgreSQL timed out")??;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Db { client, task })
}
