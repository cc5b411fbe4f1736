//! `/v1/fleets`: fleets made, read and ended, members joining, reading their assignment,
//! draining and evicted (docs/DESIGN.md §5.5). Each handler checks, calls the fleet service and
//! maps the error; who may act on a fleet's resources is judged here, by [`gate`].

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::authz::{self, Caller};
use super::preamble::{Acquiring, OnFleet, OnMember, Reading, Received};
use super::schemas::{ResourceName, Revision};
use super::{body, AppState};
use crate::audit::{Event, Kind};
use crate::auth::Op;
use crate::fleet::{
    Asked, Drainer, FleetView, Join, Joined, MemberView, SpecChange, Standing, Written,
};
use crate::lease::validate;
use crate::{Error, Result};

/// The largest body of `PUT /v1/fleets/{fleet}`, whatever `--max-body-bytes` says: 10,000
/// names must fit.
pub(crate) const FLEET_BODY_BYTES: usize = 1024 * 1024;

/// Body of `PUT /v1/fleets/{fleet}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SpecBody {
    /// The resources the fleet shares: each in the resource grammar, none twice, at most
    /// 10,000 of at most 512 KiB together.
    #[schema(max_items = 10_000)]
    resources: Vec<String>,
    /// How long a member has to release a resource moved away from it before the service
    /// revokes it, in milliseconds (default 5000, at most 3,600,000).
    #[serde(default, deserialize_with = "validate::opt_whole_number")]
    #[schema(minimum = 0, maximum = 3_600_000)]
    drain_ms: Option<u64>,
    /// Most hand-offs in flight at once (default: a tenth of the resources, at least 10).
    #[serde(default, deserialize_with = "validate::opt_whole_number")]
    #[schema(minimum = 1, maximum = 10_000)]
    max_moves: Option<u64>,
}

/// Body of `POST /v1/fleets/{fleet}/members`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct JoinBody {
    /// The member's name: the resource grammar. A live member of the same name (and the same
    /// principal) is replaced.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[A-Za-z0-9](\.?[A-Za-z0-9_:-])*\.?$"
    )]
    member: String,
    /// The member's session TTL: whole seconds, within the proxy's `--min-ttl`..`--max-ttl`.
    #[schema(value_type = u64, minimum = 1)]
    ttl_seconds: serde_json::Number,
    /// Its share's weight, 1 to 1000 (default 1).
    #[serde(default, deserialize_with = "validate::opt_whole_number")]
    #[schema(minimum = 1, maximum = 1000)]
    weight: Option<u64>,
}

/// Body of a drain: strictly nothing.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DrainBody {}

/// Query of `GET /v1/fleets/{fleet}/members/{member}`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct AssignmentQuery {
    /// Answer once the assignment's `revision` passes this one (a long poll).
    #[param(value_type = Option<Revision>, inline)]
    after: Option<String>,
    /// How long to wait for that, in milliseconds (at most the proxy's `--max-wait`; 0: answer
    /// at once).
    #[param(minimum = 0)]
    wait_ms: Option<u64>,
}

/// Whose resource names a refusal may show.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Names {
    /// The caller's own: the body it sent lists them, so the refusal names the first it may
    /// not act on.
    Shown,
    /// The fleet's, as stored: a caller that may not act on them learns none of them (nor,
    /// from the answer, anything else of the fleet), only that it may not.
    Kept,
}

/// The judgement of `caller` for every resource of a fleet: `op` on each (403 otherwise),
/// audited with the first it may not.
fn gate<'a>(
    app: &'a AppState,
    headers: &'a HeaderMap,
    caller: &'a Caller,
    fleet: &'a str,
    op: Op,
    names: Names,
) -> impl Fn(&[String]) -> Result<()> + Sync + 'a {
    move |resources: &[String]| {
        let Some(principal) = caller else {
            return Ok(());
        };
        let Some(denied) = resources.iter().find(|r| !principal.may(op, r)) else {
            return Ok(());
        };
        app.audit.record(Event {
            principal: Some(principal.name.clone()),
            op: Some(op.as_str()),
            resource: Some(denied.clone()),
            ..Event::new(Kind::Authz, "forbidden", headers)
        });
        let target = match names {
            Names::Shown => format!("`{denied}`, a resource of fleet `{fleet}`"),
            Names::Kept => format!("every resource of fleet `{fleet}`"),
        };
        Err(Error::Forbidden {
            principal: principal.name.clone(),
            op,
            target,
        })
    }
}

/// Makes or changes a fleet.
#[utoipa::path(
    put,
    path = "/v1/fleets/{fleet}",
    operation_id = "put_fleet",
    tag = "fleets",
    params(("fleet" = inline(ResourceName), Path, description = "The fleet: the resource grammar")),
    request_body(content = SpecBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Written", body = Written),
        (status = 400, description = "Invalid fleet, body, or a resource outside the grammar"),
        (status = 403, description = "The caller may not acquire one of the resources, or the fleet is another principal's"),
        (status = 408, description = "The body took too long"),
        (status = 409, description = "The fleet changed meanwhile, again and again"),
        (status = 413, description = "The body is over 1 MiB"),
        (status = 415, description = "The body is not JSON"),
        (status = 429, description = "Over a quota: the acquire rate, or `--quota-fleets` for a new fleet", headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
)]
pub(super) async fn put(
    State(app): State<Arc<AppState>>,
    on: OnFleet<Acquiring>,
    body: Body,
) -> Result<Response> {
    let (fleet, caller, headers) = (on.fleet, on.by.caller, on.by.headers);
    let limits = body::BodyLimits {
        bytes: app.body.bytes.max(FLEET_BODY_BYTES),
        deadline: app.body.deadline,
    };
    let req: SpecBody = body::json(&headers, body, limits).await?;
    let change = SpecChange {
        resources: req.resources,
        drain_ms: req.drain_ms,
        max_moves: req.max_moves,
    };
    change.checked()?;
    gate(&app, &headers, &caller, &fleet, Op::Acquire, Names::Shown)(&change.resources)?;
    // Each write of a spec makes every replica decide the fleet again: it costs the
    // principal's acquire rate, as a join does.
    super::leases::take_rate(&app, &headers, &caller, &fleet)?;
    let written = app
        .fleets
        .put(&fleet, &change, authz::name(&caller))
        .await
        .inspect_err(|e| authz::audit_refusal(&app, &headers, &caller, Op::Acquire, &fleet, e))?;
    audit(&app, &headers, &caller, Kind::FleetPut, (&fleet, None));
    Ok(Json(written).into_response())
}

/// A fleet as it stands: its members, what each holds and hands off, what nobody holds.
#[utoipa::path(
    get,
    path = "/v1/fleets/{fleet}",
    operation_id = "get_fleet",
    tag = "fleets",
    params(("fleet" = inline(ResourceName), Path, description = "The fleet: the resource grammar")),
    responses(
        (status = 200, description = "The fleet", body = FleetView),
        (status = 400, description = "Invalid fleet"),
        (status = 403, description = "The caller may not read one of the fleet's resources"),
        (status = 404, description = "No such fleet"),
    ),
)]
pub(super) async fn get(
    State(app): State<Arc<AppState>>,
    on: OnFleet<Reading>,
) -> Result<Response> {
    let gate = gate(
        &app,
        &on.by.headers,
        &on.by.caller,
        &on.fleet,
        Op::Read,
        Names::Kept,
    );
    let view = app.fleets.view(&on.fleet, &gate).await?;
    Ok(Json(view).into_response())
}

/// Ends a fleet: every grant it made is released before the answer; idempotent.
#[utoipa::path(
    delete,
    path = "/v1/fleets/{fleet}",
    operation_id = "delete_fleet",
    tag = "fleets",
    params(("fleet" = inline(ResourceName), Path, description = "The fleet: the resource grammar")),
    responses(
        (status = 204, description = "Ended, or there was no such fleet: either way every grant the fleet made is released"),
        (status = 400, description = "Invalid fleet"),
        (status = 403, description = "The caller may not acquire one of the resources, or the fleet is another principal's"),
        (status = 409, description = "The fleet changed meanwhile, again and again"),
    ),
)]
pub(super) async fn delete(
    State(app): State<Arc<AppState>>,
    on: OnFleet<Acquiring>,
) -> Result<StatusCode> {
    let (fleet, caller, headers) = (on.fleet, on.by.caller, on.by.headers);
    let principal = authz::name(&caller);
    let gate = gate(&app, &headers, &caller, &fleet, Op::Acquire, Names::Kept);
    app.fleets
        .delete(&fleet, principal.as_deref(), &gate)
        .await?;
    audit(&app, &headers, &caller, Kind::FleetDelete, (&fleet, None));
    Ok(StatusCode::NO_CONTENT)
}

/// Joins a fleet: a new session, the member's record on it.
#[utoipa::path(
    post,
    path = "/v1/fleets/{fleet}/members",
    operation_id = "join_fleet",
    tag = "fleets",
    params(("fleet" = inline(ResourceName), Path, description = "The fleet: the resource grammar")),
    request_body(content = JoinBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Joined: the only answer that shows the session's secret", body = Joined,
            headers(
                ("Location" = String, description = "The member's assignment"),
                ("Cache-Control" = String, description = "`no-store`"),
            ),
        ),
        (status = 400, description = "Invalid fleet or body"),
        (status = 403, description = "The caller may not acquire one of the fleet's resources"),
        (status = 404, description = "No such fleet"),
        (status = 408, description = "The body took too long"),
        (status = 409, description = "The name is another principal's live member, the fleet is full, or it changed meanwhile again and again"),
        (status = 413, description = "The body is too large"),
        (status = 415, description = "The body is not JSON"),
        (status = 429, description = "Over a quota", headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
)]
pub(super) async fn join(
    State(app): State<Arc<AppState>>,
    Received(received): Received,
    on: OnFleet<Acquiring>,
    body: Body,
) -> Result<Response> {
    let (fleet, caller, headers) = (on.fleet, on.by.caller, on.by.headers);
    let req: JoinBody = body::json(&headers, body, app.body).await?;
    let limits = app.leases.limits();
    crate::fleet::check_member(&req.member)?;
    let ttl_seconds = validate::ttl(&req.ttl_seconds, limits.min_ttl, limits.max_ttl)?;
    super::leases::take_rate(&app, &headers, &caller, &fleet)?;
    let join = Join {
        member: req.member,
        ttl_seconds,
        weight: req.weight,
        principal: authz::name(&caller),
        received,
    };
    let gate = gate(&app, &headers, &caller, &fleet, Op::Acquire, Names::Kept);
    let joined: Joined = app.fleets.join(&fleet, join, &gate).await?;
    audit(
        &app,
        &headers,
        &caller,
        Kind::FleetJoin,
        (&fleet, Some(&joined.member)),
    );
    let location = format!("/v1/fleets/{fleet}/members/{}", joined.member);
    Ok(super::leases::created(joined, &location))
}

/// A member's assignment, proved with its session's secret: at once, or (with `after`) once it
/// has changed past that revision, waiting up to `wait_ms`.
#[utoipa::path(
    get,
    path = "/v1/fleets/{fleet}/members/{member}",
    operation_id = "get_member",
    tag = "fleets",
    params(
        ("fleet" = inline(ResourceName), Path, description = "The fleet: the resource grammar"),
        ("member" = inline(ResourceName), Path, description = "The member: the resource grammar"),
        ("Lease-Secret" = String, Header, description = "The member's session `secret`"),
        AssignmentQuery,
    ),
    responses(
        (status = 200, description = "The assignment (carries tokens: never cached)", body = MemberView,
            headers(("Cache-Control" = String, description = "`no-store`"))),
        (status = 400, description = "Invalid fleet, member, query or header"),
        (status = 403, description = "The secret does not prove the member's session, or the caller may not acquire one of the fleet's resources"),
        (status = 404, description = "No such fleet or member"),
        (status = 429, description = "Over a quota", headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
)]
pub(super) async fn member(
    State(app): State<Arc<AppState>>,
    on: OnMember<Acquiring>,
    query: Result<Query<AssignmentQuery>, QueryRejection>,
) -> Result<Response> {
    let (caller, headers) = (on.by.caller, on.by.headers);
    let secret = body::secret(&headers)?;
    let Query(q) = query.map_err(|e| Error::InvalidRequest(e.body_text()))?;
    let after = q
        .after
        .as_deref()
        .map(|a| {
            a.parse::<i64>()
                .ok()
                .filter(|r| *r >= 0 && r.to_string() == a)
                .ok_or_else(|| Error::InvalidField {
                    field: "after",
                    reason: "not a revision (a decimal number from 0 that fits in 63 bits)".into(),
                })
        })
        .transpose()?;
    let max_wait = app.leases.limits().max_wait;
    let wait = std::time::Duration::from_millis(q.wait_ms.unwrap_or(0));
    if wait > max_wait {
        return Err(Error::InvalidField {
            field: "wait_ms",
            reason: format!("at most {}", max_wait.as_millis()),
        });
    }
    let principal = authz::name(&caller);
    // A wait holds one of the replica's stream slots, within the principal's share.
    let _slot = match (after, wait.is_zero()) {
        (Some(_), false) => Some(app.watch_slots.take(principal.as_deref())?),
        _ => None,
    };
    let gate = gate(&app, &headers, &caller, &on.fleet, Op::Acquire, Names::Kept);
    let asked = Asked {
        gate: &gate,
        member: &on.member,
        secret: &secret,
        principal: principal.as_deref(),
        after,
        wait,
    };
    let view: MemberView = app
        .fleets
        .member_view(&on.fleet, &asked)
        .await
        .inspect_err(|e| {
            if matches!(e, Error::NotMember) {
                audit_refusal(&app, &headers, &caller, "not-member", &on.fleet);
            }
        })?;
    let mut response = Json(view).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// Drains a member: it hands off everything and takes nothing new. The member itself (its
/// session's secret in `Lease-Secret`) or an operator (`acquire` on every resource of the
/// fleet, no `Lease-Secret`).
#[utoipa::path(
    post,
    path = "/v1/fleets/{fleet}/members/{member}/drain",
    operation_id = "drain_member",
    tag = "fleets",
    params(
        ("fleet" = inline(ResourceName), Path, description = "The fleet: the resource grammar"),
        ("member" = inline(ResourceName), Path, description = "The member: the resource grammar"),
        ("Lease-Secret" = Option<String>, Header, description = "The member's session `secret` (the member draining itself)"),
    ),
    request_body(content = Option<DrainBody>, content_type = "application/json", description = "Nothing, or an empty object"),
    responses(
        (status = 202, description = "Draining (or evicted already)", body = Standing),
        (status = 400, description = "Invalid fleet, member, body or header"),
        (status = 403, description = "The secret does not prove the member, or the caller may not acquire one of the fleet's resources"),
        (status = 404, description = "No such fleet or member"),
        (status = 408, description = "The body took too long"),
        (status = 409, description = "The fleet changed meanwhile, again and again"),
        (status = 413, description = "The body is too large"),
        (status = 415, description = "The body is not JSON"),
    ),
)]
pub(super) async fn drain(
    State(app): State<Arc<AppState>>,
    on: OnMember<Acquiring>,
    body: Body,
) -> Result<Response> {
    let (caller, headers) = (on.by.caller, on.by.headers);
    let DrainBody {} = body::optional_json(&headers, body, app.body).await?;
    let principal = authz::name(&caller);
    let gate = gate(&app, &headers, &caller, &on.fleet, Op::Acquire, Names::Kept);
    let secret = match headers.get(crate::headers::SECRET_HEADER) {
        Some(_) => Some(body::secret(&headers)?),
        None => None,
    };
    let by = match &secret {
        Some(secret) => Drainer::Member {
            secret,
            principal: principal.as_deref(),
            gate: &gate,
        },
        None => Drainer::Operator(&gate),
    };
    let standing: Standing = app.fleets.drain(&on.fleet, &on.member, by).await?;
    audit(
        &app,
        &headers,
        &caller,
        Kind::FleetDrain,
        (&on.fleet, Some(&on.member)),
    );
    Ok((StatusCode::ACCEPTED, Json(standing)).into_response())
}

/// Evicts a member (an operator's call: `acquire` on every resource of the fleet): its grants
/// end at once, and it gets nothing until it joins again.
#[utoipa::path(
    delete,
    path = "/v1/fleets/{fleet}/members/{member}",
    operation_id = "evict_member",
    tag = "fleets",
    params(
        ("fleet" = inline(ResourceName), Path, description = "The fleet: the resource grammar"),
        ("member" = inline(ResourceName), Path, description = "The member: the resource grammar"),
    ),
    responses(
        (status = 204, description = "Evicted"),
        (status = 400, description = "Invalid fleet or member"),
        (status = 403, description = "The caller may not acquire one of the fleet's resources"),
        (status = 404, description = "No such fleet or member"),
        (status = 409, description = "The fleet changed meanwhile, again and again"),
    ),
)]
pub(super) async fn evict(
    State(app): State<Arc<AppState>>,
    on: OnMember<Acquiring>,
) -> Result<StatusCode> {
    let (caller, headers) = (on.by.caller, on.by.headers);
    let gate = gate(&app, &headers, &caller, &on.fleet, Op::Acquire, Names::Kept);
    app.fleets.evict(&on.fleet, &on.member, &gate).await?;
    audit(
        &app,
        &headers,
        &caller,
        Kind::FleetEvict,
        (&on.fleet, Some(&on.member)),
    );
    Ok(StatusCode::NO_CONTENT)
}

/// Audits a fleet request that succeeded; `member` names the member it was about, if any.
fn audit(
    app: &AppState,
    headers: &HeaderMap,
    caller: &Caller,
    event: Kind,
    (fleet, member): (&str, Option<&str>),
) {
    app.audit.record(Event {
        principal: authz::name(caller),
        fleet: Some(fleet.to_owned()),
        member: member.map(str::to_owned),
        ..Event::new(event, "ok", headers)
    });
}

fn audit_refusal(
    app: &AppState,
    headers: &HeaderMap,
    caller: &Caller,
    why: &'static str,
    fleet: &str,
) {
    app.audit.record(Event {
        principal: authz::name(caller),
        fleet: Some(fleet.to_owned()),
        ..Event::new(Kind::Fleet, why, headers)
    });
}
