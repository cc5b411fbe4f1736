//! The in-database deployment (`--marks in-database`): the protected storage is a
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
//! The SQL clients are in [`clients`]; here are the deployment, its nemesis and the run.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use fencing::indb::InstallOptions;
use fencing::{KeyId, Keyring};
use lease_proxy_testkit::{free_port, workspace_binary, Etcd};
use tokio::task::JoinSet;
use tokio::time::Instant;

mod clients;

use clients::{connect, Clients, Env};

use crate::checker;
use crate::cluster::{wait_ready, Control, Proc};
use crate::history::History;
use crate::nemesis::{Fault, Injected};
use crate::plan::Step;
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
        ..InstallOptions::default()
    };
    fencing::indb::install(url, &options).await?;
    fencing::indb::sync_keys(url, SCHEMA, key_file, fencing::indb::DEFAULT_LOCK_TIMEOUT).await?;
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
