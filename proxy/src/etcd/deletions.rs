//! A watch of key deletions under one prefix, shared by every waiter of this replica.
//!
//! Fair waiting (see `lease::queue`) has each waiter wait for the deletion of one key: the
//! queue entry just ahead of it. One watch stream per replica carries them all; a waiter
//! picks out its own key from the broadcast, so a deletion wakes exactly the waiter behind it,
//! and costs etcd nothing per waiter. When the watch has to be re-opened events may have been
//! missed, so [`Deleted::All`] is sent and every waiter re-reads its place (a read, no write).

use etcd_client::{EventType, WatchFilterType, WatchOptions};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{reopening, Etcd};

const CHANNEL: usize = 4096;

/// Why a waiter should look at its place again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Deleted {
    /// This key was deleted.
    Key(Vec<u8>),
    /// Deletions may have been missed; everyone look again.
    All,
}

impl Deleted {
    /// Whether a waiter for the deletion of `key` should look again.
    pub(crate) fn concerns(&self, key: &[u8]) -> bool {
        match self {
            Deleted::Key(k) => k == key,
            Deleted::All => true,
        }
    }
}

/// The deletions under a prefix, as a broadcast.
#[derive(Clone)]
pub(crate) struct Deletions {
    tx: broadcast::Sender<Deleted>,
}

impl Deletions {
    /// Starts watching deletions under `prefix` on `tracker`, until `cancel` fires.
    pub(crate) fn start(
        etcd: &Etcd,
        prefix: String,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let (tx, _) = broadcast::channel(CHANNEL);
        let (etcd, sender) = (etcd.clone(), tx.clone());
        tracker.spawn(async move {
            reopening(cancel, || watch(&etcd, &prefix, &sender)).await;
        });
        Self { tx }
    }

    /// A receiver of every deletion from now on. Subscribe *before* reading what to wait for:
    /// a linearizable read after subscribing sees every deletion the receiver will not, so
    /// nothing falls between the read and the wait. A lagging receiver should treat the lag as
    /// [`Deleted::All`].
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Deleted> {
        self.tx.subscribe()
    }
}

/// Follows deletions from the current revision until the watch fails; whether it delivered
/// anything.
async fn watch(etcd: &Etcd, prefix: &str, tx: &broadcast::Sender<Deleted>) -> bool {
    let revision = match etcd.header().await {
        Ok(header) => header.revision,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read etcd's revision for the queue watch");
            return false;
        }
    };
    // Whatever was deleted while the watch was down: every waiter looks again.
    let _ = tx.send(Deleted::All);
    let options = WatchOptions::new()
        .with_prefix()
        .with_filters([WatchFilterType::NoPut])
        .with_start_revision(revision + 1);
    etcd.follow(prefix, options, "queue", |resp| {
        for event in resp.events() {
            if event.event_type() != EventType::Delete {
                continue;
            }
            if let Some(kv) = event.kv() {
                let _ = tx.send(Deleted::Key(kv.key().to_vec()));
            }
        }
    })
    .await
}
