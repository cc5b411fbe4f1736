//! `etcdserverpb.Lease`: Grant, Revoke, TimeToLive, Leases and the bidirectional KeepAlive,
//! all through the core, so only the caller's own `/v3` leases can be touched.

use std::sync::Arc;

use etcd_client::proto::{
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse,
    PbLeaseLeasesRequest, PbLeaseLeasesResponse, PbLeaseRevokeRequest, PbLeaseRevokeResponse,
    PbLeaseService, PbLeaseTimeToLiveRequest, PbLeaseTimeToLiveResponse,
};
use futures::stream::{BoxStream, StreamExt};
use tonic::{Request, Response, Streaming};

use super::renewals::Renewals;
use super::{status, Front};

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
    /// at once and the requests read ahead ([`Renewals`]: each is an etcd round trip here, where
    /// etcd renews from memory); an unknown (or another tenant's) lease answered with TTL 0. A
    /// reload that removes the caller's principal ends the stream, renewing or not.
    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<PbLeaseKeepAliveRequest>>,
    ) -> Answer<Self::LeaseKeepAliveStream> {
        let caller = Arc::new(self.caller(&req)?);
        let front = self.clone();
        let requests = req.into_inner().map(|request| request.map(|r| r.id));
        let requests = caller.while_authorised(requests, status);
        let answers = Renewals::new(requests, move |id| {
            let (front, caller) = (front.clone(), caller.clone());
            async move {
                front
                    .core()
                    .lease_keep_alive(&caller, id)
                    .await
                    .map_err(status)
            }
        });
        Ok(Response::new(answers.boxed()))
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
