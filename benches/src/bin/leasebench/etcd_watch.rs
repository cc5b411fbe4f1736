//! Watchers of the whole keyspace straight to etcd, held while the tables run: `--etcd-watchers
//! N` opens them before the first table and keeps them until the last, each reading (and
//! counting) every event of every side. Against a run without them, the rows' CPU per operation
//! shows what a watch's fan-out costs etcd per operation — what the proxy's own holder watch
//! costs it, measured apart from the proxy (each replica has one such watch, on its prefix).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use etcd_client::{Client, WatchOptions};
use serde_json::json;
use tokio::task::JoinSet;

/// The open watches and the events they have read.
pub(crate) struct Held {
    _readers: JoinSet<()>,
    watchers: usize,
    events: Arc<AtomicU64>,
}

impl Held {
    /// The watchers and the events they read, as JSON.
    pub(crate) fn report(&self) -> serde_json::Value {
        json!({"watchers": self.watchers, "events": self.events.load(Ordering::Relaxed)})
    }
}

/// Opens `n` watches of every key on the etcd at `url` (one client, a stream each).
pub(crate) async fn open(n: usize, url: &str) -> anyhow::Result<Held> {
    let client = Client::connect([url], None)
        .await
        .with_context(|| format!("connecting to {url} to watch"))?;
    let events = Arc::new(AtomicU64::new(0));
    let mut readers = JoinSet::new();
    for _ in 0..n {
        let mut stream = client
            .watch_client()
            .watch("\0", Some(WatchOptions::new().with_from_key()))
            .await
            .context("opening a watch of every key")?;
        let events = events.clone();
        readers.spawn(async move {
            while let Ok(Some(resp)) = stream.message().await {
                events.fetch_add(resp.events().len() as u64, Ordering::Relaxed);
            }
        });
    }
    println!("\n{n} etcd watcher(s) of every key open while the tables run");
    Ok(Held {
        _readers: readers,
        watchers: n,
        events,
    })
}
