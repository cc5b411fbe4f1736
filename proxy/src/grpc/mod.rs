//! etcd's gRPC API on the proxy's own listener (docs/DESIGN.md §5.2): HTTP/2 requests with
//! `content-type: application/grpc…` go to etcd's services, everything else to the HTTP routes,
//! as etcd serves gRPC and HTTP on one client port ([`front`]).
//!
//! A second front over the `/v3` core ([`crate::v3::Service`]): tonic decodes etcd's protobuf
//! messages, the core checks, confines (namespace both ways, leases per principal) and calls
//! etcd under `--etcd-timeout`, and its [`Status`] becomes a `tonic::Status` in one place
//! ([`status`]) — the codes and messages etcd gives, which Go clients match by text. Callers are
//! judged as `/v3` JSON judges them ([`crate::api::etcd_principal`]), before any service runs.
//!
//! One file per etcd service, as etcd's `v3rpc` has them: `kv.rs`, `lease.rs`, `cluster.rs`
//! (Cluster and Maintenance, what clients call at connect time). Not served yet: Watch, Lock,
//! Election, Auth (answered Unimplemented, as for any unknown service).

mod cluster;
mod kv;
mod lease;

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Version};
use axum::response::{IntoResponse, Response};
use axum::Router;
use etcd_client::proto::{PbClusterServer, PbKvServer, PbLeaseServer, PbMaintenanceServer};
use futures::future::BoxFuture;
use tonic::service::Routes;

use crate::api::{etcd_principal, AppState};
use crate::v3::{Caller, Service, Status};

/// The etcd services, each holding the proxy's state.
#[derive(Clone)]
struct Front {
    app: Arc<AppState>,
}

/// A gRPC call judged before it reaches a service, carried in its extensions.
#[derive(Clone)]
struct Judged {
    /// Whom it is served for: the principal, `None` with authentication off.
    principal: Option<String>,
    /// The proxy's URL as the client called it (scheme and authority).
    url: String,
}

impl Front {
    /// The core every service calls.
    fn core(&self) -> &Service {
        self.app.v3.core()
    }

    /// The caller of `req`, as `/v3` JSON builds it; refused if [`front`] did not judge it
    /// (which cannot happen: every gRPC request goes through it).
    fn caller<T>(&self, req: &tonic::Request<T>) -> Result<Caller, tonic::Status> {
        let judged = req
            .extensions()
            .get::<Judged>()
            .ok_or_else(|| tonic::Status::internal("lease-proxy: gRPC call not authorised"))?;
        Ok(self.core().caller(judged.principal.as_deref()))
    }
}

/// A refusal or failure of the core, as etcd's gRPC server gives it: etcd's code and message.
/// The only place a gRPC status is made from one.
fn status(s: Status) -> tonic::Status {
    tonic::Status::new(tonic::Code::from_i32(s.code()), s.message())
}

/// `http` with etcd's gRPC services beside it on the same listener.
pub(crate) fn front(app: Arc<AppState>, http: Router) -> Router {
    let limit = app.body.bytes;
    let services = Front { app: app.clone() };
    let grpc = Routes::new(PbKvServer::new(services.clone()).max_decoding_message_size(limit))
        .add_service(PbLeaseServer::new(services.clone()).max_decoding_message_size(limit))
        .add_service(PbClusterServer::new(services.clone()).max_decoding_message_size(limit))
        .add_service(PbMaintenanceServer::new(services).max_decoding_message_size(limit))
        .prepare();
    Router::new().fallback_service(Dispatch { app, http, grpc })
}

/// Routes each request to gRPC or HTTP.
#[derive(Clone)]
struct Dispatch {
    app: Arc<AppState>,
    http: Router,
    grpc: Routes,
}

/// Whether `req` is a gRPC call: HTTP/2 with a gRPC content type (`application/grpc`,
/// `application/grpc+proto`…). Anything else is the HTTP routes', whatever its path.
fn is_grpc(req: &Request<Body>) -> bool {
    req.version() == Version::HTTP_2
        && req
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl tower::Service<Request<Body>> for Dispatch {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        // Both are always ready (a Router and tonic's Routes are).
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        use tower::ServiceExt;
        if !is_grpc(&req) {
            let http = self.http.clone();
            return Box::pin(async move { http.oneshot(req).await });
        }
        let (app, grpc) = (self.app.clone(), self.grpc.clone());
        Box::pin(async move {
            match etcd_principal(&app, &credentials(&req), req.extensions()) {
                Ok(principal) => {
                    let url = called_url(&req);
                    req.extensions_mut().insert(Judged { principal, url });
                    Ok(grpc.oneshot(req).await.into_response())
                }
                Err(e) => Ok(status(Status::from(e)).into_http::<Body>()),
            }
        })
    }
}

/// The request's headers with etcd's `token` metadata read as a bearer token when there is no
/// `authorization` (Go's clientv3 sends its auth token so); one credential, else the headers as
/// they are (two credentials are refused by the token check).
fn credentials(req: &Request<Body>) -> axum::http::HeaderMap {
    let mut headers = req.headers().clone();
    if headers.contains_key(header::AUTHORIZATION) {
        return headers;
    }
    let token = headers.get("token").and_then(|t| t.to_str().ok());
    if let Some(value) = token.and_then(|t| HeaderValue::from_str(&format!("Bearer {t}")).ok()) {
        headers.insert(header::AUTHORIZATION, value);
    }
    headers
}

/// The URL the client called: the request's scheme (`http` for h2c) and authority.
fn called_url(req: &Request<Body>) -> String {
    let uri = req.uri();
    let scheme = uri.scheme_str().unwrap_or("http");
    let authority = uri.authority().map_or("", |a| a.as_str());
    format!("{scheme}://{authority}")
}
