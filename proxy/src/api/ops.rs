//! Operational endpoints: liveness, readiness and metrics.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::AppState;

/// Alive as long as the process serves HTTP.
pub(super) async fn livez() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready when not draining and etcd answers a linearizable read (so it has a quorum).
pub(super) async fn readyz(State(app): State<Arc<AppState>>) -> (StatusCode, Json<Value>) {
    if app.draining.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining"})),
        );
    }
    match app.etcd.get(&app.readiness_key).await {
        Ok(_) => (StatusCode::OK, Json(json!({"status": "ok", "etcd": "ok"}))),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "etcd": e.to_string()})),
        ),
    }
}

/// Prometheus text: every instrument of `crate::metrics`.
pub(super) async fn metrics(State(app): State<Arc<AppState>>) -> axum::response::Response {
    app.etcd.metrics().render()
}
