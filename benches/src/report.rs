//! Rows of a side-by-side measurement: a markdown table, JSON, and per-cell means for the chart.

use serde_json::json;

use crate::stats::{ms, Run};

/// One cell measured on every backend, in the same round.
#[derive(Debug, Clone)]
pub struct Row {
    /// The operation measured.
    pub op: String,
    /// Requests in flight.
    pub in_flight: usize,
    /// Round number (backends alternate within a round).
    pub round: usize,
    /// Each backend's result, in column order.
    pub runs: Vec<(String, Run)>,
}

impl Row {
    /// Throughput of the last backend over the first (e.g. proxy / raw etcd).
    pub fn ratio(&self) -> f64 {
        match (self.runs.first(), self.runs.last()) {
            (Some((_, base)), Some((_, subject))) if base.per_sec > 0.0 => {
                subject.per_sec / base.per_sec
            }
            _ => 0.0,
        }
    }

    /// Throughput of the backend `name` over the first; 0 when either is missing or idle.
    pub fn ratio_of(&self, name: &str) -> f64 {
        let subject = self.runs.iter().find(|(n, _)| n == name);
        match (self.runs.first(), subject) {
            (Some((_, base)), Some((_, subject))) if base.per_sec > 0.0 => {
                subject.per_sec / base.per_sec
            }
            _ => 0.0,
        }
    }

    /// The row as JSON: every backend's run, `ratio` (last over first) and, with more than two
    /// backends, `ratios` (each later backend over the first).
    pub fn json(&self) -> serde_json::Value {
        let mut runs = serde_json::Map::new();
        for (name, run) in &self.runs {
            runs.insert(name.clone(), run.json());
        }
        let mut row = json!({
            "op": self.op,
            "in_flight": self.in_flight,
            "round": self.round,
            "backends": runs,
            "ratio": self.ratio(),
        });
        if self.runs.len() > 2 {
            let ratios: serde_json::Map<_, _> = self.runs[1..]
                .iter()
                .map(|(n, _)| (n.clone(), json!(self.ratio_of(n))))
                .collect();
            row["ratios"] = ratios.into();
        }
        row
    }
}

/// The markdown table header for rows over `backends`; `ratio` names the ratio column.
pub fn header(backends: &[&str], ratio: &str) -> String {
    let (mut top, mut rule) = header_cells(backends);
    top.push_str(&format!(" {ratio} |"));
    rule.push_str("--:|");
    format!("{top}\n{rule}")
}

/// A table line's cells up to the ratios: the row's keys and each backend's figures.
fn cells(row: &Row) -> String {
    let mut s = format!("| {} | {} | {} |", row.op, row.in_flight, row.round);
    for (_, run) in &row.runs {
        s.push_str(&format!(
            " {:.0}{} | {:.2} / {:.2} |",
            run.per_sec,
            if run.cut { " (cut)" } else { "" },
            ms(run.p50),
            ms(run.p99)
        ));
    }
    s
}

/// A header's first two lines up to the ratio columns, over `backends`.
fn header_cells(backends: &[&str]) -> (String, String) {
    let mut top = String::from("| op | in flight | round |");
    let mut rule = String::from("|---|--:|--:|");
    for b in backends {
        top.push_str(&format!(" {b} ops/s | p50 / p99 ms |"));
        rule.push_str("--:|--:|");
    }
    (top, rule)
}

/// One markdown table line.
pub fn line(row: &Row) -> String {
    let mut s = cells(row);
    s.push_str(&format!(" {:.2} |", row.ratio()));
    s
}

/// The markdown table header for rows over `backends` with one ratio column per backend after
/// the first (each over the first).
pub fn header_ratios(backends: &[&str]) -> String {
    let (mut top, mut rule) = header_cells(backends);
    if let Some((base, rest)) = backends.split_first() {
        for b in rest {
            top.push_str(&format!(" {b} / {base} |"));
            rule.push_str("--:|");
        }
    }
    format!("{top}\n{rule}")
}

/// One markdown table line under [`header_ratios`].
pub fn line_ratios(row: &Row) -> String {
    let mut s = cells(row);
    for (name, _) in row.runs.iter().skip(1) {
        s.push_str(&format!(" {:.2} |", row.ratio_of(name)));
    }
    s
}

/// One point of a chart series: means over rounds at one concurrency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Requests in flight.
    pub in_flight: usize,
    /// Mean throughput.
    pub per_sec: f64,
    /// Mean median latency, ms.
    pub p50_ms: f64,
    /// Mean 99th percentile latency, ms.
    pub p99_ms: f64,
}

/// Means over rounds of one (op, backend) series, in ascending in-flight order.
pub fn series(rows: &[Row], op: &str, backend: &str) -> Vec<Point> {
    let mut levels: Vec<usize> = rows
        .iter()
        .filter(|r| r.op == op)
        .map(|r| r.in_flight)
        .collect();
    levels.sort_unstable();
    levels.dedup();
    levels
        .into_iter()
        .filter_map(|c| {
            let runs: Vec<&Run> = rows
                .iter()
                .filter(|r| r.op == op && r.in_flight == c)
                .flat_map(|r| r.runs.iter().filter(|(n, _)| n == backend).map(|(_, r)| r))
                .collect();
            if runs.is_empty() {
                return None;
            }
            let n = runs.len() as f64;
            let mean = |f: &dyn Fn(&Run) -> f64| runs.iter().map(|r| f(r)).sum::<f64>() / n;
            Some(Point {
                in_flight: c,
                per_sec: mean(&|r| r.per_sec),
                p50_ms: mean(&|r| ms(r.p50)),
                p99_ms: mean(&|r| ms(r.p99)),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn run(per_sec: f64, p50_ms: u64) -> Run {
        Run {
            ops: 10,
            per_sec,
            p50: Duration::from_millis(p50_ms),
            p99: Duration::from_millis(p50_ms * 2),
            max: Duration::from_millis(p50_ms * 3),
            cut: false,
        }
    }

    fn row(round: usize, c: usize, etcd: f64, proxy: f64) -> Row {
        Row {
            op: "acquire".into(),
            in_flight: c,
            round,
            runs: vec![
                ("etcd".into(), run(etcd, 2)),
                ("proxy".into(), run(proxy, 4)),
            ],
        }
    }

    #[test]
    fn ratio_is_last_over_first() {
        assert!((row(0, 1, 200.0, 100.0).ratio() - 0.5).abs() < 1e-9);
        assert_eq!(row(0, 1, 0.0, 100.0).ratio(), 0.0);
    }

    #[test]
    fn series_averages_rounds_in_order() {
        let rows = [
            row(0, 8, 100.0, 50.0),
            row(0, 1, 10.0, 5.0),
            row(1, 8, 300.0, 150.0),
        ];
        let s = series(&rows, "acquire", "proxy");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].in_flight, 1);
        assert_eq!(
            s[1],
            Point {
                in_flight: 8,
                per_sec: 100.0,
                p50_ms: 4.0,
                p99_ms: 8.0
            }
        );
        assert!(series(&rows, "renew", "proxy").is_empty());
    }

    #[test]
    fn table_lines_have_as_many_cells_as_the_header() {
        let h = header(&["etcd", "proxy"], "proxy/etcd");
        let l = line(&row(0, 1, 10.0, 5.0));
        let cells = |s: &str| s.matches('|').count();
        assert_eq!(cells(h.lines().next().unwrap_or_default()), cells(&l));
    }

    #[test]
    fn ratios_are_each_over_the_first() {
        let mut r = row(0, 1, 100.0, 300.0);
        r.runs.insert(1, ("proxy unbatched".into(), run(150.0, 3)));
        assert!((r.ratio_of("proxy unbatched") - 1.5).abs() < 1e-9);
        assert!((r.ratio_of("proxy") - 3.0).abs() < 1e-9);
        assert_eq!(r.ratio_of("absent"), 0.0);
        let j = r.json();
        assert!((j["ratios"]["proxy"].as_f64().unwrap_or_default() - 3.0).abs() < 1e-9);
        let h = header_ratios(&["etcd", "proxy unbatched", "proxy"]);
        let cells = |s: &str| s.matches('|').count();
        assert_eq!(
            cells(h.lines().next().unwrap_or_default()),
            cells(&line_ratios(&r))
        );
    }
}
