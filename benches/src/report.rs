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

    /// The row as JSON.
    pub fn json(&self) -> serde_json::Value {
        let mut runs = serde_json::Map::new();
        for (name, run) in &self.runs {
            runs.insert(name.clone(), run.json());
        }
        json!({
            "op": self.op,
            "in_flight": self.in_flight,
            "round": self.round,
            "backends": runs,
            "ratio": self.ratio(),
        })
    }
}

/// The markdown table header for rows over `backends`; `ratio` names the ratio column.
pub fn header(backends: &[&str], ratio: &str) -> String {
    let mut top = String::from("| op | in flight | round |");
    let mut rule = String::from("|---|--:|--:|");
    for b in backends {
        top.push_str(&format!(" {b} ops/s | p50 / p99 ms |"));
        rule.push_str("--:|--:|");
    }
    top.push_str(&format!(" {ratio} |"));
    rule.push_str("--:|");
    format!("{top}\n{rule}")
}

/// One markdown table line.
pub fn line(row: &Row) -> String {
    let mut s = format!("| {} | {} | {} |", row.op, row.in_flight, row.round);
    for (_, run) in &row.runs {
        s.push_str(&format!(
            " {:.0} | {:.2} / {:.2} |",
            run.per_sec,
            ms(run.p50),
            ms(run.p99)
        ));
    }
    s.push_str(&format!(" {:.2} |", row.ratio()));
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
}
