//! `Watch`: etcd's bidirectional watch stream, confined to the caller's namespace.
//! (Over 500 lines with its tests — 455 of code: one pump, whose confinement, bounds and endings
//! read best together.)
//!
//! One etcd watch stream per client stream, opened on the client's first create, so watch ids
//! are the ids etcd itself assigns (or the client chose) and every answer — created, canceled,
//! compacted (`compact_revision`), progress, fragments — is etcd's own. What the proxy adds:
//! - every create is confined: its key and range end move into the namespace exactly as a
//!   Range's do ([`Namespace::range_end`]), so `\0`, over-long ends and "every key" stop at the
//!   namespace's end; every event's key and `prev_kv` come back out (an event outside the
//!   namespace, which a confined watch cannot produce, is dropped);
//! - at most [`MAX_WATCHES`] watches per stream; a create past it is answered as etcd answers a
//!   failed create (`created` and `canceled`, watch id -1, the reason), in order after the
//!   creates before it;
//! - etcd's answers are read as they come, whatever the client does: at most
//!   [`MAX_BUFFERED_BYTES`] wait for a client that does not read, after which its stream ends
//!   Unavailable (a client resumes from the last revision it got, as on a member failure), so a
//!   stalled reader never holds back etcd or the connection every other stream shares;
//! - the caller's right is judged again whenever the token file changes: a removed or narrowed
//!   principal's stream ends PermissionDenied;
//! - a failed etcd stream ends the client's Unavailable (its member is unpinned), as do the
//!   proxy's shutdown and etcd ending the stream; the client's own half-close ends it as etcd
//!   ends it (status OK).
//!
//! The pump that does this is one task per stream, on the proxy's task tracker; it ends when
//! the client's stream is dropped (a cancel, a reset, the connection gone) or the proxy stops.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use etcd_client::proto::{PbResponseHeader, PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};
use etcd_client::{WatchFilterType, WatchOptions, WatchStream};
use futures::stream::{BoxStream, Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::namespace::Namespace;
use super::service::{Caller, Service};
use super::status::{Code, Status};
use crate::etcd::Etcd;
use crate::lease::{Recheck, Slot, WatchSlots};

/// Most watches (created or being created) on one stream.
pub(crate) const MAX_WATCHES: usize = 1024;

/// Most bytes of answers waiting for a client that does not read (one answer alone always
/// passes: a client that reads gets even an answer larger than this, as etcd would send it).
pub(crate) const MAX_BUFFERED_BYTES: usize = 8 << 20;

/// Most bytes of answers waiting, over every stream of the replica: past it, a stream that
/// already holds answers is cut off rather than given more memory.
pub(crate) const MAX_BUFFERED_TOTAL: usize = 256 << 20;

/// etcd's id for "no watch" (a failed create, a progress answer of the whole stream).
const NO_WATCH: i64 = -1;

/// What a client's stream sends.
pub(crate) type Requests = BoxStream<'static, Result<PbWatchRequest, Status>>;

/// What it is answered.
pub(crate) type Answers = BoxStream<'static, Result<PbWatchResponse, Status>>;

/// One client request, confined.
enum Ask {
    /// A create, with its etcd key and options.
    Create(Vec<u8>, WatchOptions),
    Cancel(i64),
    Progress,
    /// An empty request (no union): etcd ignores it.
    Nothing,
}

/// A create's key, range and options as etcd reads them, moved into `ns`: an empty key is
/// `\0` (etcd's smallest key), an empty range end a single key, `\0` every key from `key` on.
fn confine(ns: &Namespace, request: PbWatchRequest) -> Ask {
    let Some(union) = request.request_union else {
        return Ask::Nothing;
    };
    let c = match union {
        PbWatchRequestUnion::CreateRequest(c) => c,
        PbWatchRequestUnion::CancelRequest(c) => return Ask::Cancel(c.watch_id),
        PbWatchRequestUnion::ProgressRequest(_) => return Ask::Progress,
    };
    let key = if c.key.is_empty() {
        ns.key(b"\0")
    } else {
        ns.key(&c.key)
    };
    let end = ns.range_end(&c.range_end);
    let mut options = WatchOptions::new()
        .with_key(key.clone())
        .with_start_revision(c.start_revision)
        .with_watch_id(c.watch_id);
    if !end.is_empty() {
        options = options.with_range(end);
    }
    // etcd ignores filter values it does not know.
    let filters: Vec<_> = c
        .filters
        .iter()
        .filter_map(|f| match f {
            0 => Some(WatchFilterType::NoPut),
            1 => Some(WatchFilterType::NoDelete),
            _ => None,
        })
        .collect();
    if !filters.is_empty() {
        options = options.with_filters(filters);
    }
    if c.progress_notify {
        options = options.with_progress_notify();
    }
    if c.prev_kv {
        options = options.with_prev_key();
    }
    if c.fragment {
        options = options.with_fragment();
    }
    Ask::Create(key, options)
}

/// etcd's answer as the client sees it: every key out of `ns`; events outside it dropped.
fn strip(ns: &Namespace, mut r: PbWatchResponse) -> PbWatchResponse {
    r.events.retain_mut(|e| {
        let Some(kv) = e.kv.as_mut() else {
            return false;
        };
        let Some(key) = ns.strip(&kv.key) else {
            return false;
        };
        kv.key = key.to_vec();
        if let Some(prev) = e.prev_kv.as_mut() {
            match ns.strip(&prev.key) {
                Some(key) => prev.key = key.to_vec(),
                None => e.prev_kv = None,
            }
        }
        true
    });
    r
}

/// The answers waiting for the client, bounded in bytes.
struct Outbox {
    tx: mpsc::UnboundedSender<(usize, Result<PbWatchResponse, Status>)>,
    /// This stream's waiting bytes.
    bytes: Arc<AtomicUsize>,
    /// Every stream's.
    total: Arc<AtomicUsize>,
}

impl Outbox {
    /// Queues `answer`; false if the client already holds answers and this one would take it
    /// past its bound or the replica past its own (or the client is gone).
    fn push(&self, answer: PbWatchResponse) -> bool {
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
fn inbox(
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

/// One stream's state in the pump.
struct Pump {
    etcd: Etcd,
    slots: Arc<WatchSlots>,
    /// The stream's event-stream slot, taken with its first create (an idle stream holds none).
    slot: Option<Slot>,
    caller: Caller,
    outbox: Outbox,
    /// The etcd watch stream (opened by the first create), and its member's index.
    stream: Option<(usize, WatchStream)>,
    /// Watches etcd confirmed, by id.
    active: HashSet<i64>,
    /// Creates sent to etcd and not yet answered.
    pending: usize,
    /// Answers of refused creates, sent once every create before them is answered.
    refusals: VecDeque<PbWatchResponse>,
    /// The header of etcd's last answer, for the proxy's own.
    header: Option<PbResponseHeader>,
}

/// Why a stream ended.
enum End {
    /// The client half-closed or went away: no last answer.
    Quietly,
    Failed(Status),
}

impl Pump {
    async fn header(&mut self) -> Result<PbResponseHeader, Status> {
        if let Some(h) = self.header {
            return Ok(h);
        }
        Ok(self.etcd.header().await?.into())
    }

    /// Answers `answer` or ends the stream if the client holds too much.
    fn send(&self, answer: PbWatchResponse) -> Result<(), End> {
        if self.outbox.push(answer) {
            Ok(())
        } else {
            Err(End::Failed(Status::new(
                Code::Unavailable,
                "lease-proxy: the watch stream fell behind (the client did not read); resume from \
                 the last revision received",
            )))
        }
    }

    async fn ask(&mut self, ask: Ask) -> Result<(), End> {
        match ask {
            Ask::Nothing => Ok(()),
            Ask::Create(key, options) => self.create(key, options).await,
            Ask::Cancel(id) => match &mut self.stream {
                // etcd answers nothing for a cancel of a watch it does not have.
                None => Ok(()),
                Some((_, stream)) => stream.cancel(id).await.map_err(|e| self.etcd_failed(e)),
            },
            Ask::Progress => match &mut self.stream {
                Some((_, stream)) => stream
                    .request_progress()
                    .await
                    .map_err(|e| self.etcd_failed(e)),
                None => {
                    let header = self.header().await.map_err(End::Failed)?;
                    self.send(PbWatchResponse {
                        header: Some(header),
                        watch_id: NO_WATCH,
                        ..Default::default()
                    })
                }
            },
        }
    }

    async fn create(&mut self, key: Vec<u8>, options: WatchOptions) -> Result<(), End> {
        if self.active.len() + self.pending >= MAX_WATCHES {
            let header = self.header().await.map_err(End::Failed)?;
            self.refusals.push_back(PbWatchResponse {
                header: Some(header),
                watch_id: NO_WATCH,
                created: true,
                canceled: true,
                cancel_reason: format!(
                    "lease-proxy: more than {MAX_WATCHES} watches on one stream; open another"
                ),
                ..Default::default()
            });
            return self.flush_refusals();
        }
        match &mut self.stream {
            Some((_, stream)) => {
                let sent = stream.watch(key, Some(options)).await;
                sent.map_err(|e| self.etcd_failed(e))?;
            }
            None => {
                let slot = self.slots.take(self.caller.owner.as_deref());
                self.slot = Some(slot.map_err(|e| End::Failed(Status::from(e)))?);
                let what = "gRPC client's";
                let opened = self.etcd.open_watch(key, options, what).await;
                let opened = opened.ok_or_else(|| {
                    End::Failed(Status::new(
                        Code::Unavailable,
                        "lease-proxy: cannot open a watch on etcd",
                    ))
                })?;
                self.stream = Some(opened);
            }
        }
        self.pending += 1;
        Ok(())
    }

    fn flush_refusals(&mut self) -> Result<(), End> {
        while self.pending == 0 {
            let Some(refusal) = self.refusals.pop_front() else {
                break;
            };
            self.send(refusal)?;
        }
        Ok(())
    }

    /// etcd's answer, passed on.
    fn answer(&mut self, r: PbWatchResponse) -> Result<(), End> {
        if r.header.is_some() {
            self.header = r.header;
        }
        if r.created {
            self.pending = self.pending.saturating_sub(1);
            if !r.canceled {
                self.active.insert(r.watch_id);
            }
        } else if r.canceled {
            self.active.remove(&r.watch_id);
        }
        let created = r.created;
        self.send(strip(&self.caller.namespace, r))?;
        if created {
            self.flush_refusals()?;
        }
        Ok(())
    }

    /// The etcd stream failed: its member is unpinned and the client's stream ends with what
    /// etcd said (Unavailable if not a gRPC status), so the client reconnects and resumes.
    fn etcd_failed(&self, e: etcd_client::Error) -> End {
        if let Some((index, _)) = &self.stream {
            self.etcd.unpin(*index);
        }
        End::Failed(Status::from(crate::Error::from(e)))
    }

    /// The next etcd answer, or never while no watch was created.
    async fn next_from_etcd(
        stream: &mut Option<(usize, WatchStream)>,
    ) -> Result<Option<PbWatchResponse>, etcd_client::Error> {
        match stream {
            Some((_, stream)) => stream.message().await.map(|r| r.map(|r| r.0)),
            None => std::future::pending().await,
        }
    }

    async fn run(
        mut self,
        mut requests: Requests,
        stop: CancellationToken,
        stopping: CancellationToken,
        max_duration: std::time::Duration,
    ) -> End {
        let mut recheck = self.caller.recheck.clone();
        let over = tokio::time::sleep(max_duration);
        tokio::pin!(over);
        loop {
            let step = tokio::select! {
                () = stop.cancelled() => return End::Quietly,
                () = &mut over => return End::Failed(Status::new(
                    Code::Unavailable,
                    "lease-proxy: the watch stream reached --watch-max-duration; reconnect and \
                     resume from the last revision received",
                )),
                () = stopping.cancelled() => {
                    return End::Failed(Status::from(crate::Error::ShuttingDown));
                }
                () = Recheck::changed_or_never(&mut recheck) => {
                    self.caller.still_authorised().map_err(End::Failed)
                }
                request = requests.next() => match request {
                    None => return End::Quietly,
                    Some(Err(status)) => return End::Failed(status),
                    Some(Ok(request)) => {
                        let ask = confine(&self.caller.namespace, request);
                        self.ask(ask).await
                    }
                },
                answer = Self::next_from_etcd(&mut self.stream) => match answer {
                    Ok(Some(answer)) => self.answer(answer),
                    Ok(None) => Err(End::Failed(Status::new(
                        Code::Unavailable,
                        "lease-proxy: etcd ended the watch stream",
                    ))),
                    Err(e) => Err(self.etcd_failed(e)),
                },
            };
            if let Err(end) = step {
                return end;
            }
        }
    }
}

impl Service {
    /// `Watch`: the answers to a client's watch requests (see the module's documentation). The
    /// stream's work runs in a task of its own that ends when the answers are dropped, or
    /// Unavailable once the proxy drains or the stream reaches `--watch-max-duration`.
    pub(crate) fn watch(&self, caller: Caller, requests: Requests) -> Answers {
        let (tx, rx) = mpsc::unbounded_channel();
        let bytes = Arc::new(AtomicUsize::new(0));
        let total = self.streams.buffered.clone();
        let stop = CancellationToken::new();
        let pump = Pump {
            etcd: self.etcd.clone(),
            slots: self.streams.slots.clone(),
            slot: None,
            caller,
            outbox: Outbox {
                tx,
                bytes: bytes.clone(),
                total: total.clone(),
            },
            stream: None,
            active: HashSet::new(),
            pending: 0,
            refusals: VecDeque::new(),
            header: None,
        };
        let stopped = stop.clone();
        let (stopping, max_duration) = (self.streams.stopping.clone(), self.streams.max_duration);
        self.etcd.spawn(async move {
            let tx = pump.outbox.tx.clone();
            if let End::Failed(status) = pump.run(requests, stopped, stopping, max_duration).await {
                // The last answer, past the byte bound: it is what ends the stream.
                let _ = tx.send((0, Err(status)));
            }
        });
        inbox(rx, bytes, total, stop).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_client::proto::{PbEvent, PbKeyValue};

    fn create(key: &[u8], range_end: &[u8]) -> PbWatchRequest {
        WatchOptions::new()
            .with_key(key.to_vec())
            .with_range(range_end.to_vec())
            .into()
    }

    fn created_range(ask: Ask) -> (Vec<u8>, Vec<u8>) {
        let Ask::Create(_, options) = ask else {
            panic!("not a create");
        };
        let request: PbWatchRequest = options.into();
        match request.request_union {
            Some(PbWatchRequestUnion::CreateRequest(c)) => (c.key, c.range_end),
            _ => panic!("not a create"),
        }
    }

    #[test]
    fn every_watched_range_stays_inside_the_namespace() {
        let ns = Namespace::new(b"/ns/".to_vec());
        for (key, end, want_key, want_end) in [
            (
                b"a".as_slice(),
                b"".as_slice(),
                b"/ns/a".as_slice(),
                b"".as_slice(),
            ),
            (b"a", b"b", b"/ns/a", b"/ns/b"),
            (b"a", b"\0", b"/ns/a", b"/ns0"),
            (b"", b"\0", b"/ns/\0", b"/ns0"),
            (b"\0", b"\xff\xff", b"/ns/\0", b"/ns/\xff\xff"),
            (b"", b"", b"/ns/\0", b""),
        ] {
            let got = created_range(confine(&ns, create(key, end)));
            assert_eq!(
                got,
                (want_key.to_vec(), want_end.to_vec()),
                "{key:?} {end:?}"
            );
        }
    }

    #[test]
    fn events_come_back_out_or_not_at_all() {
        let ns = Namespace::new(b"/ns/".to_vec());
        let kv = |k: &[u8]| PbKeyValue {
            key: k.to_vec(),
            ..Default::default()
        };
        let answer = PbWatchResponse {
            events: vec![
                PbEvent {
                    kv: Some(kv(b"/ns/a")),
                    prev_kv: Some(kv(b"/ns/a")),
                    ..Default::default()
                },
                PbEvent {
                    kv: Some(kv(b"/other/b")),
                    ..Default::default()
                },
                PbEvent::default(),
            ],
            ..Default::default()
        };
        let out = strip(&ns, answer);
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.events[0].kv.as_ref().unwrap().key, b"a");
        assert_eq!(out.events[0].prev_kv.as_ref().unwrap().key, b"a");
    }
}
