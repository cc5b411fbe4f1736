//! The answers waiting for a client: bounded in bytes per stream and over every stream, so a
//! client that does not read is cut off alone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use etcd_client::proto::PbWatchResponse;
use futures::stream::Stream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{MAX_BUFFERED_BYTES, MAX_BUFFERED_TOTAL};
use crate::v3::status::{Code, Status};

/// The answers waiting for the client, bounded in bytes.
#[derive(Clone)]
pub(super) struct Outbox {
    pub(super) tx: mpsc::UnboundedSender<(usize, Result<PbWatchResponse, Status>)>,
    /// This stream's waiting bytes.
    pub(super) bytes: Arc<AtomicUsize>,
    /// Every stream's.
    pub(super) total: Arc<AtomicUsize>,
}

impl Outbox {
    /// Queues `answer`; false if the client already holds answers and this one would take it
    /// past its bound or the replica past its own (or the client is gone).
    pub(super) fn push(&self, answer: PbWatchResponse) -> bool {
        let size = prost::Message::encoded_len(&answer);
        let held = self.bytes.load(Ordering::Acquire);
        let all = self.total.load(Ordering::Acquire);
        if held > 0 && (held + size > MAX_BUFFERED_BYTES || all + size > MAX_BUFFERED_TOTAL) {
            return false;
        }
        self.bytes.fetch_add(size, Ordering::AcqRel);
        self.total.fetch_add(size, Ordering::AcqRel);
        self.tx.send((size, Ok(answer))).is_ok()
    }
}

/// The stream the client reads: the outbox, each answer's bytes given back as it goes; the
/// pump stops when this is dropped.
pub(super) fn inbox(
    rx: mpsc::UnboundedReceiver<(usize, Result<PbWatchResponse, Status>)>,
    bytes: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
    stop: CancellationToken,
) -> impl Stream<Item = Result<PbWatchResponse, Status>> + Send + 'static {
    let inbox = Inbox {
        rx,
        total,
        _stop: stop.drop_guard(),
    };
    futures::stream::unfold(inbox, move |mut inbox| {
        let bytes = bytes.clone();
        async move {
            let (size, answer) = inbox.rx.recv().await?;
            bytes.fetch_sub(size, Ordering::AcqRel);
            inbox.total.fetch_sub(size, Ordering::AcqRel);
            Some((answer, inbox))
        }
    })
}

/// The client's end of the outbox: what is still in it is given back to the replica's total
/// when it goes, and the pump is stopped.
struct Inbox {
    rx: mpsc::UnboundedReceiver<(usize, Result<PbWatchResponse, Status>)>,
    total: Arc<AtomicUsize>,
    _stop: tokio_util::sync::DropGuard,
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.rx.close();
        while let Ok((size, _)) = self.rx.try_recv() {
            self.total.fetch_sub(size, Ordering::AcqRel);
        }
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
