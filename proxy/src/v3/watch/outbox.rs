//! The answers waiting for a client: bounded in bytes per stream and over every stream, so a
//! client that does not read is cut off alone. A stream that ends with a failure (it fell
//! behind, etcd failed, the proxy drains) gives back what was still waiting at once — its client
//! gets the failure as its next answer and resumes from the last revision it read — so a client
//! that holds a dead stream open without reading it holds no memory of the replica's.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use etcd_client::proto::PbWatchResponse;
use futures::stream::Stream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{MAX_BUFFERED_BYTES, MAX_BUFFERED_TOTAL};
use crate::v3::status::{Code, Status};

/// The producing side: the pump, and the hubs its shared watches are in.
#[derive(Clone)]
pub(super) struct Outbox {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Notify,
    /// Every stream's waiting bytes.
    total: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Queue {
    answers: VecDeque<(usize, PbWatchResponse)>,
    /// This stream's waiting bytes.
    bytes: usize,
    /// How the stream ends, once it does (`None` inside: quietly).
    end: Option<Option<Status>>,
    /// The client has had the end, or is gone.
    closed: bool,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Empties the queue, giving its bytes back to the replica's total.
    fn clear(&self, q: &mut Queue) {
        self.total.fetch_sub(q.bytes, Ordering::AcqRel);
        q.bytes = 0;
        q.answers.clear();
    }
}

impl Outbox {
    /// An empty outbox counting towards `total`.
    pub(super) fn new(total: Arc<AtomicUsize>) -> Self {
        Self {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                ready: Notify::new(),
                total,
            }),
        }
    }

    /// Queues `answer`; false if the client already holds answers and this one would take it
    /// past its bound or the replica past its own, or the stream has ended.
    pub(super) fn push(&self, answer: PbWatchResponse) -> bool {
        let size = prost::Message::encoded_len(&answer);
        let mut q = self.shared.lock();
        if q.closed || q.end.is_some() {
            return false;
        }
        let all = self.shared.total.load(Ordering::Acquire);
        if q.bytes > 0 && (q.bytes + size > MAX_BUFFERED_BYTES || all + size > MAX_BUFFERED_TOTAL) {
            return false;
        }
        q.bytes += size;
        self.shared.total.fetch_add(size, Ordering::AcqRel);
        q.answers.push_back((size, answer));
        drop(q);
        self.shared.ready.notify_one();
        true
    }

    /// Ends the stream: with `failure`, at once — what was waiting is given back and the
    /// failure is the client's next answer; without, once the client has read what waits.
    pub(super) fn end(&self, failure: Option<Status>) {
        let mut q = self.shared.lock();
        if failure.is_some() {
            self.shared.clear(&mut q);
        }
        if q.end.is_none() {
            q.end = Some(failure);
        }
        drop(q);
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
        if let Some((size, answer)) = q.answers.pop_front() {
            q.bytes -= size;
            self.shared.total.fetch_sub(size, Ordering::AcqRel);
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
        self.shared.clear(&mut q);
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
