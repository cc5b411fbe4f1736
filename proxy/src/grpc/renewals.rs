//! The answers of one `LeaseKeepAlive` stream: its requests are read as they come, up to
//! [`READ_AHEAD`] not yet started, and renewed [`IN_FLIGHT`] at a time, answered in the order
//! they were asked. Reading ahead matters: HTTP/2 (the `h2` crate) ends the whole connection
//! (`GOAWAY ENHANCE_YOUR_CALM`) once about 2,000 small DATA frames wait unread, and a client
//! renewing thousands of leases on one stream (Go's clientv3 renews every lease of a client on
//! one) sends its due renewals in one burst, each request its own frame, as etcd takes them.
//!
//! Each request is judged first ([`Renewer::judge`]: still authorised, the caller's lease), and
//! the caller's leases renewed over the proxy's shared keepalive streams ([`Renewer::renew`])
//! until the stream has more than one request under way at once — a client renewing many
//! leases on one stream, as Go's clientv3 does. From then on they are renewed on an etcd
//! keepalive stream of this stream's own: a renewal is one message each way, with no other task
//! in between, and etcd answers a stream's keepalives in the order sent. A stream that renews
//! one lease at a time (a stream per lease, or one renewal and a half-close) keeps to the shared
//! streams, which carry many such streams' renewals together and cost it no opening. Renewals
//! go over the shared streams while the own one opens; once it is lost (etcd ends it, fails, or
//! leaves a keepalive unanswered), what was on it and every later renewal go there too, and
//! they re-open and resend on their own: a keepalive is idempotent, so one sent twice does no
//! harm. An opening that finds its lease gone is tried again later.
//!
//! No task is spawned: the answers are a stream that tonic polls and drops when the call ends,
//! so a half-close ends it once every answer is sent, and a cancel stops it (and the etcd stream
//! of its own, and every renewal not yet sent to etcd) at once.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, Stream, StreamExt};

/// Most renewals of one stream under way at once.
pub(crate) const IN_FLIGHT: usize = 64;

/// Most requests of one stream read and not yet started (8 bytes each: 32 KiB a stream).
pub(crate) const READ_AHEAD: usize = 4096;

/// What a renewal is once judged.
pub(crate) enum Step<T> {
    /// Answered as it is (not the caller's lease: no TTL).
    Answer(T),
    /// The caller's lease: renew it.
    Renew(i64),
}

/// How opening the stream's own etcd stream went.
pub(crate) enum Open<U> {
    Stream(U),
    /// etcd does not know the lease it was opened with.
    Gone,
    /// Not opened (etcd did not answer or refused, or no more are allowed): the shared streams
    /// take every renewal from now on.
    Failed,
}

/// The decisions and the etcd around one stream's renewals.
pub(crate) trait Renewer {
    type Answer: Send + Unpin + 'static;
    type Upstream: Upstream<Answer = Self::Answer>;
    /// Judges a request for lease `id`.
    fn judge(&self, id: i64) -> BoxFuture<'static, Result<Step<Self::Answer>, tonic::Status>>;
    /// Opens an etcd keepalive stream of the stream's own with lease `id` (judged the caller's),
    /// whose answer to that first renewal is not passed on.
    fn open(&self, id: i64) -> BoxFuture<'static, Open<Self::Upstream>>;
    /// Renews lease `id` (judged the caller's) over the shared streams.
    fn renew(&self, id: i64) -> BoxFuture<'static, Result<Self::Answer, tonic::Status>>;
}

/// An etcd keepalive stream of one stream's own.
pub(crate) trait Upstream {
    type Answer;
    /// Sends a keepalive for `id`; `false` if the stream is lost.
    fn send(&mut self, id: i64) -> bool;
    /// etcd's next answer, for the lease it names; `None` once the stream is lost.
    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Option<(i64, Self::Answer)>>;
}

/// Where the stream's renewals go.
enum Route<U> {
    /// Over the shared streams, until the stream has more than one request under way: then
    /// to a stream of its own, opened with the renewal that found it so.
    Unopened,
    /// Over the shared streams while it opens.
    Opening(BoxFuture<'static, Open<U>>),
    Own(U),
    /// Over the shared streams, for the rest of the stream's life.
    Shared,
}

type Judging<T> = Tagged<BoxFuture<'static, Result<Step<T>, tonic::Status>>>;

/// Answers to `requests` (lease ids, or the failure that ends the stream), each from `renewer`.
pub(crate) struct Renewals<S, R: Renewer> {
    requests: Option<S>,
    waiting: VecDeque<i64>,
    /// The requests' failure, answered once every earlier request is.
    failed: Option<tonic::Status>,
    /// The answers of the renewals started, in the order asked, from number `first` on: `None`
    /// until answered.
    answers: VecDeque<Option<Result<R::Answer, tonic::Status>>>,
    first: u64,
    /// Renewals being judged, or renewed over the shared streams, by number.
    running: FuturesUnordered<Judging<R::Answer>>,
    /// Renewals sent on the stream's own etcd stream, oldest first: (number, lease).
    on_wire: VecDeque<(u64, i64)>,
    route: Route<R::Upstream>,
    renewer: R,
}

impl<S, R> Renewals<S, R>
where
    S: Stream<Item = Result<i64, tonic::Status>> + Unpin,
    R: Renewer + Unpin,
    R::Upstream: Unpin,
{
    pub(crate) fn new(requests: S, renewer: R) -> Self {
        Self {
            requests: Some(requests),
            waiting: VecDeque::new(),
            failed: None,
            answers: VecDeque::new(),
            first: 0,
            running: FuturesUnordered::new(),
            on_wire: VecDeque::new(),
            route: Route::Unopened,
            renewer,
        }
    }

    /// Reads what has come, as far as the bound allows (else the connection's budget goes).
    fn read(&mut self, cx: &mut Context<'_>) {
        while self.waiting.len() < READ_AHEAD {
            let Some(requests) = self.requests.as_mut() else {
                break;
            };
            match requests.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(id))) => self.waiting.push_back(id),
                Poll::Ready(Some(Err(e))) => {
                    self.failed = Some(e);
                    self.requests = None;
                }
                Poll::Ready(None) => self.requests = None,
                Poll::Pending => break,
            }
        }
    }

    fn start(&mut self) {
        while self.answers.len() < IN_FLIGHT {
            let Some(id) = self.waiting.pop_front() else {
                break;
            };
            let seq = self.first + self.answers.len() as u64;
            self.answers.push_back(None);
            let fut = self.renewer.judge(id);
            self.running.push(Tagged { seq, fut });
        }
    }

    fn answer(&mut self, seq: u64, answer: Result<R::Answer, tonic::Status>) {
        if let Some(slot) = usize::try_from(seq - self.first)
            .ok()
            .and_then(|i| self.answers.get_mut(i))
        {
            *slot = Some(answer);
        }
    }

    fn renew_shared(&mut self, seq: u64, id: i64) {
        let fut = self.renewer.renew(id).map(|r| r.map(Step::Answer)).boxed();
        self.running.push(Tagged { seq, fut });
    }

    /// Renewal `seq` of the caller's lease `id`, on its way.
    fn renew(&mut self, seq: u64, id: i64) {
        match &mut self.route {
            Route::Own(own) => {
                if own.send(id) {
                    self.on_wire.push_back((seq, id));
                } else {
                    self.lose();
                    self.renew_shared(seq, id);
                }
            }
            Route::Unopened if self.answers.len() > 1 => {
                self.route = Route::Opening(self.renewer.open(id));
                self.renew_shared(seq, id);
            }
            Route::Unopened | Route::Opening(_) | Route::Shared => self.renew_shared(seq, id),
        }
    }

    /// The own stream is lost: what was on it goes over the shared streams.
    fn lose(&mut self) {
        self.route = Route::Shared;
        while let Some((seq, id)) = self.on_wire.pop_front() {
            self.renew_shared(seq, id);
        }
    }

    /// Whether anything changed.
    fn poll_opening(&mut self, cx: &mut Context<'_>) -> bool {
        let Route::Opening(opening) = &mut self.route else {
            return false;
        };
        let Poll::Ready(opened) = opening.poll_unpin(cx) else {
            return false;
        };
        self.route = match opened {
            Open::Stream(own) => Route::Own(own),
            Open::Gone => Route::Unopened,
            Open::Failed => Route::Shared,
        };
        true
    }

    /// Whether anything changed.
    fn poll_running(&mut self, cx: &mut Context<'_>) -> bool {
        let mut changed = false;
        while let Poll::Ready(Some((seq, step))) = self.running.poll_next_unpin(cx) {
            changed = true;
            match step {
                Ok(Step::Renew(id)) => self.renew(seq, id),
                Ok(Step::Answer(answer)) => self.answer(seq, Ok(answer)),
                Err(e) => self.answer(seq, Err(e)),
            }
        }
        changed
    }

    /// Whether anything changed.
    fn poll_own(&mut self, cx: &mut Context<'_>) -> bool {
        let mut changed = false;
        while let Route::Own(own) = &mut self.route {
            match own.poll_answer(cx) {
                Poll::Ready(Some((id, answer))) => {
                    changed = true;
                    // etcd answers in the order sent: the oldest renewal of `id` on the wire.
                    if let Some(at) = self.on_wire.iter().position(|&(_, on)| on == id) {
                        if let Some((seq, _)) = self.on_wire.remove(at) {
                            self.answer(seq, Ok(answer));
                        }
                    }
                }
                Poll::Ready(None) => {
                    self.lose();
                    return true;
                }
                Poll::Pending => break,
            }
        }
        changed
    }
}

impl<S, R> Stream for Renewals<S, R>
where
    S: Stream<Item = Result<i64, tonic::Status>> + Unpin,
    R: Renewer + Unpin,
    R::Upstream: Unpin,
{
    type Item = Result<R::Answer, tonic::Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.read(cx);
        this.start();
        // Until nothing changes: a change can start what has not been polled yet (an opening,
        // a renewal over the shared streams, a stall to watch for).
        while this.poll_opening(cx) | this.poll_running(cx) | this.poll_own(cx) {}
        if let Some(Some(_)) = this.answers.front() {
            this.first += 1;
            return Poll::Ready(this.answers.pop_front().flatten());
        }
        // Nothing under way and nothing waiting: ended, or waiting for requests (polled above,
        // so their arrival wakes this).
        if this.answers.is_empty() && this.waiting.is_empty() && this.requests.is_none() {
            return Poll::Ready(this.failed.take().map(Err));
        }
        Poll::Pending
    }
}

/// A future with the number of the renewal it is for.
pub(crate) struct Tagged<F> {
    seq: u64,
    fut: F,
}

impl<F: Future + Unpin> Future for Tagged<F> {
    type Output = (u64, F::Output);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.fut.poll_unpin(cx).map(|out| (this.seq, out))
    }
}

#[cfg(test)]
mod tests;
