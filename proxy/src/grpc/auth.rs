//! `etcdserverpb.Auth`: `Authenticate` as etcd answers it, so clients configured with a user and
//! password work. With authentication off: `FailedPrecondition "etcdserver: authentication is
//! not enabled"`, which Go's clientv3 reads as "go on without a token". With `--auth-tokens`:
//! the user is a principal's name and the password its bearer token; the token etcd would mint
//! is that bearer token itself (the client already holds it), which the client then sends as
//! `token` metadata and the proxy reads as a bearer token; a refused name or password is counted
//! and audited as any refused credential. `AuthStatus` answers whether
//! authentication is on. Every other method changes or reads cluster-wide users and roles (the
//! lists too, which etcd without auth would answer: they name other tenants'): PermissionDenied,
//! as etcd refuses a user without the root role.
//!
//! Served by hand ([`super::manual`]): etcd-client does not export the AuthStatus messages.

use etcd_client::proto::{PbAuthenticateRequest, PbAuthenticateResponse, PbResponseHeader};
use futures::future::BoxFuture;
use tonic::{Request, Response};

use super::manual::{unary, Answer, HttpRequest, HttpResponse, Methods};
use super::{status, Front};
use crate::auth::Op;
use crate::etcdapi::{Code, Status};

/// The method served without judging its caller first: it is how a caller gets credentials.
pub(super) const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";

/// etcd's refusal of a user and password it does not know.
const AUTH_FAILED: &str = "etcdserver: authentication failed, invalid user ID or password";

/// `etcdserverpb.AuthStatusRequest` (no fields).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct AuthStatusRequest {}

/// `etcdserverpb.AuthStatusResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct AuthStatusResponse {
    #[prost(message, optional, tag = "1")]
    header: Option<PbResponseHeader>,
    #[prost(bool, tag = "2")]
    enabled: bool,
    #[prost(uint64, tag = "3")]
    auth_revision: u64,
}

impl Front {
    async fn authenticate(
        self,
        req: Request<PbAuthenticateRequest>,
    ) -> Answer<PbAuthenticateResponse> {
        let Some(auth) = self.judge.auth() else {
            return Err(status(Status::new(
                Code::FailedPrecondition,
                "etcdserver: authentication is not enabled",
            )));
        };
        let (metadata, _, req) = req.into_parts();
        let PbAuthenticateRequest { name, password } = req;
        let principal = auth.principal_of_token(&password);
        // The name must be the token's principal's; anything else is etcd's one refusal,
        // whichever part was wrong — counted and audited as any refused credential. A principal
        // without the etcd API's permission is let in, as etcd lets in a user without roles:
        // its calls are then refused `permission denied`, which says what is missing.
        if principal.is_none_or(|p| p.name != name) {
            self.judge.unauthenticated(metadata.as_ref(), Op::V3, None);
            return Err(status(Status::invalid(AUTH_FAILED)));
        }
        let header = self.etcd.header().await.map_err(|e| status(e.into()))?;
        Ok(Response::new(PbAuthenticateResponse {
            header: Some(header.into()),
            token: password,
        }))
    }

    async fn auth_status(self, _: Request<AuthStatusRequest>) -> Answer<AuthStatusResponse> {
        let header = self.etcd.header().await.map_err(|e| status(e.into()))?;
        Ok(Response::new(AuthStatusResponse {
            header: Some(header.into()),
            enabled: self.judge.auth().is_some(),
            auth_revision: 0,
        }))
    }
}

/// The Auth service.
pub(super) struct AuthService;

impl Methods for AuthService {
    const NAME: &'static str = "etcdserverpb.Auth";

    fn call(f: Front, limit: usize, req: HttpRequest) -> BoxFuture<'static, HttpResponse> {
        match req.uri().path() {
            AUTHENTICATE => Box::pin(unary(limit, req, move |r| f.clone().authenticate(r))),
            "/etcdserverpb.Auth/AuthStatus" => {
                Box::pin(unary(limit, req, move |r| f.clone().auth_status(r)))
            }
            _ => Box::pin(async { status(Status::cluster_wide()).into_http() }),
        }
    }
}
