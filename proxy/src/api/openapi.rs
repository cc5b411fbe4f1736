//! The OpenAPI 3.1 document of the HTTP API, served at `GET /openapi.json`: the paths come from
//! the handlers' `#[utoipa::path]` annotations as the router registers them (so the document and
//! the routes cannot drift apart), the schemas from the types the handlers read and answer, and
//! every problem type from [`Kind::ALL`].

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use runtime::openapi::{ProblemType, Problems};
use serde_json::{json, Value};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::OpenApi;
use utoipa::PartialSchema;

use super::problem::Kind;
use super::schemas::ResourceName;
use super::AppState;
use crate::lease::Limits;

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "lease-proxy",
        description = "Exclusive, time-bounded ownership of named resources, on etcd, with fencing tokens.\n\n\
            Every refusal is an RFC 9457 problem (`application/problem+json`) whose `type` is one of the URIs listed below. \
            `expires_in_ms` is measured from when the request reached the proxy: a client's deadline is the instant it sent the request plus `expires_in_ms`.\n\n\
            With `--auth-tokens` every route but `/livez`, `/readyz`, `/metrics` and `/openapi.json` needs `Authorization: Bearer TOKEN`.\n\n\
            The etcd-compatible JSON gateway (`/v3/*`, `/v3beta/*`, `/v3alpha/*`, `/version`, `/health`) is served too but not described here: it answers as etcd's gateway does.",
    ),
    tags(
        (name = "leases", description = "Acquire, renew, release and inspect leases"),
        (name = "sessions", description = "Sessions: one lease kept alive for many grants"),
        (name = "fleets", description = "Fleets: many members sharing many resources, assigned by the service, handed over revoke-before-grant"),
        (name = "forwarding", description = "The holder's requests, forwarded upstream with its fencing token"),
        (name = "operations", description = "Liveness, readiness, metrics and this document"),
    ),
    modifiers(&Bearer),
)]
struct Base;

/// Adds the optional bearer authentication.
struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, doc: &mut OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The document's frame (info, tags, security schemes) for the router to add its paths to.
pub(super) fn base() -> OpenApi {
    <Base as utoipa::OpenApi>::openapi()
}

/// Statuses every `/v1` operation may answer besides its own.
const COMMON: [(StatusCode, &str); 4] = [
    (
        StatusCode::UNAUTHORIZED,
        "No or an unknown bearer token, or no secret where one is needed",
    ),
    (
        StatusCode::FORBIDDEN,
        "Not permitted, or not the grant's holder",
    ),
    (StatusCode::INTERNAL_SERVER_ERROR, "A bug in the proxy"),
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "etcd unavailable, or the proxy is shutting down",
    ),
];

/// Headers of refusals.
const HEADERS: [(StatusCode, &str, &str); 4] = [
    (
        StatusCode::UNAUTHORIZED,
        "WWW-Authenticate",
        "`Bearer realm=\"lease-proxy\"` for the bearer token, `Lease-Secret` for a secret",
    ),
    (
        StatusCode::CONFLICT,
        "Retry-After",
        "`lease-held`: seconds until the resource may be free",
    ),
    (
        StatusCode::TOO_MANY_REQUESTS,
        "Retry-After",
        "Seconds to wait",
    ),
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "Retry-After",
        "Seconds to wait",
    ),
];

/// Completes the router's document: every refusal a problem of its status, the list of problem
/// types, the optional bearer authentication of `/v1`, and this proxy's limits.
pub(super) fn finish(mut doc: OpenApi, limits: Limits) -> serde_json::Result<Value> {
    for (path, item) in doc.paths.paths.iter_mut() {
        if !path.starts_with("/v1/") && path != "/v1" {
            continue;
        }
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ];
        for operation in operations.into_iter().flatten() {
            operation.security = Some(vec![
                SecurityRequirement::default(),
                SecurityRequirement::new("bearer", Vec::<String>::new()),
            ]);
        }
    }
    let types: Vec<ProblemType> = Kind::ALL
        .iter()
        .map(|k| ProblemType {
            status: k.status(),
            slug: k.slug(),
            title: k.title(),
        })
        .collect();
    let string = |description: &str| json!({"type": "string", "description": description});
    let mut json = runtime::openapi::finish(
        &doc,
        &Problems {
            types: &types,
            extensions: vec![
                ("resource", string("`lease-held`: the resource")),
                ("holder", string("`lease-held`: who holds it")),
                (
                    "token",
                    string("`lease-held`: the holder's token (revision, decimal)"),
                ),
                (
                    "expires_in_ms",
                    json!({"type": "integer", "minimum": 0,
                        "description": "`lease-held`: the holder's remaining TTL"}),
                ),
                ("quota", string("`quota-exceeded`: which quota")),
            ],
            common: &COMMON,
            common_under: "/v1/",
            headers: &HEADERS,
        },
    )?;
    configured(&mut json, limits);
    headers_not_null(&mut json);
    Ok(json)
}

/// An optional header is absent or a string, never JSON `null` (utoipa writes `Option<String>`
/// as `["string", "null"]`, and a client sending the text `null` would be refused).
fn headers_not_null(doc: &mut Value) {
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    let operations = paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut());
    for operation in operations {
        let Some(parameters) = operation
            .get_mut("parameters")
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        for parameter in parameters.iter_mut().filter(|p| p["in"] == "header") {
            if let Some(types) = parameter["schema"]["type"].as_array() {
                let types: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                parameter["schema"]["type"] = match types.as_slice() {
                    [one] => one.clone(),
                    _ => Value::Array(types),
                };
            }
        }
    }
}

/// This proxy's bounds (`--min-ttl`, `--max-ttl`, `--max-wait`) in the request schemas, so a
/// request the document calls valid is one the proxy accepts.
fn configured(doc: &mut Value, limits: Limits) {
    let schemas = &mut doc["components"]["schemas"];
    for body in ["AcquireBody", "OpenBody", "JoinBody"] {
        let ttl = &mut schemas[body]["properties"]["ttl_seconds"];
        ttl["minimum"] = limits.min_ttl.into();
        ttl["maximum"] = limits.max_ttl.into();
    }
    let max_wait = u64::try_from(limits.max_wait.as_millis()).unwrap_or(u64::MAX);
    schemas["AcquireBody"]["properties"]["wait_ms"]["maximum"] = max_wait.into();
    // A fleet's resources are resource names, none twice.
    let resources = &mut schemas["SpecBody"]["properties"]["resources"];
    resources["items"] = serde_json::to_value(<ResourceName as PartialSchema>::schema())
        .unwrap_or_else(|_| json!({"type": "string"}));
    resources["uniqueItems"] = true.into();
    // What the derive cannot say: an acquire names a TTL, or the session it lives on.
    schemas["AcquireBody"]["anyOf"] = json!([
        {"required": ["ttl_seconds"], "properties": {"ttl_seconds": {"type": "integer"}}},
        {"required": ["session"], "properties": {"session": {"type": "string"}}},
    ]);
    // A member's long poll waits at most `--max-wait` too.
    let member = &mut doc["paths"]["/v1/fleets/{fleet}/members/{member}"]["get"]["parameters"];
    if let Some(parameters) = member.as_array_mut() {
        for parameter in parameters.iter_mut().filter(|p| p["name"] == "wait_ms") {
            parameter["schema"]["maximum"] = max_wait.into();
        }
    }
}

/// This document, as served.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "operations",
    responses((status = 200, description = "This document (OpenAPI 3.1)", body = Object)),
)]
pub(super) async fn serve(State(app): State<Arc<AppState>>) -> Response {
    let json = app.openapi.get_or_init(|| {
        super::document(app.leases.limits())
            .and_then(|doc| serde_json::to_string(&doc))
            .ok()
    });
    match json {
        Some(json) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            json.clone(),
        )
            .into_response(),
        None => super::internal_error(),
    }
}
