//! `lock/lock` and `lock/unlock`, as etcd's lock service does them (`concurrency.Mutex`): the
//! lock `name` is held by the oldest key under `{namespace}{name}/`; a locker puts
//! `{name}/{lease id in hex}` attached to its lease and waits until every older key is gone.
//!
//! The proxy runs that algorithm itself rather than calling etcd's lock service, so that every
//! step is an etcd call under the proxy's deadline and failover, and waiting for a holder (which
//! may take as long as the holder likes) is a watch that is re-checked with a fresh read every
//! deadline — so a stopped member cannot hold a waiter forever. A locker that goes away while
//! waiting leaves no key behind, and one whose principal is removed or narrowed while it waits
//! gets no lock (its right is judged again on every token-file change and before the answer).
//!
//! The answer carries a fencing token for the lock key's create revision, minted for the lock's
//! own fencing domain, [`fencing::lock_resource`] (`lock/` + hex of the name's bytes) — never
//! for a `/v1` resource, whatever the name — and names that domain in `Fencing-Resource`.

use std::time::Duration;

use super::request::Lock;
use super::service::{Caller, Service};
use super::status::{Code, Status, EMPTY_KEY, LEASE_NOT_FOUND};
use crate::etcd::{prefix_end, Etcd, Header};
use crate::lease::Recheck;
use etcd_client::proto::{
    PbKeyValue, PbLockResponse, PbRangeResponse, PbResponseHeader, PbTxnOpResponse, PbTxnResponse,
    PbUnlockResponse,
};
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchOptions,
};
use fencing::Token;

/// Go's `concurrency.ErrElectionNotLeader`, which etcd's election service answers untyped.
pub(super) const NOT_LEADER: &str = "election: not leader";

/// `{namespace}{name}/`: the prefix of a lock's (or an election's) queue.
pub(super) fn queue_prefix(s: &Caller, name: &[u8]) -> Vec<u8> {
    let mut prefix = s.namespace.key(name);
    prefix.push(b'/');
    prefix
}

/// The read of the oldest key under `prefix` — the lock's holder, the election's leader.
fn oldest(prefix: &[u8]) -> GetOptions {
    GetOptions::new()
        .with_range(prefix_end(prefix))
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// The oldest key under `prefix`, if any, and the read's header (a linearizable read, as `op`
/// in the metrics).
pub(super) async fn oldest_under(
    etcd: &Etcd,
    prefix: &[u8],
    op: &'static str,
) -> Result<(Option<PbKeyValue>, PbResponseHeader), Status> {
    let options = oldest(prefix);
    let mut resp = etcd
        .bounded(op, |c| {
            let (prefix, options) = (prefix.to_vec(), options.clone());
            async move { c.kv_client().get(prefix, Some(options)).await }
        })
        .await?;
    let header = resp.take_header().map(|h| h.0).ok_or_else(no_header)?;
    let kv = resp.take_kvs().into_iter().next().map(|kv| kv.0);
    Ok((kv, header))
}

/// Deletes a waiting locker's key if the wait is abandoned (the client went away, or the wait
/// failed), as etcd's lock service does, so a lock nobody waits for any more blocks nobody.
struct Abandoned {
    etcd: Etcd,
    key: Vec<u8>,
    create_revision: i64,
    armed: bool,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (etcd, key, rev) = (self.etcd.clone(), self.key.clone(), self.create_revision);
        // Only this incarnation of the key: the same lease may have locked again since.
        let cleanup = self.etcd.clone();
        cleanup.spawn(async move {
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
                .and_then([TxnOp::delete(key, None)]);
            let deleted = etcd
                .bounded("v3_lock_abandon", |c| {
                    let txn = txn.clone();
                    async move { c.kv_client().txn(txn).await }
                })
                .await;
            if let Err(e) = deleted {
                tracing::debug!(error = %e, "removing an abandoned lock key failed; it goes with its lease");
            }
        });
    }
}

/// The key under `prefix` with the highest create revision at most `max`, and the header.
async fn last_before(
    etcd: &Etcd,
    prefix: &[u8],
    max: i64,
) -> Result<(Option<Vec<u8>>, Header), Status> {
    let options = GetOptions::new()
        .with_range(prefix_end(prefix))
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(max)
        .with_limit(1);
    let mut resp = etcd
        .bounded("v3_lock_wait", |c| {
            let options = options.clone();
            async move { c.kv_client().get(prefix, Some(options)).await }
        })
        .await?;
    let header = resp.header().map(Header::from).ok_or_else(no_header)?;
    let key = resp
        .take_kvs()
        .into_iter()
        .next()
        .map(|kv| kv.key().to_vec());
    Ok((key, header))
}

fn no_header() -> Status {
    Status::new(Code::Unknown, "etcd answered without a header")
}

/// Waits (at most `patience`) for `key` to be deleted after `revision`. Any failure or a quiet
/// watch just returns: the caller reads again.
async fn deleted_after(etcd: &Etcd, key: Vec<u8>, revision: i64, patience: Duration) {
    let wait = async {
        let client = etcd.pinned().client;
        let options = WatchOptions::new().with_start_revision(revision + 1);
        let Ok(mut stream) = client.watch_client().watch(key, Some(options)).await else {
            // Not a busy loop of reads while watches fail.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return;
        };
        while let Ok(Some(resp)) = stream.message().await {
            if resp.canceled()
                || resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
            {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(patience, wait).await;
}

/// A lock taken: etcd's answer, and the fencing token of the lock key's create revision in the
/// lock's own domain (a gRPC front sends both in its response metadata, `/v3` JSON in headers).
pub(crate) struct Locked {
    /// `LockResponse`: the header, and the lock key (out of the namespace).
    pub(crate) response: PbLockResponse,
    /// The signed token (`Fencing-Token`).
    pub(crate) fencing_token: String,
    /// Its fencing domain (`Fencing-Resource`): `lock/` + the hex of the lock's domain name.
    pub(crate) fencing_resource: String,
}

impl Service {
    /// `lock/lock`.
    pub(crate) async fn lock(&self, s: &Caller, l: Lock) -> Result<Locked, Status> {
        // A tenant's lock gets a fencing domain of its own (`{principal}/{name}`), so its token
        // is worth nothing at another tenant's lock of the same name.
        let domain = s.lock_domain(&l.name);
        if l.name.is_empty() || domain.len() > fencing::MAX_LOCK_NAME_BYTES {
            return Err(Status::refused(format!(
                "a lock name must be 1 to {} bytes, less the principal's name and a `/` with \
                 authentication on (its fencing domain is lock/ + its hex)",
                fencing::MAX_LOCK_NAME_BYTES
            )));
        }
        let Queued { key, mine, header } = self.queue(s, &l.name, l.lease, None).await?;
        let client_key = s.namespace.strip(&key).unwrap_or_default().to_vec();
        let resource = fencing::lock_resource(&domain);
        let token = Token::new(self.era, u64::try_from(mine).unwrap_or(0));
        Ok(Locked {
            response: PbLockResponse {
                header: Some(header),
                key: client_key,
            },
            fencing_token: self.keys.current().mint(&resource, token),
            fencing_resource: resource,
        })
    }

    /// `lock/token` (the proxy's own): the fencing token of a lock that etcd's client-side
    /// recipes took — Go's `concurrency.Mutex` and `Election` (what `etcdctl lock` and `etcdctl
    /// elect` run), npm and python locks — which put `{name}/{id}` and hold `name` while theirs
    /// is the oldest key under `{name}/`, exactly as [`Service::lock`] does. `key` (the lock key,
    /// `ETCD_LOCK_KEY` in `etcdctl lock`'s child) must be, in one linearizable read, the oldest
    /// key under its name in the caller's namespace: then the token is for its create revision,
    /// in the domain a `lock/lock` of the same name gets, so the two kinds of holder order as
    /// one. A key that does not hold its lock (gone, or an older key waits before it) gets no
    /// token.
    pub(crate) async fn lock_token(&self, s: &Caller, key: Vec<u8>) -> Result<Locked, Status> {
        if key.is_empty() {
            return Err(Status::invalid(EMPTY_KEY));
        }
        let name = match key.iter().rposition(|&b| b == b'/') {
            Some(slash) if slash > 0 => &key[..slash],
            _ => {
                return Err(Status::refused(
                    "a lock key is {name}/{id}, as etcd's lock recipes make it",
                ))
            }
        };
        let domain = s.lock_domain(name);
        if domain.len() > fencing::MAX_LOCK_NAME_BYTES {
            return Err(Status::refused(format!(
                "a lock name must be at most {} bytes, less the principal's name and a `/` with \
                 authentication on",
                fencing::MAX_LOCK_NAME_BYTES
            )));
        }
        let (holder, header) =
            oldest_under(&self.etcd, &queue_prefix(s, name), "v3_lock_token").await?;
        let held = s.namespace.key(&key);
        let Some(holder) = holder.filter(|kv| kv.key == held) else {
            return Err(Status::new(
                Code::FailedPrecondition,
                "lease-proxy: this key does not hold its lock (it is gone, or an older key under \
                 its name holds the lock)",
            ));
        };
        let resource = fencing::lock_resource(&domain);
        let token = Token::new(self.era, u64::try_from(holder.create_revision).unwrap_or(0));
        Ok(Locked {
            response: PbLockResponse {
                header: Some(header),
                key,
            },
            fencing_token: self.keys.current().mint(&resource, token),
            fencing_resource: resource,
        })
    }

    /// `lock/unlock`: deletes the lock key (inside the namespace), as etcd's lock service does.
    pub(crate) async fn unlock(
        &self,
        s: &Caller,
        key: Vec<u8>,
    ) -> Result<PbUnlockResponse, Status> {
        if key.is_empty() {
            return Err(Status::new(Code::Unknown, EMPTY_KEY));
        }
        let key = s.namespace.key(&key);
        let resp = self
            .etcd
            .bounded_once("v3_unlock", |c| {
                let key = key.clone();
                async move { c.kv_client().delete(key, None).await }
            })
            .await?;
        Ok(PbUnlockResponse {
            header: resp.0.header,
        })
    }
}

/// A place in a lock's (or an election's) queue that has come to the front.
pub(super) struct Queued {
    /// The etcd key (in the namespace).
    pub(super) key: Vec<u8>,
    /// Its create revision: the fencing token's value.
    pub(super) mine: i64,
    /// The header of the read that found it at the front.
    pub(super) header: PbResponseHeader,
}

/// What the joining transaction found. It is `[put, range(oldest)]` when it created the key,
/// `[range(the key), range(oldest)]` when the key was there already (an earlier call with the
/// same lease).
#[derive(Debug, PartialEq)]
struct Joined {
    /// Whether this call created the key.
    created: bool,
    /// The key's create revision: the fencing token's value.
    mine: i64,
    /// The create revision of the oldest key under the prefix.
    oldest: Option<i64>,
    /// The key's value, when it was there already.
    existing: Option<Vec<u8>>,
    /// The transaction's header.
    header: PbResponseHeader,
}

impl Joined {
    fn decode(resp: PbTxnResponse) -> Result<Self, Status> {
        let first_kv = |r: Option<&PbRangeResponse>| r.and_then(|r| r.kvs.first()).cloned();
        let ranges: Vec<_> = resp
            .responses
            .iter()
            .filter_map(|op| match &op.response {
                Some(PbTxnOpResponse::ResponseRange(r)) => Some(r),
                _ => None,
            })
            .collect();
        let header = resp.header.ok_or_else(no_header)?;
        let oldest = first_kv(ranges.last().copied()).map(|kv| kv.create_revision);
        let (mine, existing) = if resp.succeeded {
            (header.revision, None)
        } else {
            let kv = first_kv(ranges.first().copied()).ok_or_else(no_header)?;
            (kv.create_revision, Some(kv.value))
        };
        Ok(Self {
            created: resp.succeeded,
            mine,
            oldest,
            existing,
            header,
        })
    }
}

/// etcd's lock service answers every failure but unavailability untyped (gRPC Unknown).
fn untyped(s: Status) -> Status {
    if s.code() == Code::Unavailable as i32 {
        s
    } else {
        Status::new(Code::Unknown, s.message().to_owned())
    }
}

/// Joins the queue under `prefix` with `key` on `lease` (or finds the key from an earlier call
/// with the same lease) and reads the oldest key, in one transaction. Safe to repeat: a repeat
/// finds the key it created.
fn join_txn(prefix: &[u8], key: &[u8], lease: i64, value: Option<&[u8]>) -> Txn {
    let owner = oldest(prefix);
    Txn::new()
        .when([Compare::create_revision(key.to_vec(), CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(
                key.to_vec(),
                value.unwrap_or_default().to_vec(),
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::get(prefix.to_vec(), Some(owner.clone())),
        ])
        .or_else([
            TxnOp::get(key.to_vec(), None),
            TxnOp::get(prefix.to_vec(), Some(owner)),
        ])
}

impl Service {
    /// Joins the queue of `name` with `lease` — the key `{name}/{lease in hex}`, holding
    /// `value` (an election's; a lock's is empty) — and waits until it is the oldest key under
    /// `{name}/`, as etcd's Mutex and Election do. The lease must be the caller's.
    pub(super) async fn queue(
        &self,
        s: &Caller,
        name: &[u8],
        lease: i64,
        value: Option<&[u8]>,
    ) -> Result<Queued, Status> {
        if lease == 0 {
            return Err(Status::refused(
                "a lock (or a campaign) needs a lease granted through /v3 (etcd would grant one the proxy cannot \
                 account for)",
            ));
        }
        // etcd's lock service reports a lease it does not know untyped: gRPC Unknown, HTTP 500.
        // A lease remembered here but gone since is refused by etcd's put below with the same
        // message; where no put happens (the key was there already), it is read again.
        if !self.leases.owned_remembered(lease, s).await? {
            return Err(Status::new(Code::Unknown, LEASE_NOT_FOUND));
        }
        let prefix = queue_prefix(s, name);
        let mut key = prefix.clone();
        key.extend_from_slice(format!("{lease:x}").as_bytes());
        let txn = join_txn(&prefix, &key, lease, value);
        let resp = self
            .etcd
            .bounded("v3_lock", |c| {
                let txn = txn.clone();
                async move { c.kv_client().txn(txn).await }
            })
            .await
            .map_err(|e| untyped(e.into()))?;
        if !resp.0.succeeded && !self.leases.owned(lease, s).await? {
            return Err(Status::new(Code::Unknown, LEASE_NOT_FOUND));
        }
        let Joined {
            created,
            mine,
            oldest,
            existing,
            mut header,
        } = Joined::decode(resp.0)?;
        // A campaign again with the same lease and another value proclaims it (Go's Campaign).
        if let (Some(value), Some(existing)) = (value, existing) {
            if existing != value {
                header = self
                    .replace(&key, mine, value, lease)
                    .await
                    .map_err(untyped)?;
            }
        }
        if oldest.is_some_and(|oldest| oldest != mine) {
            header = self.wait_for_front(s, &prefix, &key, mine, created).await?;
        }
        Ok(Queued { key, mine, header })
    }

    /// Waits until the key `key`, created at `mine`, is the oldest under `prefix`: the header of
    /// the read that found it so. `created`: this call made the key, and takes it away if the
    /// wait ends without the lock.
    async fn wait_for_front(
        &self,
        s: &Caller,
        prefix: &[u8],
        key: &[u8],
        mine: i64,
        created: bool,
    ) -> Result<PbResponseHeader, Status> {
        let mut abandoned = Abandoned {
            etcd: self.etcd.clone(),
            key: key.to_vec(),
            create_revision: mine,
            armed: created,
        };
        // The caller's right to the lock is judged again whenever the token file may have
        // changed and before the lock is its: a principal removed or narrowed while it
        // waits gets no lock and no token, and its key goes (`abandoned`).
        // A waiter holds an etcd watch while it waits: one of the replica's event-stream
        // slots (refused, it leaves: its key goes), and it ends when the proxy drains.
        let _slot = self.streams.slots.take(s.owner.as_deref())?;
        let stopping = &self.streams.stopping;
        let mut recheck = s.recheck.clone();
        let header = loop {
            let (older, at) = last_before(&self.etcd, prefix, mine - 1).await?;
            let Some(older) = older else {
                break at.into();
            };
            tokio::select! {
                () = deleted_after(&self.etcd, older, at.revision, self.etcd.timeout()) => {}
                () = Recheck::changed_or_never(&mut recheck) => s.still_authorised()?,
                () = stopping.cancelled() => return Err(crate::Error::ShuttingDown.into()),
            }
        };
        s.still_authorised()?;
        // The lease may have lapsed while waiting, taking the key with it.
        let still = self.etcd.get_bytes(key).await.map_err(Status::from)?;
        if still.is_none_or(|kv| kv.create_revision() != mine) {
            return Err(Status::new(Code::Unknown, LEASE_NOT_FOUND));
        }
        abandoned.armed = false;
        Ok(header)
    }

    /// Puts `value` in `key` if it is still the incarnation created at `mine`; the header.
    pub(super) async fn replace(
        &self,
        key: &[u8],
        mine: i64,
        value: &[u8],
        lease: i64,
    ) -> Result<PbResponseHeader, Status> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.to_vec(),
                CompareOp::Equal,
                mine,
            )])
            .and_then([TxnOp::put(
                key.to_vec(),
                value.to_vec(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let resp = self
            .etcd
            .bounded("v3_election_proclaim", |c| {
                let txn = txn.clone();
                async move { c.kv_client().txn(txn).await }
            })
            .await?;
        if !resp.0.succeeded {
            return Err(Status::new(Code::Unknown, NOT_LEADER));
        }
        resp.0.header.ok_or_else(no_header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_client::proto::{PbPutResponse, PbResponseOp};

    fn range(create_revision: i64, value: &[u8]) -> PbResponseOp {
        PbResponseOp {
            response: Some(PbTxnOpResponse::ResponseRange(PbRangeResponse {
                kvs: vec![PbKeyValue {
                    create_revision,
                    value: value.to_vec(),
                    ..Default::default()
                }],
                ..Default::default()
            })),
        }
    }

    fn txn(succeeded: bool, responses: Vec<PbResponseOp>) -> PbTxnResponse {
        PbTxnResponse {
            header: Some(PbResponseHeader {
                revision: 40,
                ..Default::default()
            }),
            succeeded,
            responses,
        }
    }

    #[test]
    fn a_created_key_is_the_transactions_revision() {
        let put = PbResponseOp {
            response: Some(PbTxnOpResponse::ResponsePut(PbPutResponse::default())),
        };
        let joined = Joined::decode(txn(true, vec![put, range(12, b"older")])).unwrap();
        assert!(joined.created);
        assert_eq!((joined.mine, joined.oldest), (40, Some(12)));
        assert_eq!(joined.existing, None);
    }

    #[test]
    fn a_key_found_again_is_its_own_create_revision_and_value() {
        let joined = Joined::decode(txn(false, vec![range(30, b"mine"), range(12, b"")])).unwrap();
        assert!(!joined.created);
        assert_eq!((joined.mine, joined.oldest), (30, Some(12)));
        assert_eq!(joined.existing.as_deref(), Some(&b"mine"[..]));
        // At the front: the oldest key is its own.
        let front = Joined::decode(txn(false, vec![range(30, b""), range(30, b"")])).unwrap();
        assert_eq!(front.oldest, Some(front.mine));
    }

    #[test]
    fn an_answer_without_the_key_or_a_header_is_refused() {
        let empty = PbResponseOp {
            response: Some(PbTxnOpResponse::ResponseRange(PbRangeResponse::default())),
        };
        assert!(Joined::decode(txn(false, vec![empty, range(12, b"")])).is_err());
        let mut headless = txn(true, vec![range(12, b"")]);
        headless.header = None;
        assert!(Joined::decode(headless).is_err());
    }
}
