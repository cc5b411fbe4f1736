//! The HTTP surface: routes, shared state, and the problem+json mapping.

mod authz;
mod body;
mod fleets;
mod forward;
mod leases;
mod openapi;
mod ops;
mod preamble;
mod problem;
mod progress;
mod rate;
mod schemas;
mod sessions;
mod ui;
mod watch;

use std::any::Any;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::response::Response;
use axum::routing::any;
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(crate) use crate::lease::WatchSlots;
pub(crate) use body::BodyLimits;
pub(crate) use rate::AcquireRate;
pub(crate) use ui::Ui;

use crate::etcd::Etcd;
use crate::lease::Leases;
use crate::Error;

/// What every handler shares.
pub(crate) struct AppState {
    /// The lease service.
    pub(crate) leases: Leases,
    /// The fleet service.
    pub(crate) fleets: crate::fleet::Fleets,
    /// etcd, for readiness.
    pub(crate) etcd: Etcd,
    /// The key read by `/readyz`.
    pub(crate) readiness_key: String,
    /// Largest request body, and how long it may take to arrive.
    pub(crate) body: body::BodyLimits,
    /// Where holders' writes are forwarded, if anywhere.
    pub(crate) upstream: Option<crate::upstream::Upstream>,
    /// Largest forwarded request body.
    pub(crate) max_forward_bytes: usize,
    /// The token table, when `--auth-tokens` is given; `None`: anyone may call.
    pub(crate) auth: Option<Arc<crate::auth::Auth>>,
    /// Judges who calls against `auth`, counting and auditing each verdict.
    pub(crate) judge: crate::auth::Judge,
    /// Acquires a second per principal on this replica (`--quota-acquire-rate`).
    pub(crate) acquire_rate: Option<AcquireRate>,
    /// The audit log (a no-op without `--audit-log`).
    pub(crate) audit: crate::audit::Audit,
    /// Slots for event streams (`--max-watch-streams`, `--quota-watch-streams`).
    pub(crate) watch_slots: Arc<WatchSlots>,
    /// Their longest life (`--watch-max-duration`, ±10 %).
    pub(crate) watch_max_duration: std::time::Duration,
    /// How long a stream waits on a reader that takes nothing before it ends
    /// (`--client-write-timeout`).
    pub(crate) watch_write_timeout: std::time::Duration,
    /// Set when SIGTERM arrives: `/readyz` answers 503 from then on.
    pub(crate) draining: AtomicBool,
    /// What the dashboard needs (the enforcer whose feed it relays).
    pub(crate) ui: ui::Ui,
    /// `/openapi.json`, rendered at its first request (`None`: it could not be).
    pub(crate) openapi: std::sync::OnceLock<Option<String>>,
}

/// The router with every route — `/v1`'s and `others` (the `/v3` JSON gateway's, which have
/// their own state and are left out of the OpenAPI document: their shapes are etcd's gateway's)
/// — and the cross-cutting layers.
pub(crate) fn router(state: Arc<AppState>, others: Router) -> Router {
    let (router, _) = routes().split_for_parts();
    let router = router
        // The dashboard: HTML, served and left out of the document.
        .route("/ui", axum::routing::get(ui::page))
        .route("/ui/", axum::routing::get(ui::page))
        .route("/ui/enforcer", axum::routing::get(ui::enforcer))
        .route("/ui/{file}", axum::routing::get(ui::file))
        .fallback(|| async { Error::NoRoute })
        .method_not_allowed_fallback(|| async { Error::MethodNotAllowed })
        .with_state(state)
        .merge(others);
    runtime::serve::with_request_ids(router).layer(CatchPanicLayer::custom(panic_response))
}

/// The documented routes, each registered from its handler's `#[utoipa::path]` annotation (its
/// path and methods), so the OpenAPI document lists exactly what they serve.
fn routes() -> OpenApiRouter<Arc<AppState>> {
    let mut router = OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(leases::list))
        .routes(routes!(leases::acquire, leases::get, leases::release))
        .routes(routes!(leases::renew))
        .routes(routes!(sessions::open))
        .routes(routes!(sessions::get, sessions::close))
        .routes(routes!(sessions::keepalive))
        .routes(routes!(fleets::put, fleets::get, fleets::delete))
        .routes(routes!(fleets::join))
        .routes(routes!(fleets::member, fleets::evict))
        .routes(routes!(fleets::drain))
        .routes(routes!(watch::watch))
        .routes(routes!(ops::livez))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(openapi::serve));
    // Forwarding takes every method, extension methods included (`any`), and the rest of the
    // path as one wildcard, which OpenAPI writes `{path}` and axum `{*path}`.
    for (route, (schemas, paths, _), handler) in [
        (
            "/v1/leases/{resource}/forward",
            routes!(forward::forward_root),
            any(forward::forward_root),
        ),
        (
            "/v1/leases/{resource}/forward/{*path}",
            routes!(forward::forward),
            any(forward::forward),
        ),
    ] {
        let doc = router.get_openapi_mut();
        doc.paths.paths.extend(paths.paths);
        doc.components
            .get_or_insert_with(Default::default)
            .schemas
            .extend(schemas);
        router = router.route(route, handler);
    }
    router
}

/// The OpenAPI document of [`router`]'s documented routes, with this proxy's limits.
fn document(limits: crate::lease::Limits) -> serde_json::Result<serde_json::Value> {
    openapi::finish(routes().into_openapi(), limits)
}

/// A panic is a bug; the client still gets a problem+json 500 and the process keeps serving.
fn panic_response(_: Box<dyn Any + Send + 'static>) -> Response {
    tracing::error!("handler panicked");
    internal_error()
}

/// The problem+json 500 of a bug.
fn internal_error() -> Response {
    let kind = problem::Kind::Internal;
    runtime::problem::response(
        kind.status(),
        kind.slug(),
        kind.title(),
        "the proxy hit an internal error",
        None,
    )
}
