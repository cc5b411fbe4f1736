//! fencebench: what the enforcer costs. The same HTTP writes go, in the same run and interleaved,
//! straight to a storage stand-in (`direct`), through a bare pass-through proxy built on the
//! gateway's own serving and forwarding stack (`bare`), and through `fence-gateway` with the
//! SQLite mark store (`gateway`). The ratio column is gateway / bare: the price of verifying the
//! token, ordering the write and keeping the mark.
//!
//! - `write`: every write presents its resource's current token (check only: the steady state);
//! - `raise`: every write presents a higher token (check and durable raise, an fsync each).
//!
//! Each backend is its own process (`fencebench upstream`, `fencebench bare`, the
//! `fence-gateway` built next to this binary): `cargo build --release -p fencing --features
//! fencing/server -p lease-proxy-benches && target/release/fencebench`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use axum::body::Body;
use axum::Router;
use clap::{Parser, Subcommand};
use fencing::gateway::Forwarder;
use fencing::{KeyId, Keyring, Token};
use indicatif::{ProgressBar, ProgressStyle};
use lease_proxy_benches::chart;
use lease_proxy_benches::report::{self, Row};
use lease_proxy_benches::stack::{self, free_port, serve_forever, Stack};
use lease_proxy_benches::stats::{ms, Run};
use serde_json::json;
use tokio::time::Instant;

#[derive(Parser)]
#[command(about = "Enforcer overhead: fence-gateway vs a bare pass-through proxy vs direct")]
struct Args {
    #[command(subcommand)]
    role: Option<Role>,
    /// Operations to measure, comma-separated: write, raise.
    #[arg(long, value_delimiter = ',', default_value = "write,raise")]
    op: Vec<String>,
    /// Requests in flight, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256")]
    concurrency: Vec<usize>,
    /// Requests per backend per cell.
    #[arg(long, default_value_t = 5000)]
    ops: usize,
    /// Rounds; the backend order rotates with each round.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Request body size in bytes.
    #[arg(long, default_value_t = 256)]
    body: usize,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also draw the results as an SVG chart to this file.
    #[arg(long)]
    chart: Option<PathBuf>,
}

/// Helper processes fencebench starts from its own binary.
#[derive(Subcommand)]
enum Role {
    /// The storage stand-in: reads each request's body and answers 204.
    #[command(hide = true)]
    Upstream {
        #[arg(long)]
        listen: std::net::SocketAddr,
    },
    /// The bare pass-through proxy: the gateway's forwarder without enforcement.
    #[command(hide = true)]
    Bare {
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        upstream: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match &args.role {
        Some(Role::Upstream { listen }) => {
            serve_forever(*listen, Router::new().fallback(storage)).await
        }
        Some(Role::Bare { listen, upstream }) => {
            let forwarder = Forwarder::new(
                upstream.parse()?,
                Duration::from_secs(30),
                &runtime::tls::ClientFiles::default(),
            )?;
            let app = Router::new().fallback_service(tower::service_fn(
                move |req: http::Request<Body>| {
                    let forwarder = forwarder.clone();
                    async move { Ok::<_, std::convert::Infallible>(forwarder.forward(req).await) }
                },
            ));
            serve_forever(*listen, app).await
        }
        None => lease_proxy_benches::until_interrupted(bench(&args)).await,
    }
}

/// The storage stand-in's only handler.
async fn storage(body: axum::body::Bytes) -> http::StatusCode {
    std::hint::black_box(body);
    http::StatusCode::NO_CONTENT
}

const BACKENDS: [&str; 3] = ["bare", "direct", "gateway"];

async fn bench(args: &Args) -> anyhow::Result<()> {
    let mut stack = Stack::new()?;
    let me = std::env::current_exe()?;
    let ports = (free_port(), free_port(), free_port());
    let direct = format!("http://127.0.0.1:{}", ports.0);
    let bare = format!("http://127.0.0.1:{}", ports.1);
    let gateway = format!("http://127.0.0.1:{}", ports.2);

    let mut upstream = Command::new(&me);
    upstream.args(["upstream", "--listen", &format!("127.0.0.1:{}", ports.0)]);
    stack.spawn(upstream)?;
    let mut bare_cmd = Command::new(&me);
    bare_cmd.args(["bare", "--listen", &format!("127.0.0.1:{}", ports.1)]);
    bare_cmd.args(["--upstream", &direct]);
    stack.spawn(bare_cmd)?;

    let key_file = stack.dir().join("keys");
    let kid = KeyId::parse("bench").context("key id")?;
    Keyring::create_file(&key_file, &kid)?;
    let keys = Arc::new(Keyring::load(&key_file)?);
    let mut gw = Command::new(stack::workspace_binary("fence-gateway"));
    gw.args(["--listen", &format!("127.0.0.1:{}", ports.2)])
        .args(["--upstream", &direct])
        .arg("--store")
        .arg(format!("sqlite:{}", stack.dir().join("marks.db").display()))
        .arg("--key-file")
        .arg(&key_file)
        .env("RUST_LOG", "error");
    stack.spawn(gw)?;
    // The stand-in answers 204 to anything, the gateway serves /readyz itself.
    stack::wait_ready(&format!("{direct}/ready")).await?;
    stack::wait_ready(&format!("{bare}/ready")).await?;
    stack::wait_ready(&format!("{gateway}/readyz")).await?;

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .build()?;
    let revision = Arc::new(AtomicU64::new(1));
    let body = bytes_of(args.body);
    let cells = args.op.len() * args.concurrency.len() * args.rounds * BACKENDS.len();
    let progress = ProgressBar::new(u64::try_from(cells)?);
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    progress.suspend(|| {
        println!(
            "{} gateway − bare p50 µs |",
            report::header(&BACKENDS, "gateway/bare")
                .lines()
                .next()
                .unwrap_or_default()
        );
        println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    });
    let mut rows = Vec::new();
    for op in &args.op {
        let raise = match op.as_str() {
            "write" => false,
            "raise" => true,
            other => bail!("unknown operation `{other}` (write, raise)"),
        };
        for &in_flight in &args.concurrency {
            for round in 0..args.rounds {
                let mut runs = Vec::new();
                // Rotate who goes first, so no backend always measures a warm or cold machine.
                for k in 0..BACKENDS.len() {
                    let name = BACKENDS[(k + round) % BACKENDS.len()];
                    progress.set_message(format!("{op} × {in_flight}, round {round}: {name}"));
                    let base = match name {
                        "direct" => &direct,
                        "bare" => &bare,
                        _ => &gateway,
                    };
                    let run = load(
                        &http,
                        base,
                        &keys,
                        &revision,
                        raise,
                        in_flight,
                        args.ops,
                        &body,
                        &format!("{op}-{in_flight}-{round}"),
                    )
                    .await
                    .with_context(|| format!("{name}, {op} × {in_flight}"))?;
                    runs.push((name.to_owned(), run));
                    progress.inc(1);
                }
                runs.sort_by_key(|(n, _)| BACKENDS.iter().position(|b| b == n));
                let row = Row {
                    op: op.clone(),
                    in_flight,
                    round,
                    runs,
                };
                let added = added_p50_us(&row);
                progress.suspend(|| println!("{} {added:+.0} |", report::line(&row)));
                rows.push(row);
            }
        }
    }
    progress.finish_and_clear();
    check_enforcing(&http, &gateway, &keys).await?;
    if let Some(path) = &args.chart {
        chart::draw(
            path,
            "fencebench: fence-gateway vs bare pass-through vs direct (same run)",
            &rows,
            &BACKENDS,
        )?;
    }
    if let Some(path) = &args.json {
        let doc: Vec<_> = rows
            .iter()
            .map(|r| {
                let mut j = r.json();
                j["added_p50_us"] = json!(added_p50_us(r));
                j
            })
            .collect();
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}

/// Proves the measured gateway was enforcing: after a write with revision 2, one with revision 1
/// must be refused.
async fn check_enforcing(
    http: &reqwest::Client,
    gateway: &str,
    keys: &Keyring,
) -> anyhow::Result<()> {
    let url = format!("{gateway}/items/fb-sanity");
    for (revision, want) in [(2, 204), (1, 409)] {
        let status = http
            .put(&url)
            .header(
                fencing::TOKEN_HEADER,
                keys.mint("fb-sanity", Token::new(1, revision)),
            )
            .header(fencing::RESOURCE_HEADER, "fb-sanity")
            .send()
            .await?
            .status();
        if status != want {
            bail!("the gateway answered {status} to revision {revision}, not {want}: it is not enforcing");
        }
    }
    Ok(())
}

/// The gateway's median latency minus the bare proxy's, in microseconds.
fn added_p50_us(row: &Row) -> f64 {
    let p50 = |name: &str| {
        row.runs
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0.0, |(_, r)| ms(r.p50) * 1e3)
    };
    p50("gateway") - p50("bare")
}

fn bytes_of(n: usize) -> bytes::Bytes {
    bytes::Bytes::from(vec![b'x'; n])
}

/// `in_flight` workers each writing to their own resource, `ops` writes in all. Every write
/// presents a token signed for its resource: the same one throughout (`raise == false`), or a
/// fresh, higher one each time.
#[allow(clippy::too_many_arguments)]
async fn load(
    http: &reqwest::Client,
    base: &str,
    keys: &Arc<Keyring>,
    revision: &Arc<AtomicU64>,
    raise: bool,
    in_flight: usize,
    ops: usize,
    body: &bytes::Bytes,
    tag: &str,
) -> anyhow::Result<Run> {
    let per = ops.div_ceil(in_flight.max(1));
    let started = std::sync::Arc::new(std::sync::OnceLock::<Instant>::new());
    let warm = std::sync::Arc::new(tokio::sync::Barrier::new(in_flight.max(1)));
    let workers: Vec<_> = (0..in_flight.max(1))
        .map(|w| {
            let (started, warm) = (started.clone(), warm.clone());
            let (http, keys, revision, body) =
                (http.clone(), keys.clone(), revision.clone(), body.clone());
            let resource = format!("fb-{tag}-{w}");
            let url = format!("{base}/items/{resource}");
            tokio::spawn(async move {
                let steady = keys.mint(
                    &resource,
                    Token::new(1, revision.fetch_add(1, Ordering::Relaxed)),
                );
                let mut latencies = Vec::with_capacity(per);
                // One untimed write first: it creates the resource's mark (a durable raise), so
                // `write` measures the steady state and every backend sees warm connections.
                for i in 0..=per {
                    let token = if raise {
                        keys.mint(
                            &resource,
                            Token::new(1, revision.fetch_add(1, Ordering::Relaxed)),
                        )
                    } else {
                        steady.clone()
                    };
                    let t = Instant::now();
                    let resp = http
                        .put(&url)
                        .header(fencing::TOKEN_HEADER, token)
                        .header(fencing::RESOURCE_HEADER, &resource)
                        .body(body.clone())
                        .send()
                        .await?;
                    let status = resp.status();
                    resp.bytes().await?;
                    if status != 204 {
                        bail!("write answered {status}");
                    }
                    if i > 0 {
                        latencies.push(t.elapsed());
                    } else {
                        warm.wait().await;
                        started.get_or_init(Instant::now);
                    }
                }
                Ok::<_, anyhow::Error>(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(ops);
    for w in futures::future::join_all(workers).await {
        latencies.extend(w.map_err(|e| anyhow::anyhow!("worker: {e}"))??);
    }
    let elapsed = started.get().map(|s| s.elapsed()).unwrap_or_default();
    Ok(Run::from_latencies(latencies, elapsed))
}
