//! The sides of the comparison: each worker's transaction on each side, and the table of them
//! measured in turn.

use std::sync::Arc;

use lease_proxy_benches::stats::{ms, Run};
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_postgres::Client;

/// A side of the comparison.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Unfenced,
    Temporal,
    Floor,
    Admit,
    Trigger,
}

/// Every side, in the order of the enum (`Side as usize` indexes it).
pub(crate) const SIDES: [Side; 5] = [
    Side::Unfenced,
    Side::Temporal,
    Side::Floor,
    Side::Admit,
    Side::Trigger,
];

/// The sides checked inside the database, each compared with the unfenced and Temporal's.
pub(crate) const FENCED: [Side; 3] = [Side::Floor, Side::Admit, Side::Trigger];

impl Side {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Side::Unfenced => "unfenced",
            Side::Temporal => "temporal",
            Side::Floor => "floor",
            Side::Admit => "admit",
            Side::Trigger => "trigger",
        }
    }

    /// The transaction's shape, for the JSON report.
    pub(crate) fn shape(self) -> &'static str {
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

/// The floor side's function: the least a check costs written as the package writes its
/// functions (a `SECURITY DEFINER` call with a fixed `search_path`, PL/pgSQL, one row read
/// `FOR SHARE`), checking nothing.
pub(crate) const FLOOR: &str = "CREATE FUNCTION bench_floor(resource text) RETURNS bytea
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    DECLARE mark bytea;
    BEGIN
        SELECT m.mark INTO mark FROM fencing.fence_marks AS m
            WHERE m.resource = bench_floor.resource FOR SHARE;
        RETURN mark;
    END $$";

/// The range id every worker owns in `shards` (Temporal's side compares with it).
pub(crate) const RANGE_ID: i64 = 1;

/// Each worker's connection, aisle and token, and its prepared updates.
pub(crate) struct Worker {
    pub(crate) client: Client,
    pub(crate) aisle: String,
    pub(crate) token: String,
    /// `UPDATE stock …` (unprotected) and `UPDATE guarded …` (protected).
    pub(crate) update: [tokio_postgres::Statement; 2],
    /// Temporal's `SELECT range_id … FOR SHARE`.
    pub(crate) read_lock_shard: tokio_postgres::Statement,
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

/// The peer table: every side at each of `concurrency` transactions in flight, `rounds` times
/// (the side that goes first rotating), as markdown rows and as JSON cells.
pub(crate) async fn table(
    workers: &[Arc<Worker>],
    concurrency: &[usize],
    rounds: usize,
    ops: usize,
) -> anyhow::Result<(String, Vec<Value>)> {
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
    for &n in concurrency {
        let cell = &workers[..n.max(1).min(workers.len())];
        for round in 0..rounds {
            let mut got = [Run::default(); SIDES.len()];
            for k in 0..SIDES.len() {
                let i = (k + round) % SIDES.len();
                got[i] = measure(cell, SIDES[i], ops).await?;
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
    Ok((md, rows))
}
