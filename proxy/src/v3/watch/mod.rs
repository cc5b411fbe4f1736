//! `Watch`: etcd's bidirectional watch stream, confined to the caller's namespace: the pump of
//! one client stream here, its requests and answers' keys in [`request`], its bounded outbox in
//! [`outbox`], the etcd watches shared between streams in [`hub`].
//!
//! A watch "from now" (no start revision, fragments or progress notifications) is a member of
//! the replica's shared etcd watch of its range ([`hub`]): any number of clients watching one
//! prefix are one etcd watch. Every other watch goes on the stream's own etcd watch stream,
//! opened on its first such create, so every answer to it — created, canceled, compacted
//! (`compact_revision`), progress, fragments — is etcd's own. The pump assigns watch ids as
//! etcd does (the client's own, or the next free one; a taken one is refused as etcd refuses
//! it), so both kinds share one id space, and answers creates and cancels in the order they
//! came. A progress request on a stream with shared watches is answered once every hub it is
//! in has had etcd's own progress answer (so every event before it was handed out). What the
//! proxy adds:
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
//!   stalled reader never holds back etcd or the connection every other stream shares; every
//!   answer is counted until written, against its principal's budget and the replica's
//!   ([`budget`]), and a budget spent ends the stream that holds the memory;
//! - the caller's right is judged again whenever the token file changes: a removed or narrowed
//!   principal's stream ends PermissionDenied;
//! - a failed etcd stream ends the client's Unavailable (its member is unpinned), as do the
//!   proxy's shutdown and etcd ending the stream — and what still waited for the client is
//!   dropped then ([`outbox`]); after the client's half-close its watches go on, as etcd's do.
//!
//! The pump that does this is one task per stream, on the proxy's task tracker; it ends when
//! the client's stream is dropped (a cancel, a reset, the connection gone) or the proxy stops.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use etcd_client::proto::{PbResponseHeader, PbWatchRequest, PbWatchResponse};
use etcd_client::WatchStream;
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod budget;
mod hub;
mod outbox;
mod request;

pub(crate) use budget::Budgets;
pub(crate) use hub::Hubs;
use hub::{Member, Ready, Subscription};
use outbox::Outbox;
pub(crate) use outbox::Written;
use request::{confine, strip, Ask, Create};

use super::service::{Caller, Service};
use super::status::{Code, Status};
use crate::etcd::Etcd;
use crate::lease::{Recheck, Slot, WatchSlots};

/// Most watches (created or being created) on one stream.
pub(crate) const MAX_WATCHES: usize = 1024;

/// Most bytes of answers queued for a client that does not read (one answer alone always
/// passes this bound — a client that reads gets even an answer larger than this, as etcd would
/// send it — but not its principal's budget, [`budget::PRINCIPAL`]).
pub(crate) const MAX_BUFFERED_BYTES: usize = 8 << 20;

/// etcd's id for "no watch" (a failed create, a progress answer of the whole stream).
const NO_WATCH: i64 = -1;

/// etcd's `mvcc.ErrWatcherDuplicateID`, the reason of a create that names a taken id.
const DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

/// What a client's stream sends.
pub(crate) type Requests = BoxStream<'static, Result<PbWatchRequest, Status>>;

/// What it is answered.
pub(crate) type Answers = BoxStream<'static, Result<PbWatchResponse, Status>>;

/// How a stream ends when its etcd watch fails: etcd's own status if Unavailable (its message
/// verbatim: Go's client matches `etcdserver: no leader`), else Unavailable with what happened
/// (a member gone is a transport error, which the client must take as "resume elsewhere").
fn watch_failed(e: etcd_client::Error) -> Status {
    let status = Status::from(crate::Error::from(e));
    if status.code() == Code::Unavailable as i32 {
        return status;
    }
    Status::new(
        Code::Unavailable,
        format!(
            "lease-proxy: the etcd watch failed ({}); resume from the last revision received",
            status.message()
        ),
    )
}

/// What waits until every create sent to etcd before it is answered.
enum Deferred {
    Answer(PbWatchResponse),
    /// A shared watch's created answer, and its joining.
    Join(i64, Subscription, Member),
    /// A shared watch's cancel: it leaves, and is answered canceled.
    Cancel(i64),
}

/// One stream's state in the pump.
struct Pump {
    etcd: Etcd,
    slots: Arc<WatchSlots>,
    /// The stream's event-stream slot, taken with its first create (an idle stream holds none).
    slot: Option<Slot>,
    caller: Caller,
    outbox: Outbox,
    /// The stream's own etcd watch stream (opened by its first unshared create), and its
    /// member's index.
    stream: Option<(usize, WatchStream)>,
    /// Every watch id in use: created, being created, or shared.
    used: HashSet<i64>,
    /// Ids the client canceled on the stream's own etcd watch whose cancel etcd has not
    /// answered yet (already free: etcd frees an id as it reads the cancel).
    cancelling: HashSet<i64>,
    /// Where the next free id is looked for (etcd's own rule: upwards, never back).
    next_id: i64,
    /// Creates sent to etcd and not yet answered, in order: their ids, whether the proxy picked
    /// it, and their place in the stream's order.
    pending: VecDeque<(i64, bool, u64)>,
    /// Answers (and joins) sent once every create sent to etcd before them is answered, with
    /// their place in the stream's order.
    deferred: VecDeque<(u64, Deferred)>,
    /// The next place in the stream's order of creates, cancels and progress requests.
    order: u64,
    /// The replica's shared watches, and this stream's memberships.
    hubs: Arc<Hubs>,
    shared: HashMap<i64, Subscription>,
    /// A hub ending a member's stream (it fell behind, or etcd failed the hub's watch).
    ended: (
        mpsc::UnboundedSender<Status>,
        mpsc::UnboundedReceiver<Status>,
    ),
    /// The header of etcd's last answer, for the proxy's own.
    header: Option<PbResponseHeader>,
}

/// Why a stream ended.
enum End {
    /// The client went away: no last answer.
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
        self.outbox.push(answer).map_err(End::Failed)
    }

    async fn ask(&mut self, ask: Ask) -> Result<(), End> {
        match ask {
            Ask::Nothing => Ok(()),
            Ask::Create(create) => self.create(create).await,
            // The id is free again at once, as etcd frees it; a shared watch leaves its hub at
            // once too, and is answered canceled in order.
            Ask::Cancel(id) if self.is_shared(id) => {
                self.used.remove(&id);
                match self.shared.remove(&id) {
                    Some(left) => {
                        let header = left.header();
                        drop(left);
                        self.defer(Deferred::Answer(PbWatchResponse {
                            header,
                            watch_id: id,
                            canceled: true,
                            ..Default::default()
                        }))
                    }
                    None => self.defer(Deferred::Cancel(id)),
                }
            }
            Ask::Cancel(id) => match &mut self.stream {
                // etcd answers nothing for a cancel of a watch it does not have.
                None => Ok(()),
                Some((_, stream)) => {
                    stream.cancel(id).await.map_err(|e| self.etcd_failed(e))?;
                    if self.used.remove(&id) {
                        self.cancelling.insert(id);
                    }
                    Ok(())
                }
            },
            Ask::Progress => self.progress().await,
        }
    }

    /// Whether `id` is a shared watch of this stream (joined or about to be).
    fn is_shared(&self, id: i64) -> bool {
        self.shared.contains_key(&id)
            || self
                .deferred
                .iter()
                .any(|(_, d)| matches!(d, Deferred::Join(joining, ..) if *joining == id))
    }

    /// A progress request: with shared watches, once each of their hubs had etcd's own progress
    /// answer; then etcd's answer on the stream's own watch stream, or the proxy's.
    async fn progress(&mut self) -> Result<(), End> {
        let mut latest = None;
        if !self.shared.is_empty() {
            let asked = futures::future::join_all(self.shared.values().map(|s| s.progress()));
            let answers = tokio::time::timeout(self.etcd.timeout(), asked)
                .await
                .map_err(|_| {
                    End::Failed(Status::new(
                        Code::Unavailable,
                        "lease-proxy: etcd did not answer a progress request in time",
                    ))
                })?;
            latest = answers
                .into_iter()
                .filter_map(Result::ok)
                .max_by_key(|h| h.revision);
        }
        if let Some((_, stream)) = &mut self.stream {
            return stream
                .request_progress()
                .await
                .map_err(|e| self.etcd_failed(e));
        }
        let header = match latest {
            Some(h) => h,
            None => self.header().await.map_err(End::Failed)?,
        };
        self.defer(Deferred::Answer(PbWatchResponse {
            header: Some(header),
            watch_id: NO_WATCH,
            ..Default::default()
        }))
    }

    /// A failed create, answered as etcd answers one, in order.
    async fn refuse(&mut self, reason: String) -> Result<(), End> {
        let header = self.header().await.map_err(End::Failed)?;
        self.defer(Deferred::Answer(PbWatchResponse {
            header: Some(header),
            watch_id: NO_WATCH,
            created: true,
            canceled: true,
            cancel_reason: reason,
            ..Default::default()
        }))
    }

    /// The next free watch id, as etcd picks it.
    fn free_id(&mut self) -> i64 {
        while self.used.contains(&self.next_id) {
            self.next_id += 1;
        }
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    async fn create(&mut self, c: Create) -> Result<(), End> {
        if self.used.len() >= MAX_WATCHES {
            let reason =
                format!("lease-proxy: more than {MAX_WATCHES} watches on one stream; open another");
            return self.refuse(reason).await;
        }
        if c.watch_id != 0 && self.used.contains(&c.watch_id) {
            return self.refuse(DUPLICATE_ID.to_owned()).await;
        }
        if self.slot.is_none() {
            let slot = self.slots.take(self.caller.owner.as_deref());
            self.slot = Some(slot.map_err(|e| End::Failed(Status::from(e)))?);
        }
        let unavailable = || {
            End::Failed(Status::new(
                Code::Unavailable,
                "lease-proxy: cannot open a watch on etcd",
            ))
        };
        if let Some(subscription) = c.shared().and_then(|r| self.hubs.subscribe(&self.etcd, r)) {
            let ready = tokio::time::timeout(self.etcd.timeout(), subscription.ready()).await;
            match ready.unwrap_or(Ready::Failed) {
                Ready::Yes => {}
                Ready::Refused(answer) => return self.defer(Deferred::Answer(answer)),
                Ready::Failed => return Err(unavailable()),
            }
            // The hub's header brought up to etcd's revision now, for the created answer.
            let fresh = tokio::time::timeout(self.etcd.timeout(), subscription.progress()).await;
            if !matches!(fresh, Ok(Ok(_))) {
                return Err(unavailable());
            }
            let id = self.id_for(&c);
            let member = Member {
                watch_id: id,
                no_put: c.no_put,
                no_delete: c.no_delete,
                namespace: self.caller.namespace.clone(),
                outbox: self.outbox.clone(),
                from: 0,
                end: self.ended.0.clone(),
            };
            self.used.insert(id);
            return self.defer(Deferred::Join(id, subscription, member));
        }
        // Id 0 is etcd's "assign one": only ever the stream's first id, which etcd assigns 0.
        let id = self.id_for(&c);
        let options = c.options(id);
        match &mut self.stream {
            Some((_, stream)) => {
                let sent = stream.watch(c.key, Some(options)).await;
                sent.map_err(|e| self.etcd_failed(e))?;
            }
            None => {
                let what = "gRPC client's";
                let opened = self.etcd.open_watch(c.key, options, what).await;
                self.stream = Some(opened.ok_or_else(unavailable)?);
            }
        }
        self.used.insert(id);
        let place = self.next_place();
        self.pending.push_back((id, c.watch_id == 0, place));
        Ok(())
    }

    fn next_place(&mut self) -> u64 {
        self.order += 1;
        self.order
    }

    /// The create's id: the client's, or the next free one.
    fn id_for(&mut self, c: &Create) -> i64 {
        match c.watch_id {
            0 => self.free_id(),
            id => id,
        }
    }

    /// Queues `d` behind the creates etcd has not answered yet, and sends what no longer waits.
    fn defer(&mut self, d: Deferred) -> Result<(), End> {
        let place = self.next_place();
        self.deferred.push_back((place, d));
        self.flush()
    }

    /// Sends what waits for no create etcd has not answered.
    fn flush(&mut self) -> Result<(), End> {
        let before = self.pending.front().map(|&(_, _, place)| place);
        while self
            .deferred
            .front()
            .is_some_and(|(place, _)| before.is_none_or(|b| *place < b))
        {
            let Some((_, next)) = self.deferred.pop_front() else {
                break;
            };
            match next {
                Deferred::Answer(answer) => self.send(answer)?,
                Deferred::Join(id, subscription, member) => {
                    subscription.join(member).map_err(End::Failed)?;
                    self.shared.insert(id, subscription);
                }
                // A shared watch canceled before it joined: answered created, then canceled.
                Deferred::Cancel(id) => {
                    if let Some(left) = self.shared.remove(&id) {
                        let header = left.header();
                        drop(left);
                        self.send(PbWatchResponse {
                            header,
                            watch_id: id,
                            canceled: true,
                            ..Default::default()
                        })?;
                    }
                }
            }
        }
        Ok(())
    }

    /// etcd's answer, passed on.
    fn answer(&mut self, r: PbWatchResponse) -> Result<(), End> {
        if r.header.is_some() {
            self.header = r.header;
        }
        if r.created {
            // What came before this create goes first; what came after it waits for the next.
            self.flush()?;
            let sent = self.pending.pop_front();
            if let (true, Some((id, picked, _))) = (r.canceled, sent) {
                // A refused create takes no id from etcd: the next one picked is this one.
                self.used.remove(&id);
                if picked && id + 1 == self.next_id {
                    self.next_id = id;
                }
            }
        } else if r.canceled && !self.cancelling.remove(&r.watch_id) {
            // etcd's own cancel (compaction, say); a client's freed the id when it was asked.
            self.used.remove(&r.watch_id);
        }
        let created = r.created;
        self.send(strip(&self.caller.namespace, r))?;
        if created {
            self.flush()?;
        }
        Ok(())
    }

    /// The etcd stream failed: its member is unpinned and the client's stream ends with what
    /// etcd said (Unavailable if not a gRPC status), so the client reconnects and resumes.
    fn etcd_failed(&self, e: etcd_client::Error) -> End {
        if let Some((index, _)) = &self.stream {
            self.etcd.unpin(*index);
        }
        End::Failed(watch_failed(e))
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
        max_duration: Option<std::time::Duration>,
    ) -> End {
        let mut recheck = self.caller.recheck.clone();
        let over = crate::v3::service::until_or_never(
            max_duration.map(|d| tokio::time::Instant::now() + d),
        );
        tokio::pin!(over);
        // After the client's half-close its watches go on, as etcd's do, until it goes away.
        let mut half_closed = false;
        loop {
            let step = tokio::select! {
                () = stop.cancelled() => return End::Quietly,
                () = &mut over => return End::Failed(Status::new(
                    Code::Unavailable,
                    "lease-proxy: the watch stream reached --v3-watch-max-duration; reconnect and \
                     resume from the last revision received",
                )),
                () = stopping.cancelled() => {
                    return End::Failed(Status::from(crate::Error::ShuttingDown));
                }
                Some(status) = self.ended.1.recv() => Err(End::Failed(status)),
                () = Recheck::changed_or_never(&mut recheck) => {
                    self.caller.still_authorised().map_err(End::Failed)
                }
                request = requests.next(), if !half_closed => match request {
                    None => {
                        half_closed = true;
                        Ok(())
                    }
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
    /// `Watch`: the answers to a client's watch requests (see the module's documentation), and
    /// what the client's front holds of them once encoded, which it must hand over through
    /// [`Written`]. The stream's work runs in a task of its own that ends when the answers are
    /// dropped, or Unavailable once the proxy drains or the stream reaches
    /// `--v3-watch-max-duration`.
    pub(crate) fn watch(&self, caller: Caller, requests: Requests) -> (Answers, Written) {
        let ended = mpsc::unbounded_channel();
        let budgets = &self.streams.budgets;
        let outbox = Outbox::new(budgets, caller.owner.as_deref(), ended.0.clone());
        let stop = CancellationToken::new();
        let pump = Pump {
            etcd: self.etcd.clone(),
            slots: self.streams.slots.clone(),
            slot: None,
            caller,
            outbox: outbox.clone(),
            stream: None,
            used: HashSet::new(),
            cancelling: HashSet::new(),
            next_id: 0,
            pending: VecDeque::new(),
            deferred: VecDeque::new(),
            order: 0,
            hubs: self.streams.hubs.clone(),
            shared: HashMap::new(),
            ended,
            header: None,
        };
        let stopped = stop.clone();
        let (stopping, max_duration) = (self.streams.stopping.clone(), self.streams.max_duration);
        let answers = outbox.inbox(stop);
        let written = outbox.written();
        self.etcd.spawn(async move {
            let ending = pump.outbox.clone();
            match pump.run(requests, stopped, stopping, max_duration).await {
                End::Failed(status) => ending.end(Some(status)),
                End::Quietly => ending.end(None),
            }
        });
        (answers.boxed(), written)
    }
}
