//! Watches shared between streams: every watch "from now" (no start revision, no fragments, no
//! progress notifications) of the same etcd range — the namespaced key and range end, so two
//! tenants never share one — with the same `prev_kv` is one etcd watch per replica, a [`Hub`],
//! whatever the number of client streams (etcd's grpc-proxy coalesces watches the same way).
//!
//! A hub's task reads its etcd watch as it comes and hands every answer to each member's own
//! outbox at once — filtered by the member's `NOPUT`/`NODELETE` (an answer left empty is not
//! sent, as etcd sends none), with the member's watch id, keys out of its namespace — so a
//! member that does not read is cut off alone ([`Outbox`]'s bound, and the budgets: the stream
//! that holds the memory ends) and never slows the hub, etcd or the others. Before a member joins, the hub asks etcd for a progress answer, so its header
//! is at least etcd's revision when the client asked; the member then joins under the hub's
//! lock and is answered `created` with that header: every event after its revision reaches it,
//! none at or before (a watch from revision header + 1, which is what a watch "from now" is,
//! and a revision a reconnecting client can resume from — not one compacted since the hub's
//! last event). The hub ends, and its etcd watch
//! with it, when its last holder goes; when etcd fails it or ends it, every member's stream ends
//! as a stream whose own etcd watch failed would.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use etcd_client::proto::{PbResponseHeader, PbWatchResponse};
use etcd_client::WatchOptions;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::outbox::Outbox;
use super::request::strip;
use super::watch_failed;
use crate::etcd::Etcd;
use crate::etcdapi::namespace::Namespace;
use crate::etcdapi::status::{Code, Status};

/// Most hubs per replica, each its own etcd watch stream: past it, a watch from now goes on its
/// client stream's own etcd watch stream, as any other (so distinct ranges cost etcd no more
/// streams than before sharing: at most one per client stream besides these).
pub(crate) const MAX_HUBS: usize = 1024;

/// What a shared watch watches, in etcd's keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Range {
    pub(super) key: Vec<u8>,
    /// Empty for one key.
    pub(super) end: Vec<u8>,
    pub(super) prev_kv: bool,
}

/// A client's watch in a hub.
pub(super) struct Member {
    pub(super) watch_id: i64,
    pub(super) no_put: bool,
    pub(super) no_delete: bool,
    pub(super) namespace: Namespace,
    pub(super) outbox: Outbox,
    /// Events at or below this revision are not its (set as it joins: its created answer's).
    pub(super) from: i64,
    /// Ends the member's stream, with this status.
    pub(super) end: mpsc::UnboundedSender<Status>,
}

/// The replica's hubs, by range.
#[derive(Default)]
pub(crate) struct Hubs {
    map: Mutex<HashMap<Range, Weak<Hub>>>,
}

/// Whether a hub's etcd watch is created.
#[derive(Debug, Clone, PartialEq)]
enum Created {
    Pending,
    Ready,
    /// etcd refused the create (an empty range, say): its answer.
    Refused(PbWatchResponse),
    Failed,
}

/// How a hub's etcd watch came out, for a subscription waiting on it.
pub(super) enum Ready {
    Yes,
    /// etcd's answer refusing the create, to be answered as it is.
    Refused(PbWatchResponse),
    Failed,
}

/// One shared etcd watch.
pub(super) struct Hub {
    range: Range,
    state: Mutex<State>,
    stop: CancellationToken,
    created: watch::Receiver<Created>,
    progress: mpsc::UnboundedSender<oneshot::Sender<PbResponseHeader>>,
}

#[derive(Default)]
struct State {
    /// The header of etcd's last answer.
    header: Option<PbResponseHeader>,
    members: HashMap<u64, Member>,
    /// Subscriptions, joined or not: the hub stops when the last goes.
    holders: usize,
    next: u64,
    /// Failed or stopped: takes no one any more.
    over: bool,
}

/// A stream's hold on a hub: taken before the hub's etcd watch exists, a member once joined.
/// Dropping it leaves (and stops the hub if it was the last).
pub(super) struct Subscription {
    hubs: Arc<Hubs>,
    hub: Arc<Hub>,
    id: u64,
}

impl Hubs {
    /// A hold on the hub of `range`: the running one, or a new one whose etcd watch is opened
    /// now, in a task of its own (on `etcd`'s task tracker) — `None` if [`MAX_HUBS`] run: the
    /// watch then goes on its stream's own etcd watch.
    pub(super) fn subscribe(self: &Arc<Self>, etcd: &Etcd, range: Range) -> Option<Subscription> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let running = map.get(&range).and_then(Weak::upgrade);
        if let Some(hub) = running {
            let mut state = hub.lock();
            if !state.over {
                state.holders += 1;
                let id = state.next;
                state.next += 1;
                drop(state);
                return Some(Subscription {
                    hubs: self.clone(),
                    hub,
                    id,
                });
            }
        }
        map.retain(|_, hub| hub.strong_count() > 0);
        if map.len() >= MAX_HUBS {
            return None;
        }
        let (created_tx, created) = watch::channel(Created::Pending);
        let (progress, asked) = mpsc::unbounded_channel();
        let hub = Arc::new(Hub {
            range: range.clone(),
            state: Mutex::new(State {
                holders: 1,
                next: 1,
                ..State::default()
            }),
            stop: CancellationToken::new(),
            created,
            progress,
        });
        map.insert(range, Arc::downgrade(&hub));
        etcd.spawn(run(etcd.clone(), hub.clone(), created_tx, asked));
        Some(Subscription {
            hubs: self.clone(),
            hub,
            id: 0,
        })
    }
}

impl State {
    /// The hub's header moves only forwards: etcd 3.4 may send a progress answer before events
    /// of lower revisions, and a member joining at a revision must get every event after it.
    fn advance(&mut self, header: Option<PbResponseHeader>) {
        let newer = match (&self.header, &header) {
            (Some(now), Some(h)) => h.revision > now.revision,
            (None, Some(_)) => true,
            _ => false,
        };
        if newer {
            self.header = header;
        }
    }
}

impl Hub {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the hub: no one joins it any more, every member's stream ends with `status`.
    fn fail(&self, status: &Status) {
        let members = {
            let mut state = self.lock();
            state.over = true;
            std::mem::take(&mut state.members)
        };
        for member in members.into_values() {
            let _ = member.end.send(status.clone());
        }
    }

    /// etcd's answer with events, to every member it concerns.
    fn deliver(&self, r: PbWatchResponse) {
        let mut state = self.lock();
        state.advance(r.header);
        state.members.retain(|_, m| {
            let events: Vec<_> = r
                .events
                .iter()
                .filter(|e| e.kv.as_ref().is_some_and(|kv| kv.mod_revision > m.from))
                .filter(|e| match e.r#type {
                    0 => !m.no_put,
                    _ => !m.no_delete,
                })
                .cloned()
                .collect();
            if events.is_empty() {
                return true;
            }
            let answer = PbWatchResponse {
                header: r.header,
                watch_id: m.watch_id,
                events,
                ..Default::default()
            };
            match m.outbox.push(strip(&m.namespace, answer)) {
                Ok(()) => true,
                Err(status) => {
                    let _ = m.end.send(status);
                    false
                }
            }
        });
    }
}

impl Subscription {
    /// Waits until the hub's etcd watch is created, or refused, or failed.
    pub(super) async fn ready(&self) -> Ready {
        let mut created = self.hub.created.clone();
        let now = created
            .wait_for(|c| *c != Created::Pending)
            .await
            .map(|c| c.clone());
        match now {
            Ok(Created::Ready) => Ready::Yes,
            Ok(Created::Refused(answer)) => Ready::Refused(answer),
            _ => Ready::Failed,
        }
    }

    /// Joins (once the hub is [`ready`](Self::ready)): answers `member` created, with the
    /// hub's last header, and from then on every event after it. Refused if the hub is over or
    /// the member's outbox refused the answer.
    pub(super) fn join(&self, mut member: Member) -> Result<(), Status> {
        let mut state = self.hub.lock();
        if state.over {
            return Err(Status::new(
                Code::Unavailable,
                "lease-proxy: the shared etcd watch ended; resume from the last revision received",
            ));
        }
        member.from = state.header.map_or(0, |h| h.revision);
        let created = PbWatchResponse {
            header: state.header,
            watch_id: member.watch_id,
            created: true,
            ..Default::default()
        };
        member.outbox.push(created)?;
        state.members.insert(self.id, member);
        Ok(())
    }

    /// The header of the hub's last answer (its created one at least, once ready).
    pub(super) fn header(&self) -> Option<PbResponseHeader> {
        self.hub.lock().header
    }

    /// Asks the hub's etcd watch for a progress answer: its header, once etcd has sent the hub
    /// everything before it (`None` if the hub ends first).
    pub(super) fn progress(&self) -> oneshot::Receiver<PbResponseHeader> {
        let (tx, rx) = oneshot::channel();
        let _ = self.hub.progress.send(tx);
        rx
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut map = self.hubs.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut state = self.hub.lock();
        state.members.remove(&self.id);
        state.holders = state.holders.saturating_sub(1);
        if state.holders == 0 {
            state.over = true;
            self.hub.stop.cancel();
            let ours = map
                .get(&self.hub.range)
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.hub)));
            if ours {
                map.remove(&self.hub.range);
            }
        }
    }
}

/// The etcd watch of `range`: its key and options.
fn watch_of(range: &Range) -> (Vec<u8>, WatchOptions) {
    let Range { key, end, prev_kv } = range.clone();
    let mut options = WatchOptions::new();
    if !end.is_empty() {
        options = options.with_range(end);
    }
    if prev_kv {
        options = options.with_prev_key();
    }
    (key, options)
}

/// What the hub does after an answer of etcd's watch.
enum Next {
    /// Reads on.
    Go,
    /// Ends: etcd refused to create the watch, and every holder was told.
    Stop,
    /// Ends, failing every holder with this.
    Fail(Status),
}

/// Hands out `r`, an answer of the hub's etcd watch: its creation, a progress answer (to the
/// `waiting` askers) or events.
fn answered(
    hub: &Hub,
    created: &watch::Sender<Created>,
    waiting: &mut Vec<oneshot::Sender<PbResponseHeader>>,
    r: PbWatchResponse,
) -> Next {
    if r.created && !r.canceled {
        hub.lock().advance(r.header);
        created.send_replace(Created::Ready);
    } else if r.created {
        hub.lock().over = true;
        created.send_replace(Created::Refused(r));
        return Next::Stop;
    } else if r.canceled {
        let reason = format!("lease-proxy: etcd canceled the watch: {}", r.cancel_reason);
        return Next::Fail(Status::new(Code::Unavailable, reason));
    } else if r.events.is_empty() {
        // A progress answer: everything before it was handed out.
        let header = {
            let mut state = hub.lock();
            state.advance(r.header);
            state.header
        };
        for asker in waiting.drain(..) {
            if let Some(h) = header {
                let _ = asker.send(h);
            }
        }
    } else {
        hub.deliver(r);
    }
    Next::Go
}

/// The hub's task: opens the etcd watch, then hands out what etcd sends until the last holder
/// goes (the etcd watch is closed with its stream) or etcd fails it.
async fn run(
    etcd: Etcd,
    hub: Arc<Hub>,
    created: watch::Sender<Created>,
    mut asked: mpsc::UnboundedReceiver<oneshot::Sender<PbResponseHeader>>,
) {
    let failed = |hub: &Hub, status: Status| {
        hub.fail(&status);
        created.send_replace(Created::Failed);
    };
    let (key, options) = watch_of(&hub.range);
    let opened = tokio::select! {
        () = hub.stop.cancelled() => return,
        opened = etcd.open_watch(key, options, "shared gRPC") => opened,
    };
    let Some((index, mut stream)) = opened else {
        let status = Status::new(
            Code::Unavailable,
            "lease-proxy: cannot open a watch on etcd",
        );
        return failed(&hub, status);
    };
    let mut waiting: Vec<oneshot::Sender<PbResponseHeader>> = Vec::new();
    loop {
        tokio::select! {
            () = hub.stop.cancelled() => return,
            Some(asker) = asked.recv() => {
                if let Err(e) = stream.request_progress().await {
                    etcd.unpin(index);
                    return failed(&hub, watch_failed(e));
                }
                waiting.push(asker);
            }
            message = stream.message() => match message {
                Ok(Some(r)) => match answered(&hub, &created, &mut waiting, r.0) {
                    Next::Go => {}
                    Next::Stop => return,
                    Next::Fail(status) => return failed(&hub, status),
                },
                Ok(None) => {
                    let status = Status::new(Code::Unavailable, "lease-proxy: etcd ended the watch stream");
                    return failed(&hub, status);
                }
                Err(e) => {
                    etcd.unpin(index);
                    return failed(&hub, watch_failed(e));
                }
            },
        }
    }
}
