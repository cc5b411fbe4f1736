//! Latency samples and their summary.

use std::time::Duration;

use serde_json::json;

/// Throughput and latency of one measurement.
#[derive(Debug, Clone, Copy, Default)]
pub struct Run {
    /// Operations completed.
    pub ops: usize,
    /// Operations per second over the whole measurement.
    pub per_sec: f64,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// Slowest operation.
    pub max: Duration,
    /// Whether the loop was cut at a deadline before all its operations were done: `ops` and
    /// `per_sec` are what it did by then.
    pub cut: bool,
}

impl Run {
    /// Summarises `latencies` of operations completed within `elapsed`.
    pub fn from_latencies(mut latencies: Vec<Duration>, elapsed: Duration) -> Self {
        latencies.sort_unstable();
        let at = |q: f64| {
            let i = ((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1));
            latencies.get(i).copied().unwrap_or_default()
        };
        Self {
            ops: latencies.len(),
            per_sec: latencies.len() as f64 / elapsed.as_secs_f64().max(1e-9),
            p50: at(0.50),
            p99: at(0.99),
            max: latencies.last().copied().unwrap_or_default(),
            cut: false,
        }
    }

    /// The summary as JSON (latencies in milliseconds).
    pub fn json(&self) -> serde_json::Value {
        let mut run = json!({
            "ops": self.ops,
            "ops_per_sec": self.per_sec,
            "p50_ms": ms(self.p50),
            "p99_ms": ms(self.p99),
            "max_ms": ms(self.max),
        });
        if self.cut {
            run["cut_at_deadline"] = json!(true);
        }
        run
    }
}

/// A duration in milliseconds, as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_sample() {
        let lat: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let run = Run::from_latencies(lat, Duration::from_secs(2));
        assert_eq!(run.ops, 100);
        assert!((run.per_sec - 50.0).abs() < 1e-9);
        assert_eq!(run.p50, Duration::from_millis(51));
        assert_eq!(run.p99, Duration::from_millis(100));
        assert_eq!(run.max, Duration::from_millis(100));
    }

    #[test]
    fn an_empty_sample_is_all_zero() {
        let run = Run::from_latencies(Vec::new(), Duration::from_secs(1));
        assert_eq!(run.ops, 0);
        assert_eq!(run.p99, Duration::ZERO);
    }
}
