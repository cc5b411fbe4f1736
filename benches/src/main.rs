//! leasebench: lease throughput and latency through lease-proxy against raw etcd doing the same
//! protocol, interleaved round by round against the same etcd so that a noisy machine affects
//! both sides alike. Prints a markdown table with the proxy/etcd ratio per row (and writes it as
//! JSON with `--json`).
//!
//! - `acquire`: raw = LeaseGrant + create-if-absent Txn; proxy = `POST /v1/leases/{r}`.
//! - `renew`: raw = keepalives for `--held` leases over one multiplexed keepalive stream;
//!   proxy = `POST /v1/leases/{r}/renew` for as many held leases.
//!
//! Without `--etcd`/`--proxy` it starts its own etcd (from `PATH`) and the `lease-proxy` binary
//! built next to it, on free loopback ports: `cargo build --release -p lease-proxy -p
//! lease-proxy-benches && target/release/leasebench`.

use std::time::Duration;

use clap::Parser;
use etcd_client::{Client, Compare, CompareOp, LeaseKeeper, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

#[derive(Parser)]
#[command(about = "Acquire throughput through lease-proxy vs raw etcd, side by side")]
struct Args {
    /// etcd client URL (the one the proxy uses); starts its own etcd and proxy when absent.
    #[arg(long, requires = "proxy")]
    etcd: Option<String>,
    /// lease-proxy base URL.
    #[arg(long, requires = "etcd")]
    proxy: Option<String>,
    /// Operations to measure, comma-separated: acquire, renew.
    #[arg(long, value_delimiter = ',', default_value = "acquire,renew")]
    ops_kind: Vec<String>,
    /// Requests in flight, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    concurrency: Vec<usize>,
    /// Operations per backend per round.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Leases held during the renew measurement.
    #[arg(long, default_value_t = 1000)]
    held: usize,
    /// Rounds; backends alternate within each round.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Also write the rows as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// etcd and lease-proxy started by the benchmark, killed when dropped.
struct Spawned {
    children: Vec<std::process::Child>,
    _dir: tempfile::TempDir,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

async fn wait_for(url: &str) -> Result<(), String> {
    for _ in 0..300 {
        if reqwest::get(url)
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("{url} did not become ready"))
}

/// Starts etcd (fsync on, as in production) and the lease-proxy built next to this binary.
async fn spawn_stack() -> Result<(String, String, Spawned), String> {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (client, peer, http) = (free_port()?, free_port()?, free_port()?);
    let etcd_url = format!("http://127.0.0.1:{client}");
    let etcd = Command::new("etcd")
        .arg("--data-dir")
        .arg(dir.path().join("etcd"))
        .args([
            "--listen-client-urls",
            &etcd_url,
            "--advertise-client-urls",
            &etcd_url,
        ])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--logger", "zap", "--log-level", "error"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start etcd: {e}"))?;
    let mut spawned = Spawned {
        children: vec![etcd],
        _dir: dir,
    };
    wait_for(&format!("{etcd_url}/health")).await?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let proxy_bin = exe.with_file_name("lease-proxy");
    let proxy_url = format!("http://127.0.0.1:{http}");
    let proxy = Command::new(&proxy_bin)
        .args([
            "--listen",
            &format!("127.0.0.1:{http}"),
            "--etcd-endpoints",
            &etcd_url,
        ])
        .arg("--data-dir")
        .arg(spawned._dir.path().join("proxy"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", proxy_bin.display()))?;
    spawned.children.push(proxy);
    wait_for(&format!("{proxy_url}/readyz")).await?;
    Ok((etcd_url, proxy_url, spawned))
}

/// Throughput and latency percentiles of one measurement.
struct Run {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
}

fn summarise(mut latencies: Vec<Duration>, elapsed: Duration) -> Run {
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Run {
        per_sec: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

/// Raw etcd: grant + txn per acquire, distinct keys. Leases are revoked afterwards, untimed.
async fn raw_etcd(
    client: &Client,
    tag: &str,
    ops: usize,
    conc: usize,
) -> Result<Run, etcd_client::Error> {
    let started = Instant::now();
    let workers = (0..conc).map(|w| {
        let client = client.clone();
        let tag = tag.to_owned();
        tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..ops / conc {
                let mut c = client.clone();
                let key = format!("/leasebench/{tag}/{w}-{i}");
                let t = Instant::now();
                let lease = c.lease_grant(30, None).await?;
                let txn = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.as_str(),
                        "x",
                        Some(PutOptions::new().with_lease(lease.id())),
                    )])
                    .or_else([TxnOp::get(key.as_str(), None)]);
                c.txn(txn).await?;
                out.push((t.elapsed(), lease.id()));
            }
            Ok::<_, etcd_client::Error>(out)
        })
    });
    let mut latencies = Vec::new();
    let mut leases = Vec::new();
    for w in futures::future::join_all(workers).await {
        for (lat, id) in w.map_err(|e| etcd_client::Error::Internal(e.to_string()))?? {
            latencies.push(lat);
            leases.push(id);
        }
    }
    let run = summarise(latencies, started.elapsed());
    for id in leases {
        let _ = client.clone().lease_revoke(id).await;
    }
    Ok(run)
}

/// Through the proxy: `POST /v1/leases/{resource}`, distinct resources; released afterwards.
async fn proxy(
    http: &reqwest::Client,
    base: &str,
    tag: &str,
    ops: usize,
    conc: usize,
) -> Result<Run, String> {
    let started = Instant::now();
    let workers = (0..conc).map(|w| {
        let http = http.clone();
        let base = base.to_owned();
        let tag = tag.to_owned();
        tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..ops / conc {
                let resource = format!("lb-{tag}-{w}-{i}");
                let t = Instant::now();
                let resp = http
                    .post(format!("{base}/v1/leases/{resource}"))
                    .json(&serde_json::json!({"holder": "leasebench", "ttl_seconds": 30}))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let status = resp.status();
                let body: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
                if status != 201 {
                    return Err(format!("acquire answered {status}: {body}"));
                }
                out.push((
                    t.elapsed(),
                    resource,
                    body["secret"].as_str().unwrap_or_default().to_owned(),
                ));
            }
            Ok(out)
        })
    });
    let mut latencies = Vec::new();
    let mut held = Vec::new();
    for w in futures::future::join_all(workers).await {
        for (lat, resource, secret) in w.map_err(|e| e.to_string())?? {
            latencies.push(lat);
            held.push((resource, secret));
        }
    }
    let run = summarise(latencies, started.elapsed());
    for (resource, secret) in held {
        let _ = http
            .delete(format!("{base}/v1/leases/{resource}"))
            .header("lease-secret", secret)
            .send()
            .await;
    }
    Ok(run)
}

/// Raw etcd renewals: keepalives for `held` leases pipelined `conc` deep on one stream, the way
/// the proxy multiplexes them.
async fn raw_renew(
    client: &Client,
    leases: &[i64],
    ops: usize,
    conc: usize,
) -> Result<Run, etcd_client::Error> {
    let (mut keeper, mut stream) = client.lease_client().keep_alive(leases[0]).await?;
    let started = Instant::now();
    let mut sent_at: std::collections::HashMap<i64, Instant> = std::collections::HashMap::new();
    let mut next = 0usize;
    let mut latencies = Vec::with_capacity(ops);
    let send = |keeper: &mut LeaseKeeper,
                next: &mut usize,
                sent_at: &mut std::collections::HashMap<i64, Instant>| {
        let id = leases[*next % leases.len()];
        *next += 1;
        keeper.id = id;
        sent_at.insert(id, Instant::now());
        id
    };
    for _ in 0..conc.min(ops) {
        send(&mut keeper, &mut next, &mut sent_at);
        keeper.keep_alive().await?;
    }
    while latencies.len() < ops {
        let Some(resp) = stream.message().await? else {
            break;
        };
        if let Some(t) = sent_at.remove(&resp.id()) {
            latencies.push(t.elapsed());
        }
        if next < ops {
            send(&mut keeper, &mut next, &mut sent_at);
            keeper.keep_alive().await?;
        }
    }
    Ok(summarise(latencies, started.elapsed()))
}

/// Renewals through the proxy: `conc` clients renewing held leases round robin.
async fn proxy_renew(
    http: &reqwest::Client,
    base: &str,
    held: &[(String, String)],
    ops: usize,
    conc: usize,
) -> Result<Run, String> {
    let started = Instant::now();
    let held = std::sync::Arc::new(held.to_vec());
    let workers = (0..conc).map(|w| {
        let http = http.clone();
        let base = base.to_owned();
        let held = held.clone();
        tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..ops / conc {
                let (resource, secret) = &held[(w + i * conc) % held.len()];
                let t = Instant::now();
                let resp = http
                    .post(format!("{base}/v1/leases/{resource}/renew"))
                    .header("lease-secret", secret)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                if resp.status() != 200 {
                    return Err(format!("renew answered {}", resp.status()));
                }
                out.push(t.elapsed());
            }
            Ok(out)
        })
    });
    let mut latencies = Vec::new();
    for w in futures::future::join_all(workers).await {
        latencies.extend(w.map_err(|e| e.to_string())??);
    }
    Ok(summarise(latencies, started.elapsed()))
}

/// Takes `n` leases both ways for the renew measurement.
async fn hold(
    client: &Client,
    http: &reqwest::Client,
    base: &str,
    n: usize,
) -> Result<(Vec<i64>, Vec<(String, String)>), String> {
    let mut raw = Vec::with_capacity(n);
    let mut via_proxy = Vec::with_capacity(n);
    for i in 0..n {
        raw.push(
            client
                .lease_client()
                .grant(300, None)
                .await
                .map_err(|e| e.to_string())?
                .id(),
        );
        let resource = format!("lb-held-{}-{i}", std::process::id());
        let grant: serde_json::Value = http
            .post(format!("{base}/v1/leases/{resource}"))
            .json(&serde_json::json!({"holder": "leasebench", "ttl_seconds": 300}))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        let secret = grant["secret"].as_str().ok_or("acquire failed")?.to_owned();
        via_proxy.push((resource, secret));
    }
    Ok((raw, via_proxy))
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let (etcd_url, proxy_url, _spawned) = match (&args.etcd, &args.proxy) {
        (Some(e), Some(p)) => (e.clone(), p.clone(), None),
        _ => {
            let (e, p, s) = spawn_stack().await?;
            (e, p, Some(s))
        }
    };
    let client = Client::connect([&etcd_url], None)
        .await
        .map_err(|e| e.to_string())?;
    let http = reqwest::Client::new();
    let mut rows = Vec::new();
    println!("| op | in flight | round | raw etcd ops/s | p50 / p99 | proxy ops/s | p50 / p99 | proxy/etcd |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|");
    let held = if args.ops_kind.iter().any(|k| k == "renew") {
        Some(hold(&client, &http, &proxy_url, args.held).await?)
    } else {
        None
    };
    for kind in &args.ops_kind {
        for &conc in &args.concurrency {
            for round in 0..args.rounds {
                let tag = format!("c{conc}r{round}-{}", std::process::id());
                let (raw, px) = match (kind.as_str(), &held) {
                    ("acquire", _) => (
                        raw_etcd(&client, &tag, args.ops, conc)
                            .await
                            .map_err(|e| e.to_string())?,
                        proxy(&http, &proxy_url, &tag, args.ops, conc).await?,
                    ),
                    ("renew", Some((raw_held, proxy_held))) => (
                        raw_renew(&client, raw_held, args.ops, conc)
                            .await
                            .map_err(|e| e.to_string())?,
                        proxy_renew(&http, &proxy_url, proxy_held, args.ops, conc).await?,
                    ),
                    (other, _) => return Err(format!("unknown operation `{other}`")),
                };
                let ratio = px.per_sec / raw.per_sec;
                println!(
                    "| {kind} | {conc} | {round} | {:.0} | {:.2} / {:.2} ms | {:.0} | {:.2} / {:.2} ms | {ratio:.2} |",
                    raw.per_sec,
                    raw.p50.as_secs_f64() * 1e3,
                    raw.p99.as_secs_f64() * 1e3,
                    px.per_sec,
                    px.p50.as_secs_f64() * 1e3,
                    px.p99.as_secs_f64() * 1e3,
                );
                rows.push(serde_json::json!({
                    "op": kind, "in_flight": conc, "round": round,
                    "etcd": {"ops_per_sec": raw.per_sec, "p50_ms": raw.p50.as_secs_f64() * 1e3, "p99_ms": raw.p99.as_secs_f64() * 1e3},
                    "proxy": {"ops_per_sec": px.per_sec, "p50_ms": px.p50.as_secs_f64() * 1e3, "p99_ms": px.p99.as_secs_f64() * 1e3},
                    "ratio": ratio,
                }));
            }
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}
