//! A PostgreSQL server of a test's own, for what the shared test server (FENCING_TEST_POSTGRES)
//! must not be used for: server settings (`max_prepared_transactions`), a superuser. `initdb`
//! into a temporary directory and `pg_ctl start -w` on a free loopback port with its socket in
//! that directory; dropping it stops the server (`-m immediate`) and removes the directory.
//! Debian's `postgresql` package provides the binaries (`/usr/lib/postgresql/<version>/bin`);
//! as root, the server runs as the `postgres` OS user (PostgreSQL refuses to run as root). About
//! a second on this machine.
//!
//! The fault campaign's `campaign/src/postgres.rs` runs one too, with crash and restart on top.

use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use tempfile::TempDir;

use crate::free_port;

/// Where Debian's `postgresql` package puts one directory per server version.
const VERSIONS_DIR: &str = "/usr/lib/postgresql";

/// A running server; its superuser is `postgres`, trusted on loopback.
#[derive(Debug)]
pub struct PrivatePostgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    run_as: Option<(u32, u32)>,
    dir: TempDir,
}

impl PrivatePostgres {
    /// Initialises and starts a server with `settings` (`-c name=value` each) on top of
    /// `listen_addresses=127.0.0.1`. Panics, with the server's log, if it does not come up.
    pub fn start(settings: &[(&str, &str)]) -> Self {
        let bin = newest_server();
        let run_as = run_as();
        let dir = tempfile::Builder::new()
            .prefix("test-postgres-")
            .tempdir()
            .expect("a temporary directory");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .expect("chown the PostgreSQL directory to the postgres user");
        }
        let server = Self {
            data: dir.path().join("data"),
            bin,
            port: free_port(),
            run_as,
            dir,
        };
        let log = server.dir.path().join("postgres.log");
        let initdb = server
            .command("initdb")
            .arg("-D")
            .arg(&server.data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .args(["--encoding=UTF8", "--locale=C"])
            .output()
            .expect("run initdb");
        assert!(initdb.status.success(), "initdb: {initdb:?}");
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            server.port,
            server.dir.path().display()
        );
        for (name, value) in settings {
            options.push_str(&format!(" -c {name}={value}"));
        }
        let started = server
            .command("pg_ctl")
            .arg("-D")
            .arg(&server.data)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "-o", &options, "start"])
            .output()
            .expect("run pg_ctl");
        assert!(
            started.status.success(),
            "pg_ctl start: {started:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        server
    }

    /// `postgres://USER@127.0.0.1:PORT/DATABASE` (trusted: no password).
    pub fn url(&self, user: &str, database: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{database}", self.port)
    }

    /// The superuser's URL to the `postgres` database.
    pub fn superuser_url(&self) -> String {
        self.url("postgres", "postgres")
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command.current_dir(self.dir.path()).stdin(Stdio::null());
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

/// The `bin` of the newest version under `/usr/lib/postgresql` that has `initdb` and `pg_ctl`.
fn newest_server() -> PathBuf {
    let mut found: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(VERSIONS_DIR)
        .expect("PostgreSQL server binaries under /usr/lib/postgresql (scripts/deps.sh)")
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let version: Vec<u32> = name
                .split('.')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("pg_ctl").is_file()).then_some((version, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .expect("a PostgreSQL server version with initdb and pg_ctl")
        .1
}

/// The `postgres` user's (uid, gid) when this process runs as root, else `None`.
fn run_as() -> Option<(u32, u32)> {
    let root = std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false);
    if !root {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("run id");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("running as root: a `postgres` user to run PostgreSQL as (scripts/deps.sh)")
    };
    Some((id("-u"), id("-g")))
}
