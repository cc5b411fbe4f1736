//! Serving an axum router with the drain both binaries need (lease-proxy uses it too), and the
//! request ids both put on every request and log line.

use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::http::{HeaderName, Request};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

/// How a server stops once told to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drain {
    /// How long to go on serving, with readiness at 503, before the listener closes: time for
    /// load balancers (Kubernetes endpoints) to stop sending new requests here.
    pub delay: Duration,
    /// How long in-flight requests then get to finish before remaining connections are closed.
    pub deadline: Duration,
}

/// Serves `app` on `listener` until `shutdown` resolves. Then: `draining` is set (readiness
/// turns 503) while serving goes on for `drain.delay`; then `stop` is cancelled (the listener
/// stops accepting; callers may hang other work off it), and in-flight requests get up to
/// `drain.deadline` to finish before remaining connections are closed.
pub async fn until_shutdown(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
    draining: &AtomicBool,
    stop: CancellationToken,
    drain: Drain,
) -> std::io::Result<()> {
    let stop_accepting = stop.clone();
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop_accepting.cancelled().await })
        .into_future();
    let mut server = tokio::spawn(server);
    let served = tokio::select! {
        result = &mut server => Some(result),
        () = shutdown => None,
    };
    let result = match served {
        Some(result) => result,
        None => {
            tracing::info!(delay = ?drain.delay, deadline = ?drain.deadline, "shutting down: draining");
            draining.store(true, Ordering::Relaxed);
            let stopped_early = tokio::select! {
                result = &mut server => Some(result),
                () = tokio::time::sleep(drain.delay) => None,
            };
            match stopped_early {
                Some(result) => result,
                None => {
                    stop.cancel();
                    match tokio::time::timeout(drain.deadline, &mut server).await {
                        Ok(result) => result,
                        Err(_) => {
                            tracing::warn!("drain deadline passed; closing remaining connections");
                            server.abort();
                            Ok(Ok(()))
                        }
                    }
                }
            }
        }
    };
    result.map_err(std::io::Error::other)?
}

/// The request id header: kept when the client sent one, else set to a fresh UUID; echoed in
/// the response, passed on by forwarding, and recorded on the request's log span.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Wraps `app` so every request carries an `X-Request-Id` and runs in a span with it (method,
/// route and request id only: never a header value, so never a secret or token). The span
/// continues the client's W3C trace (`traceparent`) when a tracer is installed.
pub fn with_request_ids(app: Router) -> Router {
    let header = HeaderName::from_static(REQUEST_ID_HEADER);
    app.layer(PropagateRequestIdLayer::new(header.clone()))
        .layer(
            TraceLayer::new_for_http().make_span_with(|req: &Request<axum::body::Body>| {
                let id = req
                    .headers()
                    .get(REQUEST_ID_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                // The route template, never the path itself: resource names stay out of span
                // names (and so out of any index built on them).
                let span = tracing::info_span!(
                    "request",
                    otel.name = tracing::field::Empty,
                    otel.kind = tracing::field::Empty,
                    method = %req.method(),
                    path = %req.uri().path(),
                    request_id = %id,
                );
                crate::telemetry::server_span(&span, req);
                span
            }),
        )
        .layer(SetRequestIdLayer::new(header, MakeRequestUuid))
}

/// Resolves on SIGTERM or SIGINT: the shutdown signal of both binaries.
pub async fn terminated() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = term => {},
    }
}
