//! `v3lockpb.Lock`: Lock and Unlock through the core's lock ([`crate::etcdapi::Service::lock`]),
//! which jetcd and etcd's own gateway call. A Lock answer carries the lock's fencing token in
//! its response metadata, `fencing-token` and `fencing-resource` (the domain of
//! `/v3/lock/lock`'s `Fencing-Token` and `Fencing-Resource` headers).
//!
//! etcd-client builds this service's server but does not export it, so it is served here by
//! hand: the two messages the requests are (`LockRequest`, `UnlockRequest`, as v3lock.proto has
//! them), and a router from the two method paths to tonic's unary call handling.

use etcd_client::proto::{PbLockResponse, PbUnlockResponse};
use futures::future::BoxFuture;
use tonic::{Request, Response};

use super::manual::{unary, unimplemented, Answer, HttpRequest, HttpResponse, Methods};
use super::{fencing_metadata, status, Front};
use crate::etcdapi::Lock;

/// `v3lockpb.LockRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct LockRequest {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(int64, tag = "2")]
    lease: i64,
}

/// `v3lockpb.UnlockRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct UnlockRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
}

impl Front {
    async fn lock(self, req: Request<LockRequest>) -> Answer<PbLockResponse> {
        let caller = self.caller(&req)?;
        let LockRequest { name, lease } = req.into_inner();
        let locked = self.core().lock(&caller, Lock { name, lease }).await;
        let locked = locked.map_err(status)?;
        let mut answer = Response::new(locked.response);
        fencing_metadata(&mut answer, locked.fencing_token, locked.fencing_resource)?;
        Ok(answer)
    }

    async fn unlock(self, req: Request<UnlockRequest>) -> Answer<PbUnlockResponse> {
        let caller = self.caller(&req)?;
        let key = req.into_inner().key;
        let answer = self.core().unlock(&caller, key).await;
        Ok(Response::new(answer.map_err(status)?))
    }
}

/// The Lock service: its two methods, each a unary call.
pub(super) struct LockService;

impl Methods for LockService {
    const NAME: &'static str = "v3lockpb.Lock";

    fn call(f: Front, limit: usize, req: HttpRequest) -> BoxFuture<'static, HttpResponse> {
        match req.uri().path() {
            "/v3lockpb.Lock/Lock" => Box::pin(unary(limit, req, move |r| f.clone().lock(r))),
            "/v3lockpb.Lock/Unlock" => Box::pin(unary(limit, req, move |r| f.clone().unlock(r))),
            _ => unimplemented(),
        }
    }
}
