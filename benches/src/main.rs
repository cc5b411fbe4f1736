//! leasebench: acquire throughput and latency through lease-proxy against raw etcd doing the same
//! protocol (LeaseGrant + create-if-absent Txn), interleaved round by round against the same etcd
//! so that a noisy machine affects both sides alike. Prints a markdown table with the
//! proxy/etcd ratio per row.
//!
//! `leasebench --etcd http://127.0.0.1:2379 --proxy http://127.0.0.1:7070`

use std::time::Duration;

use clap::Parser;
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

#[derive(Parser)]
#[command(about = "Acquire throughput through lease-proxy vs raw etcd, side by side")]
struct Args {
    /// etcd client URL (the one the proxy uses).
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    etcd: String,
    /// lease-proxy base URL.
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    proxy: String,
    /// Requests in flight, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    concurrency: Vec<usize>,
    /// Acquires per backend per round.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Rounds; backends alternate within each round.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
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

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let client = Client::connect([&args.etcd], None)
        .await
        .map_err(|e| e.to_string())?;
    let http = reqwest::Client::new();
    println!("| in flight | round | raw etcd acquires/s | p50 / p99 | proxy acquires/s | p50 / p99 | proxy/etcd |");
    println!("|--:|--:|--:|--:|--:|--:|--:|");
    for &conc in &args.concurrency {
        for round in 0..args.rounds {
            let tag = format!("c{conc}r{round}-{}", std::process::id());
            let raw = raw_etcd(&client, &tag, args.ops, conc)
                .await
                .map_err(|e| e.to_string())?;
            let px = proxy(&http, &args.proxy, &tag, args.ops, conc).await?;
            println!(
                "| {conc} | {round} | {:.0} | {:.2} / {:.2} ms | {:.0} | {:.2} / {:.2} ms | {:.2} |",
                raw.per_sec,
                raw.p50.as_secs_f64() * 1e3,
                raw.p99.as_secs_f64() * 1e3,
                px.per_sec,
                px.p50.as_secs_f64() * 1e3,
                px.p99.as_secs_f64() * 1e3,
                px.per_sec / raw.per_sec
            );
        }
    }
    Ok(())
}
