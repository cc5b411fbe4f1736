//! Every route's check of who calls: the request's principal (when `--auth-tokens` is on), its
//! permission for the route's operation on the resource, the count in `/metrics`, and an audit
//! line for every refusal. With authentication off every request passes as "no principal".

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use fencing::tls::PeerCertificate;

use super::AppState;
use crate::audit::Event;
use crate::auth::{Auth, Op, Principal, Unauthenticated};
use crate::lease::Recheck;
use crate::{Error, Result};

/// Who a request comes from: `None` when authentication is off, so nothing is checked.
pub(super) type Caller = Option<Arc<Principal>>;

/// What a request asks to do.
#[derive(Debug, Clone, Copy)]
pub(super) enum Target<'a> {
    /// One resource.
    Resource(&'a str),
    /// Some resources, to be filtered afterwards (the list): the principal must have the
    /// operation on at least one prefix.
    Some,
    /// Everything (the `/v3` API).
    All,
}

impl Target<'_> {
    fn resource(&self) -> Option<String> {
        match self {
            Target::Resource(r) => Some((*r).to_owned()),
            Target::Some | Target::All => None,
        }
    }
}

/// The verified client certificate of the request's connection (mTLS), if any.
#[derive(Debug, Clone, Default)]
pub(super) struct Peer(pub(super) Option<PeerCertificate>);

impl Peer {
    /// The certificate of the connection of the request with `extensions`.
    pub(super) fn of(extensions: &axum::http::Extensions) -> Self {
        Self(extensions.get::<PeerCertificate>().cloned())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> std::result::Result<Self, Self::Rejection> {
        Ok(Self::of(&parts.extensions))
    }
}

/// The caller of the request, allowed to do `op` on `target`; a 401 or 403 otherwise.
pub(super) fn authorize(
    app: &AppState,
    headers: &HeaderMap,
    peer: &Peer,
    op: Op,
    target: Target<'_>,
) -> Result<Caller> {
    let Some(auth) = &app.auth else {
        return Ok(None);
    };
    let principal = judge(app, auth, headers, peer, op, target)?;
    app.etcd
        .metrics()
        .auth_request("authenticated", op.as_str(), 1);
    Ok(Some(principal))
}

/// For an acquire or a `/v3` lock already authorised as `caller`: the same judgement of `op` on
/// `target` against the table in force whenever the lease layer or the lock asks — right before
/// the grant, and after every reload while it waits — and the same principal required.
/// `None` with authentication off.
pub(super) fn recheck(
    app: &Arc<AppState>,
    headers: &HeaderMap,
    peer: &Peer,
    caller: &Caller,
    op: Op,
    target: Target<'_>,
) -> Option<Recheck> {
    let (auth, caller) = (app.auth.clone()?, caller.clone()?);
    let changes = auth.changes();
    let (app, headers, peer) = (app.clone(), headers.clone(), peer.clone());
    // The target, owned: the check outlives the request.
    let (resource, some) = (target.resource(), matches!(target, Target::Some));
    Some(Recheck::new(
        move || {
            let target = match &resource {
                Some(r) => Target::Resource(r),
                None if some => Target::Some,
                None => Target::All,
            };
            let now = judge(&app, &auth, &headers, &peer, op, target)?;
            if now.name == caller.name {
                return Ok(());
            }
            app.etcd
                .metrics()
                .auth_request("unauthenticated", op.as_str(), 1);
            Err(Error::Unauthenticated(Unauthenticated::Replaced.as_str()))
        },
        changes,
    ))
}

/// The principal of the request if it may do `op` on `target`; every refusal counted and
/// audited.
fn judge(
    app: &AppState,
    auth: &Auth,
    headers: &HeaderMap,
    peer: &Peer,
    op: Op,
    target: Target<'_>,
) -> Result<Arc<Principal>> {
    let metrics = app.etcd.metrics();
    let principal = match auth.authenticate(headers, peer.0.as_ref()) {
        Ok(principal) => principal,
        Err(why) => {
            unauthenticated(app, headers, op, target.resource());
            return Err(Error::Unauthenticated(why.as_str()));
        }
    };
    let allowed = match target {
        Target::Resource(resource) => principal.may(op, resource),
        Target::Some => principal.may_any(op),
        Target::All => principal.may(op, ""),
    };
    if !allowed {
        metrics.auth_request("forbidden", op.as_str(), 1);
        app.audit.record(Event {
            principal: Some(principal.name.clone()),
            op: Some(op.as_str()),
            resource: target.resource(),
            ..Event::new("authz", "forbidden", headers)
        });
        return Err(Error::Forbidden {
            principal: principal.name.clone(),
            op: op.as_str(),
            target: match target {
                Target::Resource(r) => format!("`{r}`"),
                Target::Some => "any resource".to_owned(),
                Target::All => "the /v3 API".to_owned(),
            },
        });
    }
    Ok(principal)
}

/// Counts and audits a request for `op` (on `resource`, if one) whose credentials name no
/// principal — a refused token, a certificate without a line, etcd's `Authenticate` with a
/// wrong name or password.
pub(crate) fn unauthenticated(
    app: &AppState,
    headers: &HeaderMap,
    op: Op,
    resource: Option<String>,
) {
    app.etcd
        .metrics()
        .auth_request("unauthenticated", op.as_str(), 1);
    app.audit.record(Event {
        op: Some(op.as_str()),
        resource,
        ..Event::new("authz", "unauthenticated", headers)
    });
}

/// The name a grant records for `caller`.
pub(super) fn name(caller: &Caller) -> Option<String> {
    caller.as_ref().map(|p| p.name.clone())
}

/// Records a refusal of `op` on `resource` because the grant is another principal's, or
/// because the principal is over a quota (then counted in `/metrics` too).
pub(super) fn audit_refusal(
    app: &AppState,
    headers: &HeaderMap,
    caller: &Caller,
    op: Op,
    resource: &str,
    error: &Error,
) {
    if let Error::QuotaExceeded { quota, .. } = error {
        app.etcd.metrics().quota_refusal(quota);
        app.audit.record(Event {
            principal: name(caller),
            op: Some(op.as_str()),
            resource: Some(resource.to_owned()),
            ..Event::new("quota", quota, headers)
        });
    }
    if matches!(error, Error::OtherPrincipal) {
        app.audit.record(Event {
            principal: name(caller),
            op: Some(op.as_str()),
            resource: Some(resource.to_owned()),
            ..Event::new("authz", "other-principal", headers)
        });
    }
}

/// Records a refusal of a request under session `id` that did not prove it (another
/// principal's session, or a wrong secret): the caller got the answer of an ended session,
/// the audit log tells the truth.
pub(super) fn audit_session_refusal(
    app: &AppState,
    headers: &HeaderMap,
    caller: &Caller,
    id: i64,
    error: &Error,
) {
    if let Error::SessionNotProven { why } = error {
        app.audit.record(Event {
            principal: name(caller),
            session: Some(id.to_string()),
            ..Event::new("session", why, headers)
        });
    }
}
