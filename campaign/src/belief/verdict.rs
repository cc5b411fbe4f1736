//! The verdict on belief intervals: per resource, the real time two different holders believed
//! they held at once, and what the storage did with the older holder's writes meanwhile.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::{interval, Ended, Hold, Interval, Rule};
use crate::history::{Event, Outcome};
use crate::run::Percentiles;
use crate::storage::Applied;

/// The older holder's writes in flight during an overlap (sent before it ended, answered or
/// given up after it began), by what became of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OlderWrites {
    /// Refused (a 4xx: 409 from the enforcer, 410 from a proxy).
    pub refused: usize,
    /// Applied by the storage before the overlap began (the newer grant's pre-fence waited
    /// for them).
    pub applied_before: usize,
    /// Applied by the storage once the newer holder held: a stale write the token order must
    /// never let in. Zero is the only acceptable answer.
    pub applied_during: usize,
    /// Neither answered nor applied.
    pub lost_in_flight: usize,
}

impl OlderWrites {
    fn add(&mut self, other: Self) {
        self.refused += other.refused;
        self.applied_before += other.applied_before;
        self.applied_during += other.applied_during;
        self.lost_in_flight += other.lost_in_flight;
    }
}

/// The overlaps of one set of belief intervals.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    /// Belief intervals judged.
    pub intervals: usize,
    /// Pairs of different holders of one resource whose beliefs overlapped in real time.
    pub overlaps: usize,
    /// Their real-time overlap, summed, in milliseconds.
    pub sum_ms: f64,
    /// Overlap lengths: how long an older holder acted while a newer one held.
    pub overlap_ms: Percentiles,
    /// The same on the older holder's own (simulated, skewed) clock.
    pub overlap_client_view_ms: Percentiles,
    /// Per resource: overlaps, summed and longest overlap (ms).
    pub per_resource: BTreeMap<String, ResourceOverlap>,
    /// The older holders' writes in flight during the overlaps.
    pub older_writes: OlderWrites,
    /// The overlaps during which the older holder had a write refused: how long it acted
    /// (the overlap) before the storage refused it.
    pub acted_until_refused_ms: Percentiles,
    /// What ended the belief intervals.
    pub ended: BTreeMap<String, usize>,
    /// The longest overlaps (at most three).
    pub longest: Vec<Longest>,
}

/// One of the longest overlaps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Longest {
    /// How long, in milliseconds.
    pub ms: f64,
    /// Who and what: the resource, the older holder (its token, what ended its belief) and the
    /// newer one.
    pub between: String,
}

/// One resource's overlaps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceOverlap {
    /// How many.
    pub count: usize,
    /// Summed, in milliseconds.
    pub sum_ms: f64,
    /// The longest, in milliseconds.
    pub max_ms: f64,
}

/// The belief verdict of a run: the overlaps of the intervals the SDK's stop-by deadline
/// gives, and of two controls on the same holds (a deadline past the lease's end, and none),
/// which can only overlap as much or more: that the measure sees what the deadline does.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BeliefReport {
    /// Under the SDK's stop-by deadline, on each client's skewed clock; real time.
    pub stop_by: Summary,
    /// Control: deadlines at the TTL plus one second, no margin.
    pub late_deadline: Summary,
    /// Control: no deadline; only a signal ends a belief.
    pub no_deadline: Summary,
}

/// How much later than the TTL the late-deadline control's deadlines are.
pub const LATE: std::time::Duration = std::time::Duration::from_secs(1);

/// The belief verdict of `holds`: their intervals under the SDK's stop-by deadline and under
/// the two controls, each judged by [`verdict`].
pub fn judge(holds: &[Hold], events: &[Event], applied: &[Applied]) -> BeliefReport {
    let under = |rule: Rule| {
        let intervals: Vec<Interval> = holds.iter().map(|h| interval(h, rule)).collect();
        verdict(&intervals, events, applied)
    };
    BeliefReport {
        stop_by: under(Rule::StopBy),
        late_deadline: under(Rule::Late(LATE)),
        no_deadline: under(Rule::Disabled),
    }
}

/// One overlap between an older and a newer holder's beliefs.
struct Overlap<'a> {
    older: &'a Interval,
    newer: &'a Interval,
    from: Instant,
    to: Instant,
}

/// The verdict on `intervals`, judging the older holders' writes from the run's `events` and
/// the storage's `applied` log. Overlaps are between different clients; the older holder is
/// the one with the lower token.
pub fn verdict(intervals: &[Interval], events: &[Event], applied: &[Applied]) -> Summary {
    let overlaps = overlaps(intervals);
    let at: HashMap<(&str, u64), Instant> = applied
        .iter()
        .map(|a| ((a.client.as_str(), a.op), a.at))
        .collect();
    let mut summary = Summary {
        intervals: intervals.len(),
        overlaps: overlaps.len(),
        ..Summary::default()
    };
    let (mut lengths, mut views, mut refused) = (Vec::new(), Vec::new(), Vec::new());
    for o in &overlaps {
        let len = o.to.duration_since(o.from);
        let ms = len.as_secs_f64() * 1e3;
        lengths.push(ms);
        let rate = o.older.client_view.as_secs_f64()
            / o.older.end.duration_since(o.older.start).as_secs_f64();
        views.push(if rate.is_finite() { ms * rate } else { ms });
        summary.sum_ms += ms;
        let r = summary
            .per_resource
            .entry(o.older.resource.clone())
            .or_default();
        r.count += 1;
        r.sum_ms += ms;
        r.max_ms = r.max_ms.max(ms);
        let writes = older_writes(o, events, &at);
        if writes.refused > 0 {
            refused.push(ms);
        }
        summary.older_writes.add(writes);
    }
    for i in intervals {
        let name = match i.ended {
            Ended::Signal(s) => serde_json::to_value(s)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            Ended::Deadline => "deadline".to_owned(),
            Ended::WriteAfterDeadline => "write_after_deadline".to_owned(),
        };
        *summary.ended.entry(name).or_default() += 1;
    }
    let mut longest: Vec<&Overlap> = overlaps.iter().collect();
    longest.sort_by(|a, b| {
        b.to.duration_since(b.from)
            .cmp(&a.to.duration_since(a.from))
    });
    summary.longest = longest
        .iter()
        .take(3)
        .map(|o| Longest {
            ms: o.to.duration_since(o.from).as_secs_f64() * 1e3,
            between: format!(
                "{}: {} (token {}, ended {:?}) and {} (token {})",
                o.older.resource,
                o.older.client,
                o.older.token,
                o.older.ended,
                o.newer.client,
                o.newer.token,
            ),
        })
        .collect();
    summary.overlap_ms = Percentiles::of(lengths);
    summary.overlap_client_view_ms = Percentiles::of(views);
    summary.acted_until_refused_ms = Percentiles::of(refused);
    summary
}

/// Every overlap of two different clients' intervals on one resource (touching is not
/// overlapping).
fn overlaps(intervals: &[Interval]) -> Vec<Overlap<'_>> {
    let mut by_resource: BTreeMap<&str, Vec<&Interval>> = BTreeMap::new();
    for i in intervals {
        by_resource.entry(i.resource.as_str()).or_default().push(i);
    }
    let mut found = Vec::new();
    for list in by_resource.values_mut() {
        list.sort_by_key(|i| i.start);
        for (n, a) in list.iter().enumerate() {
            // Sorted by start: once one starts at or after `a` ends, so do the rest.
            for b in list[n + 1..].iter().take_while(|b| b.start < a.end) {
                let (from, to) = (a.start.max(b.start), a.end.min(b.end));
                if a.client == b.client || to <= from {
                    continue;
                }
                let (older, newer) = if (a.token, a.start) <= (b.token, b.start) {
                    (*a, *b)
                } else {
                    (*b, *a)
                };
                found.push(Overlap {
                    older,
                    newer,
                    from,
                    to,
                });
            }
        }
    }
    found
}

/// The older holder's writes in flight during `o`, by what became of them.
fn older_writes(o: &Overlap, events: &[Event], at: &HashMap<(&str, u64), Instant>) -> OlderWrites {
    let mut w = OlderWrites::default();
    let in_flight = events.iter().filter(|e| {
        e.kind.is_write()
            && e.client == o.older.client
            && e.resource == o.older.resource
            && e.revision == Some(o.older.token)
            && e.invoked < o.to
            && e.completed > o.from
    });
    for e in in_flight {
        match (e.outcome, at.get(&(e.client.as_str(), e.op))) {
            (Outcome::Fail(_), _) => w.refused += 1,
            (_, Some(applied)) if *applied < o.from => w.applied_before += 1,
            (_, Some(_)) => w.applied_during += 1,
            (_, None) => w.lost_in_flight += 1,
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Signal;
    use super::*;
    use crate::history::Kind;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn iv(client: &str, token: u64, t0: Instant, from: u64, to: u64) -> Interval {
        Interval {
            client: client.into(),
            resource: "r".into(),
            token,
            start: t0 + ms(from),
            end: t0 + ms(to),
            ended: Ended::Signal(Signal::Released),
            client_view: ms(to - from),
        }
    }

    fn write(
        client: &str,
        op: u64,
        token: u64,
        t0: Instant,
        span: (u64, u64),
        o: Outcome,
    ) -> Event {
        Event {
            client: client.into(),
            kind: Kind::WriteDirect,
            resource: "r".into(),
            revision: Some(token),
            op,
            invoked: t0 + ms(span.0),
            completed: t0 + ms(span.1),
            outcome: o,
        }
    }

    fn applied(client: &str, op: u64, token: u64, at: Instant) -> Applied {
        Applied {
            resource: "r".into(),
            revision: token,
            client: client.into(),
            op,
            received: at,
            at,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn adjacent_intervals_do_not_overlap() {
        let t0 = Instant::now();
        let v = verdict(
            &[iv("a", 5, t0, 0, 100), iv("b", 9, t0, 100, 200)],
            &[],
            &[],
        );
        assert_eq!(v.overlaps, 0);
        assert!(close(v.sum_ms, 0.0));
    }

    #[test]
    fn a_nested_interval_overlaps_for_its_whole_length() {
        let t0 = Instant::now();
        let v = verdict(
            &[iv("a", 5, t0, 0, 1000), iv("b", 9, t0, 200, 300)],
            &[],
            &[],
        );
        assert_eq!(v.overlaps, 1);
        assert!(close(v.sum_ms, 100.0), "{v:?}");
        assert!(close(v.overlap_ms.max_ms, 100.0));
    }

    #[test]
    fn the_same_holder_twice_is_not_an_overlap_and_other_resources_are_apart() {
        let t0 = Instant::now();
        let v = verdict(
            &[
                iv("a", 5, t0, 0, 1000),
                iv("a", 9, t0, 500, 1500),
                iv("b", 9, t0, 0, 1000).with_resource("s"),
            ],
            &[],
            &[],
        );
        assert_eq!(v.overlaps, 0, "{v:?}");
    }

    #[test]
    fn overlaps_are_summed_per_resource_and_the_longest_kept() {
        let t0 = Instant::now();
        // a [0, 1000), b [600, 1600), c [1500, 2500): a–b 400 ms, b–c 100 ms, a–c none;
        // on another resource, x [0, 50) and y [25, 75): 25 ms.
        let intervals = [
            iv("c", 12, t0, 1500, 2500),
            iv("a", 5, t0, 0, 1000),
            iv("b", 9, t0, 600, 1600),
            iv("x", 1, t0, 0, 50).with_resource("s"),
            iv("y", 2, t0, 25, 75).with_resource("s"),
        ];
        let v = verdict(&intervals, &[], &[]);
        assert_eq!(v.overlaps, 3, "{v:?}");
        assert!(close(v.sum_ms, 525.0), "{v:?}");
        assert!(close(v.overlap_ms.max_ms, 400.0));
        let r = v.per_resource["r"];
        assert_eq!(r.count, 2);
        assert!(close(r.sum_ms, 500.0) && close(r.max_ms, 400.0), "{r:?}");
        assert!(close(v.per_resource["s"].sum_ms, 25.0));
        assert!(
            v.longest[0].between.starts_with("r: a (token 5"),
            "{:?}",
            v.longest
        );
        assert!(close(v.longest[0].ms, 400.0));
    }

    #[test]
    fn the_older_holders_writes_during_an_overlap_are_judged_by_the_storage() {
        let t0 = Instant::now();
        // A paused holder (token 5) believes until 3000; the newer one holds from 2000.
        let intervals = [iv("a", 5, t0, 0, 3000), iv("b", 9, t0, 2000, 4000)];
        let events = [
            // Before the overlap: not judged.
            write("a", 1, 5, t0, (100, 150), Outcome::Ok),
            // Sent before, applied before the newer grant (the pre-fence drained it).
            write("a", 2, 5, t0, (1900, 2050), Outcome::Ok),
            // The woken zombie's write, refused.
            write("a", 3, 5, t0, (2900, 3000), Outcome::Fail(409)),
            // Given up, never applied.
            write("a", 4, 5, t0, (2100, 2200), Outcome::Indeterminate),
            // The newer holder's own write: not the older's.
            write("b", 5, 9, t0, (2500, 2600), Outcome::Ok),
        ];
        let log = [
            applied("a", 1, 5, t0 + ms(140)),
            applied("a", 2, 5, t0 + ms(1990)),
            applied("b", 5, 9, t0 + ms(2590)),
        ];
        let v = verdict(&intervals, &events, &log);
        let expected = OlderWrites {
            refused: 1,
            applied_before: 1,
            applied_during: 0,
            lost_in_flight: 1,
        };
        assert_eq!(v.older_writes, expected);
        assert!(close(v.acted_until_refused_ms.max_ms, 1000.0));
        // Had the storage applied the zombie's write, it would show.
        let mut events = events.to_vec();
        events[2].outcome = Outcome::Ok;
        let mut log = log.to_vec();
        log.push(applied("a", 3, 5, t0 + ms(2990)));
        assert_eq!(
            verdict(&intervals, &events, &log)
                .older_writes
                .applied_during,
            1
        );
    }

    impl Interval {
        fn with_resource(mut self, r: &str) -> Self {
            self.resource = r.into();
            self
        }
    }
}
