//! The acquire-rate quota (`--quota-acquire-rate R`): a token bucket per principal, refilled at
//! R tokens a second up to a burst of max(1, ⌈R⌉), one token per acquire.
//!
//! The buckets live in this replica's memory: with K replicas behind a load balancer a principal
//! can reach K·R acquires a second. That is the price of not asking etcd on every acquire; the
//! held quota, which protects etcd's size, is the one enforced across replicas.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::time::Instant;

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The buckets of every principal that has acquired through this replica.
pub(crate) struct AcquireRate {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl AcquireRate {
    /// `rate` acquires a second per principal (finite and positive: checked by the config).
    pub(crate) fn new(rate: f64) -> Self {
        Self {
            rate,
            burst: rate.ceil().max(1.0),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a token for one acquire by `principal`; when there is none, the whole seconds
    /// until there will be one (at least 1), for `Retry-After`.
    pub(crate) fn take(&self, principal: &str) -> Result<(), u64> {
        self.take_at(principal, Instant::now())
    }

    fn take_at(&self, principal: &str, now: Instant) -> Result<(), u64> {
        // A poisoned lock only means a panic between two plain field updates: the map is whole.
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let bucket = buckets.entry(principal.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - bucket.tokens) / self.rate;
        // Saturating float-to-int cast; `wait` is positive and finite for a valid rate.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Err((wait.ceil() as u64).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_refills_at_the_rate_per_principal() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let rate = AcquireRate::new(2.0);
        assert_eq!(rate.take_at("a", t0), Ok(()));
        assert_eq!(rate.take_at("a", t0), Ok(()));
        assert_eq!(rate.take_at("a", t0), Err(1));
        // Another principal has a bucket of its own.
        assert_eq!(rate.take_at("b", t0), Ok(()));
        assert_eq!(rate.take_at("a", at(500)), Ok(()));
        assert_eq!(rate.take_at("a", at(500)), Err(1));
        // Refills stop at the burst.
        for _ in 0..2 {
            assert_eq!(rate.take_at("a", at(60_000)), Ok(()));
        }
        assert_eq!(rate.take_at("a", at(60_000)), Err(1));

        let slow = AcquireRate::new(0.1);
        assert_eq!(slow.take_at("a", t0), Ok(()));
        assert_eq!(slow.take_at("a", t0), Err(10));
        assert_eq!(slow.take_at("a", at(4_000)), Err(6));
        assert_eq!(slow.take_at("a", at(10_000)), Ok(()));
    }
}
