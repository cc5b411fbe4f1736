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
//! Wake-ups: a stream waiting at the ring's end is woken when an event under its prefix comes,
//! and for everything else at most once a second (or every [`ANNOUNCE_AFTER`] messages), when
//! it reads past what is not its prefix's in one go and tells it as progress. A thousand idle
//! streams on other prefixes cost an event no wake-up.
//!
//! What a stream yields does not depend on which it reads: the ring holds the tail's messages
//! in history order (`Position`'s order), a stream yields only what is past its own position,
//! and the ring is kept contiguous — everything after its `base` is in it or yet to come. When
//! the tail's watch fails it is opened again from the tail's last position, so its streams see
//! no gap; when that position is no longer in etcd's history (compacted while etcd was out of
//! reach), the ring restarts at etcd's current revision and the streams it leaves behind read
//! their own watches, which answer them as etcd would (410 to their client, which lists again).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use runtime::backoff::Backoff;
use tokio::sync::Notify;
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

/// A stream is woken for each event under its prefix, and for the others (to move its resume
/// point past them) at least this often while they come…
const ANNOUNCE_EVERY: Duration = Duration::from_secs(1);
/// …or once this many messages have come since the last such wake-up, well before the ring
/// could overtake a stream that reads on.
const ANNOUNCE_AFTER: usize = RETAINED / 2;

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
    /// The streams reading the ring, to wake when a message comes for them.
    waiters: Mutex<Waiters>,
    /// Held while the tail is started, so that one caller starts it.
    starting: tokio::sync::Mutex<()>,
}

/// A stream's wake-up: for the events under its prefix at once, for the rest now and then.
struct Waiter {
    prefix: String,
    notify: Notify,
}

#[derive(Default)]
struct Waiters {
    all: Vec<Weak<Waiter>>,
    /// Messages pushed since every stream was last woken.
    unannounced: usize,
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
                waiters: Mutex::default(),
                starting: tokio::sync::Mutex::new(()),
            }),
            tracker,
            stopping,
        }
    }

    /// Subscribes to the events after `after` (or after now, when `None`): answers the position
    /// the subscription starts from and the subscription. [`Error::EventsUnavailable`] when
    /// `after` is no longer (or not yet) in etcd's history. Events whose resource does not start
    /// with `prefix` may be left out (and told as progress); the others are yielded as they come.
    pub(crate) async fn subscribe(
        &self,
        after: Option<Position>,
        prefix: &str,
    ) -> Result<Subscription> {
        self.start_tail().await?;
        // Checked against etcd's history (or read from etcd, for "now") as a stream of its own
        // would: the ring does not decide what is still in the history.
        let start = self.source.start(after).await?;
        let cursor = self.shared.lock().cursor(start);
        let mode = match cursor {
            Some(cursor) => Mode::Shared(cursor),
            None => {
                let own = self.source.watch_from(start).await?;
                self.source.metrics().watch_own("unreached");
                Mode::Own(Box::new(own))
            }
        };
        Ok(Subscription {
            source: self.source.clone(),
            shared: self.shared.clone(),
            waiter: self.shared.waiter(prefix),
            read_past: false,
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

    /// A new stream's wake-up.
    fn waiter(&self, prefix: &str) -> Arc<Waiter> {
        let waiter = Arc::new(Waiter {
            prefix: prefix.to_owned(),
            notify: Notify::new(),
        });
        let mut waiters = self.waiters();
        waiters.all.retain(|w| w.strong_count() > 0);
        waiters.all.push(Arc::downgrade(&waiter));
        waiter
    }

    fn waiters(&self) -> MutexGuard<'_, Waiters> {
        self.waiters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes the streams under `resource` (or every stream, for `None`).
    fn wake(&self, resource: Option<&str>) {
        let mut waiters = self.waiters();
        if resource.is_none() {
            waiters.unannounced = 0;
            waiters.all.retain(|w| w.strong_count() > 0);
        }
        for waiter in waiters.all.iter().filter_map(Weak::upgrade) {
            if resource.is_none_or(|r| r.starts_with(&waiter.prefix)) {
                // A permit is kept for a stream not waiting yet: no wake-up is lost.
                waiter.notify.notify_one();
            }
        }
    }

    /// Wakes every stream if messages came since it was last done.
    fn announce(&self) {
        if self.waiters().unannounced > 0 {
            self.wake(None);
        }
    }

    fn push(&self, next: Next) {
        let resource = match &next {
            Next::Event(event) => Some(event.resource.clone()),
            Next::Progress(_) => None,
        };
        {
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
        }
        let unannounced = {
            let mut waiters = self.waiters();
            waiters.unannounced += 1;
            waiters.unannounced
        };
        if unannounced >= ANNOUNCE_AFTER {
            self.wake(None);
        } else if let Some(resource) = resource {
            self.wake(Some(&resource));
        }
    }

    /// The ring starts again at `base`: every cursor in it is overtaken (a sequence number is
    /// skipped, so that one at the old end is too).
    fn restart(&self, base: Position) {
        {
            let mut ring = self.lock();
            ring.first = ring.end() + 1;
            ring.messages.clear();
            ring.bytes = 0;
            ring.base = Some(base);
        }
        self.wake(None);
    }

    fn stop(&self) {
        self.lock().running = false;
        // Wakes every stream waiting in the ring: none of them will get another message there.
        self.wake(None);
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
        let mut announce = tokio::time::interval(ANNOUNCE_EVERY);
        announce.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = tokio::select! {
                () = stopping.cancelled() => break,
                _ = announce.tick() => {
                    self.shared.announce();
                    continue;
                }
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
    waiter: Arc<Waiter>,
    /// Events outside the prefix were read past since the last message yielded.
    read_past: bool,
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
                    let read = read_ring(
                        &self.shared.lock(),
                        cursor,
                        &mut self.at,
                        &self.waiter.prefix,
                        &mut self.read_past,
                    );
                    match read {
                        Read::Message(next) => {
                            self.read_past = false;
                            return Ok(Some(next));
                        }
                        Read::Ended => return Ok(None),
                        Read::Wait if self.read_past => {
                            self.read_past = false;
                            return Ok(Some(Next::Progress(self.at)));
                        }
                        // A message pushed after the read above left a permit: nothing is missed.
                        Read::Wait => self.waiter.notify.notified().await,
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
    Ended,
}

/// Reads the ring from `cursor`: past what is at or before `at`, past progress and past the
/// events outside `prefix` (setting `read_past`), to the next event to yield. Moves `cursor` and `at` past
/// what it read; nothing it reads past is copied.
fn read_ring(
    ring: &Ring,
    cursor: &mut u64,
    at: &mut Position,
    prefix: &str,
    read_past: &mut bool,
) -> Read {
    if *cursor < ring.first {
        return Read::Overtaken;
    }
    while let Some(next) = ring.messages.get((*cursor - ring.first) as usize) {
        *cursor += 1;
        if next.position() <= *at {
            continue;
        }
        *at = next.position();
        match next {
            Next::Event(e) if e.resource.starts_with(prefix) => return Read::Message(next.clone()),
            // Progress, or another prefix's event: told once the ring has no more.
            _ => *read_past = true,
        }
    }
    if ring.running {
        Read::Wait
    } else {
        Read::Ended
    }
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
            waiters: Mutex::default(),
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
