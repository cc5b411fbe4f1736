//! What the gates and the layer decide, as pure functions of what they have read: the store,
//! the database and the clock are the callers' business. [`Gate`](crate::Gate),
//! [`SharedGate`](crate::SharedGate) and the [`FencingLayer`](crate::FencingLayer) call these,
//! and so does the model checker (`model/`, feature `model`), so a change to a decision changes
//! what is checked. Time is generic: tokio's `Instant` here, a tick count in the model.

use std::ops::Add;
use std::time::Duration;

use crate::admission::Outcome;
use crate::Token;

/// What the in-process gate does next with a write of `token` (see [`admit_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Refused: below the floor (the mark, or a higher token whose raise is under way).
    Stale {
        /// The floor it is below.
        floor: Token,
    },
    /// Admitted now, concurrently with the other writes at the mark.
    Admit,
    /// Above the mark: the floor rises to `floor` at once (lower tokens are refused from now
    /// on), then the write takes the raise lock, drains and raises the mark.
    Raise {
        /// The new floor.
        floor: Token,
    },
    /// The mark is not known yet: take the raise lock and read it from the store.
    Load,
}

/// The in-process gate's first look at a write of `token`, given the resource's cached `mark`
/// (`None` before it is read) and `floor`.
pub fn admit_step(mark: Option<Token>, floor: Token, token: Token) -> Step {
    match mark {
        None => Step::Load,
        Some(_) if token < floor => Step::Stale { floor },
        Some(mark) if token == mark => Step::Admit,
        Some(_) => Step::Raise {
            floor: floor.max(token),
        },
    }
}

/// Whether a raise may go ahead (see [`drain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Drain<T> {
    /// Nothing lower is in flight and no uncertain write's grace is running: raise.
    Clear,
    /// A lower write is in flight: wait until a write ends, then look again.
    AwaitEnd,
    /// An uncertain write may still be applied until then: wait (or for a write's end).
    AwaitUntil(T),
}

/// Whether a raise may go ahead now: `lower_in_flight` says whether an admitted write below the
/// raising token has not ended; `uncertain_until` is when the last uncertain write's grace ends.
pub fn drain<T: Ord>(lower_in_flight: bool, uncertain_until: T, now: T) -> Drain<T> {
    if lower_in_flight {
        Drain::AwaitEnd
    } else if uncertain_until > now {
        Drain::AwaitUntil(uncertain_until)
    } else {
        Drain::Clear
    }
}

/// Until when a resource stays closed to higher tokens after a write ended with `outcome` at
/// `now`: an uncertain write may still be applied for the write `grace`.
pub fn closed_until<T>(uncertain_until: T, outcome: Outcome, now: T, grace: Duration) -> T
where
    T: Ord + Add<Duration, Output = T>,
{
    match outcome {
        Outcome::Complete => uncertain_until,
        Outcome::Uncertain => uncertain_until.max(now + grace),
    }
}

/// The shared gate's durations, all derived from three settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timing {
    /// The longest exchange with the storage (`--upstream-timeout`).
    pub max_exchange: Duration,
    /// How long an uncertain write may still be applied (`--write-grace`).
    pub write_grace: Duration,
    /// The bound on every database step (`--store-timeout`).
    pub deadline: Duration,
}

impl Timing {
    /// By when, counted from *before* its registration was sent, a write's exchange must have
    /// ended (plus [`Timing::max_wait`] if it waited): the registration lasts this and the
    /// write grace, so an exchange cut off by then is over at the storage inside it.
    pub fn exchange_budget(&self) -> Duration {
        self.max_exchange + self.deadline
    }

    /// How long a registration lasts from its commit (`L`).
    pub fn lifetime(&self) -> Duration {
        self.exchange_budget() + self.write_grace
    }

    /// How long a write waits for lower registrations before giving up (`W`); a waiting write's
    /// registration is lengthened by it.
    pub fn max_wait(&self) -> Duration {
        self.lifetime() + self.deadline
    }

    /// The permit's deadline: counted from `registering`, the instant taken before the
    /// database step that made the registration, lengthened by the longest wait if it waited.
    pub fn permit_deadline<T: Add<Duration, Output = T>>(&self, registering: T, waited: bool) -> T {
        if waited {
            registering + self.max_wait() + self.exchange_budget()
        } else {
            registering + self.exchange_budget()
        }
    }
}

/// The live registrations of lower tokens a database step counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lower {
    /// How many.
    pub live: i64,
    /// When the first of them expires (if it is not ended sooner).
    pub next_expiry: Option<Duration>,
}

/// What registering a write at the mark found: the mark row, and whether the write was
/// registered (only when its token equals the mark).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtMark {
    /// The resource's mark.
    pub mark: Token,
    /// Whether the registration was inserted.
    pub registered: bool,
}

/// Where a registration attempt left the write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Registered {
    /// Refused: the token is below the mark. Nothing was registered.
    Stale(Token),
    /// The token is above the mark (or there is none yet): raise and register. Nothing was
    /// registered.
    NeedsRaise,
    /// Registered; `lower` live registrations of lower tokens remain to be waited out.
    Yes {
        /// Those.
        lower: Lower,
    },
}

/// What the register-at-mark transaction's answer means: no mark row (`None`), registered at
/// the mark, below it, or above it.
pub fn at_mark(answer: Option<AtMark>, token: Token, lower: Lower) -> Registered {
    match answer {
        None => Registered::NeedsRaise,
        Some(AtMark {
            registered: true, ..
        }) => Registered::Yes { lower },
        Some(AtMark { mark, .. }) if token < mark => Registered::Stale(mark),
        Some(_) => Registered::NeedsRaise,
    }
}

/// What the raise transaction's answer means: the mark `before` it (the raise is rolled back
/// when the token is below it).
pub fn raised(before: Token, token: Token, lower: Lower) -> Registered {
    if token < before {
        Registered::Stale(before)
    } else {
        Registered::Yes { lower }
    }
}

/// What a waiting write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Polled {
    /// No lower write is in flight: go ahead.
    Clear,
    /// Lower writes are still in flight; the first of them expires after this long.
    Waiting(Option<Duration>),
    /// A higher token raised the mark meanwhile: the write is refused, like any write below a
    /// raise under way, so that the higher one waits only for writes really in flight, never
    /// for a chain of waiting ones.
    Overtaken(Token),
}

/// What a waiting write's poll means, given the `mark` it read and the `lower` registrations.
pub fn polled(mark: Token, token: Token, lower: Lower) -> Polled {
    if mark > token {
        Polled::Overtaken(mark)
    } else if lower.live == 0 {
        Polled::Clear
    } else {
        Polled::Waiting(lower.next_expiry)
    }
}

/// When an admitted write's exchange must have ended: `exchange_deadline` after `read_at` (when
/// the layer read its admission), and never past the gate's deadline (a shared gate's
/// registration lapses on a clock the gateway's process does not stop).
pub fn exchange_until<T>(read_at: T, exchange_deadline: Duration, gate_deadline: Option<T>) -> T
where
    T: Ord + Add<Duration, Output = T>,
{
    let until = read_at + exchange_deadline;
    match gate_deadline {
        Some(gate) => until.min(gate),
        None => until,
    }
}

/// Whether anything of a write may still be handed to the storage at `now`.
pub fn may_send<T: Ord>(now: T, until: T) -> bool {
    now < until
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(r: u64) -> Token {
        Token::new(0, r)
    }

    const NONE: Lower = Lower {
        live: 0,
        next_expiry: None,
    };

    #[test]
    fn the_in_process_gate_refuses_below_the_floor_even_at_the_mark() {
        assert_eq!(admit_step(None, t(0), t(3)), Step::Load);
        assert_eq!(admit_step(Some(t(3)), t(3), t(3)), Step::Admit);
        assert_eq!(
            admit_step(Some(t(3)), t(4), t(3)),
            Step::Stale { floor: t(4) }
        );
        assert_eq!(
            admit_step(Some(t(3)), t(4), t(5)),
            Step::Raise { floor: t(5) }
        );
        assert_eq!(
            admit_step(Some(t(3)), t(5), t(4)),
            Step::Stale { floor: t(5) }
        );
    }

    #[test]
    fn a_raise_waits_for_lower_writes_and_the_grace() {
        assert_eq!(drain(true, 0, 5), Drain::AwaitEnd);
        assert_eq!(drain(false, 7, 5), Drain::AwaitUntil(7));
        assert_eq!(drain(false, 5, 5), Drain::Clear);
        let grace = Duration::from_secs(2);
        let now = Duration::from_secs(10);
        assert_eq!(
            closed_until(now, Outcome::Uncertain, now, grace),
            now + grace
        );
        assert_eq!(closed_until(now, Outcome::Complete, now, grace), now);
    }

    #[test]
    fn registrations_outlast_the_exchange_by_the_grace() {
        let s = Duration::from_secs;
        let timing = Timing {
            max_exchange: s(8),
            write_grace: s(7),
            deadline: s(2),
        };
        assert_eq!(timing.lifetime(), s(17));
        assert_eq!(timing.max_wait(), s(19));
        assert_eq!(timing.permit_deadline(s(100), false), s(110));
        assert_eq!(timing.permit_deadline(s(100), true), s(129));
        // The layer never sends past the gate's deadline, however late it reads the admission.
        assert_eq!(exchange_until(s(105), s(8), Some(s(110))), s(110));
        assert_eq!(exchange_until(s(100), s(8), Some(s(110))), s(108));
        assert!(may_send(s(109), s(110)) && !may_send(s(110), s(110)));
    }

    #[test]
    fn database_answers_mean_what_the_gate_does() {
        let lower = Lower {
            live: 1,
            next_expiry: None,
        };
        assert_eq!(at_mark(None, t(2), NONE), Registered::NeedsRaise);
        let answer = |mark, registered| Some(AtMark { mark, registered });
        assert_eq!(
            at_mark(answer(t(2), true), t(2), lower),
            Registered::Yes { lower }
        );
        assert_eq!(
            at_mark(answer(t(3), false), t(2), NONE),
            Registered::Stale(t(3))
        );
        assert_eq!(
            at_mark(answer(t(1), false), t(2), NONE),
            Registered::NeedsRaise
        );
        assert_eq!(raised(t(3), t(2), NONE), Registered::Stale(t(3)));
        assert_eq!(raised(t(1), t(2), NONE), Registered::Yes { lower: NONE });
        assert_eq!(polled(t(3), t(2), lower), Polled::Overtaken(t(3)));
        assert_eq!(polled(t(2), t(2), lower), Polled::Waiting(None));
        assert_eq!(polled(t(2), t(2), NONE), Polled::Clear);
    }
}
