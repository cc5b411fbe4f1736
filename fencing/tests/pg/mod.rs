//! What the in-database package's tests share: a scratch database with its own roles
//! ([`Scratch`]), fence-gateway's `pg` commands, one `psql` process per script, key files.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use fencing::{KeyId, Keyring};

use crate::common;

pub mod guide;

pub const GATEWAY: &str = env!("CARGO_BIN_EXE_fence-gateway");

/// A database and roles of one test, dropped (with `psql`, synchronously) when it ends.
pub struct Scratch {
    pub name: String,
    pub admin: tokio_postgres::Config,
    pub password: String,
}

impl Scratch {
    pub const ROLES: [&'static str; 7] = ["owner", "app", "nobody", "tab", "gw", "robot", "proxy"];

    pub async fn new() -> Self {
        let url = common::postgres_url();
        let admin: tokio_postgres::Config = url.parse().unwrap();
        let password = String::from_utf8(admin.get_password().unwrap().to_vec()).unwrap();
        let name = common::unique("indb").replace('-', "_");
        let scratch = Self {
            name,
            admin,
            password,
        };
        let client = connect(&url).await;
        let me = scratch.installer();
        client
            .batch_execute(&format!("CREATE DATABASE {}", scratch.name))
            .await
            .unwrap();
        for role in Self::ROLES {
            let login = if role == "owner" {
                "NOLOGIN".to_owned()
            } else {
                format!("LOGIN PASSWORD '{}'", scratch.password)
            };
            client
                .batch_execute(&format!("CREATE ROLE {} {login}", scratch.role(role)))
                .await
                .unwrap();
        }
        client
            .batch_execute(&format!("GRANT {} TO {me}", scratch.role("owner")))
            .await
            .unwrap();
        let db = connect(&scratch.url()).await;
        // `tab` owns the protected table; `app` may create in public as before PostgreSQL 15,
        // to plant objects there.
        db.batch_execute(&format!(
            "GRANT CREATE ON SCHEMA public TO {}, {}",
            scratch.role("tab"),
            scratch.role("app")
        ))
        .await
        .unwrap();
        scratch
    }

    pub fn installer(&self) -> String {
        self.admin.get_user().unwrap().to_owned()
    }

    pub fn role(&self, role: &str) -> String {
        format!("{}_{role}", self.name)
    }

    /// The scratch database as the installing role.
    pub fn url(&self) -> String {
        self.url_as(&self.installer())
    }

    pub fn url_as(&self, user: &str) -> String {
        let (host, port) = host_port(&self.admin);
        format!(
            "postgres://{user}:{}@{host}:{port}/{}",
            self.password, self.name
        )
    }

    pub fn install(&self, extra: &[&str]) -> Output {
        let (owner, app, tab, gw) = (
            self.role("owner"),
            self.role("app"),
            self.role("tab"),
            self.role("gw"),
        );
        let url = self.url();
        let mut args = vec!["pg", "install", "--database-url", &url, "--owner", &owner];
        args.extend(["--writer", &app, "--writer", &tab, "--gateway-role", &gw]);
        args.extend(extra);
        gateway(&args)
    }

    /// `fence-gateway pg sync-keys` of `key_file` into the scratch database, which must succeed.
    pub fn sync_keys(&self, key_file: &Path) {
        let url = self.url();
        let key_file = key_file.display().to_string();
        let synced = gateway(&[
            "pg",
            "sync-keys",
            "--database-url",
            &url,
            "--key-file",
            &key_file,
        ]);
        assert!(synced.status.success(), "{}", text(&synced));
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let roles: Vec<String> = Self::ROLES.iter().map(|r| self.role(r)).collect();
        // Membership of the login roles lets DROP DATABASE … (FORCE) end their sessions. A test
        // may have made `docowner` (the guide's owner role) too.
        let sql = format!(
            "GRANT {} TO CURRENT_USER;\nDROP DATABASE IF EXISTS {} WITH (FORCE);\nDROP ROLE IF EXISTS {}, {};\n",
            roles[1..].join(", "),
            self.name,
            roles.join(", "),
            self.role("docowner")
        );
        let _ = psql(
            &self.admin,
            &self.installer(),
            "lease_proxy_test",
            &sql,
            &[],
            &[],
        );
    }
}

pub fn host_port(config: &tokio_postgres::Config) -> (String, u16) {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    (host, config.get_ports().first().copied().unwrap_or(5432))
}

pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL for the tests (run ./scripts/test.sh, or set FENCING_TEST_POSTGRES)");
    tokio::spawn(connection);
    client
}

pub fn gateway(args: &[&str]) -> Output {
    Command::new(GATEWAY).args(args).output().unwrap()
}

pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `psql` once on `database` as `user` with `script` on its standard input (so errors
/// carry no file name and line) and stdout and stderr in one stream, as pg_regress does.
pub fn psql(
    admin: &tokio_postgres::Config,
    user: &str,
    database: &str,
    script: &str,
    vars: &[(String, String)],
    env: &[(&str, String)],
) -> String {
    let (host, port) = host_port(admin);
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut command = Command::new("psql");
    command
        .args(["-X", "-q", "-a", "-v", "ON_ERROR_STOP=0"])
        .args([
            "-h",
            &host,
            "-p",
            &port.to_string(),
            "-U",
            user,
            "-d",
            database,
        ])
        .env(
            "PGPASSWORD",
            String::from_utf8_lossy(admin.get_password().unwrap_or_default()).as_ref(),
        )
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    for (name, value) in vars {
        command.arg("-v").arg(format!("{name}={value}"));
    }
    let mut child = command.spawn().expect("psql (PostgreSQL's client) on PATH");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), script.as_bytes()).unwrap();
    drop(child.stdin.take());
    child.wait().unwrap();
    std::fs::read_to_string(out_path).unwrap()
}

pub fn key_file(dir: &Path, name: &str, kids: &[&str]) -> (PathBuf, Keyring) {
    let text: String = kids
        .iter()
        .map(|k| Keyring::generate_file(&KeyId::parse(k).unwrap()))
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, &text).unwrap();
    (path, Keyring::parse(&text).unwrap())
}

/// Replaces segment `i` (0-based) of a wire token.
pub fn with_segment(wire: &str, i: usize, value: &str) -> String {
    let mut parts: Vec<&str> = wire.split('.').collect();
    parts[i] = value;
    parts.join(".")
}

/// Runs `script` (a file under `fencing/`) in one psql process as the installing role of
/// `scratch`, with psql variables `vars` and environment `env` (for its `\!` commands), and
/// compares its output with the file `expected` (`BLESS=1` rewrites it), showing a diff.
pub fn run_and_compare(
    scratch: &Scratch,
    script: &str,
    vars: &[(String, String)],
    env: &[(&str, String)],
    expected: &str,
) {
    let script = std::fs::read_to_string(script).unwrap();
    let output = psql(
        &scratch.admin,
        &scratch.installer(),
        &scratch.name,
        &script,
        vars,
        env,
    );
    let expected_path = Path::new(expected);
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(expected_path, &output).unwrap();
    }
    let wanted = std::fs::read_to_string(expected_path).unwrap_or_default();
    if output != wanted {
        let dir = tempfile::tempdir().unwrap();
        let actual = dir.path().join("actual");
        std::fs::write(&actual, &output).unwrap();
        let diff = Command::new("diff")
            .arg("-u")
            .arg(expected_path)
            .arg(&actual)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        panic!("psql output differs from {expected} (BLESS=1 to accept):\n{diff}");
    }
}

/// Runs `fence-gateway` with `args` on a thread of its own; its output and how long it took.
pub fn gateway_timed(args: Vec<String>) -> std::thread::JoinHandle<(Output, std::time::Duration)> {
    std::thread::spawn(move || {
        let started = tokio::time::Instant::now();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = gateway(&args);
        (output, started.elapsed())
    })
}
