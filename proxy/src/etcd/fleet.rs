//! The etcd calls of fleets: a fleet's keys read at one revision, the ownership keys of its
//! resources read many at a time, compare-and-put of its records, the guarded create of a
//! grant the service makes, and the delete of a fleet's keys.

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
};

use super::batch::{GroupCommit, ETCD_MAX_TXN_OPS};
use super::create::{Companion, Quota};
use super::{prefix_end, Etcd, RangePage};
use crate::{Error, Result};

/// A key that must not have changed since it was read: its mod revision then (0: absent).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unchanged<'a> {
    /// The key.
    pub(crate) key: &'a str,
    /// Its mod revision when read; 0 for a key that was absent.
    pub(crate) mod_revision: i64,
}

impl Unchanged<'_> {
    fn compare(&self) -> Compare {
        Compare::mod_revision(self.key, CompareOp::Equal, self.mod_revision)
    }
}

/// Every key under a prefix, read at one revision.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    /// The keys, in key order.
    pub(crate) kvs: Vec<KeyValue>,
    /// The revision they were read at.
    pub(crate) revision: i64,
}

impl Etcd {
    /// Every key under `prefix`, linearizably, at one revision (pages of `page` keys read at
    /// the first page's revision).
    pub(crate) async fn list(&self, prefix: &str, page: i64) -> Result<Listed> {
        let end = prefix_end(prefix.as_bytes());
        let mut start = prefix.as_bytes().to_vec();
        let mut at = 0;
        let mut kvs = Vec::new();
        loop {
            let RangePage {
                kvs: mut got,
                more,
                revision,
            } = self.range_at(&start, &end, page, at).await?;
            at = revision;
            let last = got.last().map(|kv| kv.key().to_vec());
            kvs.append(&mut got);
            match last {
                Some(mut last) if more => {
                    last.push(0);
                    start = last;
                }
                _ => break,
            }
        }
        Ok(Listed { kvs, revision: at })
    }

    /// The keys (without values) under `prefix`, linearizably, and the revision read at.
    pub(crate) async fn list_keys(&self, prefix: &str) -> Result<(Vec<Vec<u8>>, i64)> {
        let end = prefix_end(prefix.as_bytes());
        let mut start = prefix.as_bytes().to_vec();
        let (mut keys, mut at) = (Vec::new(), 0);
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(1_000)
                .with_revision(at)
                .with_keys_only();
            let first = start.clone();
            let mut resp = self
                .bounded("range", |c| {
                    let (options, first) = (options.clone(), first.clone());
                    async move { c.kv_client().get(first, Some(options)).await }
                })
                .await?;
            at = resp.header().map_or(at, |h| h.revision());
            let more = resp.more();
            let got: Vec<Vec<u8>> = resp.take_kvs().iter().map(|kv| kv.key().to_vec()).collect();
            let last = got.last().cloned();
            keys.extend(got);
            match last {
                Some(mut last) if more => {
                    last.push(0);
                    start = last;
                }
                _ => return Ok((keys, at)),
            }
        }
    }

    /// How many keys under `prefix` were created at or before `revision` (and are still
    /// there), linearizably. etcd filters by create revision only the keys it returns, never a
    /// count, so the keys are read (without values) and counted here.
    pub(crate) async fn count_created(&self, prefix: &str, revision: i64) -> Result<usize> {
        let end = prefix_end(prefix.as_bytes());
        let options = GetOptions::new()
            .with_range(end)
            .with_keys_only()
            .with_max_create_revision(revision);
        let resp = self
            .bounded("range", |c| {
                let options = options.clone();
                async move { c.kv_client().get(prefix, Some(options)).await }
            })
            .await?;
        Ok(resp.kvs().len())
    }

    /// The values of `keys` at `revision` (`None`: absent), in their order: transactions of at
    /// most etcd's 128 reads each, sent together. Read at the revision another read was made
    /// at, they and it are one state of etcd.
    pub(crate) async fn get_many(
        &self,
        keys: &[String],
        revision: i64,
    ) -> Result<Vec<Option<KeyValue>>> {
        let at = &GetOptions::new().with_revision(revision);
        let reads = keys.chunks(ETCD_MAX_TXN_OPS).map(|chunk| async move {
            let txn = Txn::new().and_then(
                chunk
                    .iter()
                    .map(|k| TxnOp::get(k.as_str(), Some(at.clone())))
                    .collect::<Vec<_>>(),
            );
            let resp = self
                .bounded("txn_read", |c| {
                    let txn = txn.clone();
                    async move { c.kv_client().txn(txn).await }
                })
                .await?;
            Ok::<_, Error>(
                resp.op_responses()
                    .into_iter()
                    .map(|op| match op {
                        TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            )
        });
        let mut found = Vec::with_capacity(keys.len());
        // Sent together: a fleet of 10,000 resources is 79 reads of one round trip.
        for chunk in futures::future::join_all(reads).await {
            found.extend(chunk?);
        }
        Ok(found)
    }

    /// Deletes every key under `prefix`, and `also` (if any), and puts `mark` (on no lease),
    /// if `guard` is unchanged; the revision it did that at, `None` if the guard failed.
    pub(crate) async fn delete_prefix_if(
        &self,
        prefix: &str,
        also: Option<&str>,
        mark: (&str, &[u8]),
        guard: Unchanged<'_>,
    ) -> Result<Option<i64>> {
        let end = prefix_end(prefix.as_bytes());
        let mut ops = vec![TxnOp::delete(
            prefix,
            Some(etcd_client::DeleteOptions::new().with_range(end)),
        )];
        ops.extend(also.map(|key| TxnOp::delete(key, None)));
        ops.push(TxnOp::put(mark.0, mark.1, None));
        let txn = Txn::new().when(vec![guard.compare()]).and_then(ops);
        let resp = self
            .bounded_once("txn_delete_prefix", |c| {
                let txn = txn.clone();
                async move { c.kv_client().txn(txn).await }
            })
            .await?;
        Ok(resp
            .succeeded()
            .then(|| resp.header().map(|h| h.revision()))
            .flatten())
    }

    /// Deletes `key` if it is unchanged since read; whether it did.
    pub(crate) async fn delete_if_unchanged(&self, key: Unchanged<'_>) -> Result<bool> {
        let txn = Txn::new()
            .when(vec![key.compare()])
            .and_then(vec![TxnOp::delete(key.key, None)]);
        let resp = self
            .bounded("txn_delete_unchanged", |c| {
                let txn = txn.clone();
                async move { c.kv_client().txn(txn).await }
            })
            .await?;
        Ok(resp.succeeded())
    }
}

/// The create of a grant the service makes (a fleet's): the ownership key on a session's
/// lease, only if absent and only while every guard is unchanged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Guarded<'a> {
    /// The ownership key.
    pub(crate) key: &'a str,
    /// The record.
    pub(crate) value: &'a [u8],
    /// The session's lease.
    pub(crate) lease: i64,
    /// Keys that must not have changed since the decision read them.
    pub(crate) guards: &'a [Unchanged<'a>],
    /// The held quota of the session's principal, when one applies: its index key is written
    /// with the grant, only if the principal's range is as counted.
    pub(crate) quota: Option<super::Quota<'a>>,
    /// Written with the grant (the fleet's index of its grants).
    pub(crate) alongside: Companion<'a>,
}

/// One guarded put (see [`GroupCommit::put_when`]).
struct Put<'a> {
    key: &'a str,
    value: &'a [u8],
    lease: i64,
    guards: &'a [Unchanged<'a>],
    quota: Option<Quota<'a>>,
    alongside: Option<Companion<'a>>,
}

impl GroupCommit {
    /// Puts `value` at `key` (on `lease`, 0 for none) if every guard is unchanged; the
    /// revision of the put, or `None` if a guard failed (nothing written).
    pub(crate) async fn put_if(
        &self,
        key: &str,
        value: &[u8],
        lease: i64,
        guards: &[Unchanged<'_>],
    ) -> Result<Option<i64>> {
        self.put_if_counted(key, value, lease, guards, None).await
    }

    /// [`GroupCommit::put_if`], and with a `quota` its index key too, only if its range is as
    /// counted (as an acquire's, `create.rs`): of concurrent puts counted with room for one,
    /// one succeeds.
    pub(crate) async fn put_if_counted(
        &self,
        key: &str,
        value: &[u8],
        lease: i64,
        guards: &[Unchanged<'_>],
        quota: Option<Quota<'_>>,
    ) -> Result<Option<i64>> {
        let put = Put {
            key,
            value,
            lease,
            guards,
            quota,
            alongside: None,
        };
        self.put_when("txn_put_if", put, Vec::new()).await
    }

    /// The guarded create: the key's create revision (its token) if this call created it,
    /// `None` if it exists or a guard failed (nothing written). An error leaves the outcome
    /// unknown: the caller deletes the key if it holds exactly this value.
    ///
    /// The guards are compared, never written, so grants under one decision share a batch: etcd
    /// evaluates every compare of a batch on the state before it.
    pub(crate) async fn create_guarded(&self, c: Guarded<'_>) -> Result<Option<i64>> {
        let absent = vec![Compare::create_revision(c.key, CompareOp::Equal, 0)];
        // Broken on purpose: the grant overwrites whoever holds the key.
        #[cfg(feature = "negative-controls")]
        let absent = match crate::negative_control::no_revoke_before_grant() {
            true => Vec::new(),
            false => absent,
        };
        let put = Put {
            key: c.key,
            value: c.value,
            lease: c.lease,
            guards: c.guards,
            quota: c.quota,
            alongside: Some(c.alongside),
        };
        self.put_when("txn_create_guarded", put, absent).await
    }

    /// `put.value` at `put.key` (on its lease), and `put.alongside`, if `compares` and every
    /// guard hold; with a
    /// quota, its index key too (on the same lease), only if the quota's range is as counted —
    /// the range among the batch's keys, so that no two puts under one principal's quota share
    /// a batch (whose compares all see the state before it). The batch's revision, or `None`
    /// if a compare failed (nothing written).
    async fn put_when(
        &self,
        op: &'static str,
        put: Put<'_>,
        mut compares: Vec<Compare>,
    ) -> Result<Option<i64>> {
        let Put {
            key,
            value,
            lease,
            guards,
            quota,
            alongside,
        } = put;
        compares.extend(guards.iter().map(Unchanged::compare));
        let on_lease = || Some(PutOptions::new().with_lease(lease));
        let mut puts = vec![TxnOp::put(key, value, on_lease())];
        let mut keys = vec![key.as_bytes().to_vec()];
        let mut bytes = key.len() * 2
            + value.len()
            + guards.iter().map(|g| g.key.len() + 16).sum::<usize>()
            + 64;
        if let Some(a) = alongside {
            let options = PutOptions::new().with_lease(a.lease);
            puts.push(TxnOp::put(a.key, a.value, Some(options)));
            keys.push(a.key.as_bytes().to_vec());
            bytes += a.key.len() + a.value.len();
        }
        if let Some(q) = quota {
            puts.push(TxnOp::put(q.key, Vec::new(), on_lease()));
            compares.push(q.compare());
            keys.push(q.range.to_vec());
            bytes += q.key.len() + q.range.len() * 2;
        }
        let txn = Txn::new().when(compares).and_then(puts);
        let committed = self.commit(op, keys, txn, bytes).await?;
        Ok(committed.succeeded.then_some(committed.revision))
    }
}
