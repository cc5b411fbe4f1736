//! `v3electionpb.Election`: Campaign, Proclaim, Leader, Observe (server streaming) and Resign
//! through the core's election ([`crate::etcdapi::Service::campaign`] and the rest), which jetcd's
//! election client calls. A Campaign answer carries the leader's fencing token in its response
//! metadata, `fencing-token` and `fencing-resource`, as a Lock answer does.
//!
//! Served by hand ([`super::manual`]): etcd-client builds this server but does not export it;
//! the requests are v3election.proto's messages, the answers etcd-client's.

use etcd_client::proto::{
    PbCampaignResponse, PbLeaderKey, PbLeaderResponse, PbProclaimResponse, PbResignResponse,
};
use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt};
use tonic::{Request, Response};

use super::manual::{
    server_streaming, unary, unimplemented, Answer, HttpRequest, HttpResponse, Methods,
};
use super::{fencing_metadata, status, Front};

/// `v3electionpb.CampaignRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct CampaignRequest {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(int64, tag = "2")]
    lease: i64,
    #[prost(bytes = "vec", tag = "3")]
    value: Vec<u8>,
}

/// `v3electionpb.ProclaimRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct ProclaimRequest {
    #[prost(message, optional, tag = "1")]
    leader: Option<PbLeaderKey>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `v3electionpb.LeaderRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct LeaderRequest {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
}

/// `v3electionpb.ResignRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct ResignRequest {
    #[prost(message, optional, tag = "1")]
    leader: Option<PbLeaderKey>,
}

type Observed = BoxStream<'static, Result<PbLeaderResponse, tonic::Status>>;

impl Front {
    async fn campaign(self, req: Request<CampaignRequest>) -> Answer<PbCampaignResponse> {
        let caller = self.caller(&req)?;
        let CampaignRequest { name, lease, value } = req.into_inner();
        let elected = self.core().campaign(&caller, name, lease, value).await;
        let elected = elected.map_err(status)?;
        let mut answer = Response::new(elected.response);
        fencing_metadata(&mut answer, elected.fencing_token, elected.fencing_resource)?;
        Ok(answer)
    }

    async fn proclaim(self, req: Request<ProclaimRequest>) -> Answer<PbProclaimResponse> {
        let caller = self.caller(&req)?;
        let ProclaimRequest { leader, value } = req.into_inner();
        let answer = self.core().proclaim(&caller, leader, value).await;
        Ok(Response::new(answer.map_err(status)?))
    }

    async fn leader(self, req: Request<LeaderRequest>) -> Answer<PbLeaderResponse> {
        let caller = self.caller(&req)?;
        let answer = self.core().leader(&caller, &req.into_inner().name).await;
        Ok(Response::new(answer.map_err(status)?))
    }

    async fn observe(self, req: Request<LeaderRequest>) -> Answer<Observed> {
        let caller = self.caller(&req)?;
        let name = req.into_inner().name;
        let answers = self.core().observe(caller, name).map_err(status)?;
        Ok(Response::new(answers.map(|a| a.map_err(status)).boxed()))
    }

    async fn resign(self, req: Request<ResignRequest>) -> Answer<PbResignResponse> {
        let caller = self.caller(&req)?;
        let answer = self.core().resign(&caller, req.into_inner().leader).await;
        Ok(Response::new(answer.map_err(status)?))
    }
}

/// The Election service.
pub(super) struct ElectionService;

impl Methods for ElectionService {
    const NAME: &'static str = "v3electionpb.Election";

    fn call(f: Front, limit: usize, req: HttpRequest) -> BoxFuture<'static, HttpResponse> {
        match req.uri().path() {
            "/v3electionpb.Election/Campaign" => {
                Box::pin(unary(limit, req, move |r| f.clone().campaign(r)))
            }
            "/v3electionpb.Election/Proclaim" => {
                Box::pin(unary(limit, req, move |r| f.clone().proclaim(r)))
            }
            "/v3electionpb.Election/Leader" => {
                Box::pin(unary(limit, req, move |r| f.clone().leader(r)))
            }
            "/v3electionpb.Election/Observe" => {
                Box::pin(server_streaming(limit, req, move |r| f.clone().observe(r)))
            }
            "/v3electionpb.Election/Resign" => {
                Box::pin(unary(limit, req, move |r| f.clone().resign(r)))
            }
            _ => unimplemented(),
        }
    }
}
