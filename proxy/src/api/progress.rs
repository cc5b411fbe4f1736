//! When a `GET /v1/watch` stream tells its client how far it has read without an event to show:
//! an id-only message (no `event`, no `data`) whose id is a resume point like any other.
//!
//! Without it, a stream whose keys are quiet (or whose events the client may not see) keeps
//! the id of its last event for ever, and once etcd compacts past that id a resume answers 410
//! although nothing was missed. The stream's task reports every position it reads past its last
//! message ([`Pacer::read_through`]); the pacer hands the newest one out once the stream has
//! been silent for [`EVERY`], so a busy etcd never turns into a flood of ids (one a second at
//! most), and an event, whose id covers everything read before it, makes a pending position
//! moot. Per the HTML standard (§9.2.6, "dispatch the event"), an `EventSource` takes a
//! message's id as its last event id before it drops a message without data, so browsers
//! resume from it as the SDKs do, and nobody sees it as an event.

use std::time::Duration;

use tokio::time::Instant;

use crate::lease::Position;

/// How long a stream is silent before it tells its client a newer position.
pub(super) const EVERY: Duration = Duration::from_secs(1);

/// The newest position a stream has read past its last message, and when it is due.
#[derive(Debug)]
pub(super) struct Pacer {
    every: Duration,
    /// Read past the last message; `None`: the last message says it all.
    unsent: Option<Position>,
    /// When the stream last handed its client a message.
    last_message: Instant,
}

impl Pacer {
    /// A pacer for a stream that has just handed over its first message.
    pub(super) fn new(every: Duration) -> Self {
        Self {
            every,
            unsent: None,
            last_message: Instant::now(),
        }
    }

    /// The stream handed its client a message: an event (whose id covers every position read
    /// before it) or a position from [`Pacer::due`].
    pub(super) fn sent(&mut self) {
        self.unsent = None;
        self.last_message = Instant::now();
    }

    /// The stream has read through `position` (it only moves forward) with no event to show.
    pub(super) fn read_through(&mut self, position: Position) {
        self.unsent = Some(position);
    }

    /// The position to tell the client, once the stream has read past its last message and
    /// been silent for the pacer's interval since that message; never while nothing is unsent.
    /// Cancel-safe: the position is taken only when it is returned.
    pub(super) async fn due(&mut self) -> Position {
        let Some(position) = self.unsent else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(self.last_message + self.every).await;
        self.unsent = None;
        position
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(revision: i64, index: Option<u32>) -> Position {
        Position { revision, index }
    }

    /// Whether `due` answers within `within` (virtual time), and with what.
    async fn due_within(pacer: &mut Pacer, within: Duration) -> Option<Position> {
        tokio::time::timeout(within, pacer.due()).await.ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_position_goes_out_once_the_stream_was_silent_for_the_interval() {
        let mut pacer = Pacer::new(EVERY);
        // Nothing read past the first message: nothing is ever due.
        assert_eq!(due_within(&mut pacer, EVERY * 10).await, None);
        // The first message went out 10 s ago: a position read now is due at once, the newest.
        pacer.read_through(at(7, Some(0)));
        pacer.read_through(at(9, None));
        assert_eq!(
            due_within(&mut pacer, Duration::ZERO).await,
            Some(at(9, None))
        );
        pacer.sent();
        // Then silence for a full interval after that message, not after the read.
        tokio::time::advance(EVERY / 2).await;
        pacer.read_through(at(12, None));
        assert_eq!(due_within(&mut pacer, EVERY / 4).await, None);
        assert_eq!(
            due_within(&mut pacer, EVERY / 4 + Duration::from_millis(1)).await,
            Some(at(12, None))
        );
        // Taken: not again.
        pacer.sent();
        assert_eq!(due_within(&mut pacer, EVERY * 10).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_makes_a_pending_position_moot_and_restarts_the_interval() {
        let mut pacer = Pacer::new(EVERY);
        pacer.read_through(at(20, Some(3)));
        tokio::time::advance(EVERY - Duration::from_millis(10)).await;
        // An event (its id covers 20.3) goes out just before the position was due.
        pacer.sent();
        assert_eq!(due_within(&mut pacer, EVERY * 10).await, None);
        // Another event, then a position: a wait cut short (the stream's task took another
        // branch) leaves it pending.
        pacer.sent();
        pacer.read_through(at(21, None));
        assert_eq!(due_within(&mut pacer, EVERY / 2).await, None);
        assert_eq!(due_within(&mut pacer, EVERY).await, Some(at(21, None)));
    }
}
