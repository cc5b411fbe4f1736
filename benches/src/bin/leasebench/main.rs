//! leasebench: lease throughput and latency through lease-proxy against raw etcd doing the same
//! protocol, measured against the same etcd in the same run, interleaved round by round (the
//! backend that goes first alternates), so a noisy machine affects both sides alike.
//!
//! Closed-loop operations (see `ops`): acquire, contended, release, cycle, renew at each
//! requested concurrency. Sustained renewal (see `held`): n held leases renewed every TTL/3,
//! open loop, through the proxy, over raw etcd's multiplexed keepalive stream and over one
//! stream per lease. Output: a markdown table, `--json`, and an SVG chart with `--chart`.
//!
//! Without `--etcd`/`--proxy` it starts its own etcd (fsync on) and the `lease-proxy` built
//! next to it: `cargo build --release -p lease-proxy -p lease-proxy-benches &&
//! target/release/leasebench`.

mod backend;
mod held;
mod http;
mod ops;
mod raw;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use lease_proxy_benches::report::{self, Row};
use lease_proxy_benches::stack::{self, Etcd, Stack};
use lease_proxy_benches::{chart, stats::ms};
use serde_json::json;

use backend::Backend;
use ops::Op;
use raw::{RawEtcd, Streams};

/// TTL of the leases held for a sustained run: long enough for any setup.
const SETUP_TTL: u64 = 3600;

#[derive(Parser)]
#[command(about = "Lease throughput through lease-proxy vs raw etcd, side by side")]
struct Args {
    /// etcd client URL (the one the proxy uses); starts its own etcd and proxy when absent.
    #[arg(long, requires = "proxy")]
    etcd: Option<String>,
    /// lease-proxy base URL.
    #[arg(long, requires = "etcd")]
    proxy: Option<String>,
    /// Pid of the proxy given with `--proxy`, to report its memory.
    #[arg(long)]
    proxy_pid: Option<u32>,
    /// Closed-loop operations to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "acquire,contended,release,cycle,renew"
    )]
    op: Vec<Op>,
    /// Requests in flight, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256")]
    concurrency: Vec<usize>,
    /// Operations per backend per cell.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Rounds; backends alternate within each round.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Leases held for the closed-loop `renew` measurement.
    #[arg(long, default_value_t = 1000)]
    held: usize,
    /// Renewals per `cycle`.
    #[arg(long, default_value_t = 3)]
    renewals: usize,
    /// Sustained renewal: numbers of held leases to run, comma-separated (none by default).
    #[arg(long, value_delimiter = ',')]
    sustain: Vec<usize>,
    /// How long each sustained run lasts.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    sustain_for: Duration,
    /// TTL the sustained renewal load stands for, in seconds: each lease is renewed every TTL/3
    /// (the leases themselves are held with a longer TTL so that setup time does not matter).
    #[arg(long, default_value_t = 30)]
    sustain_ttl: u64,
    /// Most renewals outstanding at once in a sustained run.
    #[arg(long, default_value_t = 1024)]
    sustain_in_flight: usize,
    /// Largest sustained run that also measures one keepalive stream per lease.
    #[arg(long, default_value_t = 10_000)]
    per_lease_max: usize,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also draw the closed-loop results as an SVG chart to this file.
    #[arg(long)]
    chart: Option<PathBuf>,
    /// Measure the cost of security instead: a plain proxy (HTTP, no authentication) against
    /// one with HTTPS and bearer-token authentication, both started here on the same etcd.
    #[arg(long, conflicts_with_all = ["etcd", "proxy", "sustain"])]
    secure: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    lease_proxy_benches::until_interrupted(run(Args::parse())).await
}

async fn run(args: Args) -> anyhow::Result<()> {
    if args.secure {
        return run_secure(&args).await;
    }
    let mut stack = Stack::new()?;
    let mut _etcd = None;
    let (etcd_url, proxy_url, proxy_pid) = match (&args.etcd, &args.proxy) {
        (Some(e), Some(p)) => (e.clone(), p.clone(), args.proxy_pid),
        _ => {
            let etcd = Etcd::single().await;
            let url = etcd.endpoint(0);
            let (proxy, spawned) = stack
                .lease_proxy(&stack::workspace_binary("lease-proxy"), &url)
                .await?;
            _etcd = Some(etcd);
            (url, proxy, Some(spawned.pid))
        }
    };
    let raw = Arc::new(RawEtcd::connect(&etcd_url, Streams::Multiplexed).await?);
    let proxy = Arc::new(http::Proxy::new(&proxy_url));

    let cells = args.op.len() * args.concurrency.len() * args.rounds * 2;
    let progress = ProgressBar::new(u64::try_from(cells + args.sustain.len() * 3)?);
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );

    let mut rows = Vec::new();
    if !args.op.is_empty() {
        progress.suspend(|| println!("{}", report::header(&["etcd", "proxy"], "proxy/etcd")));
        rows = closed_loop(&args, &raw, &proxy, ["etcd", "proxy"], &progress).await?;
    }
    let mut sustained = Vec::new();
    if !args.sustain.is_empty() {
        progress.suspend(|| {
            println!(
                "\n| held leases | renewals via | offered/s | renewed/s | p50 / p99 / max ms | failed | proxy RSS (peak) MiB |"
            );
            println!("|--:|---|--:|--:|--:|--:|--:|");
        });
    }
    for &n in &args.sustain {
        sustained.extend(sustain(&args, n, &etcd_url, &raw, &proxy, proxy_pid, &progress).await?);
    }
    progress.finish_and_clear();

    if let Some(path) = &args.chart {
        chart::draw(
            path,
            "leasebench: lease-proxy vs raw etcd (same etcd, same run)",
            &rows,
            &["etcd", "proxy"],
        )?;
    }
    write_json(&args, &rows, sustained)
}

fn write_json(args: &Args, rows: &[Row], sustained: Vec<serde_json::Value>) -> anyhow::Result<()> {
    if let Some(path) = &args.json {
        let doc = json!({
            "machine": {"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)},
            "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
            "sustained": sustained,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The cost of TLS and authentication: the same closed-loop cells through a plain proxy and
/// through one serving HTTPS with bearer tokens, both on one etcd, interleaved.
async fn run_secure(args: &Args) -> anyhow::Result<()> {
    let mut stack = Stack::new()?;
    let etcd = Etcd::single().await;
    let url = etcd.endpoint(0);
    let bin = stack::workspace_binary("lease-proxy");
    let pki = lease_proxy_testkit::pki::Pki::new("leasebench");
    let server = pki.server("proxy");
    let token = format!("leasebench-{:032x}", rand::random::<u128>());
    let tokens = stack.dir().join("tokens");
    std::fs::write(
        &tokens,
        format!(
            "leasebench {} acquire:*,read:*\n",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()))
        ),
    )?;
    let (plain_url, _) = stack.lease_proxy(&bin, &url).await?;
    let (secure_url, _) = stack
        .secure_lease_proxy(&bin, &url, &server, pki.ca(), &tokens)
        .await?;
    let plain = Arc::new(http::Proxy::new(&plain_url));
    let secure = Arc::new(http::Proxy::secure(&secure_url, pki.ca(), &token)?);
    let sides = ["proxy", "proxy tls+auth"];
    let cells = args.op.len() * args.concurrency.len() * args.rounds * 2;
    let progress = ProgressBar::new(u64::try_from(cells)?);
    progress.suspend(|| println!("{}", report::header(&sides, "tls+auth/plain")));
    let rows = closed_loop(args, &plain, &secure, sides, &progress).await?;
    progress.finish_and_clear();
    if let Some(path) = &args.chart {
        chart::draw(
            path,
            "leasebench: lease-proxy with HTTPS and bearer tokens vs plain (same etcd, same run)",
            &rows,
            &sides,
        )?;
    }
    write_json(args, &rows, Vec::new())
}

/// Every closed-loop cell on both backends (`raw` is the baseline, named `sides[0]`).
async fn closed_loop<A: Backend, B: Backend>(
    args: &Args,
    raw: &Arc<A>,
    proxy: &Arc<B>,
    sides: [&str; 2],
    progress: &ProgressBar,
) -> anyhow::Result<Vec<Row>> {
    let need_held = args.op.contains(&Op::Renew);
    let names = |side: &str| -> Vec<String> {
        (0..if need_held { args.held } else { 0 })
            .map(|i| format!("lb-held-{side}-{}-{i}", std::process::id()))
            .collect()
    };
    let raw_held = Arc::new(ops::acquire_all(raw, names("a"), 600, 64).await?);
    let proxy_held = Arc::new(ops::acquire_all(proxy, names("b"), 600, 64).await?);
    let mut rows = Vec::new();
    for &op in &args.op {
        for &in_flight in &args.concurrency {
            for round in 0..args.rounds {
                let tag = format!("{}-c{in_flight}r{round}-{}", op.name(), std::process::id());
                progress.set_message(format!("{} × {in_flight}, round {round}", op.name()));
                // Each side its own resource names (two proxies share one etcd prefix).
                let (tag_a, tag_b) = (format!("{tag}-a"), format!("{tag}-b"));
                let measure_raw = || {
                    ops::measure(
                        raw,
                        op,
                        in_flight,
                        args.ops,
                        &tag_a,
                        &raw_held,
                        args.renewals,
                    )
                };
                let measure_proxy = || {
                    ops::measure(
                        proxy,
                        op,
                        in_flight,
                        args.ops,
                        &tag_b,
                        &proxy_held,
                        args.renewals,
                    )
                };
                let (etcd_run, proxy_run) = if round % 2 == 0 {
                    let e = measure_raw().await?;
                    progress.inc(1);
                    tokio::time::sleep(ops::SETTLE).await;
                    let p = measure_proxy().await?;
                    (e, p)
                } else {
                    let p = measure_proxy().await?;
                    progress.inc(1);
                    tokio::time::sleep(ops::SETTLE).await;
                    let e = measure_raw().await?;
                    (e, p)
                };
                progress.inc(1);
                tokio::time::sleep(ops::SETTLE).await;
                let row = Row {
                    op: op.name().to_owned(),
                    in_flight,
                    round,
                    runs: vec![
                        (sides[0].to_owned(), etcd_run),
                        (sides[1].to_owned(), proxy_run),
                    ],
                };
                progress.suspend(|| println!("{}", report::line(&row)));
                rows.push(row);
            }
        }
    }
    ops::release_all(raw, take(raw_held)?, 64).await?;
    ops::release_all(proxy, take(proxy_held)?, 64).await?;
    Ok(rows)
}

fn take<T>(held: Arc<Vec<T>>) -> anyhow::Result<Vec<T>> {
    Arc::try_unwrap(held).map_err(|_| anyhow::anyhow!("held leases still shared"))
}

/// Sustained renewal of `n` held leases on each backend in turn.
async fn sustain(
    args: &Args,
    n: usize,
    etcd_url: &str,
    raw: &Arc<RawEtcd>,
    proxy: &Arc<http::Proxy>,
    proxy_pid: Option<u32>,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut out = Vec::new();
    progress.set_message(format!("sustain {n} via proxy"));
    out.push(sustain_one(args, n, "proxy", proxy, proxy_pid, progress).await?);
    progress.set_message(format!("sustain {n} via etcd, one stream"));
    out.push(sustain_one(args, n, "etcd multiplexed", raw, None, progress).await?);
    if n <= args.per_lease_max {
        progress.set_message(format!("sustain {n} via etcd, stream per lease"));
        let per_lease = Arc::new(RawEtcd::connect(etcd_url, Streams::PerLease).await?);
        out.push(sustain_one(args, n, "etcd stream per lease", &per_lease, None, progress).await?);
    } else {
        progress.inc(1);
    }
    Ok(out)
}

async fn sustain_one<B: Backend>(
    args: &Args,
    n: usize,
    name: &str,
    backend: &Arc<B>,
    pid: Option<u32>,
    progress: &ProgressBar,
) -> anyhow::Result<serde_json::Value> {
    let names = (0..n)
        .map(|i| {
            format!(
                "lb-sustain-{}-{}-{i}",
                name.replace(' ', "-"),
                std::process::id()
            )
        })
        .collect();
    // Taken with a TTL that outlasts the setup (100k acquires take longer than 30 s), then
    // renewed every `sustain_ttl`/3 — the load a fleet with that TTL puts on the proxy. A
    // renewal later than 2/3 of `sustain_ttl` would have lost a real lease: see `max`.
    let held = Arc::new(ops::acquire_all(backend, names, SETUP_TTL, 64).await?);
    let period = Duration::from_secs(args.sustain_ttl) / 3;
    let s = held::sustain(
        backend,
        held.clone(),
        period,
        args.sustain_for,
        args.sustain_in_flight,
    )
    .await?;
    let memory = pid.and_then(stack::rss_mib);
    ops::release_all(backend, take(held)?, 64).await?;
    progress.inc(1);
    let offered = s.offered as f64 / args.sustain_for.as_secs_f64();
    let rss = memory.map_or_else(
        || "–".to_owned(),
        |(rss, peak)| format!("{rss:.0} ({peak:.0})"),
    );
    let line = format!(
        "| {n} | {name} | {offered:.0} | {:.0} | {:.1} / {:.1} / {:.1} | {} | {rss} |",
        s.run.per_sec,
        ms(s.run.p50),
        ms(s.run.p99),
        ms(s.run.max),
        s.failed,
    );
    progress.suspend(|| {
        println!("{line}");
        if let Some(f) = &s.first_failure {
            eprintln!("first failure ({name}, {n} held): {f}");
        }
    });
    Ok(json!({
        "held": n,
        "backend": name,
        "ttl_seconds": args.sustain_ttl,
        "seconds": args.sustain_for.as_secs_f64(),
        "offered_per_sec": offered,
        "renewals": s.run.json(),
        "failed": s.failed,
        "first_failure": s.first_failure,
        "rss_mib": memory.map(|m| m.0),
        "peak_rss_mib": memory.map(|m| m.1),
    }))
}
