//! The ownership ledger: who held each aisle when, from the proxy's event stream, kept by the
//! orchestrator while the robots work — for the audit's coverage (aisle-seconds with no
//! holder, the longest gap), its moves (an aisle granted to another robot than the last) and
//! what each robot event (a kill, a stall, a drain, a restart) moved. The accounting is pure
//! (timestamps in, figures out); `follow` feeds it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use lease_proxy_client::{Client, EventKind};
use tokio::time::Instant;

/// One aisle's standing.
#[derive(Debug, Default)]
struct Aisle {
    /// The grant held now: (holder, token).
    held: Option<(String, u64)>,
    /// Who held it last (now, or before the gap).
    last_holder: Option<String>,
    /// Since when nobody holds it (`None`: held, or never held).
    unowned_since: Option<Instant>,
    /// Time without a holder since coverage began.
    unowned: Duration,
    longest_gap: Duration,
}

/// What happened to the aisles, and the robot events that moved them.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    aisles: BTreeMap<String, Aisle>,
    /// When every aisle was first held at once: coverage is counted from then.
    covered_from: Option<Instant>,
    /// Counting stops here (the end of the run, before the robots are stopped).
    closed_at: Option<Instant>,
    /// When each move (a grant to another robot than the aisle's last) was seen.
    moves: Vec<Instant>,
    /// A grant made while another of the same aisle was not yet seen ending.
    pub(crate) overlaps: Vec<String>,
    /// The robot events, in order: (when, what).
    events: Vec<(Instant, &'static str)>,
}

/// The coverage figures.
#[derive(Debug, PartialEq)]
pub(crate) struct Coverage {
    pub(crate) aisle_seconds: f64,
    pub(crate) unowned_seconds: f64,
    /// The longest gap, and its aisle.
    pub(crate) longest_gap: (f64, String),
}

impl Ledger {
    /// A ledger of `aisles`, none held yet.
    pub(crate) fn new(aisles: &[String]) -> Self {
        Self {
            aisles: aisles
                .iter()
                .map(|a| (a.clone(), Aisle::default()))
                .collect(),
            ..Self::default()
        }
    }

    /// `holder` was granted `aisle` under `token`, at `at`.
    pub(crate) fn acquired(&mut self, aisle: &str, holder: &str, token: u64, at: Instant) {
        if self.closed_at.is_some() {
            return;
        }
        let covered_from = self.covered_from;
        let Some(a) = self.aisles.get_mut(aisle) else {
            return;
        };
        if let Some((other, held)) = &a.held {
            if *held != token {
                self.overlaps.push(format!(
                    "{aisle}: {holder} granted token {token} while {other} held {held}"
                ));
            }
        }
        if let Some(since) = a.unowned_since.take() {
            let gap = at.saturating_duration_since(covered_from.map_or(at, |c| c.max(since)));
            a.unowned += gap;
            a.longest_gap = a.longest_gap.max(gap);
        }
        if a.last_holder.as_deref().is_some_and(|last| last != holder) {
            self.moves.push(at);
        }
        a.held = Some((holder.to_owned(), token));
        a.last_holder = Some(holder.to_owned());
        if self.covered_from.is_none() && self.aisles.values().all(|a| a.held.is_some()) {
            self.covered_from = Some(at);
        }
    }

    /// The grant of `aisle` under `token` ended (released, revoked or expired) at `at`.
    pub(crate) fn ended(&mut self, aisle: &str, token: u64, at: Instant) {
        if self.closed_at.is_some() {
            return;
        }
        let Some(a) = self.aisles.get_mut(aisle) else {
            return;
        };
        if a.held.as_ref().is_some_and(|(_, held)| *held == token) {
            a.held = None;
            a.unowned_since = Some(at);
        }
    }

    /// A robot event at `at`: the moves after it, until the next, are its.
    pub(crate) fn robot_event(&mut self, what: &'static str, at: Instant) {
        self.events.push((at, what));
    }

    /// Stops counting at `at`: the gaps still open end there.
    pub(crate) fn close(&mut self, at: Instant) {
        if self.closed_at.is_some() {
            return;
        }
        for a in self.aisles.values_mut() {
            if let (Some(since), Some(from)) = (a.unowned_since, self.covered_from) {
                let gap = at.saturating_duration_since(from.max(since));
                a.unowned += gap;
                a.longest_gap = a.longest_gap.max(gap);
            }
        }
        self.closed_at = Some(at);
    }

    /// Aisle-seconds from coverage to the close, how many of them had no holder, the longest
    /// gap. `None`: the aisles were never all held at once.
    pub(crate) fn coverage(&self) -> Option<Coverage> {
        let (from, to) = (self.covered_from?, self.closed_at?);
        let span = to.saturating_duration_since(from).as_secs_f64();
        let longest = self
            .aisles
            .iter()
            .max_by_key(|(_, a)| a.longest_gap)
            .map(|(name, a)| (a.longest_gap.as_secs_f64(), name.clone()))
            .unwrap_or_default();
        Some(Coverage {
            aisle_seconds: span * self.aisles.len() as f64,
            unowned_seconds: self.aisles.values().map(|a| a.unowned.as_secs_f64()).sum(),
            longest_gap: longest,
        })
    }

    /// Per kind of robot event: how many there were, and the moves they made together (each
    /// move counted for the last event before it).
    pub(crate) fn moves_per_event(&self) -> BTreeMap<&'static str, (usize, usize)> {
        let mut per: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
        for (_, what) in &self.events {
            per.entry(what).or_default().0 += 1;
        }
        for at in &self.moves {
            let last = self.events.iter().rev().find(|(when, _)| when <= at);
            if let Some((_, what)) = last {
                per.entry(what).or_default().1 += 1;
            }
        }
        per
    }

    /// Every move, whatever caused it.
    pub(crate) fn moves(&self) -> usize {
        self.moves.len()
    }
}

/// The ledger shared by the orchestrator's tasks.
pub(crate) type Shared = Arc<Mutex<Ledger>>;

pub(crate) fn lock(ledger: &Shared) -> std::sync::MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keeps `ledger` from the proxy's event stream of `prefix` until the task is aborted; `ready`
/// is told once the stream is open (its first message, the revision it starts after, read).
pub(crate) async fn follow(
    client: Client,
    prefix: String,
    ledger: Shared,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut events = client.watch(&prefix, None);
    loop {
        // Polled a tenth of a second at a time (a stream's `next` may be dropped and asked
        // again), so that the open stream is noticed before any event.
        let next = tokio::time::timeout(Duration::from_millis(100), events.next()).await;
        if events.last_event_id().is_some() {
            if let Some(ready) = ready.take() {
                let _ = ready.send(());
            }
        }
        let event = match next {
            Err(_) => continue,
            Ok(None) => return,
            Ok(Some(Err(_))) => {
                // The stream resumes on its own; an error it cannot (a 410) ends it: again.
                tokio::time::sleep(Duration::from_millis(200)).await;
                events = client.watch(&prefix, None);
                continue;
            }
            Ok(Some(Ok(event))) => event,
        };
        let now = Instant::now();
        let mut ledger = lock(&ledger);
        match event.kind {
            EventKind::Acquired => {
                ledger.acquired(&event.resource, &event.holder, event.token, now)
            }
            EventKind::Released | EventKind::Expired => {
                ledger.ended(&event.resource, event.token, now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_count_from_coverage_and_moves_go_to_the_last_event() {
        let t0 = Instant::now();
        let s = |ms: u64| t0 + Duration::from_millis(ms);
        let mut l = Ledger::new(&["a".into(), "b".into()]);
        l.acquired("a", "r1", 1, s(0));
        l.ended("a", 1, s(100)); // before coverage: not counted
        l.acquired("a", "r1", 3, s(200));
        l.acquired("b", "r2", 4, s(300)); // covered from here
        l.robot_event("kill", s(400));
        l.ended("b", 4, s(500));
        l.acquired("b", "r1", 6, s(800)); // a move, 300 ms unowned
        l.robot_event("drain", s(900));
        l.ended("a", 3, s(1000));
        l.acquired("a", "r2", 8, s(1100)); // a move, 100 ms
        l.ended("b", 6, s(1200));
        l.close(s(1300)); // b's open gap: 100 ms
        let c = l.coverage().unwrap();
        assert!((c.unowned_seconds - 0.5).abs() < 1e-9, "{c:?}");
        assert!((c.aisle_seconds - 2.0).abs() < 1e-9, "{c:?}");
        assert_eq!(c.longest_gap.1, "b");
        assert!((c.longest_gap.0 - 0.3).abs() < 1e-9);
        let per = l.moves_per_event();
        assert_eq!(per["kill"], (1, 1));
        assert_eq!(per["drain"], (1, 1));
        assert!(l.overlaps.is_empty());
        l.acquired("a", "r3", 99, s(1250)); // after the close: ignored
        assert!(l.overlaps.is_empty());
    }

    #[test]
    fn a_grant_over_a_live_one_is_an_overlap() {
        let t0 = Instant::now();
        let mut l = Ledger::new(&["a".into()]);
        l.acquired("a", "r1", 1, t0);
        l.acquired("a", "r2", 2, t0);
        assert_eq!(l.overlaps.len(), 1);
    }
}
