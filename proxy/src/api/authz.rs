//! Every `/v1` route's check of who calls: the request's principal (when `--auth-tokens` is on)
//! and its permission for the route's operation on the resource, judged, counted and audited by
//! the proxy's one judge ([`crate::auth::Judge`]); and the refusals only `/v1` makes (another
//! principal's grant, a quota, an unproven session), audited. With authentication off every
//! request passes as "no principal".

use std::sync::Arc;

use axum::http::HeaderMap;

use super::AppState;
use crate::audit::{Event, Kind};
use crate::auth::{Op, Principal};
pub(super) use crate::auth::{Peer, Target};
use crate::lease::Recheck;
use crate::{Error, Result};

/// Who a request comes from: `None` when authentication is off, so nothing is checked.
pub(super) type Caller = Option<Arc<Principal>>;

/// The caller of the request, allowed to do `op` on `target`; a 401 or 403 otherwise (judged by
/// the proxy's one [`crate::auth::Judge`]).
pub(super) fn authorize(
    app: &AppState,
    headers: &HeaderMap,
    peer: &Peer,
    op: Op,
    target: Target<'_>,
) -> Result<Caller> {
    app.judge.authorize(headers, peer, op, target)
}

/// For an acquire already authorised as `caller`: the same judgement of `op` on `target`
/// against the table in force whenever the lease layer asks — right before the grant, and after
/// every reload while it waits — and the same principal required. `None` with authentication
/// off.
pub(super) fn recheck(
    app: &Arc<AppState>,
    headers: &HeaderMap,
    peer: &Peer,
    caller: &Caller,
    op: Op,
    target: Target<'_>,
) -> Option<Recheck> {
    app.judge.recheck(headers, peer, caller, op, target)
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
        app.etcd.metrics().quota_refusal(*quota);
        app.audit.record(Event {
            principal: name(caller),
            op: Some(op.as_str()),
            resource: Some(resource.to_owned()),
            ..Event::new(Kind::Quota, quota.as_str(), headers)
        });
    }
    if matches!(error, Error::OtherPrincipal) {
        app.audit.record(Event {
            principal: name(caller),
            op: Some(op.as_str()),
            resource: Some(resource.to_owned()),
            ..Event::new(Kind::Authz, "other-principal", headers)
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
            ..Event::new(Kind::Session, why.as_str(), headers)
        });
    }
}
