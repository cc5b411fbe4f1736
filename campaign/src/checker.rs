//! The checker: judges a run's history and the storage's apply log.
//!
//! Safety (each a violation):
//! 1. per resource, tokens never go down in storage order;
//! 2. no write with token t is applied after an acquire of the same resource returned t' > t
//!    (the pre-fence makes the enforcer refuse t before t' is announced); a lock's exchange
//!    (`/v3/lock/token`) is not pre-fenced, so its holders' order rests on 1 (the mark rises at
//!    their first write);
//! 3. every acknowledged write is in the storage;
//! 4. only tokens that were granted (acquired, exchanged for a lock, assigned to a fleet's member)
//!    appear in the storage;
//! 5. the enforcer's mark survives restarts: a stale probe after a restart is refused;
//! 6. each token belongs to exactly one holder: no two clients were granted, or wrote to the
//!    storage with, the same token for one resource;
//! 7. no refused write reached the storage: a write answered with a 4xx (409 stale from the
//!    enforcer, 410 from a proxy, any other refusal) is not in the apply log.
//!
//! A fleet's grants are judged by 1 and 3–7; by 2 in [`announced_early`], apart (the member's
//! view may show a grant before its pre-fence has completed).
//!
//! Writes are identified by (client, op), which the client puts in the body and the storage
//! logs.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::history::{Event, Kind, Outcome};
use crate::nemesis::Probe;
use crate::storage::Applied;

/// The probes' client name in the storage log.
pub const PROBE_CLIENT: &str = "probe";

/// Every violation found, described.
pub fn violations(events: &[Event], applied: &[Applied], probes: &[Probe]) -> Vec<String> {
    let mut found = Vec::new();
    let writes: Vec<&Applied> = applied
        .iter()
        .filter(|a| a.client != PROBE_CLIENT)
        .collect();

    // 1. Order per resource.
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for a in &writes {
        let l = last.entry(a.resource.as_str()).or_default();
        if a.revision < *l {
            found.push(format!(
                "order: {} applied token {} after {} (client {}, op {})",
                a.resource, a.revision, l, a.client, a.op
            ));
        }
        *l = (*l).max(a.revision);
    }

    // 2. No stale write after a newer grant was announced.
    found.extend(stale(events, &writes, Kind::Acquire, "stale"));

    // 3. Acknowledged writes are in the storage.
    let stored: HashSet<(&str, u64)> = writes.iter().map(|a| (a.client.as_str(), a.op)).collect();
    for e in events {
        if e.kind.is_write()
            && e.outcome == Outcome::Ok
            && !stored.contains(&(e.client.as_str(), e.op))
        {
            found.push(format!(
                "lost: acknowledged write op {} of {} on {} is not in storage",
                e.op, e.client, e.resource
            ));
        }
    }

    // 4. Only granted tokens.
    let granted: HashSet<(&str, u64)> = events
        .iter()
        .filter(|e| e.kind.is_grant() && e.outcome == Outcome::Ok)
        .filter_map(|e| e.revision.map(|r| (e.resource.as_str(), r)))
        .collect();
    for a in &writes {
        if !granted.contains(&(a.resource.as_str(), a.revision)) {
            found.push(format!(
                "unissued: {} applied token {} that was never granted (client {}, op {})",
                a.resource, a.revision, a.client, a.op
            ));
        }
    }

    // 6. One holder per token: in the grants, and in what the storage applied.
    let mut holders: BTreeMap<(&str, u64), BTreeSet<&str>> = BTreeMap::new();
    for e in events {
        if let (true, Outcome::Ok, Some(rev)) = (e.kind.is_grant(), e.outcome, e.revision) {
            holders
                .entry((e.resource.as_str(), rev))
                .or_default()
                .insert(e.client.as_str());
        }
    }
    for ((resource, rev), clients) in &holders {
        if clients.len() > 1 {
            found.push(format!(
                "shared token: {resource} token {rev} was granted to {clients:?}"
            ));
        }
    }
    let mut writers: BTreeMap<(&str, u64), BTreeSet<&str>> = BTreeMap::new();
    for a in &writes {
        writers
            .entry((a.resource.as_str(), a.revision))
            .or_default()
            .insert(a.client.as_str());
    }
    for ((resource, rev), clients) in &writers {
        if clients.len() > 1 && holders.get(&(*resource, *rev)).is_none_or(|h| h.len() < 2) {
            found.push(format!(
                "shared token: {resource} token {rev} was written to storage by {clients:?}"
            ));
        }
    }

    // 7. No refused write reached the storage.
    for e in events {
        if let (true, Outcome::Fail(status)) = (e.kind.is_write(), e.outcome) {
            if stored.contains(&(e.client.as_str(), e.op)) {
                found.push(format!(
                    "refused applied: write op {} of {} on {} was refused ({status}) yet applied",
                    e.op, e.client, e.resource
                ));
            }
        }
    }

    // 5. Marks survive restarts: the restarted gateway refuses a token below the highest
    // applied, and the store itself still holds a mark at least that high.
    for p in probes {
        if (200..300).contains(&p.status) {
            found.push(format!(
                "mark regressed: after a restart, stale token {} on {} was accepted",
                p.revision, p.resource
            ));
        }
        if p.verified && p.stored.is_none_or(|stored| stored <= p.revision) {
            found.push(format!(
                "mark lost: after a restart the store holds {:?} for {}, below {} applied",
                p.stored,
                p.resource,
                p.revision + 1
            ));
        }
    }
    found
}

/// Check 2 for the grants of `kind`: every write applied with token t after a grant of `kind`
/// of the same resource returned t' > t, described as `class`.
fn stale(events: &[Event], writes: &[&Applied], kind: Kind, class: &str) -> Vec<String> {
    let mut grants: BTreeMap<&str, Vec<(tokio::time::Instant, u64)>> = BTreeMap::new();
    for e in events {
        if let (true, Outcome::Ok, Some(rev)) = (e.kind == kind, e.outcome, e.revision) {
            grants
                .entry(e.resource.as_str())
                .or_default()
                .push((e.completed, rev));
        }
    }
    for g in grants.values_mut() {
        g.sort_unstable();
        let mut high = 0;
        for entry in g.iter_mut() {
            high = high.max(entry.1);
            entry.1 = high;
        }
    }
    let mut found = Vec::new();
    for a in writes {
        let Some(g) = grants.get(a.resource.as_str()) else {
            continue;
        };
        let before = g.partition_point(|(at, _)| *at < a.at);
        if before > 0 && g[before - 1].1 > a.revision {
            found.push(format!(
                "{class}: {} applied token {} after token {} had been granted (client {}, op {})",
                a.resource,
                a.revision,
                g[before - 1].1,
                a.client,
                a.op
            ));
        }
    }
    found
}

/// Check 2 for a fleet's grants, which the member's view shows before their pre-fence may have
/// completed: every write applied with an older token after a member saw the newer grant.
/// Reported beside the violations, not among them, while the view does not wait for the
/// pre-fence: storage order (check 1) holds whatever the view shows.
pub fn announced_early(events: &[Event], applied: &[Applied]) -> Vec<String> {
    let writes: Vec<&Applied> = applied
        .iter()
        .filter(|a| a.client != PROBE_CLIENT)
        .collect();
    stale(events, &writes, Kind::Assigned, "announced early")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    fn acquire(resource: &str, rev: u64, completed: Instant) -> Event {
        Event {
            client: "a".into(),
            kind: Kind::Acquire,
            resource: resource.into(),
            revision: Some(rev),
            op: 0,
            invoked: completed,
            completed,
            outcome: Outcome::Ok,
        }
    }

    fn grant(client: &str, resource: &str, rev: u64, completed: Instant) -> Event {
        Event {
            client: client.into(),
            ..acquire(resource, rev, completed)
        }
    }

    fn write(client: &str, op: u64, rev: u64, outcome: Outcome) -> Event {
        Event {
            client: client.into(),
            kind: Kind::WriteDirect,
            resource: "r".into(),
            revision: Some(rev),
            op,
            invoked: Instant::now(),
            completed: Instant::now(),
            outcome,
        }
    }

    fn applied(client: &str, op: u64, rev: u64, at: Instant) -> Applied {
        Applied {
            resource: "r".into(),
            revision: rev,
            client: client.into(),
            op,
            received: at,
            at,
        }
    }

    fn kinds(found: &[String]) -> Vec<&str> {
        found.iter().filter_map(|v| v.split(':').next()).collect()
    }

    #[test]
    fn a_clean_history_passes() {
        let t0 = Instant::now();
        let t = |ms| t0 + Duration::from_millis(ms);
        let events = vec![
            acquire("r", 5, t(0)),
            write("a", 1, 5, Outcome::Ok),
            acquire("r", 9, t(20)),
            write("b", 2, 9, Outcome::Ok),
            write("a", 3, 5, Outcome::Fail(409)),
        ];
        let log = vec![applied("a", 1, 5, t(10)), applied("b", 2, 9, t(30))];
        assert!(violations(&events, &log, &[]).is_empty());
    }

    #[test]
    fn each_kind_of_violation_is_found() {
        let t0 = Instant::now();
        let t = |ms| t0 + Duration::from_millis(ms);
        let events = vec![
            acquire("r", 5, t(0)),
            acquire("r", 9, t(20)),
            write("b", 2, 9, Outcome::Ok),
            write("c", 7, 9, Outcome::Ok),
        ];
        let log = vec![
            applied("b", 2, 9, t(30)),
            // A zombie's write with 5 after 9 was granted: order and stale.
            applied("a", 3, 5, t(40)),
            // A token nobody was granted.
            applied("x", 4, 11, t(50)),
        ];
        let probes = [
            Probe {
                resource: "r".into(),
                revision: 8,
                status: 204,
                stored: Some(9),
                verified: true,
            },
            // Refused, but the store lost the mark.
            Probe {
                resource: "r".into(),
                revision: 8,
                status: 409,
                stored: Some(7),
                verified: true,
            },
            // Not readable: not judged by the store.
            Probe {
                resource: "r".into(),
                revision: 8,
                status: 409,
                stored: None,
                verified: false,
            },
        ];
        let found = violations(&events, &log, &probes);
        for kind in [
            "order:",
            "stale:",
            "lost:",
            "unissued:",
            "mark regressed:",
            "mark lost:",
        ] {
            assert!(
                found.iter().any(|v| v.starts_with(kind)),
                "{kind} not in {found:?}"
            );
        }
        assert_eq!(found.len(), 6, "{found:?}");
    }

    #[test]
    fn a_write_applied_before_the_newer_grant_is_fine() {
        let t0 = Instant::now();
        let t = |ms| t0 + Duration::from_millis(ms);
        let events = vec![acquire("r", 5, t(0)), acquire("r", 9, t(20))];
        let log = vec![applied("a", 1, 5, t(19)), applied("b", 2, 9, t(21))];
        assert!(violations(&events, &log, &[]).is_empty());
    }

    /// One history per violation class, each otherwise clean: the checker finds exactly that
    /// class.
    #[test]
    fn each_class_is_found_alone() {
        let t0 = Instant::now();
        let t = |ms| t0 + Duration::from_millis(ms);
        let base = || {
            vec![
                grant("a", "r", 5, t(0)),
                write("a", 1, 5, Outcome::Ok),
                grant("b", "r", 9, t(20)),
                write("b", 2, 9, Outcome::Ok),
            ]
        };
        let base_log = || vec![applied("a", 1, 5, t(10)), applied("b", 2, 9, t(30))];
        assert!(violations(&base(), &base_log(), &[]).is_empty());

        // Reordering: token 5 applied after token 9, both before the grant of 9 was seen
        // (no "stale"), e.g. a write the enforcer forgot while the storage still applied it.
        let mut log = base_log();
        log.swap(0, 1);
        let events = vec![
            grant("a", "r", 5, t(0)),
            grant("b", "r", 9, t(50)),
            write("a", 1, 5, Outcome::Ok),
            write("b", 2, 9, Outcome::Ok),
        ];
        assert_eq!(kinds(&violations(&events, &log, &[])), ["order"]);

        // Two holders granted the same token.
        let mut events = base();
        events.push(grant("c", "r", 9, t(25)));
        assert_eq!(
            kinds(&violations(&events, &base_log(), &[])),
            ["shared token"]
        );

        // Two clients wrote to the storage with one token (only one was granted it).
        let mut log = base_log();
        log.push(applied("c", 3, 9, t(40)));
        assert_eq!(kinds(&violations(&base(), &log, &[])), ["shared token"]);

        // A write refused (409) that reached the storage anyway.
        let mut events = base();
        events.push(write("b", 3, 9, Outcome::Fail(409)));
        let mut log = base_log();
        log.push(applied("b", 3, 9, t(40)));
        assert_eq!(kinds(&violations(&events, &log, &[])), ["refused applied"]);

        // An acknowledged write missing from the storage.
        let mut events = base();
        events.push(write("b", 4, 9, Outcome::Ok));
        assert_eq!(kinds(&violations(&events, &base_log(), &[])), ["lost"]);

        // A fleet's grant seen before an older write landed: apart from the violations.
        let events = vec![
            Event {
                kind: Kind::Assigned,
                ..grant("a", "r", 5, t(0))
            },
            write("a", 1, 5, Outcome::Ok),
            Event {
                kind: Kind::Assigned,
                ..grant("b", "r", 9, t(20))
            },
            write("b", 2, 9, Outcome::Ok),
        ];
        let log = vec![applied("a", 1, 5, t(25)), applied("b", 2, 9, t(30))];
        assert!(violations(&events, &log, &[]).is_empty());
        assert_eq!(kinds(&announced_early(&events, &log)), ["announced early"]);

        // An unanswered write that was applied is fine; so is an unanswered one that was not.
        let mut events = base();
        events.push(write("b", 5, 9, Outcome::Indeterminate));
        events.push(write("b", 6, 9, Outcome::Indeterminate));
        let mut log = base_log();
        log.push(applied("b", 5, 9, t(60)));
        assert!(violations(&events, &log, &[]).is_empty());
    }
}
