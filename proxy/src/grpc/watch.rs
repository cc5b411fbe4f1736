//! `etcdserverpb.Watch`: the bidirectional watch stream through the core
//! ([`crate::v3::Service::watch`]), confined to the caller's namespace. Each stream holds one of
//! the replica's event-stream slots (`--max-watch-streams`, per principal
//! `--quota-watch-streams`), as a `/v1/watch` stream does, since each is an etcd watch stream.

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
        let slot = self
            .app
            .watch_slots
            .take(self.principal(&req).as_deref())
            .map_err(|e| status(Status::from(e)))?;
        let requests: WatchRequests = req
            .into_inner()
            .map(|r| r.map_err(|s| Status::from_grpc(s.code() as i32, s.message().to_owned())))
            .boxed();
        let stopping = self.app.leases.stopping().clone();
        let answers = self.core().watch(caller, requests, stopping);
        // The slot goes with the stream.
        let answers = answers.map(move |answer| {
            let _held = &slot;
            answer.map_err(status)
        });
        Ok(Response::new(answers.boxed()))
    }
}
