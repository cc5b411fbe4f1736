//! Puts etcd's backend in the same state before every timed loop, whichever side runs it.
//!
//! etcd 3.4 answers every request with a header whose revision it reads through a concurrent
//! read transaction, and opening one copies the backend's read buffer: every bucket written in
//! the last batch before the backend's most recent commit stays there (emptied, not released)
//! until a commit in which it was not written, and a copy copies each bucket's whole allocation
//! (≥ 512 entries, more if one batch wrote more). In a loop that writes nothing (renewals,
//! reads) no commit comes, so each answer's cost depends on what the untimed setup before it
//! happened to write last: a setup that wrote an ownership key or a marker (key and meta
//! buckets) makes every keepalive after it dearer than one that only granted leases (lease
//! bucket) — a difference between the sides that is not theirs
//! (docs/benchmarks/etcd-read-buffer.md).
//!
//! [`etcd`] writes the same things straight to etcd, one batch apart, so that a commit leaves
//! the buffer empty: a lease grant alone (the key and meta buckets go), a put alone (the lease
//! bucket goes), and the lease's revoke, which buffers nothing (the key and meta buckets go).
//! A loop that writes fills the buffer again at once, as it would in any case.

use std::sync::OnceLock;
use std::time::Duration;

use anyhow::Context;
use etcd_client::Client;

/// Longer than etcd's backend batch interval (`--backend-batch-interval`, 100 ms by default):
/// each write below is committed in a batch of its own.
const PAUSE: Duration = Duration::from_millis(150);

/// The key the settling put writes (outside every prefix a measurement uses).
const KEY: &str = "/leasebench-settle";

/// The etcd client to settle with; none: settling is off.
static ETCD: OnceLock<Client> = OnceLock::new();

/// Settles through `client` before every timed loop from now on.
pub(crate) fn install(client: Client) {
    let _ = ETCD.set(client);
}

/// Brings etcd's read buffer to the same (empty) state; nothing if settling is off.
pub(crate) async fn etcd() -> anyhow::Result<()> {
    let Some(client) = ETCD.get() else {
        return Ok(());
    };
    let (mut leases, mut kv) = (client.lease_client(), client.kv_client());
    tokio::time::sleep(PAUSE).await;
    let lease = leases.grant(60, None).await.context("settling etcd")?.id();
    tokio::time::sleep(PAUSE).await;
    kv.put(KEY, "", None).await.context("settling etcd")?;
    tokio::time::sleep(PAUSE).await;
    leases.revoke(lease).await.context("settling etcd")?;
    tokio::time::sleep(PAUSE).await;
    Ok(())
}
