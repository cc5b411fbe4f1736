//! Many runs as one markdown report.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::nemesis::Fault;
use crate::run::{Percentiles, Report};

/// The markdown summary of `runs`.
pub fn markdown(runs: &[Report]) -> String {
    let mut md = String::new();
    let seeds: Vec<String> = runs.iter().map(|r| r.seed.to_string()).collect();
    let _ = writeln!(
        md,
        "{} run(s), control `{}`, seeds {}; storage processing {} ms per write.\n",
        runs.len(),
        runs.first()
            .and_then(|r| serde_json::to_value(r.control).ok())
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        seeds.join(", "),
        runs.first()
            .map(|r| format!("{}–{}", r.processing_ms.0, r.processing_ms.1))
            .unwrap_or_default(),
    );
    if let Some(r) = runs.first() {
        let marks = match r.marks {
            crate::cluster::Marks::InDatabase => "the protected table's database".to_owned(),
            other => serde_json::to_value(other)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
        };
        let _ = writeln!(
            md,
            "Deployment: {} gateway(s), marks in {marks}; runs of {} s ({} s fault-free at the \
             end), {} clients on {} resources.\n",
            r.gateways,
            r.duration_ms / 1000,
            r.final_phase_ms / 1000,
            r.clients,
            r.resources
        );
    }
    let caught = runs.iter().filter(|r| !r.violations.is_empty()).count();
    let sum = |f: &dyn Fn(&Report) -> usize| runs.iter().map(f).sum::<usize>();
    let _ = writeln!(md, "| | total | per run (min / max) |");
    let _ = writeln!(md, "|---|--:|--:|");
    type Count<'a> = &'a dyn Fn(&Report) -> usize;
    let hostile = |r: &Report, f: &dyn Fn(&crate::hostile::Stats) -> u64| {
        r.hostile
            .as_ref()
            .map_or(0, |h| usize::try_from(f(h)).unwrap_or(usize::MAX))
    };
    let rows: [(&str, Count); 16] = [
        ("runs with violations", &|r| {
            usize::from(!r.violations.is_empty())
        }),
        ("violations", &|r| r.violations.len()),
        ("grants", &|r| r.grants),
        ("writes acknowledged", &|r| r.writes_acknowledged),
        ("writes applied", &|r| r.writes_applied),
        ("stale writes refused by the enforcer (409)", &|r| {
            r.stale_rejected_by_enforcer
        }),
        ("writes refused by a proxy, lease lost (410)", &|r| {
            r.stale_rejected_by_proxy
        }),
        ("writes refused otherwise (other 4xx)", &|r| {
            r.refused_otherwise
        }),
        ("writes with unknown outcome", &|r| r.writes_indeterminate),
        ("… of which applied by the storage", &|r| {
            r.applied_unanswered
        }),
        ("faults injected", &|r| r.fault_log.len()),
        ("proxy kills that found an acquire in flight", &|r| {
            r.fault_log
                .iter()
                .filter(|f| f.target.ends_with("(mid-acquire)"))
                .count()
        }),
        ("mark probes after gateway and PostgreSQL restarts", &|r| {
            r.probes
        }),
        ("hostile /v3 requests sent", &|r| hostile(r, &|h| h.sent)),
        ("… answered", &|r| hostile(r, &|h| h.answered)),
        ("… aimed at a live /v1 lease", &|r| {
            hostile(r, &|h| h.aimed_at_native)
        }),
    ];
    // Rows of clients that older data predates, shown where a run has them.
    let lock_rows: [(&str, Count); 2] = [
        (
            "locks taken with etcd's Mutex recipe over gRPC, exchanged for a token",
            &|r| r.locks_exchanged,
        ),
        ("… writes under them acknowledged", &|r| {
            r.lock_writes_acknowledged
        }),
    ];
    let fleet =
        |r: &Report, f: &dyn Fn(&crate::fleet::FleetReport) -> usize| r.fleet.as_ref().map_or(0, f);
    let late = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let fleet_rows: [(&str, Count); 6] = [
        ("fleet grants, as its members saw them", &|r| {
            fleet(r, &|f| f.grants)
        }),
        ("… members' writes acknowledged", &|r| {
            fleet(r, &|f| f.writes_acknowledged)
        }),
        (
            "… late writes (after a pause, or evicted) refused",
            &|r| fleet(r, &|f| late(f.late_writes.refused)),
        ),
        ("… late writes accepted, before the next grant", &|r| {
            fleet(r, &|f| late(f.late_writes.accepted))
        }),
        (
            "… writes with an older token applied after a member saw the newer grant",
            &|r| fleet(r, &|f| f.announced_early.len()),
        ),
        (
            "… resources a member's view listed as held and releasing at once",
            &|r| fleet(r, &|f| late(f.held_and_releasing)),
        ),
    ];
    let shown = lock_rows
        .into_iter()
        .chain(fleet_rows)
        .filter(|(_, f)| sum(*f) > 0);
    for (name, f) in rows.into_iter().chain(shown) {
        let min = runs.iter().map(f).min().unwrap_or_default();
        let max = runs.iter().map(f).max().unwrap_or_default();
        let _ = writeln!(md, "| {name} | {} | {min} / {max} |", sum(f));
    }
    let _ = writeln!(
        md,
        "\n{caught} of {} runs reported violations.\n",
        runs.len()
    );

    let mut faults: BTreeMap<Fault, usize> = BTreeMap::new();
    for r in runs {
        for (f, n) in &r.faults {
            *faults.entry(*f).or_default() += n;
        }
    }
    let _ = writeln!(md, "| fault | injected |");
    let _ = writeln!(md, "|---|--:|");
    for (f, n) in &faults {
        let name = serde_json::to_value(f)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let _ = writeln!(md, "| {name} | {n} |");
    }
    let _ = writeln!(md, "| **total** | {} |", faults.values().sum::<usize>());

    let pooled = |pick: &dyn Fn(&Report) -> &Percentiles| {
        // Percentiles cannot be merged exactly; report the per-run medians' median and the
        // worst p99 and max.
        let mut p50: Vec<f64> = runs
            .iter()
            .map(pick)
            .filter(|p| p.n > 0)
            .map(|p| p.p50_ms)
            .collect();
        p50.sort_by(f64::total_cmp);
        let n: usize = runs.iter().map(pick).map(|p| p.n).sum();
        let p99 = runs.iter().map(pick).map(|p| p.p99_ms).fold(0.0, f64::max);
        let max = runs.iter().map(pick).map(|p| p.max_ms).fold(0.0, f64::max);
        let med = p50.get(p50.len() / 2).copied().unwrap_or_default();
        format!("| {n} | {med:.0} | {p99:.0} | {max:.0} |")
    };
    let _ = writeln!(
        md,
        "\n| takeover after a holder died | samples | p50 ms (median of runs) | p99 ms (worst run) | max ms |"
    );
    let _ = writeln!(md, "|---|--:|--:|--:|--:|");
    let _ = writeln!(md, "| etcd leader unchanged {}", pooled(&|r| &r.takeover));
    let _ = writeln!(
        md,
        "| etcd leader killed or paused meanwhile {}",
        pooled(&|r| &r.takeover_with_leader_fault)
    );
    let firsts: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.first_write_after_heal_ms)
        .collect();
    let worst_first = firsts.iter().copied().fold(0.0, f64::max);
    let success = runs
        .iter()
        .map(|r| r.write_success_after_heal)
        .fold(1.0, f64::min);
    let _ = writeln!(
        md,
        "\nAfter healing: first acknowledged write within {worst_first:.0} ms (worst run); \
         at least {:.1} % of writes acknowledged in every run's final phase.",
        success * 100.0
    );
    let idle: Vec<&crate::run::IdleProbe> = runs.iter().filter_map(|r| r.idle.as_ref()).collect();
    if !idle.is_empty() {
        let firsts: Vec<f64> = idle.iter().filter_map(|i| i.first_acquire_ms).collect();
        let ok: usize = idle.iter().map(|i| i.succeeded).sum();
        let all: usize = idle.iter().map(|i| i.operations).sum();
        let _ = writeln!(
            md,
            "\nThe idle replica, after {:.0}–{:.0} s serving nothing: first acquire within {:.0} ms \
             (worst run; {} of {} runs acquired), {ok} of {all} operations through it succeeded.",
            idle.iter().map(|i| i.idle_s).fold(f64::INFINITY, f64::min),
            idle.iter().map(|i| i.idle_s).fold(0.0, f64::max),
            firsts.iter().copied().fold(0.0, f64::max),
            firsts.len(),
            idle.len(),
        );
    }
    belief(&mut md, runs);
    fleet_coverage(&mut md, runs);
    let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
    for v in runs.iter().flat_map(|r| r.violations.iter()) {
        *classes
            .entry(v.split_once(':').map_or(v.as_str(), |(c, _)| c))
            .or_default() += 1;
    }
    if !classes.is_empty() {
        let _ = writeln!(md, "\n| violation class | found |");
        let _ = writeln!(md, "|---|--:|");
        for (class, n) in &classes {
            let _ = writeln!(md, "| {class} | {n} |");
        }
    }
    let examples: Vec<&String> = runs
        .iter()
        .flat_map(|r| r.violations.iter())
        .take(5)
        .collect();
    if !examples.is_empty() {
        let _ = writeln!(md, "\nFirst violations:\n");
        for v in examples {
            let _ = writeln!(md, "- {v}");
        }
    }
    md
}

/// The fleet's coverage, run by run, in runs with a fleet.
fn fleet_coverage(md: &mut String, runs: &[Report]) {
    let fleets: Vec<(&Report, &crate::fleet::FleetReport)> = runs
        .iter()
        .filter_map(|r| r.fleet.as_ref().map(|f| (r, f)))
        .collect();
    let Some((_, first)) = fleets.first() else {
        return;
    };
    let mut early: Vec<&String> = Vec::new();
    let _ = writeln!(
        md,
        "\nThe fleet: {} members at the start on {} resources of their own (TTL {} s, `drain_ms` \
         {}). Owned: the share of resource-seconds held by a live member (running, not \
         stopped), sampled from etcd every {} ms from the first moment every resource was; a \
         gap: a resource without one.\n",
        first.shape.members,
        first.shape.resources,
        crate::client::TTL_SECONDS,
        crate::fleet::DRAIN_MS,
        crate::fleet::coverage::EVERY.as_millis(),
    );
    let _ = writeln!(
        md,
        "| seed | owned | longest gap, ms (resource) | median resource's longest gap, ms | member events |"
    );
    let _ = writeln!(md, "|--:|--:|--:|--:|--:|");
    for (r, f) in &fleets {
        early.extend(f.announced_early.iter().take(2));
        let c = &f.coverage;
        let events = r.fault_log.iter().filter(|i| i.fault.is_member()).count();
        if c.settled_s.is_none() {
            let _ = writeln!(md, "| {} | never all owned | | | {events} |", r.seed);
            continue;
        }
        let (worst, gap) = c
            .longest_gap_ms
            .iter()
            .max_by_key(|(_, g)| **g)
            .map_or(("", 0), |(r, g)| (r.as_str(), *g));
        let mut gaps: Vec<u64> = c.longest_gap_ms.values().copied().collect();
        gaps.sort_unstable();
        let median = gaps.get(gaps.len() / 2).copied().unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {:.1} % | {gap} ({worst}) | {median} | {events} |",
            r.seed,
            c.owned * 100.0
        );
    }
    if !early.is_empty() {
        let _ = writeln!(
            md,
            "\nA member saw a grant before a write with the older token landed (its view shows \
             a grant once it exists in etcd, before its pre-fence may have completed):\n"
        );
        for e in early.iter().take(5) {
            let _ = writeln!(md, "- {e}");
        }
    }
}

/// The belief verdict, in runs that have one: the overlaps under the SDK's stop-by deadline
/// and under the two controls.
fn belief(md: &mut String, runs: &[Report]) {
    let beliefs: Vec<&crate::belief::BeliefReport> =
        runs.iter().filter_map(|r| r.belief.as_ref()).collect();
    if beliefs.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nBelief: how long two different holders of one resource believed they held at once \
         (real time on the host; a belief runs from the acquire's answer to the client's own \
         signal or its stop-by deadline, on its own clock skewed by up to ±{:.0} %, and through \
         a write decided before that deadline). Measured, not bounded.\n",
        crate::belief::SKEW * 100.0
    );
    let _ = writeln!(
        md,
        "| deadline | intervals | overlaps | sum ms | p99 ms (worst run) | max ms | older holder's writes meanwhile: refused / applied before / applied during / lost |"
    );
    let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|--:|");
    type Pick<'a> = &'a dyn Fn(&crate::belief::BeliefReport) -> &crate::belief::Summary;
    let late = format!(
        "control: TTL + {} s, no margin",
        crate::belief::LATE.as_secs()
    );
    let rows: [(&str, Pick); 3] = [
        ("the SDK's stop-by", &|b| &b.stop_by),
        (&late, &|b| &b.late_deadline),
        ("control: none", &|b| &b.no_deadline),
    ];
    for (name, pick) in rows {
        let all: Vec<&crate::belief::Summary> = beliefs.iter().map(|b| pick(b)).collect();
        let n =
            |f: &dyn Fn(&crate::belief::Summary) -> usize| all.iter().map(|s| f(s)).sum::<usize>();
        let worst = |f: &dyn Fn(&crate::belief::Summary) -> f64| {
            all.iter().map(|s| f(s)).fold(0.0, f64::max)
        };
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {:.0} | {:.0} | {:.0} | {} / {} / {} / {} |",
            n(&|s| s.intervals),
            n(&|s| s.overlaps),
            all.iter().map(|s| s.sum_ms).sum::<f64>(),
            worst(&|s| s.overlap_ms.p99_ms),
            worst(&|s| s.overlap_ms.max_ms),
            n(&|s| s.older_writes.refused),
            n(&|s| s.older_writes.applied_before),
            n(&|s| s.older_writes.applied_during),
            n(&|s| s.older_writes.lost_in_flight),
        );
    }
    let refused: Vec<&crate::run::Percentiles> = beliefs
        .iter()
        .map(|b| &b.stop_by.acted_until_refused_ms)
        .filter(|p| p.n > 0)
        .collect();
    let n: usize = refused.iter().map(|p| p.n).sum();
    if n == 0 {
        let _ = writeln!(
            md,
            "\nNo older holder had a write refused while a newer one held."
        );
    } else {
        let _ = writeln!(
            md,
            "\nAn older holder (paused, or stuck in a write) acted for at most {:.0} ms while a \
             newer one held before its writes were refused (p99 {:.0} ms, worst run; {n} \
             overlaps).",
            refused.iter().map(|p| p.max_ms).fold(0.0, f64::max),
            refused.iter().map(|p| p.p99_ms).fold(0.0, f64::max),
        );
    }
    let mut longest: Vec<&crate::belief::Longest> = beliefs
        .iter()
        .flat_map(|b| b.stop_by.longest.iter())
        .collect();
    longest.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    if !longest.is_empty() {
        let _ = writeln!(md, "\nLongest overlaps (under the SDK's stop-by):\n");
        for l in longest.iter().take(3) {
            let _ = writeln!(md, "- {:.0} ms: {}", l.ms, l.between);
        }
    }
}
