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
    let shown = lock_rows.into_iter().filter(|(_, f)| sum(*f) > 0);
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
