//! The HTTP surface: routes, shared state, and the problem+json mapping.

mod authz;
mod body;
mod forward;
mod leases;
mod ops;
mod problem;
mod rate;
mod sessions;
mod watch;

use std::any::Any;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;

pub(crate) use body::{BodyLimits, SECRET_HEADER};
pub(crate) use problem::BEARER_CHALLENGE;
pub use problem::PROBLEM_BASE;
pub(crate) use rate::AcquireRate;

use crate::etcd::Etcd;
use crate::lease::Leases;
use crate::Error;

/// What every handler shares.
pub(crate) struct AppState {
    /// The lease service.
    pub(crate) leases: Leases,
    /// etcd, for readiness.
    pub(crate) etcd: Etcd,
    /// The key read by `/readyz`.
    pub(crate) readiness_key: String,
    /// Largest request body, and how long it may take to arrive.
    pub(crate) body: body::BodyLimits,
    /// Where holders' writes are forwarded, if anywhere.
    pub(crate) upstream: Option<crate::forward::Upstream>,
    /// Largest forwarded request body.
    pub(crate) max_forward_bytes: usize,
    /// etcd's JSON API, namespaced.
    pub(crate) v3: crate::v3::V3,
    /// The token table, when `--auth-tokens` is given; `None`: anyone may call.
    pub(crate) auth: Option<Arc<crate::auth::Auth>>,
    /// Acquires a second per principal on this replica (`--quota-acquire-rate`).
    pub(crate) acquire_rate: Option<AcquireRate>,
    /// The audit log (a no-op without `--audit-log`).
    pub(crate) audit: crate::audit::Audit,
    /// Slots for event streams (`--max-watch-streams`).
    pub(crate) watch_streams: Arc<tokio::sync::Semaphore>,
    /// Their number.
    pub(crate) max_watch_streams: usize,
    /// Their longest life (`--watch-max-duration`, ±10 %).
    pub(crate) watch_max_duration: std::time::Duration,
    /// Set when SIGTERM arrives: `/readyz` answers 503 from then on.
    pub(crate) draining: AtomicBool,
}

/// The router with every route and the cross-cutting layers.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    let router = Router::new()
        .route("/v1/leases", get(leases::list))
        .route(
            "/v1/leases/{resource}",
            post(leases::acquire)
                .get(leases::get)
                .delete(leases::release),
        )
        .route("/v1/leases/{resource}/renew", post(leases::renew))
        .route("/v1/watch", get(watch::watch))
        .route("/v1/sessions", post(sessions::open))
        .route(
            "/v1/sessions/{id}",
            get(sessions::get).delete(sessions::close),
        )
        .route("/v1/sessions/{id}/keepalive", post(sessions::keepalive))
        .route("/v1/leases/{resource}/forward", any(forward::forward))
        .route(
            "/v1/leases/{resource}/forward/{*path}",
            any(forward::forward),
        )
        .route("/v3/{*method}", any(v3))
        .route("/v3beta/{*method}", any(v3))
        .route("/v3alpha/{*method}", any(v3))
        .route("/version", any(etcd_version))
        .route("/health", any(etcd_health))
        .route("/livez", get(ops::livez))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .fallback(|| async { Error::NoRoute })
        .method_not_allowed_fallback(|| async { Error::MethodNotAllowed })
        .with_state(state);
    fencing::serve::with_request_ids(router).layer(CatchPanicLayer::custom(panic_response))
}

async fn v3(
    axum::extract::State(app): axum::extract::State<Arc<AppState>>,
    req: axum::http::Request<axum::body::Body>,
) -> Response {
    let target = authz::Target::All;
    let peer = authz::Peer::of(&req);
    let caller = match authz::authorize(&app, req.headers(), &peer, crate::auth::Op::V3, target) {
        Ok(caller) => caller,
        Err(e) => return crate::v3::refusal(e),
    };
    app.v3
        .handle(req, caller.as_deref().map(|p| p.name.as_str()))
        .await
}

/// etcd's `GET /version`, for gateway clients that discover the API path from it.
async fn etcd_version(
    axum::extract::State(app): axum::extract::State<Arc<AppState>>,
    method: axum::http::Method,
) -> Response {
    app.v3.version(&method).await
}

/// etcd's `GET /health`.
async fn etcd_health(
    axum::extract::State(app): axum::extract::State<Arc<AppState>>,
    method: axum::http::Method,
) -> Response {
    app.v3.health(&method).await
}

/// A panic is a bug; the client still gets a problem+json 500 and the process keeps serving.
fn panic_response(_: Box<dyn Any + Send + 'static>) -> Response {
    tracing::error!("handler panicked");
    let body = serde_json::json!({
        "type": format!("{PROBLEM_BASE}internal"),
        "title": "Internal error",
        "status": 500,
        "detail": "the proxy hit an internal error",
    });
    (
        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        [(axum::http::header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}
