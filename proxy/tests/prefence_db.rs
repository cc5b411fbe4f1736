//! The pre-fence into PostgreSQL (`--prefence-database-url`) against a real PostgreSQL
//! (`FENCING_TEST_POSTGRES`, which the README's test command provides) with fencing's
//! in-database package installed: a grant raises the resource's mark in the database before it
//! is returned; a raise that cannot commit within `--forward-timeout` — the old holder's SQL
//! transaction still open, or the database down — withdraws the grant (fail closed); once the old
//! holder's transaction is over, its token is refused in SQL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use tokio::time::Instant;

use common::*;
use fencing::indb::InstallOptions;
use serde_json::{json, Value};

fn admin_url() -> String {
    std::env::var("FENCING_TEST_POSTGRES").unwrap_or_else(|_| {
        "postgres://lease_proxy:lease_proxy@127.0.0.1:5432/lease_proxy_test".to_owned()
    })
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// A scratch database with the package installed and a writer role, dropped at the end.
struct Scratch {
    name: String,
    admin: String,
}

impl Scratch {
    async fn new(key_file: &std::path::Path) -> Self {
        let admin = admin_url();
        let name = format!("prefence_{}_{}", std::process::id(), rand::random::<u32>());
        let c = connect(&admin).await;
        for sql in [
            format!("CREATE DATABASE {name}"),
            format!("CREATE ROLE {name}_w LOGIN PASSWORD 'w'"),
        ] {
            c.batch_execute(&sql).await.unwrap();
        }
        let scratch = Self { name, admin };
        let options = InstallOptions {
            schema: "fencing".into(),
            owner: None,
            writers: vec![format!("{}_w", scratch.name)],
            ..InstallOptions::default()
        };
        fencing::indb::install(&scratch.url(), &options)
            .await
            .unwrap();
        fencing::indb::sync_keys(
            &scratch.url(),
            "fencing",
            key_file,
            fencing::indb::DEFAULT_LOCK_TIMEOUT,
        )
        .await
        .unwrap();
        scratch
    }

    /// The scratch database as the installing role.
    fn url(&self) -> String {
        let base = self.admin.rsplit_once('/').unwrap().0;
        format!("{base}/{}", self.name)
    }

    /// The scratch database as its writer role.
    fn writer_url(&self) -> String {
        let config: tokio_postgres::Config = self.admin.parse().unwrap();
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "127.0.0.1".into(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        format!("postgres://{}_w:w@{host}:{port}/{}", self.name, self.name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Separate commands: DROP DATABASE runs outside a transaction block only; membership of
        // the writer role lets `WITH (FORCE)` end its sessions.
        let member = format!("GRANT {}_w TO CURRENT_USER", self.name);
        let database = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let role = format!("DROP ROLE IF EXISTS {}_w", self.name);
        let _ = std::process::Command::new("psql")
            .args([
                self.admin.as_str(),
                "-q",
                "-c",
                &member,
                "-c",
                &database,
                "-c",
                &role,
            ])
            .output();
    }
}

async fn acquire(proxy: &Proxy, resource: &str, holder: &str) -> (u16, Value) {
    let resp = http()
        .post(format!("{}/v1/leases/{resource}", proxy.url))
        .json(&json!({"holder": holder, "ttl_seconds": 30}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn release(proxy: &Proxy, resource: &str, secret: &str) {
    let resp = http()
        .delete(format!("{}/v1/leases/{resource}", proxy.url))
        .header("lease-secret", secret)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
}

/// The resource's mark in the database, as `era:revision`.
async fn mark(db: &tokio_postgres::Client, resource: &str) -> Option<String> {
    db.query_one("SELECT fencing.mark($1)", &[&resource])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_raise_the_mark_in_the_database_or_are_withdrawn() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("keys");
    fencing::Keyring::create_file(&key_file, &fencing::KeyId::parse("k1").unwrap()).unwrap();
    let scratch = Scratch::new(&key_file).await;
    let etcd = Etcd::shared().await;
    let prefix = lease_proxy_testkit::prefix("prefence-db");
    let writer_url = scratch.writer_url();
    let proxy = Proxy::start_with_keys(etcd.endpoints(), key_file.clone(), |c| {
        c.etcd_prefix = prefix.clone();
        c.prefence_database_url = Some(writer_url.clone());
        c.forward_timeout = Duration::from_secs(2);
    })
    .await;
    let db = connect(&writer_url).await;

    // A grant raises the mark before it is returned.
    let (status, first) = acquire(&proxy, "aisle-1", "robot-a").await;
    assert_eq!(status, 201, "{first}");
    let token = first["fencing_token"].as_str().unwrap().to_owned();
    let revision = first["token"].as_str().unwrap().to_owned();
    let raised = mark(&db, "aisle-1").await.expect("no mark after the grant");
    assert!(
        raised.ends_with(&format!(":{revision}")),
        "{raised} vs {revision}"
    );

    // The old holder's SQL transaction, admitted, still open: the next grant's raise waits for
    // it past the deadline, and the grant is withdrawn — the resource stays free.
    let mut old = connect(&writer_url).await;
    let tx = old.transaction().await.unwrap();
    tx.query_one("SELECT fencing.admit('aisle-1', $1)", &[&token])
        .await
        .unwrap();
    release(&proxy, "aisle-1", first["secret"].as_str().unwrap()).await;
    let asked = Instant::now();
    let (status, refused) = acquire(&proxy, "aisle-1", "robot-b").await;
    assert_eq!(status, 503, "{refused}");
    assert!(
        refused["type"]
            .as_str()
            .unwrap()
            .ends_with("prefence-failed"),
        "{refused}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(6),
        "{:?}",
        asked.elapsed()
    );
    let held = http()
        .get(format!("{}/v1/leases/aisle-1", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 404, "a withdrawn grant holds the resource");
    assert_eq!(mark(&db, "aisle-1").await.as_deref(), Some(raised.as_str()));

    // The old holder commits; the next grant raises, and the old token is refused in SQL.
    tx.commit().await.unwrap();
    let (status, second) = acquire(&proxy, "aisle-1", "robot-b").await;
    assert_eq!(status, 201, "{second}");
    let stale = old
        .query_one("SELECT fencing.admit('aisle-1', $1)", &[&token])
        .await
        .unwrap_err();
    assert_eq!(stale.code().map(|c| c.code()), Some("23F01"), "{stale}");

    // The database gone (nothing listens there): grants fail closed, quickly.
    let gone = Proxy::start_with_keys(etcd.endpoints(), key_file.clone(), |c| {
        c.etcd_prefix = prefix.clone();
        c.prefence_database_url = Some("postgres://nobody:x@127.0.0.1:1/none".into());
        c.forward_timeout = Duration::from_secs(2);
    })
    .await;
    let (status, refused) = acquire(&gone, "aisle-2", "robot-c").await;
    assert_eq!(status, 503, "{refused}");
    let (status, _) = acquire(&proxy, "aisle-2", "robot-d").await;
    assert_eq!(status, 201, "the failed grant was not withdrawn");
}
