//! A private PostgreSQL instance for the campaign: two fence-gateways share its marks
//! while the nemesis kills their sessions or crashes the whole server.
//!
//! It is never the machine's own cluster (the test suite uses that one): [`Postgres::start`]
//! runs `initdb` into a temporary directory and starts a `postgres` of its own on a free
//! loopback port, with its socket in that directory. Debian's `postgresql` package provides the
//! binaries (`/usr/lib/postgresql/<version>/bin`); `./scripts/test.sh` (through
//! `scripts/deps.sh`) installs it.
//!
//! As root, the server runs as the `postgres` OS user (PostgreSQL refuses to run as root): the
//! directory is chowned to it and the server is spawned with that uid and gid directly (not
//! through `runuser`, which forks and waits), so the [`Child`] *is* the postmaster and killing
//! it is a real crash.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, Context as _};
use fencing::{HighWaterMarks as _, PostgresStore, Token};
use lease_proxy_testkit::free_port;
use tempfile::TempDir;
use tokio::time::Instant;
use tokio_postgres::NoTls;

/// Where Debian's `postgresql` package puts one directory per server version.
const VERSIONS_DIR: &str = "/usr/lib/postgresql";
/// The role and database the gateways use.
const GATEWAY_ROLE: &str = "fence";
/// The application name of this module's own sessions, so that no prefix a campaign uses for
/// its gateways (`fence-gateway…`) selects them.
const ADMIN_APPLICATION: &str = "campaign-admin";
/// How long a start (or the start after a crash, with its recovery) may take to accept
/// connections.
const READY_DEADLINE: Duration = Duration::from_secs(30);
/// How long the old server processes may take to exit after the postmaster was killed before
/// the stragglers are killed too.
const EXIT_GRACE: Duration = Duration::from_secs(5);
/// Bound on each administrative step (connect, one statement, a mark read).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A PostgreSQL server of the campaign's own, on `127.0.0.1` and a free port, with a role and
/// database for the gateways. Dropping it stops the server and removes its data directory.
///
/// Every method takes `&self`, so the nemesis can crash the server while other tasks read marks
/// or kill sessions; crashes are serialised with each other.
#[derive(Debug)]
pub struct Postgres {
    bin: PathBuf,
    /// The server's version, from the name of its directory (`[15]`).
    version: Vec<u32>,
    /// `Some` until a failed start keeps it for its log.
    dir: Option<TempDir>,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    /// The `postgres` OS user's (uid, gid) when running as root.
    run_as: Option<(u32, u32)>,
    /// The postmaster; `None` only while a crash is under way.
    server: tokio::sync::Mutex<Option<Child>>,
}

/// A mark row held `FOR UPDATE` ([`Postgres::hold_mark`]); dropping it ends the session, and so
/// the hold.
pub struct MarkHold {
    client: tokio_postgres::Client,
}

impl MarkHold {
    /// Waits (up to `within`) until a session of `application_name` waits for a lock — the
    /// held row, when that gateway registers a write on it; whether one did.
    pub async fn until_waited_for(&self, application_name: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let waiting = self
                .client
                .query_one(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
                     WHERE NOT l.granted AND a.application_name = $1",
                    &[&application_name],
                )
                .await
                .map(|row| row.get::<_, i64>(0));
            match waiting {
                Ok(n) if n > 0 => return true,
                Ok(_) => tokio::time::sleep(Duration::from_millis(2)).await,
                Err(_) => return false,
            }
        }
        false
    }

    /// Lets the row go: the waiting registration goes ahead at once.
    pub async fn release(self) {
        let _ = tokio::time::timeout(ADMIN_TIMEOUT, self.client.batch_execute("ROLLBACK")).await;
    }
}

impl Postgres {
    /// Initialises a data directory in a new temporary directory, starts a server on it and
    /// waits (up to 30 s) until it accepts connections, then creates the gateways' role and
    /// database. Fails with a message naming the log file if the server does not come up; the
    /// directory is then kept for that log.
    pub async fn start() -> anyhow::Result<Self> {
        let (version, bin) = newest_server()?;
        let run_as = run_as()?;
        let dir = tempfile::Builder::new()
            .prefix("campaign-postgres-")
            .tempdir()
            .context("temporary directory for PostgreSQL")?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .context("chown the PostgreSQL directory to the postgres user")?;
        }
        // Canonical, so that it compares equal to the servers' `/proc/<pid>/cwd`.
        let root = dir.path().canonicalize()?;
        let postgres = Self {
            bin,
            version,
            data: root.join("data"),
            log: root.join("postgres.log"),
            port: free_port(),
            run_as,
            dir: Some(dir),
            server: tokio::sync::Mutex::new(None),
        };
        match postgres.init().await {
            Ok(()) => Ok(postgres),
            Err(e) => {
                let mut postgres = postgres;
                postgres.stop();
                if let Some(dir) = postgres.dir.take() {
                    let _ = dir.keep();
                }
                Err(e)
            }
        }
    }

    async fn init(&self) -> anyhow::Result<()> {
        let mut initdb = self.command("initdb")?;
        initdb
            .arg("-D")
            .arg(&self.data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .args(["--encoding=UTF8", "--locale=C"]);
        let status = tokio::process::Command::from(initdb)
            .status()
            .await
            .with_context(|| format!("run {}", self.bin.join("initdb").display()))?;
        if !status.success() {
            bail!("initdb failed ({status}); see {}", self.log.display());
        }
        let child = self.start_server().await?;
        *self.server.lock().await = Some(child);
        let admin = self.admin().await?;
        let create = format!(
            "CREATE ROLE {GATEWAY_ROLE} LOGIN; CREATE DATABASE {GATEWAY_ROLE} OWNER {GATEWAY_ROLE}"
        );
        // CREATE DATABASE cannot run in a transaction block, so statement by statement.
        for statement in create.split(';') {
            tokio::time::timeout(ADMIN_TIMEOUT, admin.batch_execute(statement))
                .await
                .context("creating the gateways' role and database timed out")?
                .with_context(|| format!("`{}`", statement.trim()))?;
        }
        Ok(())
    }

    /// The port the server listens on (on `127.0.0.1`), the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's log (every start appends to it).
    pub fn log_file(&self) -> &Path {
        &self.log
    }

    /// A URL for fence-gateway's `--store` (and for [`PostgresStore::connect`]): the gateways'
    /// role and database, every session tagged with `application_name` so that
    /// [`terminate_sessions`](Self::terminate_sessions) can pick them out.
    pub fn url(&self, application_name: &str) -> String {
        self.url_as(GATEWAY_ROLE, application_name)
    }

    /// A URL to the gateways' database as `role` (trusted: no password), sessions tagged with
    /// `application_name`.
    pub fn url_as(&self, role: &str, application_name: &str) -> String {
        format!(
            "postgres://{role}@127.0.0.1:{}/{GATEWAY_ROLE}?application_name={}",
            self.port,
            percent_encode(application_name)
        )
    }

    /// [`url_as`](Self::url_as) the superuser, as this module's own sessions are
    /// ([`terminate_sessions`](Self::terminate_sessions) spares them).
    pub fn superuser_url(&self) -> String {
        self.url_as("postgres", ADMIN_APPLICATION)
    }

    /// Terminates every session whose application name starts with `application_name_prefix`
    /// (`pg_terminate_backend`), over a short-lived superuser session of its own; returns how
    /// many were terminated. Each step is bounded by a few seconds.
    pub async fn terminate_sessions(&self, application_name_prefix: &str) -> anyhow::Result<usize> {
        let pattern = format!("{}%", escape_like(application_name_prefix));
        let admin = self.admin().await?;
        let rows = tokio::time::timeout(
            ADMIN_TIMEOUT,
            admin.query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name LIKE $1 AND pid <> pg_backend_pid()",
                &[&pattern],
            ),
        )
        .await
        .context("pg_terminate_backend timed out")??;
        Ok(rows.iter().filter(|row| row.get::<_, bool>(0)).count())
    }

    /// Crashes the server and starts it again: SIGKILL of the postmaster (no shutdown
    /// checkpoint, so the next start runs crash recovery), a wait until every old server process
    /// has exited, `down` with no server, then a start on the same port and data directory,
    /// returning once it accepts connections.
    ///
    /// Old processes are those whose working directory is the data directory (the postmaster
    /// and everything it forked, wherever they were reparented); they exit on their own when
    /// they notice the postmaster's death, and are killed after a few seconds if they have not.
    /// PostgreSQL also refuses to start while the old shared memory is attached, so a start
    /// that exits early is retried until the start deadline. Cancelled midway, it may leave the
    /// server down; the next call starts it again.
    pub async fn crash_and_restart(&self, down: Duration) -> anyhow::Result<()> {
        let mut server = self.server.lock().await;
        if let Some(mut child) = server.take() {
            // Already exited is fine: either way it is reaped here.
            let _ = child.kill();
            child.wait().context("reap the killed postmaster")?;
        }
        self.wait_old_processes_gone().await?;
        tokio::time::sleep(down).await;
        *server = Some(self.start_server().await?);
        Ok(())
    }

    /// The stored high-water mark of `resource`, read from the database the gateways share and
    /// decoded by fencing's own [`PostgresStore`] (which creates the tables if no gateway has
    /// yet). `None` if no write has ever raised it.
    pub async fn mark(&self, resource: &str) -> anyhow::Result<Option<Token>> {
        let store =
            PostgresStore::connect_with_deadline(&self.url(ADMIN_APPLICATION), 1, ADMIN_TIMEOUT)
                .await
                .context("connect to the marks")?;
        Ok(store.get(resource).await?)
    }

    /// Holds `resource`'s mark row `FOR UPDATE` in a transaction of its own, so that a gateway's
    /// next registration of a write on it (which takes the row `FOR SHARE`) waits in the
    /// database until the hold is let go. `None` if the resource has no mark yet.
    pub async fn hold_mark(&self, resource: &str) -> anyhow::Result<Option<MarkHold>> {
        let client = self.admin_in(GATEWAY_ROLE).await?;
        let held = tokio::time::timeout(ADMIN_TIMEOUT, async {
            client.batch_execute("BEGIN").await?;
            client
                .query_opt(
                    "SELECT 1 FROM fence_marks WHERE resource = $1 FOR UPDATE",
                    &[&resource],
                )
                .await
        })
        .await
        .context("holding the mark row timed out")??;
        Ok(held.map(|_| MarkHold { client }))
    }

    /// A superuser session (`postgres` database) whose connection task runs in the background
    /// until the client is dropped.
    async fn admin(&self) -> anyhow::Result<tokio_postgres::Client> {
        self.admin_in("postgres").await
    }

    /// A superuser session in database `dbname`.
    async fn admin_in(&self, dbname: &str) -> anyhow::Result<tokio_postgres::Client> {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(dbname)
            .application_name(ADMIN_APPLICATION)
            .connect_timeout(ADMIN_TIMEOUT);
        let (client, connection) = tokio::time::timeout(ADMIN_TIMEOUT, config.connect(NoTls))
            .await
            .context("connecting to PostgreSQL timed out")??;
        tokio::spawn(connection);
        Ok(client)
    }

    /// `bin/<program>` with the log as output, the directory as working directory and, as
    /// root, the postgres user's identity.
    fn command(&self, program: &str) -> anyhow::Result<Command> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("open {}", self.log.display()))?;
        let mut command = Command::new(self.bin.join(program));
        command
            .current_dir(self.data.parent().unwrap_or(&self.data))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some((uid, gid)) = self.run_as {
            // With a uid set and no groups given, std also drops root's supplementary groups.
            command.uid(uid).gid(gid);
        }
        Ok(command)
    }

    /// Spawns the postmaster and waits until it accepts connections, spawning again while it
    /// exits early (old shared memory still attached, lock file still held) until the start
    /// deadline.
    async fn start_server(&self) -> anyhow::Result<Child> {
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            let mut child = self.command("postgres")?;
            child
                .arg("-D")
                .arg(&self.data)
                .args(["-p", &self.port.to_string(), "-k"])
                .arg(self.data.parent().unwrap_or(&self.data))
                .args(["-c", "listen_addresses=127.0.0.1"])
                .args(["-c", "fsync=on"])
                // The in-database deployment orders its table's rows by commit time.
                .args(["-c", "track_commit_timestamp=on"])
                .args(["-c", "max_connections=200"]);
            if self.version.first().is_some_and(|major| *major >= 14) {
                // Crash recovery first fsyncs every file of the data directory (seconds, about
                // as long as the rest of the recovery); one syncfs gives the same guarantee.
                child.args(["-c", "recovery_init_sync_method=syncfs"]);
            }
            let mut child = child
                .spawn()
                .with_context(|| format!("run {}", self.bin.join("postgres").display()))?;
            match self.wait_ready(&mut child, deadline).await {
                Ok(()) => return Ok(child),
                Err(NotReady::Exited(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!(
                        "PostgreSQL did not start within {READY_DEADLINE:?} ({e}); see {}:\n{}",
                        self.log.display(),
                        log_tail(&self.log)
                    );
                }
            }
        }
    }

    async fn wait_ready(&self, child: &mut Child, deadline: Instant) -> Result<(), NotReady> {
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(NotReady::Exited(status));
            }
            let last = match self.admin().await {
                Ok(client) => {
                    match tokio::time::timeout(ADMIN_TIMEOUT, client.simple_query("SELECT 1")).await
                    {
                        Ok(Ok(_)) => return Ok(()),
                        Ok(Err(e)) => format!("{e:?}"),
                        Err(_) => "SELECT 1 timed out".into(),
                    }
                }
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                return Err(NotReady::Timeout(last));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until no process of the old server is left, killing stragglers after
    /// [`EXIT_GRACE`].
    async fn wait_old_processes_gone(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut killed = false;
        loop {
            let left = processes_in(&self.data);
            if left.is_empty() {
                return Ok(());
            }
            if started.elapsed() >= EXIT_GRACE * 2 {
                bail!(
                    "old PostgreSQL processes {left:?} still alive {:?} after the postmaster's death",
                    started.elapsed()
                );
            }
            if !killed && started.elapsed() >= EXIT_GRACE {
                for pid in &left {
                    lease_proxy_testkit::signal_pid(*pid, "KILL");
                }
                killed = true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the server (immediate shutdown, SIGKILL if that takes too long), then kills
    /// whatever is left of it — also a postmaster a cancelled restart spawned and lost.
    fn stop(&mut self) {
        // Counted polls rather than a clock: this runs in Drop, perhaps on a runtime whose
        // (tokio) time is paused, where `Instant::now()` would not move during a thread sleep.
        const POLL: Duration = Duration::from_millis(20);
        let polls = EXIT_GRACE.as_millis() / POLL.as_millis();
        if let Some(mut child) = self.server.get_mut().take() {
            // SIGQUIT: the postmaster stops its children itself and exits at once.
            lease_proxy_testkit::signal_pid(child.id(), "QUIT");
            for _ in 0..polls {
                if !matches!(child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(POLL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        for i in 0..polls {
            let left = processes_in(&self.data);
            if left.is_empty() {
                break;
            }
            if i == polls / 2 {
                for pid in left {
                    lease_proxy_testkit::signal_pid(pid, "KILL");
                }
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why a spawned server is not accepting connections.
#[derive(Debug)]
enum NotReady {
    /// It exited (perhaps because the old server's processes still held its shared memory).
    Exited(ExitStatus),
    /// It runs but did not answer before the deadline; the last error.
    Timeout(String),
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited(status) => write!(f, "postgres exited: {status}"),
            Self::Timeout(last) => write!(f, "last error: {last}"),
        }
    }
}

/// The newest version under `/usr/lib/postgresql` whose `bin` holds `initdb` and `postgres`,
/// and that `bin`.
fn newest_server() -> anyhow::Result<(Vec<u32>, PathBuf)> {
    let missing = || {
        anyhow::anyhow!(
            "no PostgreSQL server binaries under {VERSIONS_DIR}/<version>/bin: run \
             ./scripts/test.sh or scripts/deps.sh, which installs postgresql"
        )
    };
    let entries = std::fs::read_dir(VERSIONS_DIR).map_err(|_| missing())?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let version: Vec<u32> = name
                .split('.')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file())
                .then_some((version, bin))
        })
        .max()
        .ok_or_else(missing)
}

/// The `postgres` user's (uid, gid) when this process runs as root, else `None`.
fn run_as() -> anyhow::Result<Option<(u32, u32)>> {
    if std::fs::metadata("/proc/self")?.uid() != 0 {
        return Ok(None);
    }
    let id = |flag: &str| -> anyhow::Result<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output()?;
        if !out.status.success() {
            bail!(
                "running as root, and there is no `postgres` user to run PostgreSQL as (run \
                 ./scripts/test.sh or scripts/deps.sh, which installs postgresql)"
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
    };
    Ok(Some((id("-u")?, id("-g")?)))
}

/// The live processes whose working directory is `dir`: for the data directory, the postmaster
/// and every process it forked (they inherit its working directory), even once reparented.
/// Zombies have no working directory and hold nothing, so they are not listed.
fn processes_in(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cwd = std::fs::read_link(entry.path().join("cwd")).ok()?;
            (cwd == dir).then_some(pid)
        })
        .collect()
}

/// The last lines of the server log, for error messages.
fn log_tail(log: &Path) -> String {
    let text = File::open(log)
        .ok()
        .and_then(|f| std::io::read_to_string(f).ok())
        .unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// `prefix` as a literal `LIKE` pattern (backslash is `LIKE`'s default escape).
fn escape_like(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Percent-encodes everything but URL-unreserved characters, for a query parameter value.
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn like_prefix_is_literal() {
        assert_eq!(escape_like("fence_gw%1\\"), "fence\\_gw\\%1\\\\");
    }

    #[test]
    fn url_parses_with_application_name() {
        let value = percent_encode("fence-gateway a/1");
        assert_eq!(value, "fence-gateway%20a%2F1");
        let url = format!("postgres://fence@127.0.0.1:5432/fence?application_name={value}");
        let config: tokio_postgres::Config = url.parse().unwrap();
        assert_eq!(config.get_application_name(), Some("fence-gateway a/1"));
    }
}
