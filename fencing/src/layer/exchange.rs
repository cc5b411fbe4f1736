//! One admitted write's exchange with the storage, and when it has truly ended (docs/DESIGN.md §4,
//! "In flight means in flight at the storage").
//!
//! The [`Permit`] is owned by an [`Exchange`] shared by the three things that make up the
//! exchange: the request body on its way to the storage, the task that calls the storage, and
//! the response body on its way back. The permit ends when the last of them lets go:
//! [`Outcome::Complete`] if the request body reached its end, the storage answered and that
//! answer's body reached its end, all before the deadline; [`Outcome::Uncertain`] in every
//! other case (the client or the storage went away, the deadline passed, the storage answered
//! early, or the answer is a proxy's own failure marked [`ExchangeIncomplete`]).

use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::admission::{Outcome, Permit};
use crate::decide;

/// Marks a response that did not come complete from the storage: e.g. a proxy's own 502 or 504
/// after it may already have sent (part of) the write. The fencing layer then ends the write as
/// [`Outcome::Uncertain`]. Inner services behind [`FencingLayer`](super::FencingLayer) that
/// forward writes should insert it into such responses' extensions.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExchangeIncomplete;

/// The shared state of one exchange; ends the permit when dropped.
pub(super) struct Exchange {
    permit: Mutex<Option<Permit>>,
    request_done: AtomicBool,
    answered: AtomicBool,
    response_done: AtomicBool,
    deadline: Instant,
}

impl Exchange {
    pub(super) fn new(permit: Permit, deadline: Instant) -> Arc<Self> {
        Arc::new(Self {
            permit: Mutex::new(Some(permit)),
            request_done: AtomicBool::new(false),
            answered: AtomicBool::new(false),
            response_done: AtomicBool::new(false),
            deadline,
        })
    }

    /// The storage answered, with an answer that says it came from the storage. An answer that
    /// arrives before the request body was handed over in full is an *early* answer: the storage
    /// may still be reading (and applying) the rest, so the exchange stays uncertain.
    pub(super) fn answered(&self) {
        if self.request_done.load(Ordering::Acquire) {
            self.answered.store(true, Ordering::Release);
        }
    }

    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Ends the permit now, whatever the exchange is doing: when nothing was sent, and for the
    /// negative control that ties the permit to the caller (`super::broken`).
    pub(super) fn end_now(&self, outcome: Outcome) {
        let permit = self
            .permit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(mut permit) = permit {
            permit.end(outcome);
        }
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let complete = self.request_done.load(Ordering::Acquire)
            && self.answered.load(Ordering::Acquire)
            && self.response_done.load(Ordering::Acquire);
        let permit = self
            .permit
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut permit) = permit {
            permit.end(if complete {
                Outcome::Complete
            } else {
                Outcome::Uncertain
            });
        }
    }
}

/// Which end of the exchange a [`Tracked`] body is.
#[derive(Debug, Clone, Copy)]
pub(super) enum Side {
    Request,
    Response,
}

/// A body that tells its [`Exchange`] when it has been read to its end, lets go of it then (or
/// when dropped before), and fails once the exchange's deadline has passed.
pub(super) struct Tracked<B> {
    inner: B,
    exchange: Option<Arc<Exchange>>,
    side: Side,
    deadline: Pin<Box<Sleep>>,
}

/// The deadline passed while a body was still on its way.
#[derive(Debug, thiserror::Error)]
#[error("the write's exchange with the storage passed its deadline")]
pub struct ExchangeDeadline;

impl<B: HttpBody> Tracked<B> {
    pub(super) fn new(inner: B, exchange: Arc<Exchange>, side: Side) -> Self {
        let deadline = Box::pin(tokio::time::sleep_until(exchange.deadline()));
        let mut tracked = Self {
            inner,
            exchange: Some(exchange),
            side,
            deadline,
        };
        if tracked.inner.is_end_stream() {
            tracked.finish();
        }
        tracked
    }

    fn finish(&mut self) {
        if let Some(exchange) = self.exchange.take() {
            let flag = match self.side {
                Side::Request => &exchange.request_done,
                Side::Response => &exchange.response_done,
            };
            flag.store(true, Ordering::Release);
        }
    }
}

impl<B> HttpBody for Tracked<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.exchange.is_none() {
            // Ended, or failed: nothing more to give.
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        // A request frame (or its end, which completes a chunked request) handed over past the
        // deadline would reach the storage after the gate stopped counting the write as in
        // flight — it happens when the process was paused with the frame ready: fail instead.
        if matches!(this.side, Side::Request)
            && polled.is_ready()
            && !decide::may_send(Instant::now(), this.deadline.deadline())
        {
            this.exchange = None;
            return Poll::Ready(Some(Err(Box::new(ExchangeDeadline))));
        }
        match polled {
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => {
                if this.inner.is_end_stream() {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                // Let go without marking the end: the exchange is uncertain.
                this.exchange = None;
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.exchange = None;
                    Poll::Ready(Some(Err(Box::new(ExchangeDeadline))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
