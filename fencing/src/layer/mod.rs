//! A tower layer that enforces fencing on the writes of any hyper/axum/tower service.
//!
//! For each request a [`Classify`] decision says whether it is a protected write and for which
//! resource. A protected write must carry exactly one valid signed token for that resource
//! (`Fencing-Token`, or `X-Fencing-Token`), and is admitted through the ordering [`Gate`]: the
//! inner service is called only for admitted writes, and the write counts as in flight until the
//! inner service has answered. Refusals are problem+json and reach nothing behind the layer.

mod classify;
mod reject;

pub use classify::{ByHeader, Classify, Decision, PathPattern};
pub use reject::{Rejection, PROBLEM_BASE};

#[doc(hidden)]
pub use self::token_header as presented_token;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use futures::future::BoxFuture;
use http::{Request, Response};
use tower::{Layer, Service};

use crate::admission::{Admission, Permit};
use crate::{Keyring, Token, TOKEN_HEADER, TOKEN_HEADER_LEGACY};

/// Everything the layer needs, shared by all its services.
pub struct Fence<A: ?Sized> {
    /// Verifies tokens.
    pub keys: Arc<Keyring>,
    /// Orders and remembers.
    pub gate: Arc<A>,
    /// Counts of what the enforcer decided.
    pub outcomes: Arc<Outcomes>,
}

impl<A: ?Sized> Fence<A> {
    /// A fence verifying with `keys` and admitting through `gate`.
    pub fn new(keys: Arc<Keyring>, gate: Arc<A>) -> Self {
        Self {
            keys,
            gate,
            outcomes: Arc::default(),
        }
    }
}

impl<A: ?Sized> Clone for Fence<A> {
    fn clone(&self) -> Self {
        Self {
            keys: self.keys.clone(),
            gate: self.gate.clone(),
            outcomes: self.outcomes.clone(),
        }
    }
}

/// Counters of the enforcer's decisions, by outcome.
#[derive(Debug, Default)]
pub struct Outcomes {
    /// Protected writes admitted.
    pub admitted: AtomicU64,
    /// Requests passed through unprotected (reads).
    pub passed: AtomicU64,
    /// Writes refused as stale.
    pub stale: AtomicU64,
    /// Writes refused for a missing, malformed, forged or misdirected token or resource.
    pub invalid: AtomicU64,
    /// Writes refused because the mark store failed.
    pub store_errors: AtomicU64,
}

impl Outcomes {
    fn refused(&self, rejection: &Rejection) {
        let counter = match rejection {
            Rejection::Stale { .. } => &self.stale,
            Rejection::StoreUnavailable => &self.store_errors,
            _ => &self.invalid,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl<A: Admission + ?Sized> Fence<A> {
    /// Checks a presented token (`wire`) for `resource` and admits it through the gate.
    pub async fn admit(&self, resource: &str, wire: &str) -> Result<(Token, Permit), Rejection> {
        let token = self.keys.verify(resource, wire).map_err(Rejection::Token)?;
        let permit = self.gate.admit(resource, token).await?;
        Ok((token, permit))
    }
}

/// The single token header value of a request.
pub fn token_header<B>(req: &Request<B>) -> Result<&str, Rejection> {
    let headers = req.headers();
    let mut values = headers
        .get_all(TOKEN_HEADER)
        .iter()
        .chain(headers.get_all(TOKEN_HEADER_LEGACY).iter());
    let value = values.next().ok_or(Rejection::MissingToken)?;
    if values.next().is_some() {
        return Err(Rejection::DuplicateToken);
    }
    value
        .to_str()
        .map_err(|_| Rejection::Token(crate::TokenError::Malformed))
}

/// Layer putting [`FencingService`] in front of a service.
pub struct FencingLayer<S: ?Sized, C> {
    fence: Fence<S>,
    classify: C,
}

impl<S: ?Sized, C: Clone> Clone for FencingLayer<S, C> {
    fn clone(&self) -> Self {
        Self {
            fence: self.fence.clone(),
            classify: self.classify.clone(),
        }
    }
}

impl<S: ?Sized, C> FencingLayer<S, C> {
    /// A layer enforcing `fence` on the requests `classify` marks as protected.
    pub fn new(fence: Fence<S>, classify: C) -> Self {
        Self { fence, classify }
    }
}

impl<Inner, S: ?Sized, C> Layer<Inner> for FencingLayer<S, C>
where
    C: Clone,
{
    type Service = FencingService<Inner, S, C>;

    fn layer(&self, inner: Inner) -> Self::Service {
        FencingService {
            inner,
            fence: self.fence.clone(),
            classify: self.classify.clone(),
        }
    }
}

/// The service produced by [`FencingLayer`].
pub struct FencingService<Inner, S: ?Sized, C> {
    inner: Inner,
    fence: Fence<S>,
    classify: C,
}

impl<Inner: Clone, S: ?Sized, C: Clone> Clone for FencingService<Inner, S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            fence: self.fence.clone(),
            classify: self.classify.clone(),
        }
    }
}

impl<Inner, S, C, ReqBody, ResBody> Service<Request<ReqBody>> for FencingService<Inner, S, C>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    Inner::Future: Send,
    Inner::Error: Send,
    S: Admission + ?Sized,
    C: Classify<ReqBody>,
    ReqBody: Send + 'static,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<Body>;
    type Error = Inner::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, Inner::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone that was driven to readiness serves this request (tower's usual dance).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let fence = self.fence.clone();
        let decision = match self.classify.classify(&req) {
            Decision::Protect(resource) => match token_header(&req) {
                Ok(wire) => Ok((resource, wire.to_owned())),
                Err(rejection) => Err(Some(rejection)),
            },
            Decision::Reject(rejection) => Err(Some(rejection)),
            Decision::Pass => Err(None),
        };
        Box::pin(async move {
            let (resource, wire) = match decision {
                Ok(protected) => protected,
                Err(None) => {
                    fence.outcomes.passed.fetch_add(1, Ordering::Relaxed);
                    return Ok(inner.call(req).await?.map(Body::new));
                }
                Err(Some(rejection)) => {
                    fence.outcomes.refused(&rejection);
                    return Ok(rejection.into_response());
                }
            };
            let (token, permit) = match fence.admit(&resource, &wire).await {
                Ok(admitted) => admitted,
                Err(rejection) => {
                    tracing::info!(%resource, reason = %rejection, "write refused");
                    fence.outcomes.refused(&rejection);
                    return Ok(rejection.into_response());
                }
            };
            fence.outcomes.admitted.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%resource, %token, "write admitted");
            let response = inner.call(req).await;
            // The write is done at the storage once it has answered: later tokens may go now.
            drop(permit);
            Ok(response?.map(Body::new))
        })
    }
}
