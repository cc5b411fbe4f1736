//! Many gRPC watchers of one prefix, through the proxy and straight to etcd: `watchers` client
//! watch streams (each its own `Watch` call with one watch on the prefix), spread over
//! `channels` clients (HTTP/2 connections: the proxy serves at most 200 streams on one), then
//! `puts` puts under the prefix, one at a time, each of which must reach every watcher.
//!
//! Reported per side: what etcd holds for them (`etcd_debugging_mvcc_watch_stream_total` and
//! `etcd_debugging_mvcc_watcher_total` from etcd's `/metrics`, and etcd's resident memory), the
//! proxy's resident memory before and with the watchers, how long opening them took, and the
//! time from a put's start to each watcher's event (p50 / p99 / max). The proxy does not
//! coalesce watches yet: each client stream is its own etcd watch stream, which is what the
//! etcd figures show.

use std::time::Duration;

use anyhow::{bail, Context};
use etcd_client::{Client, WatchOptions};
use futures::{StreamExt, TryStreamExt};
use lease_proxy_benches::stack;
use lease_proxy_benches::stats::{ms, Run};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::grpc;

/// Longest wait for a put's event to reach every watcher, and for etcd to drop closed watches.
const DEADLINE: Duration = Duration::from_secs(30);

/// Watch streams opened at once.
const OPENING: usize = 64;

/// What to measure.
pub(crate) struct Plan {
    /// Client watch streams per side.
    pub(crate) watchers: usize,
    /// Clients (connections) they are spread over.
    pub(crate) channels: usize,
    /// Puts whose delivery is timed.
    pub(crate) puts: usize,
    /// Runs per side, the side that goes first alternating.
    pub(crate) rounds: usize,
}

/// The two sides' endpoints and the processes measured.
pub(crate) struct Target<'a> {
    /// etcd's client URL (also where its `/metrics` are).
    pub(crate) etcd: &'a str,
    /// The proxy's URL (gRPC on its HTTP address).
    pub(crate) proxy: &'a str,
    /// The proxy's pid, for its memory.
    pub(crate) proxy_pid: Option<u32>,
}

/// etcd's watch gauges and memory at one instant.
#[derive(Debug, Clone, Copy, Default)]
struct EtcdWatch {
    streams: f64,
    watchers: f64,
    rss_mib: f64,
}

/// Reads [`EtcdWatch`] from etcd's `/metrics` at `etcd`.
async fn etcd_watch(http: &reqwest::Client, etcd: &str) -> anyhow::Result<EtcdWatch> {
    let url = format!("{}/metrics", etcd.trim_end_matches('/'));
    let text = http.get(&url).send().await?.error_for_status()?;
    let text = text.text().await?;
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .with_context(|| format!("{name} is not in {url}"))
    };
    Ok(EtcdWatch {
        streams: value("etcd_debugging_mvcc_watch_stream_total")?,
        watchers: value("etcd_debugging_mvcc_watcher_total")?,
        rss_mib: value("process_resident_memory_bytes")? / (1024.0 * 1024.0),
    })
}

/// Runs the plan on both sides, printing a markdown line per run; the runs as JSON.
pub(crate) async fn run(plan: &Plan, target: &Target<'_>) -> anyhow::Result<serde_json::Value> {
    if plan.watchers.div_ceil(plan.channels.max(1)) > 200 {
        bail!(
            "more than 200 watch streams per channel (the proxy serves at most 200 on one \
             connection): raise --grpc-watch-channels"
        );
    }
    println!(
        "\n| watchers via | watchers | channels | etcd watch streams (+) | etcd watchers (+) | etcd RSS MiB before → with | proxy RSS MiB before → with | open s | put → event p50 / p99 / max ms | delivered |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    let mut runs = Vec::new();
    for round in 0..plan.rounds.max(1) {
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for via_proxy in order {
            let mut r = one(plan, target, via_proxy).await?;
            r["round"] = json!(round);
            runs.push(r);
        }
    }
    Ok(json!(runs))
}

/// One side's run.
async fn one(
    plan: &Plan,
    target: &Target<'_>,
    via_proxy: bool,
) -> anyhow::Result<serde_json::Value> {
    let (name, endpoint, prefix) = if via_proxy {
        ("proxy", target.proxy, "")
    } else {
        ("etcd", target.etcd, grpc::ETCD_PREFIX)
    };
    let http = reqwest::Client::new();
    let dir = format!("lbw-{}-{}/", name, rand::random::<u32>());
    let channels = plan.channels.max(1);
    let mut clients = Vec::with_capacity(channels);
    for _ in 0..channels {
        clients.push(grpc::Grpc::connect(endpoint, prefix).await?);
    }
    let prefix_key = clients[0].key(&dir);
    let before = etcd_watch(&http, target.etcd).await?;
    let proxy_before = target.proxy_pid.and_then(stack::rss_mib);

    let opened = Instant::now();
    let (tx, mut events) = mpsc::unbounded_channel::<Instant>();
    let streams: Vec<_> = futures::stream::iter(0..plan.watchers)
        .map(|i| {
            let client = clients[i % clients.len()].client().clone();
            open(client, prefix_key.clone())
        })
        .buffer_unordered(OPENING)
        .try_collect()
        .await?;
    let open_secs = opened.elapsed().as_secs_f64();
    let mut readers = JoinSet::new();
    for stream in streams {
        readers.spawn(read(stream, tx.clone()));
    }
    let with = etcd_watch(&http, target.etcd).await?;
    let proxy_with = target.proxy_pid.and_then(stack::rss_mib);

    let mut kv = clients[0].client().kv_client();
    let (delivery, delivered) = deliver(&mut kv, &prefix_key, plan, &mut events).await?;
    readers.shutdown().await;
    drop(clients);
    let after = settle(&http, target.etcd, before).await?;
    let options = etcd_client::DeleteOptions::new().with_prefix();
    kv.delete(prefix_key, Some(options)).await?;

    let mib =
        |m: Option<(f64, f64)>| m.map_or_else(|| "–".to_owned(), |(rss, _)| format!("{rss:.1}"));
    println!(
        "| {name} | {} | {} | {:.0} (+{:.0}) | {:.0} (+{:.0}) | {:.1} → {:.1} | {} → {} | {open_secs:.2} | {:.1} / {:.1} / {:.1} | {delivered} of {} |",
        plan.watchers,
        channels,
        with.streams,
        with.streams - before.streams,
        with.watchers,
        with.watchers - before.watchers,
        before.rss_mib,
        with.rss_mib,
        mib(proxy_before),
        mib(proxy_with),
        ms(delivery.p50),
        ms(delivery.p99),
        ms(delivery.max),
        plan.watchers * plan.puts,
    );
    Ok(json!({
        "via": name,
        "watchers": plan.watchers,
        "channels": channels,
        "puts": plan.puts,
        "etcd_watch_streams": {"before": before.streams, "with": with.streams, "after": after.streams},
        "etcd_watchers": {"before": before.watchers, "with": with.watchers, "after": after.watchers},
        "etcd_rss_mib": {"before": before.rss_mib, "with": with.rss_mib},
        "proxy_rss_mib": {"before": proxy_before.map(|m| m.0), "with": proxy_with.map(|m| m.0)},
        "open_seconds": open_secs,
        "delivery": delivery.json(),
        "delivered": delivered,
        "expected": plan.watchers * plan.puts,
    }))
}

/// Puts `plan.puts` keys under `prefix`, one at a time, each timed from its start to its
/// event's arrival at every watcher (`events`, up to [`DEADLINE`]); how many arrived.
async fn deliver(
    kv: &mut etcd_client::KvClient,
    prefix: &str,
    plan: &Plan,
    events: &mut mpsc::UnboundedReceiver<Instant>,
) -> anyhow::Result<(Run, usize)> {
    let mut latencies = Vec::with_capacity(plan.watchers * plan.puts);
    let started = Instant::now();
    for p in 0..plan.puts {
        let sent = Instant::now();
        kv.put(format!("{prefix}k{p}"), "leasebench", None).await?;
        let deadline = sent + DEADLINE;
        for _ in 0..plan.watchers {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(at)) => latencies.push(at.saturating_duration_since(sent)),
                Ok(None) | Err(_) => break,
            }
        }
    }
    let delivered = latencies.len();
    Ok((Run::from_latencies(latencies, started.elapsed()), delivered))
}

/// Opens one watch stream on `client` with one watch on `prefix`, once etcd (or the proxy)
/// confirms it was created.
async fn open(client: Client, prefix: String) -> anyhow::Result<etcd_client::WatchStream> {
    let options = WatchOptions::new().with_prefix();
    let mut stream = client.watch_client().watch(prefix, Some(options)).await?;
    let first = stream
        .message()
        .await?
        .context("watch stream ended before created")?;
    if !first.created() || first.canceled() {
        bail!("watch not created: {}", first.cancel_reason());
    }
    Ok(stream)
}

/// Reports the arrival of every event on `stream` (which stays open, sender included, until
/// the task is dropped) to `tx`.
async fn read(mut stream: etcd_client::WatchStream, tx: mpsc::UnboundedSender<Instant>) {
    while let Ok(Some(resp)) = stream.message().await {
        let at = Instant::now();
        for _ in resp.events() {
            if tx.send(at).is_err() {
                return;
            }
        }
    }
}

/// Waits (up to [`DEADLINE`]) until etcd's watcher count is back to `baseline`'s; the gauges then.
async fn settle(
    http: &reqwest::Client,
    etcd: &str,
    baseline: EtcdWatch,
) -> anyhow::Result<EtcdWatch> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let now = etcd_watch(http, etcd).await?;
        if now.watchers <= baseline.watchers || Instant::now() >= deadline {
            return Ok(now);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
