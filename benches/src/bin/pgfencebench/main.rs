//! pgfencebench: what fencing inside PostgreSQL costs a writer. The same write
//! transaction — a prepared `UPDATE … SET qty = qty + 1 WHERE aisle = $1`, committed, three round
//! trips — runs in the same run, interleaved round by round (the order rotates), each worker on
//! its own connection and its own aisle (a holder writing what it holds):
//! - `unfenced`: `BEGIN`, the update, `COMMIT`;
//! - `temporal`: Temporal's hand-written fence (its SQL persistence's `readLockShard`): `BEGIN`,
//!   a prepared `SELECT range_id FROM shards WHERE … FOR SHARE` whose answer the application
//!   compares with the range it owns, the update, `COMMIT` (one round trip more, no signature);
//! - `floor`: `BEGIN; SELECT bench_floor(aisle)` in one message, the update, `COMMIT`: the least
//!   a check costs written as the package writes its functions — a `SECURITY DEFINER` PL/pgSQL
//!   function with a fixed `search_path` that reads the resource's mark row `FOR SHARE` and
//!   nothing else (no token, no verdict, no gateway check): the bound for `admit` so written;
//! - `admit`: `BEGIN; SELECT fencing.admit(aisle, token)` in one message, the update, `COMMIT`;
//! - `trigger`: `BEGIN; SET LOCAL fencing.token = …` in one message, the update of a protected
//!   table (`fencing.protect`, the ORM mode: the row trigger verifies the token), `COMMIT`.
//!
//! The mark raise (once per new holder: admit with a higher token, committed) is measured on its
//! own against an admit of the current token, and a server-side breakdown of an admit's parts
//! (an admit of a token it remembers as verified, and one it verifies: `_verify`). Last, what
//! each side asks of the server per transaction: its transactions run in a loop inside the
//! server (a procedure that commits), with no client and no round trip.
//!
//! It makes a scratch database on `--database-url` (a role that may create databases), installs
//! the package there with a fresh key file, and drops it at the end:
//! `cargo build --release -p lease-proxy-benches && target/release/pgfencebench`.

mod server;
mod sides;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use fencing::indb::InstallOptions;
use fencing::{KeyId, Keyring, Token};
use serde_json::json;
use tokio_postgres::{Client, NoTls};

use sides::{Worker, FLOOR, RANGE_ID, SIDES};

#[derive(Parser)]
#[command(about = "A fenced PostgreSQL write transaction against the same one unfenced")]
struct Args {
    /// PostgreSQL as a role that may create databases.
    #[arg(
        long,
        env = "FENCING_TEST_POSTGRES",
        default_value = "postgres://lease_proxy:lease_proxy@127.0.0.1:5432/lease_proxy_test"
    )]
    database_url: String,
    /// Transactions in flight (one connection each), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    concurrency: Vec<usize>,
    /// Transactions per side per cell.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Rounds; the side that goes first alternates.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Mark raises measured (and as many admits of the current token).
    #[arg(long, default_value_t = 500)]
    raises: usize,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keep the scratch database, and print its URL and aisle-0's token (to look closer).
    #[arg(long)]
    keep_database: bool,
}

/// The scratch database, dropped at the end.
struct Scratch {
    admin: String,
    name: String,
}

impl Scratch {
    fn url(&self) -> String {
        let base = self
            .admin
            .rsplit_once('/')
            .map_or(self.admin.as_str(), |b| b.0);
        format!("{base}/{}", self.name)
    }

    async fn drop_now(&self) -> anyhow::Result<()> {
        let admin = connect(&self.admin).await?;
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await?;
        Ok(())
    }
}

async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(connection);
    Ok(client)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let scratch = Scratch {
        admin: args.database_url.clone(),
        name: format!("pgfencebench_{}", std::process::id()),
    };
    connect(&args.database_url)
        .await?
        .batch_execute(&format!("CREATE DATABASE {}", scratch.name))
        .await?;
    let result = run(&args, &scratch).await;
    if args.keep_database {
        println!("kept {}", scratch.url());
    } else {
        scratch.drop_now().await?;
    }
    result
}

async fn run(args: &Args, scratch: &Scratch) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (keys, db, workers) = setup(args, scratch, dir.path()).await?;
    let (mut md, rows) = sides::table(&workers, &args.concurrency, args.rounds, args.ops).await?;
    if args.keep_database {
        println!("aisle-0 token {}", workers[0].token);
    }
    let parts = server::breakdown(&db, &workers[0]).await?;
    let costs = server::costs(&db, &workers[0], 2000, 6).await?;
    let check = server::raises(&db, &keys, args.raises, false).await?;
    let raise = server::raises(&db, &keys, args.raises, true).await?;
    md.push_str(&server::markdown(&parts, &costs, &check, &raise));
    print!("{md}");
    if let Some(path) = &args.json {
        let report = json!({
            "transactions": SIDES
                .iter()
                .map(|s| (s.name().to_owned(), json!(s.shape())))
                .collect::<serde_json::Map<_, _>>(),
            "cells": rows,
            "server_us_per_transaction": costs
                .iter()
                .map(|(side, us)| json!({"side": side.name(), "us": us}))
                .collect::<Vec<_>>(),
            "admit_parts_us": parts.iter().map(|(p, us)| json!({"part": p, "us": us})).collect::<Vec<_>>(),
            "admit_check": check.json(),
            "admit_raise": raise.json(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}

/// Installs the package in the scratch database with a fresh key file in `dir`, makes the
/// tables every side writes, and connects one worker per transaction in flight, each holding
/// its aisle's token (its grant's pre-fence raised the mark once).
async fn setup(
    args: &Args,
    scratch: &Scratch,
    dir: &Path,
) -> anyhow::Result<(Keyring, Client, Vec<Arc<Worker>>)> {
    let key_file = dir.join("keys");
    Keyring::create_file(&key_file, &KeyId::parse("bench").context("a key id")?)?;
    let keys = Keyring::load(&key_file)?;
    let url = scratch.url();
    let options = InstallOptions {
        schema: "fencing".into(),
        owner: None,
        writers: Vec::new(),
        gateway_roles: Vec::new(),
        ..InstallOptions::default()
    };
    fencing::indb::install(&url, &options).await?;
    fencing::indb::sync_keys(
        &url,
        "fencing",
        &key_file,
        fencing::indb::DEFAULT_LOCK_TIMEOUT,
    )
    .await?;
    let db = connect(&url).await?;
    let most = args.concurrency.iter().copied().max().unwrap_or(1);
    db.batch_execute(&format!(
        "CREATE TABLE stock(aisle text PRIMARY KEY, qty bigint NOT NULL);
         INSERT INTO stock SELECT 'aisle-' || i, 0 FROM generate_series(0, {most} - 1) AS i;
         CREATE TABLE guarded (LIKE stock INCLUDING ALL);
         INSERT INTO guarded SELECT * FROM stock;
         SELECT fencing.protect('guarded', 'aisle');
         CREATE TABLE shards(aisle text PRIMARY KEY, range_id bigint NOT NULL);
         INSERT INTO shards SELECT aisle, {RANGE_ID} FROM stock;"
    ))
    .await?;
    db.batch_execute(FLOOR).await?;
    let mut workers = Vec::new();
    for i in 0..most {
        let aisle = format!("aisle-{i}");
        let token = keys.mint(&aisle, Token::new(1, 1));
        // The holder's grant raised the mark once (the pre-fence); then it writes.
        db.query_one("SELECT fencing.admit($1, $2)", &[&aisle, &token])
            .await?;
        let client = connect(&url).await?;
        let update = [
            client
                .prepare("UPDATE stock SET qty = qty + 1 WHERE aisle = $1")
                .await?,
            client
                .prepare("UPDATE guarded SET qty = qty + 1 WHERE aisle = $1")
                .await?,
        ];
        let read_lock_shard = client
            .prepare("SELECT range_id FROM shards WHERE aisle = $1 FOR SHARE")
            .await?;
        workers.push(Arc::new(Worker {
            client,
            aisle,
            token,
            update,
            read_lock_shard,
        }));
    }
    Ok((keys, db, workers))
}
