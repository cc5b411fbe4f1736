//! Idle `GET /v1/watch` streams held open on the proxy while the tables run: `--v1-watchers N`
//! opens them (on a prefix no table writes under) before the first table and keeps them until
//! the last, so the rows are measured
//! with them (compare with a run without). Reported: etcd's watch streams and watchers and the
//! proxy's resident memory before and with them, and how long opening them took.

use std::time::Duration;

use anyhow::Context;
use lease_proxy_benches::stack;
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Streams opened at once.
const OPENING: usize = 64;

/// The open streams (their readers), and what opening them changed.
pub(crate) struct Held {
    _readers: JoinSet<()>,
    /// The figures, as JSON.
    pub(crate) report: serde_json::Value,
}

/// etcd's watch streams and watchers, from its `/metrics`.
async fn etcd_watchers(http: &reqwest::Client, etcd: &str) -> anyhow::Result<(f64, f64)> {
    let url = format!("{}/metrics", etcd.trim_end_matches('/'));
    let text = http
        .get(&url)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .with_context(|| format!("{name} is not in {url}"))
    };
    Ok((
        value("etcd_debugging_mvcc_watch_stream_total")?,
        value("etcd_debugging_mvcc_watcher_total")?,
    ))
}

/// Opens `n` idle streams on `proxy`, each reading (and dropping) what it is sent; prints one
/// markdown line.
pub(crate) async fn open(
    n: usize,
    etcd: &str,
    proxy: &str,
    proxy_pid: Option<u32>,
) -> anyhow::Result<Held> {
    let http = reqwest::Client::new();
    let before = etcd_watchers(&http, etcd).await?;
    let rss_before = proxy_pid.and_then(stack::rss_mib).map(|m| m.0);
    let started = Instant::now();
    let mut readers = JoinSet::new();
    let url = format!("{}/v1/watch?prefix=lb-idle-", proxy.trim_end_matches('/'));
    for chunk in (0..n).collect::<Vec<_>>().chunks(OPENING) {
        let mut opening = JoinSet::new();
        for _ in chunk {
            let (http, url) = (http.clone(), url.clone());
            opening.spawn(async move {
                let mut resp = http.get(&url).send().await?.error_for_status()?;
                // The first message (the stream's start) says it is open.
                resp.chunk().await?.context("the stream ended at once")?;
                anyhow::Ok(resp)
            });
        }
        while let Some(opened) = opening.join_next().await {
            let mut resp = opened??;
            readers.spawn(async move { while let Ok(Some(_)) = resp.chunk().await {} });
        }
    }
    let open_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let with = etcd_watchers(&http, etcd).await?;
    let rss_with = proxy_pid.and_then(stack::rss_mib).map(|m| m.0);
    let mib = |m: Option<f64>| m.map_or("-".to_owned(), |m| format!("{m:.1}"));
    println!(
        "\n| /v1/watch streams | etcd watch streams (+) | etcd watchers (+) | proxy RSS MiB before → with | open s |\n|--:|--:|--:|--:|--:|\n| {n} | {} (+{}) | {} (+{}) | {} → {} | {open_s:.2} |",
        with.0,
        with.0 - before.0,
        with.1,
        with.1 - before.1,
        mib(rss_before),
        mib(rss_with),
    );
    Ok(Held {
        _readers: readers,
        report: json!({
            "streams": n,
            "etcd_watch_streams": {"before": before.0, "with": with.0},
            "etcd_watchers": {"before": before.1, "with": with.1},
            "proxy_rss_mib": {"before": rss_before, "with": rss_with},
            "open_s": open_s,
        }),
    })
}
