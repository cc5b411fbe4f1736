//! The preamble every `/v1` handler shares, as extractors, so that a handler reads as etcd's
//! v3rpc handlers do — check, call the domain, map the error. In this order, which the routes'
//! documented answers (and schemathesis) hold them to:
//! 1. what the path names — the resource or the session id: 400 when malformed;
//! 2. the caller, authorised for the route's operation: 401 without a known principal, 403
//!    without the permission;
//! 3. where the route acts as the holder, the `Lease-Secret`: 401 when missing.

use std::marker::PhantomData;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::http::HeaderMap;

use super::authz::{self, Caller, Peer, Target};
use super::{body, AppState};
use crate::auth::Op;
use crate::lease::{session, validate};
use crate::{Error, Result};

/// The operation a route needs permission for.
pub(super) trait Operation: Send + Sync {
    /// The token file's operation.
    const OP: Op;
}

/// Acquiring, renewing and releasing (and everything on sessions but reading them).
pub(super) struct Acquiring;
impl Operation for Acquiring {
    const OP: Op = Op::Acquire;
}

/// Reading holders, sessions and events.
pub(super) struct Reading;
impl Operation for Reading {
    const OP: Op = Op::Read;
}

/// Forwarding the holder's requests.
pub(super) struct Forwarding;
impl Operation for Forwarding {
    const OP: Op = Op::Forward;
}

/// A caller authorised for `O` on some resource (a listing, an event stream, opening a
/// session): the principal must have `O` on at least one prefix.
pub(super) struct Authorized<O> {
    /// The caller (`None` with authentication off).
    pub(super) caller: Caller,
    /// The request's headers.
    pub(super) headers: HeaderMap,
    /// The verified client certificate, if any.
    pub(super) peer: Peer,
    op: PhantomData<O>,
}

impl<O: Operation> FromRequestParts<Arc<AppState>> for Authorized<O> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<AppState>) -> Result<Self> {
        let Ok(peer) = Peer::from_request_parts(parts, app).await;
        let caller = authz::authorize(app, &parts.headers, &peer, O::OP, Target::Some)?;
        Ok(Self {
            caller,
            headers: parts.headers.clone(),
            peer,
            op: PhantomData,
        })
    }
}

/// The resource the path names, and the caller authorised for `O` on it.
pub(super) struct OnResource<O> {
    /// The resource, valid.
    pub(super) resource: String,
    /// The caller (`None` with authentication off).
    pub(super) caller: Caller,
    /// The request's headers.
    pub(super) headers: HeaderMap,
    /// The verified client certificate, if any.
    pub(super) peer: Peer,
    op: PhantomData<O>,
}

impl<O: Operation> FromRequestParts<Arc<AppState>> for OnResource<O> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<AppState>) -> Result<Self> {
        let resource = path_resource(parts, app).await?;
        let Ok(peer) = Peer::from_request_parts(parts, app).await;
        let caller = authz::authorize(
            app,
            &parts.headers,
            &peer,
            O::OP,
            Target::Resource(&resource),
        )?;
        Ok(Self {
            resource,
            caller,
            headers: parts.headers.clone(),
            peer,
            op: PhantomData,
        })
    }
}

/// [`OnResource`], and the grant's secret from `Lease-Secret`.
pub(super) struct AsHolder<O> {
    /// The resource and its authorised caller.
    pub(super) on: OnResource<O>,
    /// The secret shown.
    pub(super) secret: String,
}

impl<O: Operation> FromRequestParts<Arc<AppState>> for AsHolder<O> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<AppState>) -> Result<Self> {
        let on = OnResource::from_request_parts(parts, app).await?;
        let secret = body::secret(&on.headers)?;
        Ok(Self { on, secret })
    }
}

/// The session the path names, and the caller authorised for `O` (on some resource: a
/// session's grants are each authorised when they are made).
pub(super) struct OnSession<O> {
    /// The session id.
    pub(super) id: i64,
    /// The caller and the request's headers.
    pub(super) by: Authorized<O>,
}

impl<O: Operation> FromRequestParts<Arc<AppState>> for OnSession<O> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<AppState>) -> Result<Self> {
        let Path(id) = Path::<String>::from_request_parts(parts, app)
            .await
            .map_err(|e| Error::InvalidField {
                field: "session",
                reason: e.body_text(),
            })?;
        let id = session::parse_id(&id)?;
        let by = Authorized::from_request_parts(parts, app).await?;
        Ok(Self { id, by })
    }
}

/// [`OnSession`], and the session's secret from `Lease-Secret`.
pub(super) struct AsSessionHolder<O> {
    /// The session and its authorised caller.
    pub(super) on: OnSession<O>,
    /// The secret shown.
    pub(super) secret: String,
}

impl<O: Operation> FromRequestParts<Arc<AppState>> for AsSessionHolder<O> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<AppState>) -> Result<Self> {
        let on = OnSession::from_request_parts(parts, app).await?;
        let secret = body::secret(&on.by.headers)?;
        Ok(Self { on, secret })
    }
}

/// The fleet the path names, and the caller authorised for `O` on some resource (a fleet's
/// resources are judged once they are known: the body's, or the spec's).
pub(super) struct OnFleet<O> {
    /// The fleet, valid.
    pub(super) fleet: String,
    /// The caller and the request's headers.
    pub(super) by: Authorized<O>,
}

impl<O: Operation> FromRequestParts<Arc<AppState>> for OnFleet<O> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<AppState>) -> Result<Self> {
        let params = path_params(parts, app, "fleet").await?;
        let fleet = param(&params, "fleet");
        crate::fleet::check_fleet(&fleet)?;
        let by = Authorized::from_request_parts(parts, app).await?;
        Ok(Self { fleet, by })
    }
}

/// The fleet and member the path names, and the caller authorised for `O` on some resource.
pub(super) struct OnMember<O> {
    /// The fleet, valid.
    pub(super) fleet: String,
    /// The member, valid.
    pub(super) member: String,
    /// The caller and the request's headers.
    pub(super) by: Authorized<O>,
}

impl<O: Operation> FromRequestParts<Arc<AppState>> for OnMember<O> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<AppState>) -> Result<Self> {
        let params = path_params(parts, app, "fleet").await?;
        let (fleet, member) = (param(&params, "fleet"), param(&params, "member"));
        crate::fleet::check_fleet(&fleet)?;
        crate::fleet::check_member(&member)?;
        let by = Authorized::from_request_parts(parts, app).await?;
        Ok(Self { fleet, member, by })
    }
}

/// The path's parameters (a malformed path is refused as an invalid `field`).
async fn path_params(
    parts: &mut Parts,
    app: &Arc<AppState>,
    field: &'static str,
) -> Result<Vec<(String, String)>> {
    let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, app)
        .await
        .map_err(|e| Error::InvalidField {
            field,
            reason: e.body_text(),
        })?;
    Ok(params)
}

/// The path parameter `name` (empty if absent: then refused by its grammar).
fn param(params: &[(String, String)], name: &str) -> String {
    params
        .iter()
        .find_map(|(k, v)| (k == name).then(|| v.clone()))
        .unwrap_or_default()
}

/// The `{resource}` of the path, valid (the forward routes name a `{path}` too).
async fn path_resource(parts: &mut Parts, app: &Arc<AppState>) -> Result<String> {
    let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, app)
        .await
        .map_err(|e| Error::InvalidField {
            field: "resource",
            reason: e.body_text(),
        })?;
    let resource = params
        .into_iter()
        .find_map(|(k, v)| (k == "resource").then_some(v))
        .unwrap_or_default();
    validate::resource(&resource)?;
    Ok(resource)
}

/// When the request reached the handler: the instant `expires_in_ms` counts from. Put before
/// the preamble among a handler's arguments, so that nothing the preamble does comes before it.
pub(super) struct Received(pub(super) tokio::time::Instant);

impl<S: Send + Sync> FromRequestParts<S> for Received {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(_: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(tokio::time::Instant::now()))
    }
}
