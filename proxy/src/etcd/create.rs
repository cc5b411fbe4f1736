//! The ownership transactions, sent through group commit: create-if-absent for every acquire,
//! and compare-and-delete for what a session ends one resource at a time.

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::batch::GroupCommit;
use super::Etcd;
use crate::{Error, Result};

/// The outcome of a create-if-absent transaction.
#[derive(Debug)]
pub(crate) enum Create {
    /// The key was created; this is its create revision.
    Created(i64),
    /// The key already existed; this is its current value, and the companion key's (if one was
    /// asked for and exists).
    Exists(Box<KeyValue>, Option<Box<KeyValue>>),
    /// The key did not exist, but the [`Quota`] guard failed: a key was written in the quota's
    /// range since it was counted. Nothing was written; count again.
    Crowded,
    /// The key did not exist, but the session named by the [`Create`]'s guard has ended
    /// (closed or expired). Nothing was written.
    NoSession,
}

/// A per-principal held quota, checked in the create transaction itself: `key` (one per held
/// grant, attached to the grant's lease) is written with the created key, and only if no key in
/// `range..range_end` was written after `revision`, the revision at which the caller counted
/// the range and found room. So of any number of concurrent creators (on any replica), at most
/// the room counted at `revision` succeed: the count cannot overshoot. (Two creators of one
/// principal never share a batch: the range is one of their keys.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct Quota<'a> {
    /// The index key of this grant.
    pub(crate) key: &'a str,
    /// The principal's range of index keys.
    pub(crate) range: &'a [u8],
    /// Its end.
    pub(crate) range_end: &'a [u8],
    /// The revision at which the range was counted.
    pub(crate) revision: i64,
}

impl Quota<'_> {
    /// Every key of the range (none is fine) last written at or before the count.
    pub(crate) fn compare(&self) -> Compare {
        Compare::mod_revision(self.range, CompareOp::Less, self.revision.saturating_add(1))
            .with_range(self.range_end)
    }
}

/// A quota's range counted at a revision, and the key one more would write in it: what a
/// [`Quota`] guard borrows.
#[derive(Debug, Clone)]
pub(crate) struct Counted {
    /// How many keys the range held.
    pub(crate) count: i64,
    key: String,
    range: Vec<u8>,
    range_end: Vec<u8>,
    revision: i64,
}

impl Counted {
    /// The transaction guard.
    pub(crate) fn guard(&self) -> Quota<'_> {
        Quota {
            key: &self.key,
            range: &self.range,
            range_end: &self.range_end,
            revision: self.revision,
        }
    }

    /// The same, with a guard that passes only while the range is empty.
    pub(crate) fn only_if_empty(self) -> Self {
        Self {
            revision: 0,
            ..self
        }
    }
}

impl Etcd {
    /// Counts the keys under `range` (a prefix), for writing `key` in it under a [`Quota`].
    pub(crate) async fn count_quota(&self, range: String, key: String) -> Result<Counted> {
        let range = range.into_bytes();
        let range_end = super::prefix_end(&range);
        let super::RangeCount { count, revision } = self.count(&range, &range_end).await?;
        Ok(Counted {
            count,
            key,
            range,
            range_end,
            revision,
        })
    }
}

/// A key put on a lease within a transaction of its own key's: beside a created key, so at the
/// same revision (written empty, read alongside the key when the creation is refused: the
/// replay window), or an end marker (`lease::marker`) beside the deletion it explains.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Companion<'a> {
    /// The companion key.
    pub(crate) key: &'a str,
    /// Its value.
    pub(crate) value: &'a [u8],
    /// The lease it is attached to (its lifetime).
    pub(crate) lease: i64,
}

/// What an ownership key is created with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Creation<'a> {
    /// The ownership key.
    pub(crate) key: &'a str,
    /// The record.
    pub(crate) value: &'a [u8],
    /// The lease it is attached to: the grant's own, or its session's.
    pub(crate) lease: i64,
    /// The replay-window key, written alongside.
    pub(crate) companion: Option<Companion<'a>>,
    /// The held-quota guard.
    pub(crate) quota: Option<Quota<'a>>,
    /// A session's key, which must still exist (the session is alive) for the key to be
    /// created on its lease.
    pub(crate) session_key: Option<&'a str>,
}

impl GroupCommit {
    /// One transaction: if the key does not exist (and the session, if any, does), put the
    /// record attached to the lease (and the companion, and the quota's index key); otherwise
    /// read the key (and the companion). Exactly one of any number of concurrent callers creates
    /// the key.
    ///
    /// Sent once (see [`super::Etcd::bounded_once`]): an attempt whose outcome is unknown is not
    /// repeated, since a late first attempt could otherwise create the key after a second one
    /// answered "exists" and the caller reused the lease.
    pub(crate) async fn create_if_absent(&self, c: Creation<'_>) -> Result<Create> {
        let lease = c.lease;
        let mut puts = vec![TxnOp::put(
            c.key,
            c.value,
            Some(PutOptions::new().with_lease(lease)),
        )];
        let mut gets = vec![TxnOp::get(c.key, None)];
        let mut keys = vec![c.key.as_bytes().to_vec()];
        let mut bytes = c.key.len() + c.value.len();
        if let Some(companion) = c.companion {
            puts.push(TxnOp::put(
                companion.key,
                companion.value,
                Some(PutOptions::new().with_lease(companion.lease)),
            ));
            gets.push(TxnOp::get(companion.key, None));
            keys.push(companion.key.as_bytes().to_vec());
            bytes += companion.key.len() + companion.value.len();
        }
        let mut compares = vec![Compare::create_revision(c.key, CompareOp::Equal, 0)];
        if let Some(q) = c.quota {
            puts.push(TxnOp::put(
                q.key,
                Vec::new(),
                Some(PutOptions::new().with_lease(lease)),
            ));
            compares.push(q.compare());
            keys.push(q.range.to_vec());
            bytes += q.key.len() + q.range.len() * 2;
        }
        if let Some(session) = c.session_key {
            compares.push(Compare::create_revision(session, CompareOp::Greater, 0));
            gets.push(TxnOp::get(session, None));
            bytes += session.len() * 2;
        }
        let txn = Txn::new().when(compares).and_then(puts).or_else(gets);
        let committed = self.commit("txn_create", keys, txn, bytes + 64).await?;
        if committed.succeeded {
            return Ok(Create::Created(committed.revision));
        }
        refused(&c, committed.responses)
    }

    /// Writes `marker` (a key on a lease: `lease::marker`'s end markers) on its lease if `alive_while` — a key that lives exactly as long as the
    /// lease (a grant's ownership key on its own lease, a session's key) — is still attached to
    /// it, in the next batch that touches neither; `false` if it is not (the lease has ended:
    /// nothing written).
    ///
    /// The compare is what keeps a lapsed lease from costing its batch: etcd refuses a whole
    /// request whose taken branch puts on a lease it no longer has (`NotFound`), and group
    /// commit then re-sends every batch-mate alone, whereas a failed compare only skips this
    /// transaction's put. Key and lease are checked in one apply, so the put never names a
    /// lease that is gone.
    pub(crate) async fn mark(&self, marker: Companion<'_>, alive_while: &str) -> Result<bool> {
        let options = PutOptions::new().with_lease(marker.lease);
        let put = TxnOp::put(marker.key, marker.value, Some(options));
        let guard = Compare::lease(alive_while, CompareOp::Equal, marker.lease);
        let bytes = (marker.key.len() + alive_while.len()) * 2 + marker.value.len() + 48;
        let keys = vec![
            marker.key.as_bytes().to_vec(),
            alive_while.as_bytes().to_vec(),
        ];
        let txn = Txn::new().when(vec![guard]).and_then(vec![put]);
        match self.commit("txn_marker", keys, txn, bytes).await {
            Ok(committed) => Ok(committed.succeeded),
            Err(Error::Etcd(e)) if super::is_lease_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes `key` (and `also`, written with it) if it is still the incarnation created at
    /// `revision`, writing `marker` in the same transaction; `true` if this call deleted it.
    /// Safe to repeat.
    pub(crate) async fn delete_if_created(
        &self,
        key: &str,
        revision: i64,
        also: &[&str],
        marker: Option<Companion<'_>>,
    ) -> Result<bool> {
        let guard = Compare::create_revision(key, CompareOp::Equal, revision);
        self.delete_when(guard, key, also, marker, 0).await
    }

    /// Deletes `key` (and `also`) if its value is exactly `value`: cleans up after a create
    /// whose outcome is unknown, on a lease that must not be revoked (a session's). The value
    /// carries the grant's own secret hash, so it matches only that grant.
    pub(crate) async fn delete_if_value(
        &self,
        key: &str,
        value: &[u8],
        also: &[&str],
    ) -> Result<bool> {
        let guard = Compare::value(key, CompareOp::Equal, value);
        self.delete_when(guard, key, also, None, value.len()).await
    }

    /// Deletes `key` and `also`, and writes `marker`, if `guard` holds; whether it did.
    async fn delete_when(
        &self,
        guard: Compare,
        key: &str,
        also: &[&str],
        marker: Option<Companion<'_>>,
        guard_bytes: usize,
    ) -> Result<bool> {
        let mut ops = vec![TxnOp::delete(key, None)];
        let mut keys = vec![key.as_bytes().to_vec()];
        for also in also {
            ops.push(TxnOp::delete(*also, None));
            keys.push(also.as_bytes().to_vec());
        }
        let mut marker_bytes = 0;
        if let Some(marker) = marker {
            let options = PutOptions::new().with_lease(marker.lease);
            ops.push(TxnOp::put(marker.key, marker.value, Some(options)));
            keys.push(marker.key.as_bytes().to_vec());
            marker_bytes = marker.key.len() + marker.value.len() + 16;
        }
        let txn = Txn::new().when(vec![guard]).and_then(ops);
        let bytes = keys.iter().map(Vec::len).sum::<usize>() * 2 + guard_bytes + marker_bytes + 32;
        Ok(self.commit("txn_delete", keys, txn, bytes).await?.succeeded)
    }
}

/// What a create refused by its compares read instead (`responses`, the failure branch's gets:
/// the key, the companion if any, the session key if any).
fn refused(c: &Creation<'_>, responses: Vec<TxnOpResponse>) -> Result<Create> {
    let mut found = responses.into_iter().map(|op| match op {
        TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
        _ => None,
    });
    let kv = found.next().flatten();
    let companion = match c.companion {
        Some(_) => found.next().flatten().map(Box::new),
        None => None,
    };
    let session_alive = match c.session_key {
        Some(_) => found.next().flatten().is_some(),
        None => true,
    };
    let Some(kv) = kv else {
        if !session_alive {
            return Ok(Create::NoSession);
        }
        if c.quota.is_some() {
            // The key is absent, so the quota's compare is the one that failed.
            return Ok(Create::Crowded);
        }
        // The key vanished between the compare and the read inside one transaction:
        // impossible, since a transaction is atomic; treat it as an etcd fault.
        return Err(Error::CorruptRecord {
            key: c.key.to_owned(),
            reason: "transaction failed its compare but read no key".to_owned(),
        });
    };
    // An attempt retried after a failure that looked undelivered finds its own key (on a
    // session's lease, only its own record is its own).
    if kv.lease() == c.lease && (c.session_key.is_none() || kv.value() == c.value) {
        return Ok(Create::Created(kv.create_revision()));
    }
    Ok(Create::Exists(Box::new(kv), companion))
}

#[cfg(test)]
mod tests {
    use etcd_client::PutOptions;

    use super::super::batch::tests::{create, etcd, lingering};
    use super::Companion;

    /// A release or close marker on a lease etcd no longer has (a grant or session that lapsed
    /// while a replica still had it cached) writes nothing and answers `false`, without etcd
    /// refusing the batch it shares: its batch-mates keep their one proposal.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_marker_on_a_lapsed_lease_never_fails_its_batch() {
        let (cluster, etcd) = etcd().await;
        let (commit, tracker, stop) = lingering(&etcd, 1);
        let mut client = cluster.client().await;
        let lease = client.lease_grant(30, None).await.unwrap().id();
        let guard = "/t/lapsed";
        client
            .put(guard, "", Some(PutOptions::new().with_lease(lease)))
            .await
            .unwrap();
        client.lease_revoke(lease).await.unwrap();
        let marker = Companion {
            key: "/t/ended/closed/1",
            value: b"",
            lease,
        };
        let (ka, ta) = create("/t/mate-a", 0);
        let (kb, tb) = create("/t/mate-b", 0);
        let (a, marked, b) = tokio::join!(
            commit.commit("txn_test", ka, ta, 64),
            commit.mark(marker, guard),
            commit.commit("txn_test", kb, tb, 64),
        );
        assert_eq!(marked.ok(), Some(false));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(a.succeeded && b.succeeded);
        assert_eq!(a.revision, b.revision, "the batch was split");
        let ended = client.get(
            "/t/ended/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        );
        assert!(ended.await.unwrap().kvs().is_empty());
        stop.cancel();
        tracker.close();
        tracker.wait().await;
    }
}
