//! `Election` (v3election), as etcd's election service runs Go's `concurrency.Election`: a
//! candidate joins the queue of `name` with its lease (`{name}/{lease in hex}`, holding its
//! value) and leads while its key is the oldest under `{name}/` — the queue a lock of the same
//! name uses ([`Service::queue`]), so a campaign waits as a lock waits, under the same deadline,
//! failover and re-judging, and leaves no key behind if abandoned. The leader's answer carries a
//! fencing token for its key's create revision, in the lock domain of `name`.
//!
//! Errors as etcd's election service gives them: Go's errors untyped (gRPC Unknown) —
//! `election: not leader`, `election: no leader`, `"leader" field must be provided`.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::proto::{
    PbCampaignResponse, PbLeaderKey, PbLeaderResponse, PbProclaimResponse, PbResignResponse,
};
use etcd_client::{Compare, CompareOp, Txn, TxnOp, WatchOptions};
use fencing::Token;
use futures::stream::{BoxStream, StreamExt};

use super::lock::{oldest_under, queue_prefix, Queued, NOT_LEADER};
use super::service::{Caller, Service};
use super::status::{Code, Status};
use crate::etcd::{prefix_end, Etcd};
use crate::lease::Recheck;

/// Go's `concurrency.ErrElectionNoLeader`.
const NO_LEADER: &str = "election: no leader";
/// etcd's `v3election.ErrMissingLeaderKey`.
const MISSING_LEADER: &str = "\"leader\" field must be provided";

/// A campaign won: etcd's answer and the leader's fencing token, as [`super::lock::Locked`].
pub(crate) struct Elected {
    pub(crate) response: PbCampaignResponse,
    pub(crate) fencing_token: String,
    pub(crate) fencing_resource: String,
}

/// Waits (at most `patience`) for any change under `prefix` after `revision`.
async fn changed_after(etcd: &Etcd, prefix: &[u8], revision: i64, patience: Duration) {
    let wait = async {
        let client = etcd.pinned().client;
        let options = WatchOptions::new()
            .with_range(prefix_end(prefix))
            .with_start_revision(revision + 1);
        let Ok(mut stream) = client.watch_client().watch(prefix, Some(options)).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            return;
        };
        while let Ok(Some(resp)) = stream.message().await {
            if resp.canceled() || !resp.events().is_empty() {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(patience, wait).await;
}

impl Service {
    /// `Campaign`.
    pub(crate) async fn campaign(
        &self,
        s: &Caller,
        name: Vec<u8>,
        lease: i64,
        value: Vec<u8>,
    ) -> Result<Elected, Status> {
        let domain = s.lock_domain(&name);
        if name.is_empty() || domain.len() > fencing::MAX_LOCK_NAME_BYTES {
            return Err(Status::refused(format!(
                "an election name must be 1 to {} bytes, less the principal's name and a `/` \
                 with authentication on (its fencing domain is lock/ + its hex)",
                fencing::MAX_LOCK_NAME_BYTES
            )));
        }
        let Queued { key, mine, header } = self.queue(s, &name, lease, Some(&value)).await?;
        let resource = fencing::lock_resource(&domain);
        let token = Token::new(self.era, u64::try_from(mine).unwrap_or(0));
        Ok(Elected {
            response: PbCampaignResponse {
                header: Some(header),
                leader: Some(PbLeaderKey {
                    name,
                    key: s.namespace.strip(&key).unwrap_or_default().to_vec(),
                    rev: mine,
                    lease,
                }),
            },
            fencing_token: self.keys.current().mint(&resource, token),
            fencing_resource: resource,
        })
    }

    /// `Proclaim`: a new value for the leader, if `leader` still leads (its key is the
    /// incarnation created at its `rev`).
    pub(crate) async fn proclaim(
        &self,
        s: &Caller,
        leader: Option<PbLeaderKey>,
        value: Vec<u8>,
    ) -> Result<PbProclaimResponse, Status> {
        let leader = leader.ok_or_else(|| Status::new(Code::Unknown, MISSING_LEADER))?;
        if !self.leases.owned(leader.lease, s).await? {
            return Err(Status::new(Code::Unknown, NOT_LEADER));
        }
        let key = s.namespace.key(&leader.key);
        let header = self.replace(&key, leader.rev, &value, leader.lease).await?;
        Ok(PbProclaimResponse {
            header: Some(header),
        })
    }

    /// `Leader`: the oldest key under the name, or `election: no leader`.
    pub(crate) async fn leader(&self, s: &Caller, name: &[u8]) -> Result<PbLeaderResponse, Status> {
        let (kv, header) =
            oldest_under(&self.etcd, &queue_prefix(s, name), "v3_election_leader").await?;
        let mut kv = kv.ok_or_else(|| Status::new(Code::Unknown, NO_LEADER))?;
        kv.key = s.namespace.strip(&kv.key).unwrap_or_default().to_vec();
        Ok(PbLeaderResponse {
            header: Some(header),
            kv: Some(kv),
        })
    }

    /// `Resign`: deletes the leader's key if it is still the incarnation created at `rev`.
    pub(crate) async fn resign(
        &self,
        s: &Caller,
        leader: Option<PbLeaderKey>,
    ) -> Result<PbResignResponse, Status> {
        let leader = leader.ok_or_else(|| Status::new(Code::Unknown, MISSING_LEADER))?;
        let key = s.namespace.key(&leader.key);
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                leader.rev,
            )])
            .and_then([TxnOp::delete(key, None)]);
        let resp = self
            .etcd
            .bounded_once("v3_election_resign", |c| {
                let txn = txn.clone();
                async move { c.kv_client().txn(txn).await }
            })
            .await?;
        // Go's Resign answers success whether or not the key was still there.
        Ok(PbResignResponse {
            header: resp.0.header,
        })
    }

    /// `Observe`: the leader now (once there is one) and again whenever it changes — a new
    /// leader, or a new value proclaimed. Each step is a read under the deadline; between
    /// steps, a watch of the name's keys, re-read at least every deadline. Ends Unavailable
    /// when the proxy drains or after `--v3-watch-max-duration`, and with the caller's refusal
    /// once its right is gone.
    pub(crate) fn observe(
        &self,
        s: Caller,
        name: Vec<u8>,
    ) -> Result<BoxStream<'static, Result<PbLeaderResponse, Status>>, Status> {
        // An observer holds an etcd watch: one of the replica's event-stream slots, for at most
        // `--v3-watch-max-duration` (unset: as long as it lasts).
        let slot = Arc::new(self.streams.slots.take(s.owner.as_deref())?);
        let stopping = self.streams.stopping.clone();
        let until = self
            .streams
            .max_duration
            .map(|d| tokio::time::Instant::now() + d);
        let etcd = self.etcd.clone();
        let prefix = queue_prefix(&s, &name);
        let state = (etcd, s, prefix, None::<(Vec<u8>, i64)>, false);
        let answers = futures::stream::unfold(state, move |(etcd, s, prefix, mut last, done)| {
            let (stopping, _slot) = (stopping.clone(), slot.clone());
            async move {
                if done {
                    return None;
                }
                let mut recheck = s.recheck.clone();
                loop {
                    let (kv, header) =
                        match oldest_under(&etcd, &prefix, "v3_election_leader").await {
                            Ok(found) => found,
                            Err(e) => return Some((Err(e), (etcd, s, prefix, last, true))),
                        };
                    if let Some(mut kv) = kv {
                        let seen = (kv.key.clone(), kv.mod_revision);
                        if last.as_ref() != Some(&seen) {
                            last = Some(seen);
                            kv.key = s.namespace.strip(&kv.key).unwrap_or_default().to_vec();
                            let answer = PbLeaderResponse {
                                header: Some(header),
                                kv: Some(kv),
                            };
                            return Some((Ok(answer), (etcd, s, prefix, last, false)));
                        }
                    }
                    let patience = etcd.timeout();
                    tokio::select! {
                        () = changed_after(&etcd, &prefix, header.revision, patience) => {}
                        () = Recheck::changed_or_never(&mut recheck) => {
                            if let Err(e) = s.still_authorised() {
                                return Some((Err(e), (etcd, s, prefix, last, true)));
                            }
                        }
                        () = stopping.cancelled() => {
                            let end = Status::from(crate::Error::ShuttingDown);
                            return Some((Err(end), (etcd, s, prefix, last, true)));
                        }
                        () = crate::etcdapi::service::until_or_never(until) => {
                            let end = Status::new(
                                Code::Unavailable,
                                "lease-proxy: the observer reached --v3-watch-max-duration; observe \
                                 again",
                            );
                            return Some((Err(end), (etcd, s, prefix, last, true)));
                        }
                    }
                }
            }
        });
        Ok(answers.boxed())
    }
}
