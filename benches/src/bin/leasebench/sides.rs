//! Tables of side-by-side closed-loop cells: each operation has its own columns ("sides"), e.g.
//! raw etcd as users write it, the best raw variant, the proxy without and with group commit.
//! Every cell runs every side of its table in the same round; the side that goes first rotates
//! from round to round, so a noisy machine affects all of them alike.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use indicatif::ProgressBar;
use lease_proxy_benches::report::{self, Row};
use lease_proxy_benches::stats::Run;
use serde_json::json;

use crate::backend::Backend;
use crate::cpu;
use crate::http::Proxy;
use crate::ops::{self, Op};

/// Runs one cell: `(in_flight, ops, tag)`, `tag` unique to the cell and side.
type Measure =
    dyn Fn(usize, usize, String) -> BoxFuture<'static, anyhow::Result<Run>> + Send + Sync;

/// One column: a named way to run a cell.
#[derive(Clone)]
pub(crate) struct Side {
    /// The column's name (a backend in the JSON).
    pub(crate) name: String,
    measure: Arc<Measure>,
    /// The proxy whose etcd request counters are read before and after each run.
    probe: Option<Arc<Proxy>>,
    /// The process serving this side (a proxy, a peer), whose CPU time per operation is
    /// reported as the side's own.
    pid: Option<u32>,
}

impl Side {
    /// A side that runs `measure(in_flight, ops, tag)`.
    pub(crate) fn new<F, Fut>(name: &str, measure: F) -> Self
    where
        F: Fn(usize, usize, String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<Run>> + Send + 'static,
    {
        Self {
            name: name.to_owned(),
            measure: Arc::new(move |c, n, tag| Box::pin(measure(c, n, tag))),
            probe: None,
            pid: None,
        }
    }

    /// Also reports the CPU time per operation of process `pid` (`None`: nothing more).
    pub(crate) fn process(mut self, pid: Option<u32>) -> Self {
        self.pid = pid;
        self
    }

    /// Also records, per run, the etcd requests `proxy` made (from its `/metrics`).
    pub(crate) fn probed(mut self, proxy: &Arc<Proxy>) -> Self {
        self.probe = Some(proxy.clone());
        self
    }

    /// A side that runs the single-lease operation `op` on `backend` (see [`ops::measure`]);
    /// `held` is the renewable set for `renew`, `renewals` the renewals per `cycle`.
    pub(crate) fn op<B: Backend>(
        name: &str,
        backend: &Arc<B>,
        op: Op,
        held: &Arc<Vec<B::Held>>,
        renewals: usize,
    ) -> Self {
        let (backend, held) = (backend.clone(), held.clone());
        Self::new(name, move |c, n, tag| {
            let (backend, held) = (backend.clone(), held.clone());
            async move { ops::measure(&backend, op, c, n, &tag, &held, renewals).await }
        })
    }
}

/// The columns of one operation's table.
pub(crate) struct Table {
    /// The operation's name in the rows.
    pub(crate) op: &'static str,
    /// Its columns; the first is the baseline every ratio is taken against.
    pub(crate) sides: Vec<Side>,
}

/// Measurement settings shared by every cell.
pub(crate) struct Cells<'a> {
    /// Requests in flight, one cell each.
    pub(crate) concurrency: &'a [usize],
    /// Rounds per cell.
    pub(crate) rounds: usize,
    /// Operations per side per cell.
    pub(crate) ops: usize,
    /// Pids of the proxies started here, whose CPU time is reported apart.
    pub(crate) proxy_pids: Vec<u32>,
    /// etcd's pid, when started here: its CPU time per operation is reported apart.
    pub(crate) etcd_pid: Option<u32>,
}

/// A measured row and, per probed side, the etcd requests its proxy made during its run.
pub(crate) struct Measured {
    /// The row.
    pub(crate) row: Row,
    /// Side name → etcd operation → requests (and `batched`: transactions sent in batches).
    pub(crate) etcd: BTreeMap<String, BTreeMap<String, f64>>,
    /// Side name → consumer → CPU milliseconds per operation (`side`: the side's own process,
    /// `etcd`: etcd's, where known).
    pub(crate) cpu: BTreeMap<String, BTreeMap<&'static str, f64>>,
}

impl Measured {
    /// The row as JSON with, per side, CPU milliseconds per operation (`cpu_ms_per_op`: the
    /// machine, leasebench, the proxies, the rest = etcd) and, per probed side, the etcd
    /// requests its proxy made (`proxy_etcd_requests`, and per operation measured). Both
    /// include the cell's untimed setup and cleanup (e.g. the releases after `acquire`).
    pub(crate) fn json(&self) -> serde_json::Value {
        let mut row = self.row.json();
        if !self.cpu.is_empty() {
            row["cpu_ms_per_op"] = json!(self.cpu);
        }
        if !self.etcd.is_empty() {
            let per_op: BTreeMap<&String, BTreeMap<&String, f64>> = self
                .etcd
                .iter()
                .filter_map(|(side, counts)| {
                    let ops = self.row.runs.iter().find(|(n, _)| n == side)?.1.ops;
                    let per = counts
                        .iter()
                        .map(|(k, v)| (k, v / ops.max(1) as f64))
                        .collect();
                    Some((side, per))
                })
                .collect();
            row["proxy_etcd_requests"] = json!(self.etcd);
            row["proxy_etcd_requests_per_op"] = json!(per_op);
        }
        row
    }
}

/// The change in each counter from `before` to `after`.
fn delta(before: &BTreeMap<String, f64>, after: BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .into_iter()
        .map(|(k, v)| {
            let d = v - before.get(&k).copied().unwrap_or(0.0);
            (k, d)
        })
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

/// Runs every table's cells, printing a markdown table per operation as rows come in.
pub(crate) async fn run(
    tables: &[Table],
    cells: &Cells<'_>,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<Measured>> {
    let mut rows = Vec::new();
    for table in tables {
        let names: Vec<&str> = table.sides.iter().map(|s| s.name.as_str()).collect();
        progress.suspend(|| println!("\n{}", report::header_ratios(&names)));
        for &in_flight in cells.concurrency {
            for round in 0..cells.rounds {
                progress.set_message(format!("{} × {in_flight}, round {round}", table.op));
                let mut runs = vec![None; table.sides.len()];
                let mut etcd = BTreeMap::new();
                let mut cpu = BTreeMap::new();
                for k in 0..table.sides.len() {
                    let i = (round + k) % table.sides.len();
                    let side = &table.sides[i];
                    // Each side its own resource names (proxies share one etcd prefix).
                    let tag = format!(
                        "{}-c{in_flight}r{round}s{i}-{}",
                        table.op,
                        std::process::id()
                    );
                    let before = match &side.probe {
                        Some(p) => Some(p.etcd_counters().await?),
                        None => None,
                    };
                    let pids = cpu::Pids {
                        proxies: &cells.proxy_pids,
                        side: side.pid,
                        etcd: cells.etcd_pid,
                    };
                    let cpu_before = cpu::sample(&pids);
                    let run = (side.measure)(in_flight, cells.ops, tag).await?;
                    if let (Some(b), Some(a)) = (cpu_before, cpu::sample(&pids)) {
                        cpu.insert(side.name.clone(), cpu::per_op(b, a, run.ops));
                    }
                    runs[i] = Some(run);
                    if let (Some(p), Some(before)) = (&side.probe, before) {
                        etcd.insert(side.name.clone(), delta(&before, p.etcd_counters().await?));
                    }
                    progress.inc(1);
                    tokio::time::sleep(ops::SETTLE).await;
                }
                let row = Row {
                    op: table.op.to_owned(),
                    in_flight,
                    round,
                    runs: table
                        .sides
                        .iter()
                        .zip(runs)
                        .map(|(s, r)| (s.name.clone(), r.unwrap_or_default()))
                        .collect(),
                };
                progress.suspend(|| println!("{}", report::line_ratios(&row)));
                rows.push(Measured { row, etcd, cpu });
            }
        }
    }
    Ok(rows)
}

/// How many side runs `tables` make, for the progress bar.
pub(crate) fn count(tables: &[Table], cells: &Cells<'_>) -> usize {
    tables.iter().map(|t| t.sides.len()).sum::<usize>() * cells.concurrency.len() * cells.rounds
}
