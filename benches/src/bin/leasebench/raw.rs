//! Raw etcd doing the proxy's protocol with etcd-client: LeaseGrant + create-if-absent Txn to
//! acquire (LeaseRevoke when the key exists), a keepalive to renew, delete-if-same-incarnation
//! Txn + LeaseRevoke to release. Renewals go over one multiplexed keepalive stream (the best raw
//! etcd offers), or — the naive way — over one stream per lease.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use etcd_client::{
    Client, Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp,
};
use tokio::sync::oneshot;

use crate::backend::Backend;

/// How renewals reach etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Streams {
    /// Every renewal on one shared keepalive stream, answered by lease id.
    Multiplexed,
    /// One keepalive stream per lease, as `Client::lease_keep_alive` gives out.
    PerLease,
}

/// Raw etcd.
pub(crate) struct RawEtcd {
    client: Client,
    streams: Streams,
    shared: Multiplexed,
}

/// A lease held through raw etcd.
pub(crate) struct RawHeld {
    key: String,
    lease: i64,
    revision: i64,
    own_stream: Option<tokio::sync::Mutex<(LeaseKeeper, LeaseKeepAliveStream)>>,
}

type Waiters = Arc<Mutex<HashMap<i64, VecDeque<oneshot::Sender<i64>>>>>;

/// One keepalive stream shared by all renewals; a reader task hands each response to the
/// oldest caller waiting on that lease. Also the shared-stream side of `grpc-keepalive-shared`,
/// through the proxy as straight to etcd.
pub(crate) struct Multiplexed {
    keeper: tokio::sync::Mutex<LeaseKeeper>,
    waiters: Waiters,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Multiplexed {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Multiplexed {
    /// Opens the stream on `client` (renewing a lease granted for the purpose).
    pub(crate) async fn open(client: &Client) -> anyhow::Result<Self> {
        // etcd-client opens a stream by renewing a real lease; later sends set their own id.
        let anchor = client.lease_client().grant(600, None).await?.id();
        let (keeper, mut stream) = client.lease_client().keep_alive(anchor).await?;
        let waiters: Waiters = Arc::default();
        let reader = tokio::spawn({
            let waiters = waiters.clone();
            async move {
                while let Ok(Some(resp)) = stream.message().await {
                    let waiter = waiters
                        .lock()
                        .ok()
                        .and_then(|mut w| w.get_mut(&resp.id()).and_then(VecDeque::pop_front));
                    if let Some(tx) = waiter {
                        let _ = tx.send(resp.ttl());
                    }
                }
            }
        });
        Ok(Self {
            keeper: tokio::sync::Mutex::new(keeper),
            waiters,
            reader,
        })
    }

    /// Renews `lease` over the stream; its remaining TTL (0 or less: gone).
    pub(crate) async fn renew(&self, lease: i64) -> anyhow::Result<i64> {
        let (tx, rx) = oneshot::channel();
        {
            let mut keeper = self.keeper.lock().await;
            self.waiters
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .entry(lease)
                .or_default()
                .push_back(tx);
            keeper.id = lease;
            keeper.keep_alive().await?;
        }
        rx.await.context("keepalive stream closed")
    }
}

impl RawEtcd {
    /// Connects to `endpoint`.
    pub(crate) async fn connect(endpoint: &str, streams: Streams) -> anyhow::Result<Self> {
        let client = Client::connect([endpoint], None).await?;
        let shared = Multiplexed::open(&client).await?;
        Ok(Self {
            client,
            streams,
            shared,
        })
    }
}

impl RawEtcd {
    /// Grants a lease of `ttl` seconds (a raft write).
    pub(crate) async fn grant(&self, ttl: u64) -> anyhow::Result<i64> {
        Ok(self
            .client
            .lease_client()
            .grant(i64::try_from(ttl)?, None)
            .await?
            .id())
    }

    /// Revokes `lease`, deleting every key attached to it (a raft write).
    pub(crate) async fn revoke(&self, lease: i64) -> anyhow::Result<()> {
        self.client.lease_client().revoke(lease).await?;
        Ok(())
    }

    /// Renews `lease` on the shared multiplexed keepalive stream; an error when it is gone.
    pub(crate) async fn keep_alive(&self, lease: i64) -> anyhow::Result<()> {
        if self.shared.renew(lease).await? <= 0 {
            bail!("lease {lease} lost");
        }
        Ok(())
    }

    /// Deletes `resource`'s key if it is still the one created at `revision` (one transaction).
    pub(crate) async fn delete_created(&self, resource: &str, revision: i64) -> anyhow::Result<()> {
        let key = format!("/leasebench/{resource}");
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        self.client.kv_client().txn(txn).await?;
        Ok(())
    }

    /// Creates `resource`'s key on `lease` if absent (one transaction); its create revision,
    /// or `None` when the key exists.
    pub(crate) async fn create(&self, resource: &str, lease: i64) -> anyhow::Result<Option<i64>> {
        let key = format!("/leasebench/{resource}");
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "leasebench",
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let resp = self.client.kv_client().txn(txn).await?;
        Ok(resp
            .succeeded()
            .then(|| resp.header().map(|h| h.revision()).unwrap_or_default()))
    }
}

impl Backend for RawEtcd {
    type Held = RawHeld;

    async fn acquire(&self, resource: String, ttl: u64) -> anyhow::Result<Option<RawHeld>> {
        let mut lease_client = self.client.lease_client();
        let lease = self.grant(ttl).await?;
        let Some(revision) = self.create(&resource, lease).await? else {
            self.revoke(lease).await?;
            return Ok(None);
        };
        let key = format!("/leasebench/{resource}");
        let own_stream = match self.streams {
            Streams::Multiplexed => None,
            Streams::PerLease => Some(tokio::sync::Mutex::new(
                lease_client.keep_alive(lease).await?,
            )),
        };
        Ok(Some(RawHeld {
            key,
            lease,
            revision,
            own_stream,
        }))
    }

    async fn renew(&self, held: &RawHeld) -> anyhow::Result<()> {
        let ttl = match &held.own_stream {
            None => self.shared.renew(held.lease).await?,
            Some(stream) => {
                let mut s = stream.lock().await;
                s.0.keep_alive().await?;
                s.1.message()
                    .await?
                    .context("keepalive stream closed")?
                    .ttl()
            }
        };
        if ttl <= 0 {
            bail!("lease {} lost", held.lease);
        }
        Ok(())
    }

    async fn read(&self, held: &RawHeld) -> anyhow::Result<()> {
        let found = self.client.kv_client().get(held.key.as_str(), None).await?;
        if found.kvs().is_empty() {
            bail!("{} is not held", held.key);
        }
        Ok(())
    }

    async fn release(&self, held: &RawHeld) -> anyhow::Result<()> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                held.key.as_str(),
                CompareOp::Equal,
                held.revision,
            )])
            .and_then([TxnOp::delete(held.key.as_str(), None)]);
        self.client.kv_client().txn(txn).await?;
        self.client.lease_client().revoke(held.lease).await?;
        Ok(())
    }
}
