//! `etcdserverpb.Watch`: the bidirectional watch stream through the core
//! ([`crate::v3::Service::watch`]), confined to the caller's namespace; the core takes the
//! stream's event-stream slot with its first create.

use etcd_client::proto::{PbWatchRequest, PbWatchResponse, PbWatchService};
use futures::stream::{BoxStream, StreamExt};
use tonic::{Request, Response, Streaming};

use super::{status, Front};
use crate::v3::{Status, WatchRequests};

type Answer<T> = Result<Response<T>, tonic::Status>;

#[tonic::async_trait]
impl PbWatchService for Front {
    type WatchStream = BoxStream<'static, Result<PbWatchResponse, tonic::Status>>;

    async fn watch(&self, req: Request<Streaming<PbWatchRequest>>) -> Answer<Self::WatchStream> {
        let caller = self.caller(&req)?;
        let requests: WatchRequests = req
            .into_inner()
            .map(|r| r.map_err(|s| Status::from_grpc(s.code() as i32, s.message().to_owned())))
            .boxed();
        let answers = self.core().watch(caller, requests);
        Ok(Response::new(answers.map(|a| a.map_err(status)).boxed()))
    }
}
