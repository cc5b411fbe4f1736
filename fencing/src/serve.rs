//! Serving an axum router with the drain both binaries need (lease-proxy uses it too).

use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves `app` on `listener` until `shutdown` resolves. Then: `draining` is set (readiness
/// turns 503), `stop` is cancelled (the listener stops accepting; callers may hang other work off
/// it), and in-flight requests get up to `drain` to finish before remaining connections are
/// closed.
pub async fn until_shutdown(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
    draining: &AtomicBool,
    stop: CancellationToken,
    drain: Duration,
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
            tracing::info!(?drain, "shutting down: draining");
            draining.store(true, Ordering::Relaxed);
            stop.cancel();
            match tokio::time::timeout(drain, &mut server).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!("drain deadline passed; closing remaining connections");
                    server.abort();
                    Ok(Ok(()))
                }
            }
        }
    };
    result.map_err(std::io::Error::other)?
}
