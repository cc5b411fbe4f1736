//! `/v1/leases`: the native lease API (DESIGN §5.1).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use tokio::time::Instant;

use super::authz::{self, Peer, Target};
use super::{body, AppState};
use crate::audit::Event;
use crate::auth::Op;
use crate::lease::{session, validate, Acquire};
use crate::{Error, Result};

/// Default and largest page size of a listing.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// Body of `POST /v1/leases/{resource}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AcquireBody {
    holder: String,
    /// Required without a session; under one, if given, it must be the session's.
    #[serde(default)]
    ttl_seconds: Option<serde_json::Number>,
    /// A session id: the grant lives on the session's lease (proven by its secret in
    /// `Lease-Secret`).
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    wait_ms: Option<u64>,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
}

/// Body of `POST /v1/leases/{resource}/renew`: nothing yet, but strictly nothing.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RenewBody {}

/// Query of `GET /v1/leases`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
    cursor: Option<String>,
}

pub(super) fn resource(path: Result<Path<String>, PathRejection>) -> Result<String> {
    let Path(name) = path.map_err(|e| Error::InvalidField {
        field: "resource",
        reason: e.body_text(),
    })?;
    validate::resource(&name)?;
    Ok(name)
}

pub(super) async fn acquire(
    State(app): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    peer: Peer,
    body: Body,
) -> Result<Response> {
    let received = Instant::now();
    let resource = resource(path)?;
    let caller = authz::authorize(
        &app,
        &headers,
        &peer,
        Op::Acquire,
        Target::Resource(&resource),
    )?;
    let idempotency_key = body::idempotency_key(&headers)?;
    let req: AcquireBody = body::json(&headers, body, app.body).await?;
    let limits = app.leases.limits();
    validate::holder(&req.holder)?;
    let ttl_seconds = match &req.ttl_seconds {
        Some(ttl) => Some(validate::ttl(ttl, limits.min_ttl, limits.max_ttl)?),
        None => None,
    };
    let principal = authz::name(&caller);
    let (session, ttl_seconds) = match &req.session {
        Some(id) => {
            let id = session::parse_id(id)?;
            let secret = body::secret(&headers)?;
            let record = app
                .leases
                .verify_session(id, &secret, principal.as_deref())
                .await
                .inspect_err(|e| {
                    authz::audit_refusal(&app, &headers, &caller, Op::Acquire, &resource, e)
                })?;
            if ttl_seconds.is_some_and(|ttl| ttl != record.ttl_seconds) {
                return Err(Error::InvalidField {
                    field: "ttl_seconds",
                    reason: format!(
                        "a grant under a session lives as long as the session ({} s); omit ttl_seconds",
                        record.ttl_seconds
                    ),
                });
            }
            (Some(id), record.ttl_seconds)
        }
        None => (
            None,
            ttl_seconds
                .ok_or_else(|| Error::InvalidRequest("missing field `ttl_seconds`".into()))?,
        ),
    };
    let wait = Duration::from_millis(req.wait_ms.unwrap_or(0));
    if wait > limits.max_wait {
        return Err(Error::InvalidField {
            field: "wait_ms",
            reason: format!("must be at most {}", limits.max_wait.as_millis()),
        });
    }
    if let Some(m) = &req.metadata {
        validate::metadata(m)?;
    }
    if let (Some(rate), Some(principal)) = (&app.acquire_rate, &caller) {
        if let Err(retry_after) = rate.take(&principal.name) {
            let e = Error::QuotaExceeded {
                quota: "rate",
                retry_after,
            };
            authz::audit_refusal(&app, &headers, &caller, Op::Acquire, &resource, &e);
            return Err(e);
        }
    }
    let grant = app
        .leases
        .acquire(&Acquire {
            resource: resource.clone(),
            holder: req.holder,
            principal,
            ttl_seconds,
            wait,
            metadata: req.metadata,
            idempotency_key,
            received,
            session,
        })
        .await
        .inspect_err(|e| {
            authz::audit_refusal(&app, &headers, &caller, Op::Acquire, &resource, e)
        })?;
    app.audit.record(Event {
        principal: authz::name(&caller),
        resource: Some(resource),
        token: Some(grant.token.clone()),
        ..Event::new("grant", "ok", &headers)
    });
    let location = format!("/v1/leases/{}", grant.resource);
    Ok(created(grant, &location))
}

/// A 201 carrying a secret: `Location` set, never cached.
pub(super) fn created(body: impl serde::Serialize, location: &str) -> Response {
    let mut response = (StatusCode::CREATED, Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

pub(super) async fn renew(
    State(app): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    peer: Peer,
    body: Body,
) -> Result<Response> {
    let resource = resource(path)?;
    let caller = authz::authorize(
        &app,
        &headers,
        &peer,
        Op::Acquire,
        Target::Resource(&resource),
    )?;
    let secret = body::secret(&headers)?;
    let RenewBody {} = body::optional_json(&headers, body, app.body).await?;
    let principal = authz::name(&caller);
    let renewal = app
        .leases
        .renew(&resource, &secret, principal.as_deref())
        .await
        .inspect_err(|e| {
            app.audit.record(Event {
                principal: principal.clone(),
                resource: Some(resource.clone()),
                ..Event::new("renew", e.slug(), &headers)
            });
        })?;
    Ok(Json(renewal).into_response())
}

pub(super) async fn release(
    State(app): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    peer: Peer,
) -> Result<StatusCode> {
    let resource = resource(path)?;
    let caller = authz::authorize(
        &app,
        &headers,
        &peer,
        Op::Acquire,
        Target::Resource(&resource),
    )?;
    let secret = body::secret(&headers)?;
    let principal = authz::name(&caller);
    let ended = app
        .leases
        .release(&resource, &secret, principal.as_deref())
        .await
        .inspect_err(|e| {
            authz::audit_refusal(&app, &headers, &caller, Op::Acquire, &resource, e)
        })?;
    if let Some(token) = ended {
        app.audit.record(Event {
            principal,
            resource: Some(resource),
            token: Some(token),
            ..Event::new("release", "ok", &headers)
        });
    }
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn get(
    State(app): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    peer: Peer,
) -> Result<Response> {
    let resource = resource(path)?;
    authz::authorize(&app, &headers, &peer, Op::Read, Target::Resource(&resource))?;
    Ok(Json(app.leases.get(&resource).await?).into_response())
}

pub(super) async fn list(
    State(app): State<Arc<AppState>>,
    query: Result<Query<ListQuery>, QueryRejection>,
    headers: HeaderMap,
    peer: Peer,
) -> Result<Response> {
    let caller = authz::authorize(&app, &headers, &peer, Op::Read, Target::Some)?;
    let Query(q) = query.map_err(|e| Error::InvalidRequest(e.body_text()))?;
    validate::resource_prefix(&q.prefix)?;
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(Error::InvalidField {
            field: "limit",
            reason: format!("must be between 1 and {MAX_LIMIT}"),
        });
    }
    let mut page = app
        .leases
        .list(&q.prefix, limit, q.cursor.as_deref())
        .await?;
    if let Some(principal) = &caller {
        // Filtered after the read, so a page may hold fewer than `limit` entries (even none)
        // while `next_cursor` still leads on: the cursor never depends on who asks.
        page.leases.retain(|h| principal.may(Op::Read, &h.resource));
    }
    Ok(Json(page).into_response())
}
