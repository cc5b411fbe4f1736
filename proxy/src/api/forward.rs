//! `ANY /v1/leases/{resource}/forward/{path…}`: the holder's writes, forwarded with its token.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::Request;
use axum::response::Response;

use super::authz;
use super::preamble::{Forwarding, OnResource};
use super::schemas::ResourceName;
use super::{body, AppState};
use crate::auth::Op;
use crate::forward::{self as forwarding, forwarded_path};
use crate::{Error, Result};

/// `ANY /v1/leases/{resource}/forward`: the upstream's root.
#[utoipa::path(
    method(get, put, post, delete, options, head, patch, trace),
    path = "/v1/leases/{resource}/forward",
    operation_id = "forward_root",
    tag = "forwarding",
    params(("resource" = inline(ResourceName), Path, description = "The resource held"), ("Lease-Secret" = String, Header, description = "The grant's `secret`")),
    responses((status = "default", description = "The upstream's answer, passed through (any status and body), or a problem+json from the proxy: `lease-lost` (410), `not-holder` (403), `missing-secret` (401), `forwarding-disabled` or `no-route` (404), `body-too-large` (413), `upstream-unavailable` (502), `upstream-timeout` (504), `prefence-failed` or `etcd-unavailable` (503)")),
)]
pub(super) async fn forward_root(
    app: State<Arc<AppState>>,
    on: OnResource<Forwarding>,
    req: Request<Body>,
) -> Result<Response> {
    forward(app, on, req).await
}

/// `ANY /v1/leases/{resource}/forward/{path…}`: the request goes to the upstream's `/{path…}`
/// with the grant's fencing token, if the caller holds `resource`.
#[utoipa::path(
    method(get, put, post, delete, options, head, patch, trace),
    path = "/v1/leases/{resource}/forward/{path}",
    operation_id = "forward",
    tag = "forwarding",
    params(
        ("resource" = inline(ResourceName), Path, description = "The resource held"),
        ("path" = String, Path, description = "The upstream path (may span several segments)"),
        ("Lease-Secret" = String, Header, description = "The grant's `secret`"),
    ),
    responses((status = "default", description = "The upstream's answer, passed through (any status and body), or a problem+json from the proxy: `lease-lost` (410), `not-holder` (403), `missing-secret` (401), `forwarding-disabled` or `no-route` (404), `body-too-large` (413), `upstream-unavailable` (502), `upstream-timeout` (504), `prefence-failed` or `etcd-unavailable` (503)")),
)]
pub(super) async fn forward(
    State(app): State<Arc<AppState>>,
    on: OnResource<Forwarding>,
    req: Request<Body>,
) -> Result<Response> {
    let OnResource {
        resource, caller, ..
    } = on;
    let upstream = app.upstream.as_ref().ok_or(Error::ForwardingDisabled)?;
    let secret = body::secret(req.headers())?;
    let target = forwarded_path(req.uri()).ok_or(Error::NoRoute)?;
    if upstream.is_enforcer_route(&target) {
        return Err(Error::NoRoute);
    }
    if let Some(len) = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > app.max_forward_bytes as u64 {
            return Err(Error::BodyTooLarge {
                limit: app.max_forward_bytes,
            });
        }
    }
    let principal = authz::name(&caller);
    let (record, signed) = app
        .leases
        .holding_for_forward(&resource, &secret, principal.as_deref())
        .await
        .inspect_err(|e| {
            authz::audit_refusal(&app, req.headers(), &caller, Op::Forward, &resource, e);
        })?;
    tracing::debug!(%resource, holder = %record.holder, "forwarding");
    let mut req = req.map(|b| Body::new(http_body_util::Limited::new(b, app.max_forward_bytes)));
    if caller.is_some() {
        // The bearer token is the client's credential towards this proxy: the upstream must
        // never see it (it could call the proxy as the client). Without authentication the
        // header is the client's business and passes through.
        req.headers_mut().remove(http::header::AUTHORIZATION);
    }
    forwarding::forward(upstream, req, &target, &resource, &signed).await
}
