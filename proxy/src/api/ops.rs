//! Operational endpoints: liveness, readiness and metrics.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;

/// The answer of `/livez` and `/readyz`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Health {
    /// `ok`, `draining` or `unavailable`.
    status: &'static str,
    /// `/readyz` only: `ok`, or why etcd did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    etcd: Option<String>,
}

/// Alive as long as the process serves HTTP.
#[utoipa::path(
    get,
    path = "/livez",
    operation_id = "livez",
    tag = "operations",
    responses((status = 200, description = "Serving", body = Health)),
)]
pub(super) async fn livez() -> Json<Health> {
    Json(Health {
        status: "ok",
        etcd: None,
    })
}

/// Ready when not draining and etcd answers a linearizable read (so it has a quorum).
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Draining, or etcd does not answer", body = Health),
    ),
)]
pub(super) async fn readyz(State(app): State<Arc<AppState>>) -> (StatusCode, Json<Health>) {
    if app.draining.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Health {
                status: "draining",
                etcd: None,
            }),
        );
    }
    match app.etcd.get(&app.readiness_key).await {
        Ok(_) => (
            StatusCode::OK,
            Json(Health {
                status: "ok",
                etcd: Some("ok".to_owned()),
            }),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Health {
                status: "unavailable",
                etcd: Some(e.to_string()),
            }),
        ),
    }
}

/// Prometheus text: every instrument of `crate::metrics`.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain")),
)]
pub(super) async fn metrics(State(app): State<Arc<AppState>>) -> axum::response::Response {
    app.etcd.metrics().render()
}
