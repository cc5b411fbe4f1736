//! One caller's own etcd keepalive stream ([`Own`]): what a gRPC `LeaseKeepAlive` stream with
//! several renewals under way renews on instead of the shared streams ([`super::KeepAlive`]).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use etcd_client::proto::{PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse};
use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use futures::StreamExt as _;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::keepalive::Renewed;
use super::{Etcd, Header};

/// How opening an etcd keepalive stream of one's own went.
pub(crate) enum Opened {
    Stream(Box<Own>),
    /// etcd does not know the lease it was opened with (expired or revoked).
    Gone,
    /// etcd did not answer, or refused: the member is passed over for the next one.
    Failed,
}

/// One caller's own etcd keepalive stream. etcd answers a stream's keepalives one by one, in the
/// order sent; a keepalive left unanswered past a third of `--etcd-timeout` (a partitioned or
/// paused member answers nothing) ends it, as an error or an end from etcd does: its owner then
/// renews what was on it elsewhere. Each renewal is timed as the shards' are.
pub(crate) struct Own {
    etcd: Etcd,
    member: usize,
    requests: mpsc::Sender<PbLeaseKeepAliveRequest>,
    responses: tonic::Streaming<PbLeaseKeepAliveResponse>,
    /// When each keepalive on the wire was sent, oldest first.
    sent: VecDeque<Instant>,
    stall_after: Duration,
    /// Wakes the owner to look for a stall while anything is on the wire.
    tick: tokio::time::Interval,
    lost: bool,
}

impl Own {
    pub(super) fn new(
        etcd: Etcd,
        member: usize,
        (keeper, responses): (LeaseKeeper, LeaseKeepAliveStream),
        stall_after: Duration,
    ) -> Self {
        etcd.metrics()
            .keepalive_streams
            .fetch_add(1, Ordering::Relaxed);
        let mut tick = tokio::time::interval((stall_after / 3).max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            etcd,
            member,
            requests: keeper.sender,
            responses: responses.stream,
            sent: VecDeque::new(),
            stall_after,
            tick,
            lost: false,
        }
    }

    /// Writes a keepalive for `id`; `false` if the stream is gone (or, which its owner's bound
    /// on renewals under way prevents, its queue full).
    pub(crate) fn send(&mut self, id: i64) -> bool {
        if self.lost
            || self
                .requests
                .try_send(PbLeaseKeepAliveRequest { id })
                .is_err()
        {
            return false;
        }
        self.sent.push_back(Instant::now());
        true
    }

    /// The next renewal etcd answered: the lease and what it was renewed to (TTL `0`: etcd no
    /// longer knows it). `None` once the stream is lost: ended, failed, answered with no header,
    /// or stalled.
    pub(crate) fn poll_renewed(&mut self, cx: &mut Context<'_>) -> Poll<Option<(i64, Renewed)>> {
        if self.lost {
            return Poll::Ready(None);
        }
        match self.responses.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(PbLeaseKeepAliveResponse {
                header: Some(h),
                id,
                ttl,
            }))) => {
                if let Some(sent) = self.sent.pop_front() {
                    self.etcd.metrics().etcd_request("keepalive", sent);
                }
                let header = Header {
                    cluster_id: h.cluster_id,
                    member_id: h.member_id,
                    revision: h.revision,
                    raft_term: h.raft_term,
                };
                let ttl = ttl.max(0);
                return Poll::Ready(Some((
                    id,
                    Renewed {
                        ttl,
                        header: Some(header),
                    },
                )));
            }
            Poll::Ready(Some(Ok(_))) => return self.lose("answered with no header"),
            Poll::Ready(Some(Err(e))) => return self.lose(&e.to_string()),
            Poll::Ready(None) => return self.lose("closed by etcd"),
            Poll::Pending => {}
        }
        let Some(oldest) = self.sent.front() else {
            return Poll::Pending;
        };
        if oldest.elapsed() > self.stall_after {
            return self.lose("keepalive unanswered");
        }
        // Polled again at the next tick: a stall is seen even if etcd sends nothing.
        while self.tick.poll_tick(cx).is_ready() {}
        Poll::Pending
    }

    fn lose<T>(&mut self, why: &str) -> Poll<Option<T>> {
        tracing::warn!(
            member = self.member,
            reason = why,
            "own keepalive stream lost"
        );
        self.etcd.unpin(self.member);
        self.lost = true;
        Poll::Ready(None)
    }
}

impl Drop for Own {
    fn drop(&mut self) {
        self.etcd
            .metrics()
            .keepalive_streams
            .fetch_sub(1, Ordering::Relaxed);
    }
}
