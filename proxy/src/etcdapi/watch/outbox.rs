//! The answers waiting for a client, and what they hold until written: each answer is counted
//! in the replica's [`Budgets`] from the moment it is queued until HTTP/2 has written (or
//! dropped) its last byte — queued here, then taken by the client's front and encoded, then
//! handed to HTTP/2 a piece at a time ([`Written`]) — so no answer is held uncounted. A
//! stream's queue is bounded on its own too ([`MAX_BUFFERED_BYTES`]: its client does not read,
//! one answer alone always passes the queue's bound, not the budgets'). A stream that ends with
//! a failure (it fell behind, a budget ended it, etcd failed, the proxy drains) gives back what
//! was still waiting at once — its client gets the failure as its next answer and resumes from
//! the last revision it read — so a client that holds a dead stream open without reading it
//! holds no memory of the replica's beyond what HTTP/2 already buffers for it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use etcd_client::proto::PbWatchResponse;
use futures::stream::Stream;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use super::budget::{Budgets, Holder, Meter, Over};
use super::MAX_BUFFERED_BYTES;
use crate::etcdapi::status::{Code, Status};

/// gRPC's frame header before each message: what an answer takes beyond its encoding.
const FRAME_HEADER: usize = 5;

/// Most bytes of encoded answers handed to HTTP/2 at once: HTTP/2 asks for more only when it can
/// send, so what it holds of a stream is its send buffer and one piece; the rest stays here,
/// where ending the stream gives it back.
const PIECE: usize = 64 << 10;

/// The producing side: the pump, and the hubs its shared watches are in.
#[derive(Clone)]
pub(super) struct Outbox {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Notify,
    meter: Meter,
    /// Ends the stream's pump when a budget ends the stream from elsewhere.
    ended: mpsc::UnboundedSender<Status>,
}

#[derive(Default)]
struct Queue {
    answers: VecDeque<(usize, PbWatchResponse)>,
    /// This stream's queued bytes (what the client has not taken).
    bytes: usize,
    /// How the stream ends, once it does (`None` inside: quietly).
    end: Option<Option<Status>>,
    /// The client has had the end, or is gone.
    closed: bool,
    /// Encoded answers the client's front took and has not handed to HTTP/2 yet.
    rest: Bytes,
    /// A budget ended the stream: nothing more is queued or handed over.
    cut: bool,
    /// It was ended with an encoded answer partly handed over: the front resets the stream,
    /// so that the client never reads part of an answer.
    reset: bool,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Empties the queue; the bytes to give back.
    fn clear(q: &mut Queue) -> usize {
        let freed = q.bytes;
        q.bytes = 0;
        q.answers.clear();
        freed
    }
}

impl Holder for Shared {
    fn cut(&self, why: Over) {
        let status = ended(why);
        let mut q = self.lock();
        if q.cut {
            return;
        }
        q.cut = true;
        let freed = Shared::clear(&mut q) + q.rest.len();
        q.reset = !q.rest.is_empty();
        q.rest = Bytes::new();
        if !q.end.as_ref().is_some_and(Option::is_some) {
            q.end = Some(Some(status.clone()));
        }
        drop(q);
        self.meter.release(freed);
        let _ = self.ended.send(status);
        self.ready.notify_one();
    }
}

impl Outbox {
    /// An empty outbox of a stream of `principal`'s, counted in `budgets`; `ended` ends its
    /// pump when a budget ends the stream.
    pub(super) fn new(
        budgets: &Arc<Budgets>,
        principal: Option<&str>,
        ended: mpsc::UnboundedSender<Status>,
    ) -> Self {
        let shared = Arc::new_cyclic(|this: &Weak<Shared>| {
            let holder: Weak<dyn Holder> = this.clone();
            Shared {
                queue: Mutex::new(Queue::default()),
                ready: Notify::new(),
                meter: budgets.open(principal, holder),
                ended,
            }
        });
        Self { shared }
    }

    /// Queues `answer`; refused — with the status the stream ends with — if the client already
    /// holds answers and this one would take its queue past its bound, if a budget cannot
    /// hold it, or if the stream has ended.
    pub(super) fn push(&self, answer: PbWatchResponse) -> Result<(), Status> {
        let size = prost::Message::encoded_len(&answer) + FRAME_HEADER;
        {
            let q = self.shared.lock();
            if q.closed || q.end.is_some() || q.cut {
                return Err(fell_behind());
            }
            if q.bytes > 0 && q.bytes + size > MAX_BUFFERED_BYTES {
                drop(q);
                self.shared.meter.refused(Over::Stream);
                return Err(fell_behind());
            }
        }
        self.shared.meter.charge(size).map_err(ended)?;
        let mut q = self.shared.lock();
        if q.closed || q.end.is_some() || q.cut {
            drop(q);
            self.shared.meter.release(size);
            return Err(fell_behind());
        }
        q.bytes += size;
        q.answers.push_back((size, answer));
        drop(q);
        self.shared.ready.notify_one();
        Ok(())
    }

    /// Ends the stream: with `failure`, at once — what was waiting is given back and the
    /// failure is the client's next answer; without, once the client has read what waits.
    pub(super) fn end(&self, failure: Option<Status>) {
        let mut q = self.shared.lock();
        let freed = if failure.is_some() {
            Shared::clear(&mut q)
        } else {
            0
        };
        if q.end.is_none() {
            q.end = Some(failure);
        }
        drop(q);
        self.shared.meter.release(freed);
        self.shared.ready.notify_one();
    }

    /// The stream the client reads; `stop` (the pump's) fires when it is dropped.
    pub(super) fn inbox(
        &self,
        stop: CancellationToken,
    ) -> impl Stream<Item = Result<PbWatchResponse, Status>> + Send + 'static {
        let inbox = Inbox {
            shared: self.shared.clone(),
            _stop: stop.drop_guard(),
        };
        futures::stream::unfold(inbox, |inbox| async move {
            loop {
                match inbox.next() {
                    Next::Answer(answer) => return Some((answer, inbox)),
                    Next::Over => return None,
                    // A push between the look and here left a permit: no wake-up is lost.
                    Next::Wait => inbox.shared.ready.notified().await,
                }
            }
        })
    }

    /// What the client's front holds of the encoded answers, until written.
    pub(super) fn written(&self) -> Written {
        Written {
            shared: self.shared.clone(),
        }
    }
}

/// What the client's next read finds.
enum Next {
    Answer(Result<PbWatchResponse, Status>),
    Over,
    Wait,
}

impl Inbox {
    fn next(&self) -> Next {
        let mut q = self.shared.lock();
        // Taken, still counted: the front encodes it, and its bytes are given back as HTTP/2
        // writes them ([`Written`]).
        if let Some((size, answer)) = q.answers.pop_front() {
            q.bytes -= size;
            return Next::Answer(Ok(answer));
        }
        if q.closed {
            return Next::Over;
        }
        match q.end.take() {
            Some(end) => {
                q.closed = true;
                end.map_or(Next::Over, |failure| Next::Answer(Err(failure)))
            }
            None => Next::Wait,
        }
    }
}

/// The client's end: what is still waiting is given back when it goes, and the pump stopped.
struct Inbox {
    shared: Arc<Shared>,
    _stop: tokio_util::sync::DropGuard,
}

impl Drop for Inbox {
    fn drop(&mut self) {
        let mut q = self.shared.lock();
        q.closed = true;
        let freed = Shared::clear(&mut q);
        drop(q);
        self.shared.meter.release(freed);
    }
}

/// A watch stream's encoded answers as its client's front holds them: every frame of the
/// encoded answer stream goes through [`Written::hold`] and out in pieces through
/// [`Written::piece`], each counted until HTTP/2 drops it (written, or the stream reset).
/// Whatever the front takes from the answer stream and never hands over is given back when
/// the stream's last handle goes.
#[derive(Clone)]
pub(crate) struct Written {
    shared: Arc<Shared>,
}

/// The stream was ended with part of an encoded answer handed over: it must be reset.
#[derive(Debug)]
pub(crate) struct CutOff;

impl std::fmt::Display for CutOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("lease-proxy: the watch stream was cut off in the middle of an answer")
    }
}

impl std::error::Error for CutOff {}

impl Written {
    /// Keeps `data`, encoded answers the front took from the answer stream, to be handed over
    /// in pieces (their bytes are already counted; given back at once if the stream was cut).
    pub(crate) fn hold(&self, data: Bytes) {
        let mut q = self.shared.lock();
        if q.cut {
            drop(q);
            self.shared.meter.release(data.len());
            return;
        }
        q.rest = if q.rest.is_empty() {
            data
        } else {
            Bytes::from([q.rest.as_ref(), data.as_ref()].concat())
        };
    }

    /// The next piece of what is held, at most [`PIECE`] bytes, counted until dropped; `None`
    /// when nothing is held; [`CutOff`] once the stream was ended mid-answer.
    pub(crate) fn piece(&self) -> Result<Option<Bytes>, CutOff> {
        let mut q = self.shared.lock();
        if q.reset {
            return Err(CutOff);
        }
        if q.rest.is_empty() {
            return Ok(None);
        }
        let n = q.rest.len().min(PIECE);
        let bytes = q.rest.split_to(n);
        drop(q);
        Ok(Some(Bytes::from_owner(Piece {
            bytes,
            shared: self.shared.clone(),
        })))
    }

    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.shared.lock().rest.is_empty()
    }
}

/// A piece handed to HTTP/2: its bytes are given back when the last of its slices goes.
struct Piece {
    bytes: Bytes,
    shared: Arc<Shared>,
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        self.shared.meter.release(self.bytes.len());
    }
}

/// Why a stream is cut off when its client does not read.
pub(super) fn fell_behind() -> Status {
    Status::new(
        Code::Unavailable,
        "lease-proxy: the watch stream fell behind (the client did not read); resume from the \
         last revision received",
    )
}

/// How a stream ends when `why` ends it.
fn ended(why: Over) -> Status {
    match why {
        Over::Stream => fell_behind(),
        Over::Principal => Status::new(
            Code::Unavailable,
            "lease-proxy: this principal's watch streams hold as many unread answers as it may, \
             and this stream held the most; resume from the last revision received",
        ),
        Over::Replica => Status::new(
            Code::Unavailable,
            "lease-proxy: the replica's watch streams hold as many unread answers as they may, \
             and this stream held the most of the principal holding the most; resume from the \
             last revision received (on another replica, say)",
        ),
        Over::TooLarge => Status::new(
            Code::ResourceExhausted,
            "lease-proxy: a watch answer larger than a principal's watch streams may hold; \
             watch with fragment set (etcd then splits it), or a narrower range",
        ),
    }
}
