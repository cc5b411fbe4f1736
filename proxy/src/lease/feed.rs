//! The event feed of `GET /v1/watch`: one etcd watch per replica for any number of streams.
//!
//! The replica's *tail* is one [`Watch`] of the ownership events, read by a tracked task into a
//! ring of the last [`RETAINED`] events and progress marks (at most [`RETAINED_BYTES`] of
//! them). Every stream is a cursor in that ring: it reads at its own pace, so a slow reader
//! holds back no one, neither the other streams nor etcd. A stream whose cursor the ring has
//! overtaken (it read nothing while the ring filled with newer messages) reads its own etcd
//! watch from where it stands, as every stream did before the feed was shared, and takes its
//! cursor back in the ring as soon as the ring holds everything after its position again.
//!
//! What a stream yields does not depend on which it reads: the ring holds the tail's messages
//! in history order (`Position`'s order), a stream yields only what is past its own position,
//! and the ring is kept contiguous — everything after its `base` is in it or yet to come. When
//! the tail's watch fails it is opened again from the tail's last position, so its streams see
//! no gap; when that position is no longer in etcd's history (compacted while etcd was out of
//! reach), the ring restarts at etcd's current revision and the streams it leaves behind read
//! their own watches, which answer them as etcd would (410 to their client, which lists again).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fencing::backoff::Backoff;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::events::{Source, Watch};
use super::{Next, Position};
use crate::etcd::Etcd;
use crate::keys::Layout;
use crate::{Error, Result};

/// Messages the ring keeps for streams behind its newest: at most this many…
const RETAINED: usize = 4096;
/// …and at most this many bytes of them (a holder name written straight into etcd can be as long
/// as etcd's value limit), as counted by [`weight`].
const RETAINED_BYTES: usize = 1 << 20;

/// Pauses between attempts to open the tail's watch again.
const REOPEN: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));

/// The replica's event feed.
#[derive(Clone)]
pub(crate) struct Feed {
    source: Source,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    stopping: CancellationToken,
}

/// The tail's ring and how far it has come.
struct Shared {
    ring: Mutex<Ring>,
    /// The sequence number after the ring's newest message; bumped with each message.
    end: watch::Sender<u64>,
    /// Held while the tail is started, so that one caller starts it.
    starting: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Ring {
    /// Whether the tail runs (and so the ring grows).
    running: bool,
    /// Every message after this position is in `messages` or is yet to come.
    base: Option<Position>,
    /// The tail's messages, oldest first.
    messages: VecDeque<Next>,
    /// The sequence number of `messages[0]`.
    first: u64,
    /// The [`weight`] of `messages`.
    bytes: usize,
}

impl Ring {
    fn end(&self) -> u64 {
        self.first + self.messages.len() as u64
    }

    /// The cursor of a stream standing at `at`: the first message past it. `None` when the ring
    /// does not hold everything after `at`.
    fn cursor(&self, at: Position) -> Option<u64> {
        if !self.running || self.base.is_none_or(|base| base > at) {
            return None;
        }
        let past = self.messages.partition_point(|m| m.position() <= at);
        Some(self.first + past as u64)
    }
}

impl Feed {
    /// The feed of the ownership events of `layout`; its tail runs on `tracker` from the first
    /// subscription until `stopping` fires.
    pub(crate) fn new(
        etcd: Etcd,
        layout: &Layout,
        tracker: TaskTracker,
        stopping: CancellationToken,
    ) -> Self {
        Self {
            source: Source::new(etcd, layout),
            shared: Arc::new(Shared {
                ring: Mutex::new(Ring::default()),
                end: watch::Sender::new(0),
                starting: tokio::sync::Mutex::new(()),
            }),
            tracker,
            stopping,
        }
    }

    /// Subscribes to the events after `after` (or after now, when `None`): answers the position
    /// the subscription starts from and the subscription. [`Error::EventsUnavailable`] when
    /// `after` is no longer (or not yet) in etcd's history.
    pub(crate) async fn subscribe(&self, after: Option<Position>) -> Result<Subscription> {
        self.start_tail().await?;
        // Checked against etcd's history (or read from etcd, for "now") as a stream of its own
        // would: the ring does not decide what is still in the history.
        let start = self.source.start(after).await?;
        let cursor = self.shared.lock().cursor(start);
        let mode = match cursor {
            Some(cursor) => Mode::Shared(cursor),
            None => {
                let own = self.source.watch(Some(start)).await?;
                self.source.metrics().watch_own("unreached");
                Mode::Own(Box::new(own))
            }
        };
        Ok(Subscription {
            source: self.source.clone(),
            shared: self.shared.clone(),
            end: self.shared.end.subscribe(),
            start,
            at: start,
            mode,
        })
    }

    /// Opens the tail's watch and starts its task, unless it runs or the replica is stopping.
    async fn start_tail(&self) -> Result<()> {
        if self.shared.lock().running || self.stopping.is_cancelled() {
            return Ok(());
        }
        let _one = self.shared.starting.lock().await;
        if self.shared.lock().running {
            return Ok(());
        }
        let watch = self.source.watch(None).await?;
        {
            let mut ring = self.shared.lock();
            ring.running = true;
            ring.base = Some(watch.start());
        }
        let tail = Tail {
            source: self.source.clone(),
            shared: self.shared.clone(),
            at: watch.start(),
        };
        self.tracker.spawn(tail.run(watch, self.stopping.clone()));
        Ok(())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, next: Next) {
        let end = {
            let mut ring = self.lock();
            ring.bytes += weight(&next);
            ring.messages.push_back(next);
            while ring.messages.len() > RETAINED || ring.bytes > RETAINED_BYTES {
                let Some(oldest) = ring.messages.pop_front() else {
                    break;
                };
                ring.bytes -= weight(&oldest);
                ring.base = Some(oldest.position());
                ring.first += 1;
            }
            ring.end()
        };
        self.end.send_replace(end);
    }

    /// The ring starts again at `base`: every cursor in it is overtaken (a sequence number is
    /// skipped, so that one at the old end is too).
    fn restart(&self, base: Position) {
        let end = {
            let mut ring = self.lock();
            ring.first = ring.end() + 1;
            ring.messages.clear();
            ring.bytes = 0;
            ring.base = Some(base);
            ring.end()
        };
        self.end.send_replace(end);
    }

    fn stop(&self) {
        self.lock().running = false;
        // Wakes every stream waiting in the ring: none of them will get another message there.
        self.end.send_modify(|_| {});
    }
}

/// What a message holds, roughly, in bytes.
fn weight(next: &Next) -> usize {
    const FIXED: usize = std::mem::size_of::<Next>();
    match next {
        Next::Event(e) => FIXED + e.resource.len() + e.holder.len() + e.token.len(),
        Next::Progress(_) => FIXED,
    }
}

/// The task that reads the replica's etcd watch into the ring.
struct Tail {
    source: Source,
    shared: Arc<Shared>,
    /// The position of the last message read.
    at: Position,
}

impl Tail {
    async fn run(mut self, mut watch: Watch, stopping: CancellationToken) {
        let mut backoff = REOPEN;
        loop {
            let next = tokio::select! {
                () = stopping.cancelled() => break,
                next = watch.next() => next,
            };
            match next {
                Ok(Some(next)) => {
                    backoff.reset();
                    self.at = next.position();
                    self.shared.push(next);
                    continue;
                }
                Ok(None) => tracing::debug!("the event feed's etcd watch ended"),
                Err(e) => tracing::warn!(error = %e, "the event feed's etcd watch failed"),
            }
            match self.reopen(&mut backoff, &stopping).await {
                Some(opened) => watch = opened,
                None => break,
            }
        }
        self.shared.stop();
    }

    /// The watch opened again after the last message read — or, when that is no longer in
    /// etcd's history, after now, with the ring restarted there. `None` once stopping.
    async fn reopen(
        &mut self,
        backoff: &mut Backoff,
        stopping: &CancellationToken,
    ) -> Option<Watch> {
        loop {
            tokio::select! {
                () = stopping.cancelled() => return None,
                () = tokio::time::sleep(backoff.pause()) => {}
            }
            let opened = tokio::select! {
                () = stopping.cancelled() => return None,
                opened = self.source.watch(Some(self.at)) => opened,
            };
            match opened {
                Ok(watch) => return Some(watch),
                Err(Error::EventsUnavailable(why)) => {
                    tracing::warn!(reason = %why, at = %self.at, "the event feed restarts at etcd's current revision");
                    let opened = tokio::select! {
                        () = stopping.cancelled() => return None,
                        opened = self.source.watch(None) => opened,
                    };
                    if let Ok(watch) = opened {
                        self.at = watch.start();
                        self.shared.restart(self.at);
                        return Some(watch);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "the event feed's etcd watch is unavailable"),
            }
        }
    }
}

/// One stream's place in the feed.
pub(crate) struct Subscription {
    source: Source,
    shared: Arc<Shared>,
    end: watch::Receiver<u64>,
    /// Where the subscription starts (the first SSE id).
    start: Position,
    /// Everything up to here has been yielded (or was before the start).
    at: Position,
    mode: Mode,
}

/// Where a stream reads.
enum Mode {
    /// The ring, at this sequence number.
    Shared(u64),
    /// Its own etcd watch (the ring overtook it, or did not hold its start).
    Own(Box<Watch>),
}

impl Subscription {
    /// The position the subscription starts after.
    pub(crate) fn start(&self) -> Position {
        self.start
    }

    /// The next event or progress, in revision order; `Ok(None)` when the feed ended (etcd ended
    /// the stream's own watch, or the replica is stopping), [`Error::EventsUnavailable`] when the
    /// stream's position is no longer in etcd's history. Cancel-safe.
    pub(crate) async fn next(&mut self) -> Result<Option<Next>> {
        loop {
            match &mut self.mode {
                Mode::Shared(cursor) => {
                    // Marked seen before the ring is read: a message pushed after the read wakes
                    // the wait below.
                    self.end.borrow_and_update();
                    let read = {
                        let ring = self.shared.lock();
                        if *cursor < ring.first {
                            Read::Overtaken
                        } else if let Some(next) =
                            ring.messages.get((*cursor - ring.first) as usize)
                        {
                            Read::Message(next.clone())
                        } else if ring.running {
                            Read::Wait
                        } else {
                            return Ok(None);
                        }
                    };
                    match read {
                        Read::Message(next) => {
                            *cursor += 1;
                            if next.position() > self.at {
                                self.at = next.position();
                                return Ok(Some(next));
                            }
                        }
                        Read::Wait => {
                            if self.end.changed().await.is_err() {
                                return Ok(None);
                            }
                        }
                        Read::Overtaken => {
                            let rejoined = self.shared.lock().cursor(self.at);
                            if let Some(rejoined) = rejoined {
                                *cursor = rejoined;
                                continue;
                            }
                            // Nothing changes until the watch is open: a cancel loses nothing.
                            let own = self.source.watch(Some(self.at)).await?;
                            self.source.metrics().watch_own("overtaken");
                            tracing::debug!(at = %self.at, "event stream overtaken by the feed; reading its own watch");
                            self.mode = Mode::Own(Box::new(own));
                        }
                    }
                }
                Mode::Own(watch) => {
                    let Some(next) = watch.next().await? else {
                        return Ok(None);
                    };
                    if next.position() <= self.at {
                        continue;
                    }
                    self.at = next.position();
                    if let Some(cursor) = self.shared.lock().cursor(self.at) {
                        self.mode = Mode::Shared(cursor);
                    }
                    return Ok(Some(next));
                }
            }
        }
    }
}

enum Read {
    Message(Next),
    Wait,
    Overtaken,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(revision: i64, index: Option<u32>) -> Position {
        Position { revision, index }
    }

    fn shared(base: Position) -> Shared {
        let shared = Shared {
            ring: Mutex::new(Ring::default()),
            end: watch::Sender::new(0),
            starting: tokio::sync::Mutex::new(()),
        };
        {
            let mut ring = shared.lock();
            ring.running = true;
            ring.base = Some(base);
        }
        shared
    }

    #[test]
    fn a_cursor_starts_past_its_position_only_where_the_ring_holds_everything_after_it() {
        let s = shared(at(10, None));
        for n in 0..3 {
            s.push(Next::Progress(at(11 + n, None)));
        }
        let ring = s.lock();
        assert_eq!(ring.cursor(at(9, None)), None, "before the base");
        assert_eq!(ring.cursor(at(10, None)), Some(0));
        assert_eq!(ring.cursor(at(11, Some(4))), Some(0), "inside revision 11");
        assert_eq!(ring.cursor(at(11, None)), Some(1));
        assert_eq!(ring.cursor(at(13, None)), Some(3), "at the end");
        assert_eq!(
            ring.cursor(at(99, None)),
            Some(3),
            "ahead: waits, skipping up to it"
        );
    }

    #[test]
    fn the_ring_keeps_its_bounds_and_moves_its_base_past_what_it_drops() {
        let s = shared(at(1, None));
        for n in 0..(RETAINED as i64 + 10) {
            s.push(Next::Progress(at(2 + n, None)));
        }
        let ring = s.lock();
        assert_eq!(ring.messages.len(), RETAINED);
        assert_eq!(ring.first, 10);
        assert_eq!(ring.base, Some(at(11, None)));
        assert_eq!(
            ring.cursor(at(10, None)),
            None,
            "dropped: a stream there reads its own"
        );
        drop(ring);
        let bytes = |s: &Shared| s.lock().bytes;
        assert!(bytes(&s) <= RETAINED_BYTES);
        s.restart(at(5000, None));
        let ring = s.lock();
        assert!(ring.messages.is_empty() && ring.bytes == 0);
        assert!(
            ring.first > RETAINED as u64 + 10,
            "a cursor at the old end is overtaken"
        );
    }
}
