//! The one judgement of who calls, for every front: the request's principal (when
//! `--auth-tokens` is on), its permission for an operation on a target, the count in
//! `/metrics`, and an audit line for every refusal — and the same judgement again on demand for
//! what waits after it was let in ([`Recheck`]). With authentication off every request passes
//! as "no principal". The `/v1` routes judge through it per route; the etcd fronts (the `/v3`
//! JSON gateway and etcd's gRPC API) through [`Judge::etcd_caller`], one judgement for both.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::{Extensions, HeaderMap};
use runtime::tls::PeerCertificate;

use super::{Auth, Op, Principal, Unauthenticated};
use crate::audit::{Audit, Event, Kind};
use crate::etcdapi::Authorised;
use crate::lease::Recheck;
use crate::metrics::Metrics;
use crate::{Error, Result};

/// What a request asks to do.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target<'a> {
    /// One resource.
    Resource(&'a str),
    /// Some resources, to be filtered afterwards (the list): the principal must have the
    /// operation on at least one prefix.
    Some,
    /// Everything (the etcd API).
    All,
}

impl Target<'_> {
    /// The resource named, if one.
    pub(crate) fn resource(&self) -> Option<String> {
        match self {
            Target::Resource(r) => Some((*r).to_owned()),
            Target::Some | Target::All => None,
        }
    }
}

/// The verified client certificate of the request's connection (mTLS), if any.
#[derive(Debug, Clone, Default)]
pub(crate) struct Peer(pub(crate) Option<PeerCertificate>);

impl Peer {
    /// The certificate of the connection of the request with `extensions`.
    pub(crate) fn of(extensions: &Extensions) -> Self {
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

/// Judges callers against the token table in force, counting and auditing every verdict.
#[derive(Clone)]
pub(crate) struct Judge {
    /// The token table, when `--auth-tokens` is given; `None`: anyone may call.
    auth: Option<Arc<Auth>>,
    metrics: Arc<Metrics>,
    audit: Audit,
}

impl Judge {
    /// A judge of callers against `auth` (`None`: authentication off), counting in `metrics`
    /// and auditing refusals in `audit`.
    pub(crate) fn new(auth: Option<Arc<Auth>>, metrics: Arc<Metrics>, audit: Audit) -> Self {
        Self {
            auth,
            metrics,
            audit,
        }
    }

    /// The token table, `None` with authentication off.
    pub(crate) fn auth(&self) -> Option<&Arc<Auth>> {
        self.auth.as_ref()
    }

    /// The caller of the request, allowed to do `op` on `target`; a 401 or 403 otherwise.
    pub(crate) fn authorize(
        &self,
        headers: &HeaderMap,
        peer: &Peer,
        op: Op,
        target: Target<'_>,
    ) -> Result<Option<Arc<Principal>>> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let principal = self.judge(auth, headers, peer, op, target)?;
        self.metrics.auth_request("authenticated", op.as_str(), 1);
        Ok(Some(principal))
    }

    /// Whom an etcd-compatible request — the `/v3` JSON gateway or etcd's gRPC API — is served
    /// for, and its right judged again while it waits (a lock): with `--auth-tokens`, its
    /// principal if it has the `v3` permission (a refusal, counted and audited, otherwise); no
    /// principal and nothing to judge again with authentication off.
    pub(crate) fn etcd_caller(
        &self,
        headers: &HeaderMap,
        extensions: &Extensions,
    ) -> Result<Authorised> {
        let peer = Peer::of(extensions);
        let (op, target) = (Op::V3, Target::All);
        let caller = self.authorize(headers, &peer, op, target)?;
        Ok(Authorised {
            recheck: self.recheck(headers, &peer, &caller, op, target),
            principal: caller.map(|p| p.name.clone()),
        })
    }

    /// For an acquire or an etcd lock already authorised as `caller`: the same judgement of
    /// `op` on `target` against the table in force whenever the lease layer or the lock asks —
    /// right before the grant, and after every reload while it waits — and the same principal
    /// required. `None` with authentication off.
    pub(crate) fn recheck(
        &self,
        headers: &HeaderMap,
        peer: &Peer,
        caller: &Option<Arc<Principal>>,
        op: Op,
        target: Target<'_>,
    ) -> Option<Recheck> {
        let (auth, caller) = (self.auth.clone()?, caller.clone()?);
        let changes = auth.changes();
        let (judge, headers, peer) = (self.clone(), headers.clone(), peer.clone());
        // The target, owned: the check outlives the request.
        let (resource, some) = (target.resource(), matches!(target, Target::Some));
        Some(Recheck::new(
            move || {
                let target = match &resource {
                    Some(r) => Target::Resource(r),
                    None if some => Target::Some,
                    None => Target::All,
                };
                let now = judge.judge(&auth, &headers, &peer, op, target)?;
                if now.name == caller.name {
                    return Ok(());
                }
                judge
                    .metrics
                    .auth_request("unauthenticated", op.as_str(), 1);
                Err(Error::Unauthenticated(Unauthenticated::Replaced.as_str()))
            },
            changes,
        ))
    }

    /// The principal of the request if it may do `op` on `target`; every refusal counted and
    /// audited.
    fn judge(
        &self,
        auth: &Auth,
        headers: &HeaderMap,
        peer: &Peer,
        op: Op,
        target: Target<'_>,
    ) -> Result<Arc<Principal>> {
        let principal = match auth.authenticate(headers, peer.0.as_ref()) {
            Ok(principal) => principal,
            Err(why) => {
                self.unauthenticated(headers, op, target.resource());
                return Err(Error::Unauthenticated(why.as_str()));
            }
        };
        let allowed = match target {
            Target::Resource(resource) => principal.may(op, resource),
            Target::Some => principal.may_any(op),
            Target::All => principal.may(op, ""),
        };
        if !allowed {
            self.metrics.auth_request("forbidden", op.as_str(), 1);
            self.audit.record(Event {
                principal: Some(principal.name.clone()),
                op: Some(op.as_str()),
                resource: target.resource(),
                ..Event::new(Kind::Authz, "forbidden", headers)
            });
            return Err(Error::Forbidden {
                principal: principal.name.clone(),
                op,
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
    pub(crate) fn unauthenticated(&self, headers: &HeaderMap, op: Op, resource: Option<String>) {
        self.metrics.auth_request("unauthenticated", op.as_str(), 1);
        self.audit.record(Event {
            op: Some(op.as_str()),
            resource,
            ..Event::new(Kind::Authz, "unauthenticated", headers)
        });
    }
}
