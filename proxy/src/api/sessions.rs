//! `/v1/sessions`: open, heartbeat, close and inspect sessions (DESIGN §5.1).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use tokio::time::Instant;

use super::authz::{self, Peer, Target};
use super::{body, AppState};
use crate::audit::Event;
use crate::auth::Op;
use crate::lease::{session, validate};
use crate::{Error, Result};

/// Body of `POST /v1/sessions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OpenBody {
    holder: String,
    ttl_seconds: serde_json::Number,
}

/// Body of `POST /v1/sessions/{id}/keepalive`: strictly nothing.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KeepaliveBody {}

fn session_id(path: Result<Path<String>, PathRejection>) -> Result<i64> {
    let Path(id) = path.map_err(|e| Error::InvalidField {
        field: "session",
        reason: e.body_text(),
    })?;
    session::parse_id(&id)
}

/// Opening a session needs the right to acquire something: its grants are each authorised
/// by resource when they are made.
pub(super) async fn open(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    peer: Peer,
    body: Body,
) -> Result<Response> {
    let received = Instant::now();
    let caller = authz::authorize(&app, &headers, &peer, Op::Acquire, Target::Some)?;
    let req: OpenBody = body::json(&headers, body, app.body).await?;
    let limits = app.leases.limits();
    validate::holder(&req.holder)?;
    let ttl = validate::ttl(&req.ttl_seconds, limits.min_ttl, limits.max_ttl)?;
    let principal = authz::name(&caller);
    let opened = app
        .leases
        .open_session(req.holder, principal.clone(), ttl, received)
        .await?;
    app.audit.record(Event {
        principal,
        ..Event::new("session-open", "ok", &headers)
    });
    let location = format!("/v1/sessions/{}", opened.session_id);
    Ok(super::leases::created(opened, &location))
}

pub(super) async fn keepalive(
    State(app): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    peer: Peer,
    body: Body,
) -> Result<Response> {
    let received = Instant::now();
    let id = session_id(path)?;
    let caller = authz::authorize(&app, &headers, &peer, Op::Acquire, Target::Some)?;
    let secret = body::secret(&headers)?;
    let KeepaliveBody {} = body::optional_json(&headers, body, app.body).await?;
    let principal = authz::name(&caller);
    let beat = app
        .leases
        .keepalive_session(id, &secret, principal.as_deref(), received)
        .await?;
    Ok(Json(beat).into_response())
}

pub(super) async fn close(
    State(app): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    peer: Peer,
) -> Result<StatusCode> {
    let id = session_id(path)?;
    let caller = authz::authorize(&app, &headers, &peer, Op::Acquire, Target::Some)?;
    let secret = body::secret(&headers)?;
    let principal = authz::name(&caller);
    app.leases
        .close_session(id, &secret, principal.as_deref())
        .await?;
    app.audit.record(Event {
        principal,
        ..Event::new("session-close", "ok", &headers)
    });
    Ok(StatusCode::NO_CONTENT)
}

/// A session and the resources held under it that the caller may read.
pub(super) async fn get(
    State(app): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    peer: Peer,
) -> Result<Response> {
    let id = session_id(path)?;
    let caller = authz::authorize(&app, &headers, &peer, Op::Read, Target::Some)?;
    let view = app
        .leases
        .session(id, |resource| {
            caller.as_ref().is_none_or(|p| p.may(Op::Read, resource))
        })
        .await?;
    Ok(Json(view).into_response())
}
