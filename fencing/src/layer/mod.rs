//! A tower layer that enforces fencing on the writes of any hyper/axum/tower service.
//!
//! For each request a [`Classify`] decision says whether it is a protected write and for which
//! resource. A protected write must carry exactly one valid signed token for that resource
//! (`Fencing-Token`, or `X-Fencing-Token`), and is admitted through the ordering [`Gate`].
//! Refusals are problem+json and reach nothing behind the layer.
//!
//! What the inner service receives: hop-by-hop headers and every client-sent fencing header
//! (`Fencing-*`, `X-Fencing-*`) removed from every request; on an admitted write, exactly one
//! `Fencing-Resource` (the verified resource) and one `Fencing-Token` (the verified token) set
//! by the layer. Storage behind the layer should check that the resource it writes is the one in
//! `Fencing-Resource`.
//!
//! **In flight means in flight at the storage.** The inner service is called from a task the
//! layer owns, not from the caller's future: a client that goes away does not cancel a write
//! half-way. The write counts as in flight (higher tokens wait) until its whole exchange has
//! ended — request body read to its end, inner service answered, response body read to its end
//! — or until the exchange deadline ([`FencingLayer::with_exchange_deadline`]) cuts it off. An
//! exchange that ends any other way (client gone, body error, deadline, an early answer, a
//! response marked [`ExchangeIncomplete`]) is *uncertain*: the gate keeps the resource closed to
//! higher tokens for its write grace (see [`crate::admission`]). An embedder's storage must
//! therefore finish or abandon any write within the write grace of its exchange ending.
//!
//! [`Gate`]: crate::Gate

mod broken;
mod classify;
mod exchange;
mod headers;
mod recent;
mod reject;

pub use crate::admission::DEFAULT_EXCHANGE_DEADLINE;
pub use classify::{ByHeader, Classify, Decision, PathPattern};
pub use exchange::{ExchangeDeadline, ExchangeIncomplete};
pub use headers::strip_hop_by_hop;
pub use recent::{feed_after, Feed, FeedMark, FeedRefusal, Reason, Recent};
pub use reject::Rejection;
pub use runtime::problem::PROBLEM_BASE;

#[doc(hidden)]
pub use self::token_header as presented_token;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum_core::body::Body;
use futures::future::BoxFuture;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Body as _;
use tower::{Layer, Service};
use tracing::Instrument as _;

use crate::admission::{Admission, Outcome, Permit};
use crate::decide;
use crate::{Keys, Token, RESOURCE_HEADER, TOKEN_HEADER, TOKEN_HEADER_LEGACY};
use broken::Broken;
#[cfg(feature = "negative-controls")]
use broken::CallerRelease;
use exchange::{Exchange, Side, Tracked};

/// Everything the layer needs, shared by all its services.
pub struct Fence<A: ?Sized> {
    /// Verifies tokens: the keyring in force when each token is checked.
    pub keys: Keys,
    /// Orders and remembers.
    pub gate: Arc<A>,
    /// Counts of what the enforcer decided.
    pub outcomes: Arc<Outcomes>,
    /// What it decided lately, per resource (the operator's feed).
    pub recent: Arc<Recent>,
}

impl<A: ?Sized> Fence<A> {
    /// A fence verifying with `keys` (a fixed [`crate::Keyring`], or [`Keys`] that a reload
    /// changes) and admitting through `gate`.
    pub fn new(keys: impl Into<Keys>, gate: Arc<A>) -> Self {
        Self {
            keys: keys.into(),
            gate,
            outcomes: Arc::default(),
            recent: Arc::default(),
        }
    }
}

impl<A: ?Sized> Clone for Fence<A> {
    fn clone(&self) -> Self {
        Self {
            keys: self.keys.clone(),
            gate: self.gate.clone(),
            outcomes: self.outcomes.clone(),
            recent: self.recent.clone(),
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
            Rejection::StoreUnavailable | Rejection::AdmittedTooLate => &self.store_errors,
            _ => &self.invalid,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl<A: Admission + ?Sized> Fence<A> {
    /// Checks a presented token (`wire`) for `resource` and admits it through the gate.
    pub async fn admit(&self, resource: &str, wire: &str) -> Result<(Token, Permit), Rejection> {
        let admitted = self.check(resource, wire).await;
        match &admitted {
            Ok((token, _)) => self.recent.admitted(resource, *token),
            Err(rejection) => self.recent.refused(resource, rejection),
        }
        admitted
    }

    async fn check(&self, resource: &str, wire: &str) -> Result<(Token, Permit), Rejection> {
        let token = self
            .keys
            .current()
            .verify(resource, wire)
            .map_err(Rejection::Token)?;
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
    deadline: Duration,
    broken: Broken,
}

impl<S: ?Sized, C: Clone> Clone for FencingLayer<S, C> {
    fn clone(&self) -> Self {
        Self {
            fence: self.fence.clone(),
            classify: self.classify.clone(),
            deadline: self.deadline,
            broken: self.broken,
        }
    }
}

impl<S: ?Sized, C> FencingLayer<S, C> {
    /// A layer enforcing `fence` on the requests `classify` marks as protected.
    pub fn new(fence: Fence<S>, classify: C) -> Self {
        Self {
            fence,
            classify,
            deadline: DEFAULT_EXCHANGE_DEADLINE,
            broken: Broken::default(),
        }
    }

    /// Bounds a write's whole exchange (request body, the inner service's answer, response
    /// body) from admission: past it the exchange is cut off and ends uncertain. This bounds how
    /// long a slow or hostile client can keep higher tokens waiting.
    pub fn with_exchange_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// **Broken on purpose**, for the fault campaign's negative control only: a write's permit
    /// ends, as complete, with the caller's request (when the answer's headers reach the caller,
    /// or the caller goes away), while the storage may still be working on the write.
    #[cfg(feature = "negative-controls")]
    pub fn negative_control_release_with_caller(mut self) -> Self {
        self.broken.release_with_caller = true;
        self
    }

    /// **Broken on purpose**, for the fault campaign's negative control only: a write's
    /// exchange deadline counts from when this process reads its admission, ignoring the
    /// gate's deadline ([`Permit::deadline`]), so a gateway paused between a shared
    /// registration and its answer can deliver the write after the registration lapsed.
    #[cfg(feature = "negative-controls")]
    pub fn negative_control_deadline_from_admission(mut self) -> Self {
        self.broken.deadline_from_admission = true;
        self
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
            deadline: self.deadline,
            broken: self.broken,
        }
    }
}

/// The service produced by [`FencingLayer`].
pub struct FencingService<Inner, S: ?Sized, C> {
    inner: Inner,
    fence: Fence<S>,
    classify: C,
    deadline: Duration,
    broken: Broken,
}

impl<Inner: Clone, S: ?Sized, C: Clone> Clone for FencingService<Inner, S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            fence: self.fence.clone(),
            classify: self.classify.clone(),
            deadline: self.deadline,
            broken: self.broken,
        }
    }
}

/// Requests have axum's [`Body`] (wrap another body with `Body::new`), as does what the inner
/// service receives.
impl<Inner, S, C, ResBody> Service<Request<Body>> for FencingService<Inner, S, C>
where
    Inner: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    S: Admission + ?Sized,
    C: Classify<Body>,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<Body>;
    type Error = Inner::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, Inner::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // The clone that was driven to readiness serves this request (tower's usual dance).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let fence = self.fence.clone();
        let deadline = self.deadline;
        #[cfg(feature = "negative-controls")]
        let broken = self.broken;
        let route = Route::of(self.classify.classify(&req), &req);
        let (mut parts, body) = req.into_parts();
        headers::strip_hop_by_hop(&mut parts.headers);
        headers::strip_fencing(&mut parts.headers);
        Box::pin(async move {
            let (resource, wire) = match route {
                Route::Protect { resource, wire } => (resource, wire),
                Route::Pass => {
                    fence.outcomes.passed.fetch_add(1, Ordering::Relaxed);
                    let req = Request::from_parts(parts, body);
                    return Ok(inner.call(req).await?.map(Body::new));
                }
                Route::Refuse(rejection) => {
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
            set_verified(&mut parts.headers, &resource, &wire);
            // The gate's deadline (a shared gate's registration lapses on a clock this process
            // does not stop) bounds the exchange too.
            let gate_deadline = permit.deadline();
            #[cfg(feature = "negative-controls")]
            let gate_deadline = gate_deadline.filter(|_| !broken.deadline_from_admission);
            let until =
                decide::exchange_until(tokio::time::Instant::now(), deadline, gate_deadline);
            let exchange = Exchange::new(permit, until);
            #[cfg(feature = "negative-controls")]
            let _caller = broken
                .release_with_caller
                .then(|| CallerRelease(exchange.clone()));
            let req = Request::from_parts(
                parts,
                Body::new(Tracked::new(body, exchange.clone(), Side::Request)),
            );
            // The exchange runs in a task of its own: the caller going away must not cancel a
            // write half-way, nor end its permit early.
            let (answer, answered) = tokio::sync::oneshot::channel();
            tokio::spawn(
                exchange_with(inner, req, exchange, fence.outcomes, answer).in_current_span(),
            );
            match answered.await {
                Ok(result) => result,
                // The task panicked: the permit ended (uncertain) with it.
                Err(_) => Ok(exchange_timeout()),
            }
        })
    }
}

/// Where a request goes, once classified.
enum Route {
    /// Not a protected write: to the inner service untouched (but for hop-by-hop and fencing
    /// headers).
    Pass,
    /// A protected write to `resource` with the token `wire` as presented: through the gate.
    Protect {
        /// The resource the write is for.
        resource: String,
        /// Its `Fencing-Token`, one well-formed value.
        wire: String,
    },
    /// Refused before anything reaches the storage.
    Refuse(Rejection),
}

impl Route {
    /// The route of `req`, classified as `decision`.
    fn of(decision: Decision, req: &Request<Body>) -> Self {
        match decision {
            Decision::Protect(resource) => match token_header(req) {
                Ok(wire) => Route::Protect {
                    resource,
                    wire: wire.to_owned(),
                },
                Err(rejection) => Route::Refuse(rejection),
            },
            Decision::Reject(rejection) => Route::Refuse(rejection),
            // A read with a body the headers did not announce (HTTP/2 needs neither
            // Content-Length nor Transfer-Encoding): it may be a write to a lenient storage.
            Decision::Pass if is_read(req.method()) && !req.body().is_end_stream() => {
                Route::Refuse(Rejection::ReadWithBody)
            }
            Decision::Pass => Route::Pass,
        }
    }
}

/// One admitted write's exchange with the storage, run in a task of its own; its answer goes
/// to `answer`, or is read to its end here if nobody waits for it.
async fn exchange_with<Inner, ResBody>(
    mut inner: Inner,
    req: Request<Body>,
    exchange: std::sync::Arc<Exchange>,
    outcomes: Arc<Outcomes>,
    answer: tokio::sync::oneshot::Sender<Result<Response<Body>, Inner::Error>>,
) where
    Inner: Service<Request<Body>, Response = Response<ResBody>>,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let until = exchange.deadline();
    // `timeout_at` polls the call before its timer, so a call begun past the deadline would
    // still go out: a process paused since its admission sends nothing, and nothing was sent.
    if !decide::may_send(tokio::time::Instant::now(), until) {
        tracing::warn!("write admitted too late to be sent before its deadline; not sent");
        exchange.end_now(Outcome::Complete);
        outcomes.refused(&Rejection::AdmittedTooLate);
        let _ = answer.send(Ok(Rejection::AdmittedTooLate.into_response()));
        return;
    }
    let response = match tokio::time::timeout_at(until, inner.call(req)).await {
        Ok(Ok(response)) => response.map(Body::new),
        Ok(Err(e)) => {
            let _ = answer.send(Err(e));
            return;
        }
        Err(_) => {
            tracing::warn!("write passed its exchange deadline");
            let _ = answer.send(Ok(exchange_timeout()));
            return;
        }
    };
    if response.extensions().get::<ExchangeIncomplete>().is_none() {
        exchange.answered();
    }
    let response = response.map(|b| Body::new(Tracked::new(b, exchange, Side::Response)));
    if let Err(Ok(unwanted)) = answer.send(Ok(response)) {
        // Nobody waits for the answer: read it to its end here, so a write the storage
        // completed counts as complete.
        let _ = http_body_util::BodyExt::collect(unwanted.into_body()).await;
    }
}

fn is_read(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    )
}

/// Sets the verified resource and token, as presented (each already checked to be one
/// well-formed value), on the request the storage receives.
fn set_verified(headers: &mut HeaderMap, resource: &str, wire: &str) {
    for (name, value) in [(RESOURCE_HEADER, resource), (TOKEN_HEADER, wire)] {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(name, value);
        }
    }
}

/// The answer when a write's exchange did not produce one in time.
fn exchange_timeout() -> Response<Body> {
    let mut response = problem(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream-timeout",
        "the storage did not answer within the write's deadline",
    );
    response.extensions_mut().insert(ExchangeIncomplete);
    response
}

/// A problem+json response.
pub(crate) fn problem(status: StatusCode, slug: &str, detail: &str) -> Response<Body> {
    runtime::problem::response(
        status,
        slug,
        status.canonical_reason().unwrap_or("Error"),
        detail,
        None,
    )
}
