//! `/v1/sessions`: open, heartbeat, close and inspect sessions (docs/DESIGN.md §5.1).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa::ToSchema;

use super::authz;
use super::preamble::{Acquiring, AsSessionHolder, Authorized, OnSession, Reading, Received};
use super::schemas::SessionId;
use super::{body, AppState};
use crate::audit::{Event, Kind};
use crate::auth::Op;
use crate::lease::session::{Heartbeat, Opened, SessionView};
use crate::lease::validate;
use crate::Result;

/// Body of `POST /v1/sessions`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct OpenBody {
    /// Who opens it: any text without control characters.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$"
    )]
    holder: String,
    /// Whole seconds, within the proxy's `--min-ttl`..`--max-ttl`.
    #[schema(value_type = u64, minimum = 1)]
    ttl_seconds: serde_json::Number,
}

/// Body of `POST /v1/sessions/{id}/keepalive`: strictly nothing.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct KeepaliveBody {}

/// Opening a session needs the right to acquire something: its grants are each authorised
/// by resource when they are made.
#[utoipa::path(
    post,
    path = "/v1/sessions",
    operation_id = "open_session",
    tag = "sessions",
    request_body(content = OpenBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Opened: the only answer that shows the secret", body = Opened,
            headers(
                ("Location" = String, description = "The session's URL"),
                ("Cache-Control" = String, description = "`no-store`"),
            ),
            links(
                ("keepalive" = (operation_id = "keepalive_session", parameters(("id" = "$response.body#/session_id"), ("header.Lease-Secret" = "$response.body#/secret")))),
                ("close" = (operation_id = "close_session", parameters(("id" = "$response.body#/session_id"), ("header.Lease-Secret" = "$response.body#/secret")))),
                ("get" = (operation_id = "get_session", parameters(("id" = "$response.body#/session_id")))),
            ),
        ),
        (status = 400, description = "Invalid body"),
        (status = 408, description = "The body took too long"),
        (status = 413, description = "The body is too large"),
        (status = 415, description = "The body is not JSON"),
        (status = 429, description = "Over a quota", headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
)]
pub(super) async fn open(
    State(app): State<Arc<AppState>>,
    Received(received): Received,
    by: Authorized<Acquiring>,
    body: Body,
) -> Result<Response> {
    let Authorized {
        caller, headers, ..
    } = by;
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
        ..Event::new(Kind::SessionOpen, "ok", &headers)
    });
    let location = format!("/v1/sessions/{}", opened.session_id);
    Ok(super::leases::created(opened, &location))
}

/// Renews the session, and so every grant under it.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/keepalive",
    operation_id = "keepalive_session",
    tag = "sessions",
    params(("id" = inline(SessionId), Path, description = "The session id (a positive decimal number that fits in 63 bits)"), ("Lease-Secret" = String, Header, description = "The session's `secret`")),
    request_body(content = Option<KeepaliveBody>, content_type = "application/json", description = "Nothing, or an empty object"),
    responses(
        (status = 200, description = "Renewed", body = Heartbeat),
        (status = 400, description = "Invalid id, body or header"),
        (status = 404, description = "No such session"),
        (status = 408, description = "The body took too long"),
        (status = 410, description = "The session has ended"),
        (status = 413, description = "The body is too large"),
        (status = 415, description = "The body is not JSON"),
    ),
)]
pub(super) async fn keepalive(
    State(app): State<Arc<AppState>>,
    Received(received): Received,
    holder: AsSessionHolder<Acquiring>,
    body: Body,
) -> Result<Response> {
    let AsSessionHolder { on, secret } = holder;
    let (id, caller, headers) = (on.id, on.by.caller, on.by.headers);
    let KeepaliveBody {} = body::optional_json(&headers, body, app.body).await?;
    let principal = authz::name(&caller);
    let beat = app
        .leases
        .keepalive_session(id, &secret, principal.as_deref(), received)
        .await
        .inspect_err(|e| authz::audit_session_refusal(&app, &headers, &caller, id, e))?;
    Ok(Json(beat).into_response())
}

/// Ends the session and every grant under it.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    operation_id = "close_session",
    tag = "sessions",
    params(("id" = inline(SessionId), Path, description = "The session id (a positive decimal number that fits in 63 bits)"), ("Lease-Secret" = String, Header, description = "The session's `secret`")),
    responses(
        (status = 204, description = "Closed"),
        (status = 400, description = "Invalid id or header"),
        (status = 404, description = "No such session"),
        (status = 410, description = "The session has ended"),
    ),
)]
pub(super) async fn close(
    State(app): State<Arc<AppState>>,
    holder: AsSessionHolder<Acquiring>,
) -> Result<StatusCode> {
    let AsSessionHolder { on, secret } = holder;
    let (id, caller, headers) = (on.id, on.by.caller, on.by.headers);
    let principal = authz::name(&caller);
    app.leases
        .close_session(id, &secret, principal.as_deref())
        .await?;
    app.audit.record(Event {
        principal,
        ..Event::new(Kind::SessionClose, "ok", &headers)
    });
    Ok(StatusCode::NO_CONTENT)
}

/// A session and the resources held under it that the caller may read.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    operation_id = "get_session",
    tag = "sessions",
    params(("id" = inline(SessionId), Path, description = "The session id (a positive decimal number that fits in 63 bits)")),
    responses(
        (status = 200, description = "The session", body = SessionView),
        (status = 400, description = "Invalid id"),
        (status = 404, description = "No such session"),
    ),
)]
pub(super) async fn get(
    State(app): State<Arc<AppState>>,
    on: OnSession<Reading>,
) -> Result<Response> {
    let (id, caller) = (on.id, on.by.caller);
    // Its principal's, or anyone's who may read every resource (and so every holder).
    let owner = caller
        .as_ref()
        .filter(|p| !p.may(Op::Read, ""))
        .map(|p| p.name.as_str());
    let view = app
        .leases
        .session(id, owner, |resource| {
            caller.as_ref().is_none_or(|p| p.may(Op::Read, resource))
        })
        .await?;
    Ok(Json(view).into_response())
}
