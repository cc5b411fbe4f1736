//! `/v1/leases`: the native lease API (docs/DESIGN.md §5.1).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::authz::{self, Caller, Target};
use super::preamble::{Acquiring, AsHolder, Authorized, OnResource, Reading, Received};
use super::schemas::{ResourceName, ResourcePrefix};
use super::{body, AppState};
use crate::audit::{Event, Kind};
use crate::auth::Op;
use crate::lease::{list_prefixes, session, validate, Acquire, Grant, Holding, Page, Renewal};
use crate::{Error, QuotaKind, Result};

/// Default and largest page size of a listing.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// Body of `POST /v1/leases/{resource}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AcquireBody {
    /// Who asks: any text without control characters.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$"
    )]
    holder: String,
    /// Whole seconds, within the proxy's `--min-ttl`..`--max-ttl`. Required without a session;
    /// under one, if given, it must be the session's.
    #[serde(default)]
    #[schema(value_type = Option<u64>, minimum = 1)]
    ttl_seconds: Option<serde_json::Number>,
    /// A session id: the grant lives on the session's lease (proven by its secret in
    /// `Lease-Secret`).
    // `schemas::SessionId`'s pattern, written out: inlining that type here would turn this
    // nullable field into a `oneOf`.
    #[serde(default)]
    #[schema(
        pattern = r"^([1-9][0-9]{0,17}|[1-8][0-9]{18}|9[0-1][0-9]{17}|92[0-1][0-9]{16}|922[0-2][0-9]{15}|9223[0-2][0-9]{14}|92233[0-6][0-9]{13}|922337[0-1][0-9]{12}|92233720[0-2][0-9]{10}|922337203[0-5][0-9]{9}|9223372036[0-7][0-9]{8}|92233720368[0-4][0-9]{7}|922337203685[0-3][0-9]{6}|9223372036854[0-6][0-9]{5}|92233720368547[0-6][0-9]{4}|922337203685477[0-4][0-9]{3}|9223372036854775[0-7][0-9]{2}|922337203685477580[0-6]|9223372036854775807)$"
    )]
    session: Option<String>,
    /// How long to wait in line for a held resource (at most the proxy's `--max-wait`).
    #[serde(default, deserialize_with = "validate::opt_whole_number")]
    wait_ms: Option<u64>,
    /// Stored with the grant and shown to readers: a JSON object of at most 4096 bytes.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    metadata: Option<serde_json::Value>,
}

/// Body of `POST /v1/leases/{resource}/renew`: nothing yet, but strictly nothing.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RenewBody {}

/// Query of `GET /v1/leases`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ListQuery {
    /// Only resources whose name starts with this (empty: all).
    #[serde(default)]
    #[param(value_type = ResourcePrefix, inline)]
    prefix: String,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// `next_cursor` of the previous page (opaque).
    #[param(pattern = "^[A-Za-z0-9_-]+$")]
    cursor: Option<String>,
}

/// Grants `resource` to the caller unless someone else holds it (waiting up to `wait_ms`).
#[utoipa::path(
    post,
    path = "/v1/leases/{resource}",
    operation_id = "acquire",
    tag = "leases",
    params(
        ("resource" = inline(ResourceName), Path, description = "The resource: 1-200 bytes of letters, digits and `._:-`, starting with a letter or digit, without `..`"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried acquire return the same grant: 1-255 visible ASCII characters", min_length = 1, max_length = 255, pattern = "^[!-~]+$"),
        ("Lease-Secret" = Option<String>, Header, description = "The session's secret, when acquiring under `session`"),
    ),
    request_body(content = AcquireBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Granted: the only answer that shows the secret", body = Grant,
            headers(
                ("Location" = String, description = "The resource's URL"),
                ("Cache-Control" = String, description = "`no-store`"),
            ),
            links(
                ("renew" = (operation_id = "renew", parameters(("resource" = "$response.body#/resource"), ("header.Lease-Secret" = "$response.body#/secret")))),
                ("release" = (operation_id = "release", parameters(("resource" = "$response.body#/resource"), ("header.Lease-Secret" = "$response.body#/secret")))),
                ("get" = (operation_id = "get_lease", parameters(("resource" = "$response.body#/resource")))),
                ("forward_read" = (operation_id = "forward_get", parameters(("resource" = "$response.body#/resource"), ("header.Lease-Secret" = "$response.body#/secret")))),
                ("forward_write" = (operation_id = "forward_put", parameters(("resource" = "$response.body#/resource"), ("header.Lease-Secret" = "$response.body#/secret")))),
            ),
        ),
        (status = 400, description = "Invalid resource, body or header"),
        (status = 404, description = "No such session"),
        (status = 408, description = "The body took too long"),
        (status = 409, description = "Held by someone else (with `holder`, `token`, `expires_in_ms`), or the idempotency key was used for another request",
            headers(("Retry-After" = u64, description = "Seconds until it may be free"))),
        (status = 410, description = "The session has ended"),
        (status = 413, description = "The body is too large"),
        (status = 415, description = "The body is not JSON"),
        (status = 429, description = "Over a quota", headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
)]
pub(super) async fn acquire(
    State(app): State<Arc<AppState>>,
    Received(received): Received,
    on: OnResource<Acquiring>,
    body: Body,
) -> Result<Response> {
    let OnResource {
        resource,
        caller,
        headers,
        peer,
        ..
    } = on;
    // Subscribed now: a reload from here on has the acquire judged again.
    let recheck = authz::recheck(
        &app,
        &headers,
        &peer,
        &caller,
        Op::Acquire,
        Target::Resource(&resource),
    );
    let idempotency_key = body::idempotency_key(&headers)?;
    let req: AcquireBody = body::json(&headers, body, app.body).await?;
    let fields = validate::acquire(
        &req.holder,
        req.ttl_seconds.as_ref(),
        req.wait_ms,
        req.metadata.as_ref(),
        &app.leases.limits(),
    )?;
    let session = req.session.as_deref().map(session::parse_id).transpose()?;
    let principal = authz::name(&caller);
    let session_ttl = session_ttl(&app, &headers, &caller, session).await?;
    let ttl_seconds = validate::grant_ttl(fields.ttl_seconds, session_ttl)?;
    take_rate(&app, &headers, &caller, &resource)?;
    let grant = app
        .leases
        .acquire(&Acquire {
            resource: resource.clone(),
            holder: req.holder,
            principal,
            ttl_seconds,
            wait: fields.wait,
            metadata: req.metadata,
            idempotency_key,
            received,
            session,
            recheck,
        })
        .await
        .inspect_err(|e| {
            authz::audit_refusal(&app, &headers, &caller, Op::Acquire, &resource, e)
        })?;
    app.audit.record(Event {
        principal: authz::name(&caller),
        resource: Some(resource),
        token: Some(grant.token.clone()),
        ..Event::new(Kind::Grant, "ok", &headers)
    });
    let location = format!("/v1/leases/{}", grant.resource);
    Ok(created(grant, &location))
}

/// The TTL of the session an acquire names, proved by the request's secret (none: `None`).
async fn session_ttl(
    app: &AppState,
    headers: &HeaderMap,
    caller: &Caller,
    session: Option<i64>,
) -> Result<Option<u64>> {
    let Some(id) = session else {
        return Ok(None);
    };
    let principal = authz::name(caller);
    let verified = app
        .leases
        .verify_session(id, &body::secret(headers)?, principal.as_deref())
        .await
        .inspect_err(|e| authz::audit_session_refusal(app, headers, caller, id, e))?;
    Ok(Some(verified.ttl_seconds))
}

/// One acquire from the principal's rate (`--quota-acquire-rate`), or the quota's 429.
pub(super) fn take_rate(
    app: &AppState,
    headers: &HeaderMap,
    caller: &Caller,
    resource: &str,
) -> Result<()> {
    let (Some(rate), Some(principal)) = (&app.acquire_rate, caller) else {
        return Ok(());
    };
    rate.take(&principal.name).map_err(|retry_after| {
        let e = Error::QuotaExceeded {
            quota: QuotaKind::Rate,
            retry_after,
        };
        authz::audit_refusal(app, headers, caller, Op::Acquire, resource, &e);
        e
    })
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

/// Extends the grant's lease by its TTL.
#[utoipa::path(
    post,
    path = "/v1/leases/{resource}/renew",
    operation_id = "renew",
    tag = "leases",
    params(("resource" = inline(ResourceName), Path, description = "The resource: 1-200 bytes of letters, digits and `._:-`, starting with a letter or digit, without `..`"), ("Lease-Secret" = String, Header, description = "The grant's `secret` (a session's, with `session` in the body of an acquire)")),
    request_body(content = Option<RenewBody>, content_type = "application/json", description = "Nothing, or an empty object"),
    responses(
        (status = 200, description = "Renewed", body = Renewal),
        (status = 400, description = "Invalid resource, body or header"),
        (status = 408, description = "The body took too long"),
        (status = 410, description = "The grant is gone: expired, released or taken over"),
        (status = 413, description = "The body is too large"),
        (status = 415, description = "The body is not JSON"),
    ),
)]
pub(super) async fn renew(
    State(app): State<Arc<AppState>>,
    holder: AsHolder<Acquiring>,
    body: Body,
) -> Result<Response> {
    let AsHolder { on, secret } = holder;
    let RenewBody {} = body::optional_json(&on.headers, body, app.body).await?;
    let principal = authz::name(&on.caller);
    let renewal = app
        .leases
        .renew(&on.resource, &secret, principal.as_deref())
        .await
        .inspect_err(|e| {
            app.audit.record(Event {
                principal: principal.clone(),
                resource: Some(on.resource.clone()),
                ..Event::new(Kind::Renew, e.slug(), &on.headers)
            });
        })?;
    Ok(Json(renewal).into_response())
}

/// Ends the grant; idempotent (a grant already gone answers 204 too).
#[utoipa::path(
    delete,
    path = "/v1/leases/{resource}",
    operation_id = "release",
    tag = "leases",
    params(("resource" = inline(ResourceName), Path, description = "The resource: 1-200 bytes of letters, digits and `._:-`, starting with a letter or digit, without `..`"), ("Lease-Secret" = String, Header, description = "The grant's `secret` (a session's, with `session` in the body of an acquire)")),
    responses(
        (status = 204, description = "Released, or already gone"),
        (status = 400, description = "Invalid resource or header"),
    ),
)]
pub(super) async fn release(
    State(app): State<Arc<AppState>>,
    holder: AsHolder<Acquiring>,
) -> Result<StatusCode> {
    let AsHolder { on, secret } = holder;
    let principal = authz::name(&on.caller);
    let ended = app
        .leases
        .release(&on.resource, &secret, principal.as_deref())
        .await
        .inspect_err(|e| {
            authz::audit_refusal(&app, &on.headers, &on.caller, Op::Acquire, &on.resource, e)
        })?;
    if let Some(token) = ended {
        app.audit.record(Event {
            principal,
            resource: Some(on.resource),
            token: Some(token),
            ..Event::new(Kind::Release, "ok", &on.headers)
        });
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Who holds `resource`.
#[utoipa::path(
    get,
    path = "/v1/leases/{resource}",
    operation_id = "get_lease",
    tag = "leases",
    params(("resource" = inline(ResourceName), Path, description = "The resource: 1-200 bytes of letters, digits and `._:-`, starting with a letter or digit, without `..`")),
    responses(
        (status = 200, description = "Held", body = Holding),
        (status = 400, description = "Invalid resource"),
        (status = 404, description = "Free"),
    ),
)]
pub(super) async fn get(
    State(app): State<Arc<AppState>>,
    on: OnResource<Reading>,
) -> Result<Response> {
    Ok(Json(app.leases.get(&on.resource).await?).into_response())
}

/// The held resources, in name order, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/leases",
    operation_id = "list_leases",
    tag = "leases",
    params(ListQuery),
    responses(
        (status = 200, description = "A page", body = Page),
        (status = 400, description = "Invalid query"),
    ),
)]
pub(super) async fn list(
    State(app): State<Arc<AppState>>,
    by: Authorized<Reading>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response> {
    let caller = by.caller;
    let Query(q) = query.map_err(|e| Error::InvalidRequest(e.body_text()))?;
    validate::resource_prefix(&q.prefix)?;
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(Error::InvalidField {
            field: "limit",
            reason: format!("must be between 1 and {MAX_LIMIT}"),
        });
    }
    // Only what the caller may read is read, so the page and its cursor show nothing else.
    let readable: Vec<&str> = match &caller {
        Some(principal) => principal.prefixes(Op::Read).collect(),
        None => vec![""],
    };
    let prefixes = list_prefixes(&q.prefix, &readable);
    let page = app
        .leases
        .list(&prefixes, limit, q.cursor.as_deref())
        .await?;
    Ok(Json(page).into_response())
}
