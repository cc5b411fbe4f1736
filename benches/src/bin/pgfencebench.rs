//! pgfencebench: what fencing inside PostgreSQL costs a writer. The same write
//! transaction — a prepared `UPDATE … SET qty = qty + 1 WHERE aisle = $1`, committed, three round
//! trips — runs in the same run, interleaved round by round (the order rotates), each worker on
//! its own connection and its own aisle (a holder writing what it holds):
//! - `unfenced`: `BEGIN`, the update, `COMMIT`;
//! - `temporal`: Temporal's hand-written fence (its SQL persistence's `readLockShard`): `BEGIN`,
//!   a prepared `SELECT range_id FROM shards WHERE … FOR SHARE` whose answer the application
//!   compares with the range it owns, the update, `COMMIT` (one round trip more, no signature);
//! - `floor`: `BEGIN; SELECT bench_floor(aisle)` in one message, the update, `COMMIT`: the
//!   cheapest check a package can make a writer pass through — a `SECURITY DEFINER` PL/pgSQL
//!   function with a fixed `search_path` that reads the resource's mark row `FOR SHARE` and
//!   nothing else (no token, no verdict, no gateway check): the bound for `admit`;
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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use fencing::indb::InstallOptions;
use fencing::{KeyId, Keyring, Token};
use lease_proxy_benches::stats::{ms, Run};
use serde_json::json;
use tokio::time::Instant;
use tokio_postgres::{Client, NoTls};

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

/// A side of the comparison.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Unfenced,
    Temporal,
    Floor,
    Admit,
    Trigger,
}

/// Every side, in the order of the enum (`Side as usize` indexes it).
const SIDES: [Side; 5] = [
    Side::Unfenced,
    Side::Temporal,
    Side::Floor,
    Side::Admit,
    Side::Trigger,
];

/// The sides checked inside the database, each compared with the unfenced and Temporal's.
const FENCED: [Side; 3] = [Side::Floor, Side::Admit, Side::Trigger];

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Unfenced => "unfenced",
            Side::Temporal => "temporal",
            Side::Floor => "floor",
            Side::Admit => "admit",
            Side::Trigger => "trigger",
        }
    }

    /// The transaction's shape, for the JSON report.
    fn shape(self) -> &'static str {
        match self {
            Side::Unfenced => "BEGIN | UPDATE stock SET qty = qty + 1 WHERE aisle = $1 | COMMIT",
            Side::Temporal => {
                "BEGIN | SELECT range_id FROM shards WHERE aisle = $1 FOR SHARE (compared) | UPDATE stock … | COMMIT"
            }
            Side::Floor => "BEGIN; SELECT bench_floor(aisle) | UPDATE stock … | COMMIT",
            Side::Admit => "BEGIN; SELECT fencing.admit(aisle, token) | UPDATE stock … | COMMIT",
            Side::Trigger => {
                "BEGIN; SET LOCAL fencing.token = token | UPDATE guarded … (protected) | COMMIT"
            }
        }
    }
}

/// The floor side's function: what any in-database check costs at least (a `SECURITY DEFINER`
/// call with a fixed `search_path`, PL/pgSQL, one row read `FOR SHARE`), checking nothing.
const FLOOR: &str = "CREATE FUNCTION bench_floor(resource text) RETURNS bytea
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    DECLARE mark bytea;
    BEGIN
        SELECT m.mark INTO mark FROM fencing.fence_marks AS m
            WHERE m.resource = bench_floor.resource FOR SHARE;
        RETURN mark;
    END $$";

/// The range id every worker owns in `shards` (Temporal's side compares with it).
const RANGE_ID: i64 = 1;

/// Each worker's connection, aisle and token, and its prepared updates.
struct Worker {
    client: Client,
    aisle: String,
    token: String,
    /// `UPDATE stock …` (unprotected) and `UPDATE guarded …` (protected).
    update: [tokio_postgres::Statement; 2],
    /// Temporal's `SELECT range_id … FOR SHARE`.
    read_lock_shard: tokio_postgres::Statement,
}

/// `ops` transactions on `side` over `workers`, all in flight at once.
async fn measure(workers: &[Arc<Worker>], side: Side, ops: usize) -> anyhow::Result<Run> {
    let started = Instant::now();
    let per = ops.div_ceil(workers.len());
    let mut tasks = Vec::new();
    for w in workers {
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per);
            for _ in 0..per {
                let t = Instant::now();
                transaction(&w, side).await?;
                latencies.push(t.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::with_capacity(ops);
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(Run::from_latencies(all, started.elapsed()))
}

async fn transaction(w: &Worker, side: Side) -> anyhow::Result<()> {
    // Tokens and aisles are the bench's own (url-safe and alphanumeric): quoted as literals.
    let begin = match side {
        Side::Unfenced | Side::Temporal => "BEGIN".to_owned(),
        Side::Floor => format!("BEGIN; SELECT bench_floor('{}')", w.aisle),
        Side::Admit => format!("BEGIN; SELECT fencing.admit('{}', '{}')", w.aisle, w.token),
        Side::Trigger => format!("BEGIN; SET LOCAL fencing.token = '{}'", w.token),
    };
    w.client.batch_execute(&begin).await?;
    if side == Side::Temporal {
        let range_id: i64 = w
            .client
            .query_one(&w.read_lock_shard, &[&w.aisle])
            .await?
            .get(0);
        anyhow::ensure!(range_id == RANGE_ID, "shard ownership lost");
    }
    let update = &w.update[usize::from(side == Side::Trigger)];
    w.client.execute(update, &[&w.aisle]).await?;
    w.client.batch_execute("COMMIT").await?;
    Ok(())
}

/// The server-side cost of an admit's parts: each expression evaluated 1,000 times in one
/// PL/pgSQL loop (so no round trip is counted), less the empty loop, in µs per call.
async fn breakdown(db: &Client, w: &Worker) -> anyhow::Result<Vec<(String, f64)>> {
    const N: u32 = 1000;
    let (aisle, token) = (w.aisle.as_str(), w.token.as_str());
    let lit = |s: &str| format!("'{}'", s.replace('\'', "''"));
    // Variables, not literals: an immutable function of constants would be folded once.
    let declare = format!(
        "DECLARE r text := {}; t text := {}; b bytea := '\\x00'; ok boolean;",
        lit(aisle),
        lit(token)
    );
    let parts = [
        "1",
        "fencing._is_resource(r)",
        "string_to_array(t, '.')",
        "fencing.hmac(b, b, 'sha256')",
        "fencing._verify(r, t)",
        "fencing._recall(r, t)",
        "fencing.admit(r, t)",
    ];
    let mut out = Vec::new();
    let mut empty = 0.0;
    for part in parts {
        let sql =
            format!("DO $$ {declare} BEGIN FOR i IN 1..{N} LOOP PERFORM {part}; END LOOP; END $$");
        db.batch_execute("BEGIN").await?;
        let t0 = Instant::now();
        db.batch_execute(&sql).await?;
        let us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(N);
        db.batch_execute("COMMIT").await?;
        if part == "1" {
            empty = us;
            continue;
        }
        out.push((part.to_owned(), (us - empty).max(0.0)));
    }
    Ok(out)
}

/// Runs `n` transactions of a side inside the server, one after another (a procedure that
/// commits in its loop): no client, no round trip, commits not waiting for the disk.
const SERVER_LOOP: &str = "CREATE PROCEDURE bench_loop(side text, n int, a text, t text)
    LANGUAGE plpgsql AS $$
    DECLARE shown text; mark bytea;
    BEGIN
        FOR i IN 1..n LOOP
            IF side = 'temporal' THEN
                PERFORM s.range_id FROM shards AS s WHERE s.aisle = a FOR SHARE;
            ELSIF side = 'floor' THEN
                mark := bench_floor(a);
            ELSIF side = 'admit' THEN
                shown := fencing.admit(a, t);
            ELSIF side = 'trigger' THEN
                PERFORM set_config('fencing.token', t, true);
            END IF;
            IF side = 'trigger' THEN
                UPDATE guarded SET qty = qty + 1 WHERE aisle = a;
            ELSE
                UPDATE stock SET qty = qty + 1 WHERE aisle = a;
            END IF;
            COMMIT;
        END LOOP;
    END $$";

/// The server's CPU per transaction of each side: `n` transactions in one server-side loop
/// (`SERVER_LOOP`), the rounds interleaved, the least time of the rounds (what the others lost
/// to the machine's other work), in µs per transaction. Without the client and the round trips
/// this is what each side asks of PostgreSQL itself.
async fn server_costs(
    db: &Client,
    w: &Worker,
    n: u32,
    rounds: usize,
) -> anyhow::Result<Vec<(Side, f64)>> {
    db.batch_execute(SERVER_LOOP).await?;
    db.batch_execute("SET synchronous_commit = off").await?;
    let call = |side: Side| {
        format!(
            "CALL bench_loop('{}', {n}, '{}', '{}')",
            side.name(),
            w.aisle,
            w.token
        )
    };
    let mut least = [f64::INFINITY; SIDES.len()];
    for round in 0..rounds {
        for k in 0..SIDES.len() {
            let i = (k + round) % SIDES.len();
            let t0 = Instant::now();
            db.batch_execute(&call(SIDES[i])).await?;
            let us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(n);
            least[i] = least[i].min(us);
        }
    }
    db.batch_execute("RESET synchronous_commit").await?;
    Ok(SIDES.iter().copied().zip(least).collect())
}

/// `n` admits committed one at a time: each a new holder's (a higher token: the raise) or the
/// current holder's again (the check alone).
async fn raises(db: &Client, keys: &Keyring, n: usize, higher: bool) -> anyhow::Result<Run> {
    let resource = if higher { "raised" } else { "checked" };
    let current = keys.mint(resource, Token::new(1, 1));
    db.query_one("SELECT fencing.admit($1, $2)", &[&resource, &current])
        .await?;
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let token = if higher {
            keys.mint(resource, Token::new(1, u64::try_from(i).unwrap_or(0) + 2))
        } else {
            current.clone()
        };
        let t = Instant::now();
        db.batch_execute("BEGIN").await?;
        db.query_one("SELECT fencing.admit($1, $2)", &[&resource, &token])
            .await?;
        db.batch_execute("COMMIT").await?;
        latencies.push(t.elapsed());
    }
    Ok(Run::from_latencies(latencies, started.elapsed()))
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
    let key_file = dir.path().join("keys");
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

    let mut rows = Vec::new();
    let mut md = String::from("| in flight | round |");
    for side in SIDES {
        md.push_str(&format!(" {} p50 / p99 ms |", side.name()));
    }
    for side in SIDES {
        md.push_str(&format!(" {} tx/s |", side.name()));
    }
    for side in FENCED {
        md.push_str(&format!(" {} / temporal: p50, tx/s |", side.name()));
    }
    md.push_str(&format!(
        "\n|--:|--:|{}\n",
        "--:|".repeat(2 * SIDES.len() + FENCED.len())
    ));
    for &n in &args.concurrency {
        let cell = &workers[..n.max(1).min(workers.len())];
        for round in 0..args.rounds {
            let mut got = [Run::default(); SIDES.len()];
            for k in 0..SIDES.len() {
                let i = (k + round) % SIDES.len();
                got[i] = measure(cell, SIDES[i], args.ops).await?;
            }
            let run = |side: Side| &got[side as usize];
            let p50 = |r: &Run, of: &Run| ms(r.p50) / ms(of.p50).max(1e-9);
            let tput = |r: &Run, of: &Run| r.per_sec / of.per_sec.max(1e-9);
            let (plain, temporal) = (run(Side::Unfenced), run(Side::Temporal));
            md.push_str(&format!("| {n} | {round} |"));
            for r in &got {
                md.push_str(&format!(" {:.3} / {:.3} |", ms(r.p50), ms(r.p99)));
            }
            for r in &got {
                md.push_str(&format!(" {:.0} |", r.per_sec));
            }
            let mut row = json!({ "in_flight": n, "round": round });
            for side in SIDES {
                row[side.name()] = run(side).json();
            }
            for side in FENCED {
                let (r, key) = (run(side), side.name());
                md.push_str(&format!(
                    " {:.2} / {:.2} |",
                    p50(r, temporal),
                    tput(r, temporal)
                ));
                row[format!("{key}_p50_ratio")] = json!(p50(r, plain));
                row[format!("{key}_throughput_ratio")] = json!(tput(r, plain));
                row[format!("{key}_temporal_p50_ratio")] = json!(p50(r, temporal));
                row[format!("{key}_temporal_throughput_ratio")] = json!(tput(r, temporal));
            }
            md.push('\n');
            rows.push(row);
        }
    }
    if args.keep_database {
        println!("aisle-0 token {}", workers[0].token);
    }
    let parts = breakdown(&db, &workers[0]).await?;
    md.push_str("\nWhere an admit's time goes (each part called 1,000 times in one server-side loop, µs per call):\n\n| part | µs |\n|---|--:|\n");
    for (part, us) in &parts {
        md.push_str(&format!("| `{part}` | {us:.1} |\n"));
    }
    let costs = server_costs(&db, &workers[0], 2000, 6).await?;
    md.push_str("\nWhat each side asks of the server, per transaction (2,000 in one server-side loop, commits not waiting for the disk, least of 6 rounds, µs):\n\n| side | µs | above unfenced |\n|---|--:|--:|\n");
    let unfenced = costs.first().map_or(0.0, |c| c.1);
    for (side, us) in &costs {
        md.push_str(&format!(
            "| {} | {us:.1} | {:.1} |\n",
            side.name(),
            us - unfenced
        ));
    }
    let check = raises(&db, &keys, args.raises, false).await?;
    let raise = raises(&db, &keys, args.raises, true).await?;
    md.push_str(&format!(
        "\nAdmit committed alone, 1 in flight: the current token (check) p50 {:.3} ms, p99 {:.3} ms; a higher one (the raise, once per new holder) p50 {:.3} ms, p99 {:.3} ms.\n",
        ms(check.p50),
        ms(check.p99),
        ms(raise.p50),
        ms(raise.p99)
    ));
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
