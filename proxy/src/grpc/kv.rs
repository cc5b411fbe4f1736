//! `etcdserverpb.KV`: Range, Put, DeleteRange and Txn through the core; Compact refused, since
//! it would compact the whole cluster, every tenant's history with it.

use etcd_client::proto::{
    PbCompactionRequest, PbCompactionResponse, PbDeleteRequest, PbDeleteResponse, PbKvService,
    PbPutRequest, PbPutResponse, PbRangeRequest, PbRangeResponse, PbRangeStreamResponse,
    PbTxnRequest, PbTxnResponse,
};
use futures::stream::BoxStream;
use tonic::{Request, Response};

use super::{status, Front};
use crate::etcdapi::Status;

type Answer<T> = Result<Response<T>, tonic::Status>;

#[tonic::async_trait]
impl PbKvService for Front {
    async fn range(&self, req: Request<PbRangeRequest>) -> Answer<PbRangeResponse> {
        let caller = self.caller(&req)?;
        let range = req.into_inner().try_into().map_err(status)?;
        let answer = self.core().range(&caller, range).await.map_err(status)?;
        Ok(Response::new(answer))
    }

    type RangeStreamStream = BoxStream<'static, Result<PbRangeStreamResponse, tonic::Status>>;

    /// Present on etcd's main branch only (no release serves it); clients fall back to Range.
    async fn range_stream(&self, _: Request<PbRangeRequest>) -> Answer<Self::RangeStreamStream> {
        Err(tonic::Status::unimplemented(
            "lease-proxy: KV.RangeStream is not served",
        ))
    }

    async fn put(&self, req: Request<PbPutRequest>) -> Answer<PbPutResponse> {
        let caller = self.caller(&req)?;
        let answer = self.core().put(&caller, req.into_inner().into()).await;
        Ok(Response::new(answer.map_err(status)?))
    }

    async fn delete_range(&self, req: Request<PbDeleteRequest>) -> Answer<PbDeleteResponse> {
        let caller = self.caller(&req)?;
        let answer = self
            .core()
            .delete_range(&caller, req.into_inner().into())
            .await;
        Ok(Response::new(answer.map_err(status)?))
    }

    async fn txn(&self, req: Request<PbTxnRequest>) -> Answer<PbTxnResponse> {
        let caller = self.caller(&req)?;
        let txn = req.into_inner().try_into().map_err(status)?;
        let answer = self.core().txn(&caller, txn).await.map_err(status)?;
        Ok(Response::new(answer))
    }

    async fn compact(&self, _: Request<PbCompactionRequest>) -> Answer<PbCompactionResponse> {
        Err(status(Status::cluster_wide()))
    }
}
