//! fence-gateway: a reverse proxy in front of an HTTP storage service that enforces fencing on
//! every write (docs/DESIGN.md §4, §5.3). Reads pass through; `POST /fence/{resource}` raises a
//! mark without a write (pre-fence); `/livez`, `/readyz`, `/metrics` and `/openapi.json` are
//! answered by the gateway itself and shadow upstream paths of the same name.

mod config;
mod entry;
mod forward;
mod openapi;

pub use crate::layer::strip_hop_by_hop;
#[cfg(feature = "negative-controls")]
pub use config::NegativeControl;
pub use config::{GatewayConfig, GatewayConfigError};
pub use entry::main;
pub use forward::Forwarder;

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use http::Request;
use http_body_util::Limited;
use opentelemetry::metrics::Meter;
use opentelemetry::KeyValue;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::layer::problem;
use crate::layer::{
    ByHeader, Classify, Decision, Fence, FencingLayer, Outcomes, PathPattern, Rejection,
};
use crate::store::StoreLatency;
use crate::{Admission, Keys};
use runtime::reload::Reloads;
use runtime::telemetry::Metrics;
use runtime::tls::PeerCertificate;

/// Why the gateway could not start or serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] GatewayConfigError),
    /// The key file is unusable.
    #[error(transparent)]
    Keys(#[from] crate::Error),
    /// The metrics could not be set up.
    #[error("metrics: {0}")]
    Metrics(#[source] runtime::Error),
    /// The mark store cannot be opened.
    #[error(transparent)]
    Store(#[from] crate::StoreError),
    /// A TLS certificate, key or CA file is unusable.
    #[error("TLS: {0}")]
    Tls(#[source] runtime::Error),
    /// Serving failed.
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
}

struct Shared {
    fence: Fence<dyn Admission>,
    draining: AtomicBool,
    metrics: Metrics,
    /// Who may pre-fence (client certificate names); empty: anyone.
    fence_principals: Vec<String>,
    /// The pre-fence route as a path-mode pattern: its resource is taken as a write's is.
    prefence_path: PathPattern,
}

/// How the gateway tells which writes are protected: a path pattern if configured, else the
/// `Fencing-Resource` header.
#[derive(Clone)]
enum Resources {
    Header,
    Path(PathPattern),
}

impl<B> Classify<B> for Resources {
    fn classify(&self, req: &Request<B>) -> Decision {
        match self {
            Resources::Header => ByHeader.classify(req),
            Resources::Path(p) => p.classify(req),
        }
    }
}

/// Serves the gateway on `listener` until `shutdown` resolves, then drains.
pub async fn run(
    listener: TcpListener,
    config: GatewayConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), GatewayError> {
    config.validate()?;
    let keys = Keys::load(config.key_file()?)?;
    let tasks = tokio_util::task::TaskTracker::new();
    let background = CancellationToken::new();
    // However `run` returns (a failed start included), the background tasks are told to stop.
    let _stop_background = background.clone().drop_guard();
    let metrics = Metrics::new("fence-gateway").map_err(GatewayError::Metrics)?;
    let reloads = Reloads::new(&metrics.meter(), "fence.reloads");
    // Watched from the start, so SIGHUP (whose default action ends the process) is handled
    // from here on, while the store is still being opened too.
    keys.watch(&reloads, &tasks, background.clone());
    let latency = StoreLatency::new(&metrics.meter());
    let fence: Fence<dyn Admission> =
        Fence::new(keys.clone(), config.open_admission(latency).await?);
    count_outcomes(&metrics.meter(), fence.outcomes.clone());
    let upstream = config
        .upstream()?
        .parse()
        .map_err(|e| GatewayConfigError(format!("--upstream: {e}")))?;
    let forwarder = Forwarder::new(upstream, config.upstream_timeout, &config.upstream_tls())
        .map_err(GatewayError::Tls)?;
    let tls = config
        .server_tls()
        .map(|files| runtime::tls::ServerTls::load(files).map(Arc::new))
        .transpose()
        .map_err(GatewayError::Tls)?;
    if let Some(tls) = &tls {
        tls.watch(&reloads, &tasks, background.clone());
    }
    let shared = Arc::new(Shared {
        fence: fence.clone(),
        draining: AtomicBool::new(false),
        metrics,
        fence_principals: config.fence_principals.clone(),
        prefence_path: PathPattern::parse(PREFENCE_PATTERN)
            .ok_or_else(|| GatewayConfigError(format!("{PREFENCE_PATTERN}: not a pattern")))?,
    });
    let app = app(&config, fence, forwarder, shared.clone())?;

    // Credentials in URLs redacted, as `--print-config` shows them.
    tracing::info!(
        listen = %listener.local_addr()?,
        https = tls.is_some(),
        upstream = %runtime::cli::redact_url(config.upstream()?),
        store = %runtime::cli::redact_url(&config.store),
        "fence-gateway serving"
    );
    let served = runtime::serve::until_shutdown(
        runtime::serve::Listener { tcp: listener, tls },
        runtime::serve::with_request_ids(app),
        shutdown,
        &shared.draining,
        CancellationToken::new(),
        config.drain(),
        config.connection_limits(),
    )
    .await;
    background.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(served?)
}

/// The gateway's routes, and every other request fenced and forwarded to the upstream.
fn app(
    config: &GatewayConfig,
    fence: Fence<dyn Admission>,
    forwarder: Forwarder,
    shared: Arc<Shared>,
) -> Result<axum::Router, GatewayError> {
    let classify = match &config.resource_path {
        Some(p) => Resources::Path(
            PathPattern::parse(p).ok_or_else(|| GatewayConfigError("--resource-path".into()))?,
        ),
        None => Resources::Header,
    };
    let max_body = config.max_body_bytes;
    let proxy = tower::service_fn(move |req: Request<Body>| {
        let forwarder = forwarder.clone();
        async move { Ok::<_, Infallible>(forwarder.forward(req).await) }
    });
    let layer = FencingLayer::new(fence, classify).with_exchange_deadline(config.upstream_timeout);
    #[cfg(feature = "negative-controls")]
    let layer = broken_layer(layer, config.negative_control);
    let protected = tower::ServiceBuilder::new()
        .map_request(move |req: Request<Body>| limit_body(req, max_body))
        .layer(layer)
        .service(proxy);
    let (app, _) = routes().split_for_parts();
    Ok(app.with_state(shared).fallback_service(
        tower::ServiceBuilder::new()
            .layer(axum::middleware::from_fn(
                move |req: Request<Body>, next: axum::middleware::Next| async move {
                    if oversized(req.headers(), max_body) {
                        return problem(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            "body-too-large",
                            "request body too large",
                        );
                    }
                    next.run(req).await
                },
            ))
            .service(protected),
    ))
}

/// The gateway's own routes, each registered from its handler's `#[utoipa::path]` annotation
/// (its path and methods), so the OpenAPI document lists exactly what they serve.
fn routes() -> OpenApiRouter<Arc<Shared>> {
    OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(prefence))
        .routes(routes!(livez))
        .routes(routes!(readyz))
        .routes(routes!(scrape))
        .routes(routes!(feed))
        .routes(routes!(openapi::serve))
}

/// The OpenAPI document of the gateway's own routes.
fn document() -> serde_json::Result<serde_json::Value> {
    openapi::finish(&routes().into_openapi())
}

fn oversized(headers: &HeaderMap, limit: usize) -> bool {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|len| len > limit as u64)
}

/// Streams the body through a limit: a body that turns out larger than declared is cut off.
fn limit_body(req: Request<Body>, limit: usize) -> Request<Body> {
    req.map(|b| Body::new(Limited::new(b, limit)))
}

/// The pre-fence route, as a [`PathPattern`].
const PREFENCE_PATTERN: &str = "/fence/{resource}";

/// `POST /fence/{resource}`: raises the mark to the presented token without a write, so an
/// evicted holder is cut off before the new holder's first write. The resource is read from the
/// raw path exactly as path mode reads a write's (canonical, no encoding, the resource grammar),
/// so a pre-fence can raise no mark that no write could reach.
#[utoipa::path(
    post,
    path = "/fence/{resource}",
    operation_id = "prefence",
    tag = "fencing",
    params(
        ("resource" = String, Path, description = "The resource whose mark to raise", pattern = r"^[A-Za-z0-9](\.?[A-Za-z0-9_:-])*\.?$", min_length = 1, max_length = 200),
        ("Fencing-Token" = String, Header, description = "The signed fencing token, for this resource (`X-Fencing-Token` is accepted too)"),
    ),
    responses(
        (status = 200, description = "The mark is now at least the token", body = openapi::Fenced),
        (status = 400, description = "More than one token, or a resource outside the resource grammar (1–200 bytes of `[A-Za-z0-9._:-]`, starting with a letter or digit, no `..`) or percent-encoded"),
        (status = 401, description = "The token is malformed, forged or from an unknown key"),
        (status = 403, description = "The token is for another resource, a `Fencing-Resource` header names another resource, or the client certificate names no principal allowed to pre-fence"),
        (status = 409, description = "The token is below the mark (which is in `mark`)"),
        (status = 428, description = "No token"),
    ),
    security((), ("client_certificate" = [])),
)]
async fn prefence(State(shared): State<Arc<Shared>>, req: Request<Body>) -> Response {
    if let Some(refusal) = fence_caller(&shared.fence_principals, &req) {
        return refusal;
    }
    let resource = match shared.prefence_path.classify(&req) {
        Decision::Protect(resource) => resource,
        Decision::Reject(refusal) => return refusal.into_response(),
        // Only for reads, and this route serves POST alone.
        Decision::Pass => return Rejection::UnmatchedPath.into_response(),
    };
    let wire = match crate::layer::presented_token(&req) {
        Ok(w) => w.to_owned(),
        Err(r) => return r.into_response(),
    };
    match shared.fence.admit(&resource, &wire).await {
        Ok((token, permit)) => {
            // Nothing was written: the raise alone is complete.
            permit.complete();
            let body = openapi::Fenced {
                resource,
                mark: token.into(),
            };
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        Err(r) => r.into_response(),
    }
}

/// With `--fence-principals`: a refusal unless the request's connection presented a verified
/// client certificate naming one of them (common name or DNS name).
fn fence_caller<B>(allowed: &[String], req: &Request<B>) -> Option<Response> {
    if allowed.is_empty() {
        return None;
    }
    let Some(peer) = req.extensions().get::<PeerCertificate>() else {
        return Some(problem(
            StatusCode::FORBIDDEN,
            "client-certificate-required",
            "this route needs a client certificate naming one of fence-gateway's --fence-principals",
        ));
    };
    let named = peer
        .common_name
        .iter()
        .chain(&peer.dns_names)
        .any(|name| allowed.iter().any(|a| a == name));
    (!named).then(|| {
        problem(
            StatusCode::FORBIDDEN,
            "forbidden",
            "the client certificate names none of fence-gateway's --fence-principals",
        )
    })
}

/// Alive as long as the process serves HTTP.
#[utoipa::path(
    get,
    path = "/livez",
    operation_id = "livez",
    tag = "operations",
    responses((status = 200, description = "`ok`", body = String, content_type = "text/plain")),
)]
async fn livez() -> &'static str {
    "ok"
}

/// Ready when not draining and the mark store can make a raise: its write probe (a small
/// durable write of its own, at most once per [`PROBE_TTL`](crate::store::PROBE_TTL)) succeeds.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    responses(
        (status = 200, description = "`ok`", body = String, content_type = "text/plain"),
        (status = 503, description = "`draining`, or `store unavailable`: the store's write probe failed (a raise would fail)", body = String, content_type = "text/plain"),
    ),
)]
async fn readyz(State(shared): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    if shared.draining.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining");
    }
    if shared.fence.gate.ready().await {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "store unavailable")
    }
}

/// Prometheus text: the enforcer's decisions, the store's latency, the serving.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain")),
)]
async fn scrape(State(shared): State<Arc<Shared>>) -> Response {
    runtime::telemetry::render(&shared.metrics)
}

/// What the enforcer decided lately: see [`crate::layer::Recent`].
#[utoipa::path(
    get,
    path = "/fence-gateway/feed",
    operation_id = "feed",
    tag = "operations",
    params(
        ("after" = Option<String>, Query, description = "Only refusals after this sequence number (the `last` of a previous answer)", pattern = "^[0-9]{1,19}$"),
    ),
    responses(
        (status = 200, description = "The highest token admitted per resource (the 1,024 most recently raised, since this process started) and the latest refusals of a token (at most 256), newest first. Resource names and token numbers only, never a token", body = openapi::FeedDoc),
        (status = 400, description = "A parameter other than `after`, or `after` not a sequence number"),
        (status = 403, description = "With `--fence-principals`: no client certificate, or one naming none of them (the feed names every tenant's resources: lease-proxy reads it for its dashboard and shows each caller only what it may read)"),
    ),
    security((), ("client_certificate" = [])),
)]
async fn feed(State(shared): State<Arc<Shared>>, req: Request<Body>) -> Response {
    if let Some(refusal) = fence_caller(&shared.fence_principals, &req) {
        return refusal;
    }
    // Read without percent-decoding: an encoded digit is refused, not guessed at.
    let Some(after) = crate::layer::feed_after(req.uri().query()) else {
        return problem(
            StatusCode::BAD_REQUEST,
            "invalid-request",
            "the only parameter is `after`, a sequence number",
        );
    };
    let feed = openapi::FeedDoc::from(shared.fence.recent.feed(after));
    let mut response = axum::Json(feed).into_response();
    response.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    response
}

/// `fence_requests_total{outcome}`: the enforcer's decisions, read from its counters at each
/// scrape.
fn count_outcomes(meter: &Meter, outcomes: Arc<Outcomes>) {
    meter
        .u64_observable_counter("fence.requests")
        .with_description("Requests seen by the enforcer, by outcome.")
        .with_callback(move |observer| {
            let o = &outcomes;
            for (outcome, counter) in [
                ("admitted", &o.admitted),
                ("passed", &o.passed),
                ("stale", &o.stale),
                ("invalid", &o.invalid),
                ("store_error", &o.store_errors),
            ] {
                observer.observe(
                    counter.load(Ordering::Relaxed),
                    &[KeyValue::new("outcome", outcome)],
                );
            }
        })
        .build();
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        Rejection::into_response(self)
    }
}

/// `layer` with the defect a negative control asks for.
#[cfg(feature = "negative-controls")]
fn broken_layer<S: ?Sized, C>(
    layer: FencingLayer<S, C>,
    control: Option<config::NegativeControl>,
) -> FencingLayer<S, C> {
    match control {
        Some(config::NegativeControl::ReleaseWithCaller) => {
            tracing::warn!("negative control release-with-caller: permits end with the caller");
            layer.negative_control_release_with_caller()
        }
        Some(config::NegativeControl::DeadlineFromAdmission) => {
            tracing::warn!(
                "negative control deadline-from-admission: the gate's deadline is ignored"
            );
            layer.negative_control_deadline_from_admission()
        }
        _ => layer,
    }
}
