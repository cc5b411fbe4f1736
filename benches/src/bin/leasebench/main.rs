//! leasebench: lease throughput and latency through lease-proxy against raw etcd doing the same
//! protocol, measured against the same etcd in the same run, interleaved round by round (the
//! backend that goes first alternates), so a noisy machine affects both sides alike.
//!
//! Closed-loop operations (see `ops`, `sessions`): acquire, contended, release, cycle, renew,
//! session-acquire, session-keepalive at each requested concurrency, each with its own columns
//! (`sides`): raw etcd as users write it, the best raw variant where one exists, the proxy (and
//! with `--unbatched` a second proxy without group commit, with `--h2c` the proxy over HTTP/2).
//! etcd's own gRPC API (see `grpc`): grpc-put, grpc-range, grpc-keepalive,
//! grpc-keepalive-shared and grpc-lock with etcd-client through the proxy's gRPC front and
//! straight to etcd; with `--grpc-watchers` many gRPC watchers of one prefix on both (see
//! `grpc_watch`). Sustained sessions (see `sustain_sessions`): many resources under sessions, heartbeats open
//! loop. Sustained renewal (see `held`): n held leases renewed every TTL/3,
//! open loop, through the proxy, over raw etcd's multiplexed keepalive stream and over one
//! stream per lease. Output: a markdown table, `--json`, and an SVG chart with `--chart`.
//!
//! Every timed loop starts on a settled etcd (see `settle`; `--no-settle` to skip).
//!
//! Without `--etcd`/`--proxy` it starts its own etcd (fsync on) and the `lease-proxy` built
//! next to it: `cargo build --release -p lease-proxy -p lease-proxy-benches &&
//! target/release/leasebench`.

mod args;
mod backend;
mod columns;
mod cpu;
mod etcd_watch;
mod fleet;
mod gateway;
mod grpc;
mod grpc_watch;
mod held;
mod http;
mod ops;
mod peers;
mod raw;
mod sessions;
mod settle;
mod sides;
mod sustain_sessions;
mod v1_watch;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use lease_proxy_benches::report::Row;
use lease_proxy_benches::stack::{self, Etcd, Stack};
use lease_proxy_benches::{chart, stats::ms};
use serde_json::json;

use args::{Args, Role};
use backend::Backend;
use columns::{Columns, Peers};
use ops::Op;
use raw::{RawEtcd, Streams};
use sides::{Side, Table};

/// TTL of the leases held for a sustained run: long enough for any setup.
const SETUP_TTL: u64 = 3600;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Role::PassThrough { listen, upstream }) = &args.role {
        return peers::serve_pass_through(*listen, upstream).await;
    }
    lease_proxy_benches::until_interrupted(run(args)).await
}

async fn run(args: Args) -> anyhow::Result<()> {
    if args.secure {
        return run_secure(&args).await;
    }
    if !args.fleet.is_empty() {
        return run_fleet(&args).await;
    }
    ops::set_deadline(args.round_deadline);
    let mut stack = Stack::new()?;
    let mut _etcd = None;
    let mut etcd_pid = None;
    let mut unbatched = None;
    let mut proxy_pids = Vec::new();
    let (etcd_url, proxy_url, proxy_pid) = match (&args.etcd, &args.proxy) {
        (Some(e), Some(p)) => (e.clone(), p.clone(), args.proxy_pid),
        _ => {
            let etcd = Etcd::single().await;
            let url = etcd.endpoint(0);
            let bin = stack::workspace_binary("lease-proxy");
            // Room for the gRPC and /v1 watchers beside the proxy's default of 256 event streams.
            let watch_streams =
                Some(args.grpc_watchers.unwrap_or(0) + args.v1_watchers.unwrap_or(0))
                    .filter(|&n| n > 0)
                    .map(|n| (n + 256).to_string());
            // Each /v1 watcher is a connection too: room for them beside the default 1,024.
            let connections = args.v1_watchers.map(|n| (n + 1024).to_string());
            let mut extra: Vec<&str> = match &watch_streams {
                Some(n) => vec!["--max-watch-streams", n],
                None => Vec::new(),
            };
            if let Some(n) = &connections {
                extra.extend(["--max-client-connections", n]);
            }
            let threads = args.proxy_worker_threads.map(|n| n.to_string());
            if let Some(n) = &threads {
                extra.extend(["--worker-threads", n]);
            }
            let (proxy, spawned) = stack.lease_proxy(&bin, &url, &extra).await?;
            if args.unbatched {
                let mut extra = vec!["--batch-max".to_owned(), "1".to_owned()];
                if let Some(n) = args.unbatched_in_flight {
                    extra.extend(["--batch-in-flight".to_owned(), n.to_string()]);
                }
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                let (p, spawned) = stack.lease_proxy(&bin, &url, &extra).await?;
                unbatched = Some(Arc::new(http::Proxy::new(&p)));
                proxy_pids.push(spawned.pid);
            }
            etcd_pid = etcd.pid(0);
            _etcd = Some(etcd);
            (url, proxy, Some(spawned.pid))
        }
    };
    if args.unbatched && unbatched.is_none() {
        anyhow::bail!("--unbatched starts its own proxies: leave out --etcd and --proxy");
    }
    let raw = Arc::new(RawEtcd::connect(&etcd_url, Streams::Multiplexed).await?);
    if !args.no_settle {
        settle::install(etcd_client::Client::connect([&etcd_url], None).await?);
    }
    let proxy = Arc::new(http::Proxy::new(&proxy_url));
    let h2c = if args.h2c {
        Some(Arc::new(http::Proxy::h2c(&proxy_url)?))
    } else {
        None
    };

    proxy_pids.extend(proxy_pid);
    let cells = sides::Cells {
        concurrency: &args.concurrency,
        rounds: args.rounds,
        ops: args.ops,
        proxy_pids,
        etcd_pid,
    };
    let mut columns = setup(&args, raw.clone(), proxy.clone(), h2c, unbatched).await?;
    columns.proxy_pid = proxy_pid;
    if args.op.iter().any(|op| op.is_grpc()) {
        columns.grpc = Some((
            Arc::new(grpc::Grpc::connect(&etcd_url, grpc::ETCD_PREFIX).await?),
            Arc::new(grpc::Grpc::connect(&proxy_url, "").await?),
        ));
    }
    if args.peers {
        columns.peers = Some(Peers::start(&args, &mut stack, &etcd_url, &proxy_url).await?);
    }
    let v1_watch = match args.v1_watchers {
        Some(n) => Some(v1_watch::open(n, &etcd_url, &proxy_url, proxy_pid).await?),
        None => None,
    };
    let etcd_watch = match args.etcd_watchers {
        Some(n) => Some(etcd_watch::open(n, &etcd_url).await?),
        None => None,
    };
    let tables = columns.tables(&args);
    let total =
        sides::count(&tables, &cells) + args.sustain.len() * (2 * args.sustain_rounds.max(1) + 1);
    let progress = ProgressBar::new(u64::try_from(total)?);
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );

    let rows = sides::run(&tables, &cells, &progress).await?;
    let names = Columns::names(&tables);
    drop(tables);
    columns.teardown().await?;
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
    let mut sessions_run = None;
    if let Some(n) = args.sustain_sessions {
        let plan = sustain_sessions::Plan {
            sessions: n,
            per_session: args.per_session,
            ttl: args.sustain_ttl,
            window: args.sustain_for,
            max_in_flight: args.sustain_in_flight,
            setup_in_flight: 256,
        };
        sessions_run = Some(sustain_sessions::run(&plan, &proxy, proxy_pid).await?);
    }
    let mut watch_run = None;
    if let Some(watchers) = args.grpc_watchers {
        let plan = grpc_watch::Plan {
            watchers,
            channels: args.grpc_watch_channels,
            puts: args.grpc_watch_puts,
            rounds: args.rounds,
        };
        let target = grpc_watch::Target {
            etcd: &etcd_url,
            proxy: &proxy_url,
            proxy_pid,
        };
        watch_run = Some(grpc_watch::run(&plan, &target).await?);
    }

    if let Some(path) = &args.chart {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        chart::draw(
            path,
            "leasebench: lease-proxy vs raw etcd (same etcd, same run)",
            &plain_rows(&rows),
            &names,
        )?;
    }
    write_json(
        &args,
        &rows,
        sustained,
        sessions_run,
        watch_run,
        v1_watch.map(|held| held.report),
        etcd_watch.map(|held| held.report()),
    )
}

/// Takes what the requested tables need, untimed: held leases on both sides for `renew`,
/// sessions on the proxy for `session-keepalive`.
async fn setup(
    args: &Args,
    raw: Arc<RawEtcd>,
    proxy: Arc<http::Proxy>,
    h2c: Option<Arc<http::Proxy>>,
    unbatched: Option<Arc<http::Proxy>>,
) -> anyhow::Result<Columns> {
    let holds = args.op.iter().any(|op| op.needs_held());
    let renews = holds || args.op.contains(&Op::SessionKeepalive);
    let names = |side: &str| -> Vec<String> {
        (0..if renews { args.held } else { 0 })
            .map(|i| format!("lb-held-{side}-{}-{i}", std::process::id()))
            .collect()
    };
    let raw_held = Arc::new(ops::acquire_all(&raw, names("a"), 600, 64).await?);
    let proxy_held = if holds {
        ops::acquire_all(&proxy, names("b"), 600, 64).await?
    } else {
        Vec::new()
    };
    let n_sessions = if args.op.contains(&Op::SessionKeepalive) {
        args.held
    } else {
        0
    };
    let sessions = sessions::open_all(&proxy, n_sessions, 600, 64).await?;
    Ok(Columns {
        raw,
        raw_held,
        proxy,
        proxy_held: Arc::new(proxy_held),
        sessions: Arc::new(sessions),
        h2c,
        unbatched,
        unbatched_in_flight: args.unbatched_in_flight,
        grpc: None,
        proxy_pid: None,
        peers: None,
    })
}

fn write_json(
    args: &Args,
    rows: &[sides::Measured],
    sustained: Vec<serde_json::Value>,
    sessions: Option<serde_json::Value>,
    grpc_watch: Option<serde_json::Value>,
    v1_watch: Option<serde_json::Value>,
    etcd_watch: Option<serde_json::Value>,
) -> anyhow::Result<()> {
    if let Some(path) = &args.json {
        let mut doc = json!({
            "machine": {"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)},
            "settings": {
                "ops_per_cell": args.ops,
                "rounds": args.rounds,
                "held": args.held,
                "h2c": args.h2c,
                "unbatched": args.unbatched,
                "unbatched_in_flight": args.unbatched_in_flight,
            },
            "rows": rows.iter().map(sides::Measured::json).collect::<Vec<_>>(),
            "sustained": sustained,
        });
        if let Some(s) = sessions {
            doc["sustained_sessions"] = s;
        }
        if let Some(w) = grpc_watch {
            doc["grpc_watch"] = w;
        }
        if let Some(w) = v1_watch {
            doc["v1_watch"] = w;
        }
        if let Some(w) = etcd_watch {
            doc["etcd_watch"] = w;
        }
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
    let (plain_url, plain_proc) = stack.lease_proxy(&bin, &url, &[]).await?;
    let (secure_url, secure_proc) = stack
        .secure_lease_proxy(&bin, &url, &server, pki.ca(), &tokens)
        .await?;
    let plain = Arc::new(http::Proxy::new(&plain_url));
    let secure = Arc::new(http::Proxy::secure(&secure_url, pki.ca(), &token)?);
    if !args.no_settle {
        settle::install(etcd_client::Client::connect([&url], None).await?);
    }
    let names = |side: &str| -> Vec<String> {
        (0..if args.op.iter().any(|op| op.needs_held()) {
            args.held
        } else {
            0
        })
            .map(|i| format!("lb-held-{side}-{}-{i}", std::process::id()))
            .collect()
    };
    let plain_held = Arc::new(ops::acquire_all(&plain, names("a"), 600, 64).await?);
    let secure_held = Arc::new(ops::acquire_all(&secure, names("b"), 600, 64).await?);
    let tables: Vec<Table> = args
        .op
        .iter()
        .map(|&op| Table {
            op: op.name(),
            sides: vec![
                Side::op("proxy", &plain, op, &plain_held, args.renewals),
                Side::op("proxy tls+auth", &secure, op, &secure_held, args.renewals),
            ],
        })
        .collect();
    let cells = sides::Cells {
        concurrency: &args.concurrency,
        rounds: args.rounds,
        ops: args.ops,
        proxy_pids: vec![plain_proc.pid, secure_proc.pid],
        etcd_pid: etcd.pid(0),
    };
    let progress = ProgressBar::new(u64::try_from(sides::count(&tables, &cells))?);
    let rows = sides::run(&tables, &cells, &progress).await?;
    drop(tables);
    ops::release_all(&plain, take(plain_held)?, 64).await?;
    ops::release_all(&secure, take(secure_held)?, 64).await?;
    progress.finish_and_clear();
    if let Some(path) = &args.chart {
        chart::draw(
            path,
            "leasebench: lease-proxy with HTTPS and bearer tokens vs plain (same etcd, same run)",
            &plain_rows(&rows),
            &["proxy", "proxy tls+auth"],
        )?;
    }
    write_json(args, &rows, Vec::new(), None, None, None, None)
}

/// Fleets through the proxy and as KCL's lease taker on raw etcd, on one etcd (the proxy
/// started here gets room for every member's long poll).
async fn run_fleet(args: &Args) -> anyhow::Result<()> {
    let mut stack = Stack::new()?;
    let mut _etcd = None;
    let (etcd_url, proxy_url) = match (&args.etcd, &args.proxy) {
        (Some(e), Some(p)) => (e.clone(), p.clone()),
        _ => {
            let etcd = Etcd::single().await;
            let url = etcd.endpoint(0);
            let bin = stack::workspace_binary("lease-proxy");
            let most = args.fleet.iter().map(|&(_, m)| m).max().unwrap_or(0);
            let streams = (most + 256).to_string();
            let (proxy, _) = stack
                .lease_proxy(&bin, &url, &["--max-watch-streams", &streams])
                .await?;
            _etcd = Some(etcd);
            (url, proxy)
        }
    };
    let plan = fleet::Plan {
        sizes: args.fleet.clone(),
        ttl: args.fleet_ttl,
        rounds: args.rounds,
    };
    let target = fleet::Target {
        etcd: &etcd_url,
        proxy: &proxy_url,
    };
    let runs = fleet::run(&plan, &target).await?;
    if let Some(path) = &args.json {
        let doc = json!({
            "machine": {"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)},
            "settings": {"rounds": args.rounds, "ttl_seconds": args.fleet_ttl},
            "fleet": runs,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The rows without their etcd request counts, for the chart.
fn plain_rows(rows: &[sides::Measured]) -> Vec<Row> {
    rows.iter().map(|m| m.row.clone()).collect()
}

fn take<T>(held: Arc<Vec<T>>) -> anyhow::Result<Vec<T>> {
    Arc::try_unwrap(held).map_err(|_| anyhow::anyhow!("held leases still shared"))
}

/// Sustained renewal of `n` held leases, proxy and raw multiplexed stream interleaved round by
/// round, then (small runs only) one stream per lease once.
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
    for round in 0..args.sustain_rounds.max(1) {
        for proxy_turn in [round % 2 == 0, round % 2 == 1] {
            let mut run = if proxy_turn {
                progress.set_message(format!("sustain {n} via proxy, round {round}"));
                sustain_one(args, n, "proxy", proxy, proxy_pid, progress).await?
            } else {
                progress.set_message(format!("sustain {n} via etcd, one stream, round {round}"));
                sustain_one(args, n, "etcd multiplexed", raw, None, progress).await?
            };
            run["round"] = json!(round);
            out.push(run);
        }
    }
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
