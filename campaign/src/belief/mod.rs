//! The campaign's second verdict: how long holders *believed* they held at once.
//!
//! The token order at the storage (the [`crate::checker`]) says whether a stale write got in;
//! this says how long a holder went on acting after someone newer held the resource — measured,
//! not bounded. Each client records what its lease told it ([`Hold`]): when the acquire's answer
//! said held, every successful acquire or renewal with the stop-by deadline the Rust SDK's guard
//! would move to ([`lease_proxy_client::stop_by`]), the writes it decided on, and the signal
//! that ended the hold (a refusal, a release, a kill, the end of the run). [`interval`] turns
//! that into a belief interval on the host's monotonic clock: from held until the signal, or
//! until the stop-by deadline passed — but never before a write decided while it still held
//! had its answer (a process stopped between its check and its write, the SIGSTOP hazard, acts
//! when it resumes). [`verdict`] then measures, per resource, the real time two different
//! holders believed at once, and what became of the older holder's writes meanwhile.
//!
//! Clients run in one process on one host; each has a simulated clock rate ([`Hold::rate`]):
//! its stop-by deadline passes when *its* clock says so. Intervals carry both the host's real
//! duration and the client's view of it; the verdict uses the host's real time.

use std::time::Duration;

use tokio::time::Instant;

mod record;
mod verdict;

pub use record::Beliefs;
pub use verdict::{
    judge, verdict, BeliefReport, Longest, OlderWrites, ResourceOverlap, Summary, LATE,
};

/// How far a client's simulated clock rate strays from the host's, at most (±): within the
/// tenth of the lifetime the SDK keeps as its default safety margin.
pub const SKEW: f64 = 0.05;

/// One successful acquire or renewal, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Granted {
    /// When its request was sent (the instant read just before sending).
    pub sent: Instant,
    /// When its answer arrived.
    pub answered: Instant,
    /// The stop-by deadline it gives, as a time after `sent` on the client's clock
    /// ([`lease_proxy_client::stop_by`] less `sent`).
    pub stop_by: Duration,
    /// The TTL it granted (for the late-deadline control).
    pub ttl: Duration,
}

/// A write the client decided on while it held: when it decided (its last check before the
/// write, before any pause it was stopped in), and when the write's answer (or its giving up)
/// came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    /// When it decided.
    pub decided: Instant,
    /// When the write ended for it.
    pub completed: Instant,
}

/// What ended a hold from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    /// A renewal or a write was refused (a 4xx): the lease said lost.
    Lost,
    /// The client released it (or walked away from it).
    Released,
    /// The client was killed.
    Killed,
    /// The run ended with the hold still open.
    RunEnded,
}

/// One hold by one client, as recorded while it ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    /// The client.
    pub client: String,
    /// The resource.
    pub resource: String,
    /// The token's revision.
    pub token: u64,
    /// The client's clock rate relative to the host's (1.02: its clock runs 2 % fast).
    pub rate: f64,
    /// When the acquire's answer said held.
    pub held: Instant,
    /// The acquire and every successful renewal, in order.
    pub grants: Vec<Granted>,
    /// The writes it decided on, in order.
    pub actions: Vec<Action>,
    /// The signal that ended it, and when (none while it is open).
    pub signal: Option<(Signal, Instant)>,
}

/// Which stop-by deadline a belief interval honours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The SDK's: [`lease_proxy_client::stop_by`], on the client's clock.
    StopBy,
    /// A control: the TTL plus this much, no margin (a deadline set past the lease's end).
    Late(Duration),
    /// A control: no deadline at all; only a signal ends a belief.
    Disabled,
}

/// What ended a belief interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ended {
    /// Its own signal.
    Signal(Signal),
    /// The stop-by deadline passed.
    Deadline,
    /// The stop-by deadline had passed, and a write decided before it then had its answer.
    WriteAfterDeadline,
}

/// A belief interval: one holder believed it held `resource` with `token` from `start` to `end`
/// on the host's monotonic clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    /// The client.
    pub client: String,
    /// The resource.
    pub resource: String,
    /// The token's revision.
    pub token: u64,
    /// When the lease said held.
    pub start: Instant,
    /// When its own signal or deadline ended the belief.
    pub end: Instant,
    /// What ended it.
    pub ended: Ended,
    /// Its length on the client's own clock.
    pub client_view: Duration,
}

impl Granted {
    /// An acquire or renewal sent at `sent` and answered just now with `body` (its
    /// `ttl_seconds` and `expires_in_ms`; `wait`: the wait an acquire allowed), with the
    /// stop-by deadline the SDK's guard would move to (its default safety margin).
    pub fn answered(sent: Instant, body: &serde_json::Value, wait: Duration) -> Option<Self> {
        let ttl = body["ttl_seconds"].as_u64()?;
        let expires = body["expires_in_ms"].as_u64()?;
        let stop_by = lease_proxy_client::stop_by(sent, ttl, expires, wait, None);
        Some(Self {
            sent,
            answered: Instant::now(),
            stop_by: stop_by.duration_since(sent),
            ttl: Duration::from_secs(ttl),
        })
    }
}

/// The belief interval of `hold` under `rule`.
pub fn interval(hold: &Hold, rule: Rule) -> Interval {
    let deadline = deadline(hold, rule);
    // A write decided before the deadline acts until its answer, even past the deadline.
    let acting = deadline.map(|d| {
        let last = hold
            .actions
            .iter()
            .filter(|a| a.decided < d)
            .map(|a| a.completed)
            .max();
        match last {
            Some(c) if c > d => (c, Ended::WriteAfterDeadline),
            _ => (d, Ended::Deadline),
        }
    });
    let signal = hold.signal.map(|(s, at)| (at, Ended::Signal(s)));
    let (end, ended) = match (signal, acting) {
        (Some(s), Some(a)) => {
            if s.0 <= a.0 {
                s
            } else {
                a
            }
        }
        (Some(s), None) => s,
        (None, Some(a)) => a,
        (None, None) => (hold.held, Ended::Deadline),
    };
    let end = end.max(hold.held);
    Interval {
        client: hold.client.clone(),
        resource: hold.resource.clone(),
        token: hold.token,
        start: hold.held,
        end,
        ended,
        client_view: end.duration_since(hold.held).mul_f64(hold.rate.max(0.0)),
    }
}

/// The real instant `hold`'s deadline under `rule` passes (none: disabled): the acquire's,
/// moved on by every renewal answered before it had passed (a loss, once seen, stays).
fn deadline(hold: &Hold, rule: Rule) -> Option<Instant> {
    let after = |g: &Granted| -> Duration {
        match rule {
            // The client's clock runs at `rate`: its span passes in span / rate of real time.
            Rule::StopBy => g.stop_by.div_f64(hold.rate.max(0.01)),
            Rule::Late(extra) => g.ttl + extra,
            Rule::Disabled => Duration::MAX,
        }
    };
    if rule == Rule::Disabled {
        return None;
    }
    let mut deadline: Option<Instant> = None;
    for g in &hold.grants {
        let moved = g.sent.checked_add(after(g)).unwrap_or(g.sent);
        deadline = match deadline {
            None => Some(moved),
            Some(d) if g.answered < d => Some(d.max(moved)),
            Some(d) => Some(d),
        };
    }
    Some(deadline.unwrap_or(hold.held))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A hold acquired at `t0`, answered 10 ms later, stop-by 2700 ms after sending (TTL 3 s).
    fn hold(t0: Instant) -> Hold {
        Hold {
            client: "c1".into(),
            resource: "r".into(),
            token: 5,
            rate: 1.0,
            held: t0 + ms(10),
            grants: vec![Granted {
                sent: t0,
                answered: t0 + ms(10),
                stop_by: ms(2700),
                ttl: ms(3000),
            }],
            actions: Vec::new(),
            signal: None,
        }
    }

    #[test]
    fn a_belief_ends_at_its_signal_or_its_deadline_whichever_is_first() {
        let t0 = Instant::now();
        let mut h = hold(t0);
        h.signal = Some((Signal::Released, t0 + ms(500)));
        let i = interval(&h, Rule::StopBy);
        assert_eq!((i.start, i.end), (t0 + ms(10), t0 + ms(500)));
        assert_eq!(i.ended, Ended::Signal(Signal::Released));

        h.signal = Some((Signal::RunEnded, t0 + ms(9000)));
        let i = interval(&h, Rule::StopBy);
        assert_eq!((i.end, i.ended), (t0 + ms(2700), Ended::Deadline));
        // The controls: later, and only the signal.
        assert_eq!(interval(&h, Rule::Late(ms(1000))).end, t0 + ms(4000));
        assert_eq!(interval(&h, Rule::Disabled).end, t0 + ms(9000));
    }

    #[test]
    fn a_renewal_moves_the_deadline_only_while_it_still_held() {
        let t0 = Instant::now();
        let mut h = hold(t0);
        h.signal = Some((Signal::RunEnded, t0 + ms(20_000)));
        h.grants.push(Granted {
            sent: t0 + ms(1000),
            answered: t0 + ms(1100),
            stop_by: ms(2700),
            ttl: ms(3000),
        });
        assert_eq!(interval(&h, Rule::StopBy).end, t0 + ms(3700));
        // Answered after the deadline had passed: lost stays lost.
        h.grants.push(Granted {
            sent: t0 + ms(3600),
            answered: t0 + ms(3800),
            stop_by: ms(2700),
            ttl: ms(3000),
        });
        assert_eq!(interval(&h, Rule::StopBy).end, t0 + ms(3700));
    }

    #[test]
    fn a_write_decided_before_the_deadline_acts_until_its_answer() {
        let t0 = Instant::now();
        let mut h = hold(t0);
        // Decided at 1 s, stopped for 5 s, then written and refused at 6.2 s.
        h.actions.push(Action {
            decided: t0 + ms(1000),
            completed: t0 + ms(6200),
        });
        // Decided after the deadline: not under belief.
        h.actions.push(Action {
            decided: t0 + ms(6300),
            completed: t0 + ms(7000),
        });
        h.signal = Some((Signal::Lost, t0 + ms(6200)));
        let i = interval(&h, Rule::StopBy);
        assert_eq!(i.end, t0 + ms(6200));
        h.signal = Some((Signal::RunEnded, t0 + ms(9000)));
        let i = interval(&h, Rule::StopBy);
        assert_eq!((i.end, i.ended), (t0 + ms(6200), Ended::WriteAfterDeadline));
    }

    #[test]
    fn a_skewed_clock_moves_the_real_deadline_and_keeps_its_own_view() {
        let t0 = Instant::now();
        let mut h = hold(t0);
        h.signal = Some((Signal::RunEnded, t0 + ms(9000)));
        // 8 % slow: its 2700 ms pass in 2935 ms of real time.
        h.rate = 0.92;
        let i = interval(&h, Rule::StopBy);
        let real = ms(2700).div_f64(0.92);
        assert_eq!(i.end, t0 + real);
        let view = (real - ms(10)).mul_f64(0.92);
        assert!(i.client_view.abs_diff(view) < Duration::from_micros(1));
    }
}
