//! etcd's own gRPC API with the `etcd-client` crate, through the proxy's gRPC front and
//! straight to etcd: each side one shared client (one HTTP/2 connection), as an application
//! holds one, and the same closed loop on both.
//!
//! - `grpc-put`: every worker overwrites its own key;
//! - `grpc-range`: every worker reads its own key (written beforehand, untimed);
//! - `grpc-keepalive`: every worker renews its own lease over its own `LeaseKeepAlive` stream,
//!   one request outstanding per stream;
//! - `grpc-keepalive-shared`: every worker renews its own lease over one stream shared by all
//!   (how Go's clientv3 renews every lease of a client), answers matched by lease id;
//! - `grpc-lock`: `Lock` of a name no one else uses, under the worker's lease, then `Unlock`,
//!   timed as one operation.
//!
//! Leases (60 s) are granted before the loop and revoked after it, untimed; keys written are
//! deleted after it. Through the proxy the keys are relative to its `/v3` namespace; straight
//! to etcd they live under [`ETCD_PREFIX`].

use std::sync::Arc;

use anyhow::{bail, Context};
use etcd_client::{Client, DeleteOptions, LeaseKeepAliveStream, LeaseKeeper, LockOptions};
use lease_proxy_benches::stats::Run;
use tokio::sync::Mutex;

use crate::ops::{closed_loop, Op};
use crate::raw::Multiplexed;

/// Where the keys of the side straight to etcd live (the proxy's side is namespaced).
pub(crate) const ETCD_PREFIX: &str = "/leasebench-grpc/";

/// TTL of the leases the keepalive and lock loops use.
const TTL: i64 = 60;

/// One side: a gRPC client of the proxy or of etcd, and the prefix its keys get.
pub(crate) struct Grpc {
    client: Client,
    prefix: String,
}

impl Grpc {
    /// Connects one client (one channel) to `endpoint`; keys get `prefix`.
    pub(crate) async fn connect(endpoint: &str, prefix: &str) -> anyhow::Result<Self> {
        let client = Client::connect([endpoint], None)
            .await
            .with_context(|| format!("connecting to {endpoint} over gRPC"))?;
        Ok(Self {
            client,
            prefix: prefix.to_owned(),
        })
    }

    /// The client, to clone (clones share the channel).
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// `name` with this side's prefix.
    pub(crate) fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Grants `n` leases of [`TTL`], one at a time.
    async fn grant(&self, n: usize) -> anyhow::Result<Vec<i64>> {
        let mut leases = Vec::with_capacity(n);
        let mut c = self.client.lease_client();
        for _ in 0..n {
            leases.push(c.grant(TTL, None).await?.id());
        }
        Ok(leases)
    }

    /// Revokes `leases`, one at a time.
    async fn revoke(&self, leases: &[i64]) -> anyhow::Result<()> {
        let mut c = self.client.lease_client();
        for &lease in leases {
            c.revoke(lease).await?;
        }
        Ok(())
    }

    /// Deletes every key under `name` (with this side's prefix).
    async fn delete_under(&self, name: &str) -> anyhow::Result<()> {
        let options = DeleteOptions::new().with_prefix();
        self.client
            .kv_client()
            .delete(self.key(name), Some(options))
            .await?;
        Ok(())
    }
}

/// Measures `op` once on `side`: `in_flight` workers, `ops` operations, names unique by `tag`.
pub(crate) async fn measure(
    side: &Arc<Grpc>,
    op: Op,
    in_flight: usize,
    ops: usize,
    tag: &str,
) -> anyhow::Result<Run> {
    let workers = in_flight.max(1);
    let dir = format!("lbg-{tag}/");
    let key = {
        let (side, dir) = (side.clone(), dir.clone());
        move |w: usize| side.key(&format!("{dir}{w}"))
    };
    let run = match op {
        Op::GrpcPut => {
            let kv = side.client.kv_client();
            closed_loop(in_flight, ops, move |w, _| {
                let (mut kv, key) = (kv.clone(), key(w));
                async move {
                    kv.put(key, "leasebench", None).await?;
                    Ok(())
                }
            })
            .await?
        }
        Op::GrpcRange => {
            let mut kv = side.client.kv_client();
            for w in 0..workers {
                kv.put(key(w), "leasebench", None).await?;
            }
            closed_loop(in_flight, ops, move |w, _| {
                let (mut kv, key) = (kv.clone(), key(w));
                async move {
                    if kv.get(key.as_str(), None).await?.kvs().is_empty() {
                        bail!("{key} is gone");
                    }
                    Ok(())
                }
            })
            .await?
        }
        Op::GrpcKeepalive => {
            let leases = side.grant(workers).await?;
            let mut streams = Vec::with_capacity(workers);
            let mut c = side.client.lease_client();
            for &lease in &leases {
                streams.push(Mutex::new(c.keep_alive(lease).await?));
            }
            let streams = Arc::new(streams);
            let run = closed_loop(in_flight, ops, move |w, _| {
                let streams = streams.clone();
                async move { renew_own(&streams[w]).await }
            })
            .await?;
            side.revoke(&leases).await?;
            run
        }
        Op::GrpcKeepaliveShared => {
            let leases = Arc::new(side.grant(workers).await?);
            let shared = Arc::new(Multiplexed::open(&side.client).await?);
            let run = closed_loop(in_flight, ops, {
                let leases = leases.clone();
                move |w, _| {
                    let (shared, lease) = (shared.clone(), leases[w]);
                    async move {
                        if shared.renew(lease).await? <= 0 {
                            bail!("lease {lease} lost");
                        }
                        Ok(())
                    }
                }
            })
            .await?;
            side.revoke(&leases).await?;
            run
        }
        Op::GrpcLock => {
            let leases = Arc::new(side.grant(workers).await?);
            let lock = side.client.lock_client();
            let run = closed_loop(in_flight, ops, {
                let leases = leases.clone();
                move |w, i| {
                    let (mut lock, lease) = (lock.clone(), leases[w]);
                    let name = format!("{}-{i}", key(w));
                    async move {
                        let options = LockOptions::new().with_lease(lease);
                        let held = lock.lock(name, Some(options)).await?;
                        lock.unlock(held.key()).await?;
                        Ok(())
                    }
                }
            })
            .await?;
            side.revoke(&leases).await?;
            run
        }
        other => bail!("{} is not a gRPC operation", other.name()),
    };
    side.delete_under(&dir).await?;
    Ok(run)
}

/// One renewal over a worker's own keepalive stream: send, then read its answer.
async fn renew_own(stream: &Mutex<(LeaseKeeper, LeaseKeepAliveStream)>) -> anyhow::Result<()> {
    let mut s = stream.lock().await;
    s.0.keep_alive().await?;
    let answer = s.1.message().await?.context("keepalive stream closed")?;
    if answer.ttl() <= 0 {
        bail!("lease {} lost", answer.id());
    }
    Ok(())
}
