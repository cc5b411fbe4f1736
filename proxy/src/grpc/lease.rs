//! `etcdserverpb.Lease`: Grant, Revoke, TimeToLive, Leases and the bidirectional KeepAlive,
//! all through the core, so only the caller's own `/v3` leases can be touched.

use std::sync::Arc;
use std::task::{Context, Poll};

use etcd_client::proto::{
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse,
    PbLeaseLeasesRequest, PbLeaseLeasesResponse, PbLeaseRevokeRequest, PbLeaseRevokeResponse,
    PbLeaseService, PbLeaseTimeToLiveRequest, PbLeaseTimeToLiveResponse,
};
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{BoxStream, StreamExt};
use tonic::{Request, Response, Streaming};

use super::renewals::{Open, Renewals, Renewer, Step, Upstream};
use super::{status, Front};
use crate::etcd::{Opened, Own};
use crate::etcdapi::{Caller, Judged, Service};
use crate::lease::Slot;

type Answer<T> = Result<Response<T>, tonic::Status>;

#[tonic::async_trait]
impl PbLeaseService for Front {
    async fn lease_grant(&self, req: Request<PbLeaseGrantRequest>) -> Answer<PbLeaseGrantResponse> {
        let caller = self.caller(&req)?;
        let answer = self
            .core()
            .lease_grant(&caller, req.into_inner().into())
            .await;
        Ok(Response::new(answer.map_err(status)?))
    }

    async fn lease_revoke(
        &self,
        req: Request<PbLeaseRevokeRequest>,
    ) -> Answer<PbLeaseRevokeResponse> {
        let caller = self.caller(&req)?;
        let answer = self.core().lease_revoke(&caller, req.into_inner().id).await;
        Ok(Response::new(answer.map_err(status)?))
    }

    type LeaseKeepAliveStream = BoxStream<'static, Result<PbLeaseKeepAliveResponse, tonic::Status>>;

    /// Answers in the order of the requests, as etcd answers them, several renewals under way
    /// at once and the requests read ahead, the caller's leases renewed on an etcd stream of
    /// the stream's own once it has several under way ([`Renewals`]); an unknown (or another
    /// tenant's) lease answered with TTL 0. A reload that removes the caller's principal ends
    /// the stream, renewing or not.
    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<PbLeaseKeepAliveRequest>>,
    ) -> Answer<Self::LeaseKeepAliveStream> {
        let caller = Arc::new(self.caller(&req)?);
        let requests = req.into_inner().map(|request| request.map(|r| r.id));
        let requests = caller.while_authorised(requests, status);
        let renewer = Keeping {
            core: self.core.clone(),
            caller,
        };
        Ok(Response::new(Renewals::new(requests, renewer).boxed()))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<PbLeaseTimeToLiveRequest>,
    ) -> Answer<PbLeaseTimeToLiveResponse> {
        let caller = self.caller(&req)?;
        let answer = self
            .core()
            .lease_time_to_live(&caller, req.into_inner().into())
            .await;
        Ok(Response::new(answer.map_err(status)?))
    }

    async fn lease_leases(
        &self,
        req: Request<PbLeaseLeasesRequest>,
    ) -> Answer<PbLeaseLeasesResponse> {
        let caller = self.caller(&req)?;
        let answer = self.core().lease_leases(&caller).await;
        Ok(Response::new(answer.map_err(status)?))
    }
}

/// One keepalive stream's caller and the core that judges and renews for it.
struct Keeping {
    core: Arc<Service>,
    caller: Arc<Caller>,
}

impl Renewer for Keeping {
    type Answer = PbLeaseKeepAliveResponse;
    type Upstream = Forwarding;

    fn judge(&self, id: i64) -> BoxFuture<'static, Result<Step<Self::Answer>, tonic::Status>> {
        let (core, caller) = (self.core.clone(), self.caller.clone());
        async move {
            match core.judge_keep_alive(&caller, id).await.map_err(status)? {
                Judged::Ours => Ok(Step::Renew(id)),
                Judged::Answer(answer) => Ok(Step::Answer(answer)),
            }
        }
        .boxed()
    }

    fn open(&self, id: i64) -> BoxFuture<'static, Open<Forwarding>> {
        let (core, caller) = (self.core.clone(), self.caller.clone());
        async move {
            match core.open_keep_alive(&caller, id).await {
                Some((Opened::Stream(own), slot)) => Open::Stream(Forwarding {
                    own,
                    _slot: slot,
                    core,
                }),
                Some((Opened::Gone, _)) => Open::Gone,
                Some((Opened::Failed, _)) | None => Open::Failed,
            }
        }
        .boxed()
    }

    fn renew(&self, id: i64) -> BoxFuture<'static, Result<Self::Answer, tonic::Status>> {
        let core = self.core.clone();
        async move { core.renew_ours(id).await.map_err(status) }.boxed()
    }
}

/// A keepalive stream's own etcd stream, its answers as the core gives them.
struct Forwarding {
    own: Box<Own>,
    /// Held while open ([`Service::open_keep_alive`]).
    _slot: Slot,
    core: Arc<Service>,
}

impl Upstream for Forwarding {
    type Answer = PbLeaseKeepAliveResponse;

    fn send(&mut self, id: i64) -> bool {
        self.own.send(id)
    }

    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Option<(i64, Self::Answer)>> {
        let core = &self.core;
        self.own
            .poll_renewed(cx)
            .map(|renewed| renewed.map(|(id, r)| (id, core.renewed(id, r))))
    }
}
