//! Exponential backoff: the one way both binaries pause between retries (lease-proxy's etcd
//! calls, streams and watches; fence-gateway's PostgreSQL polls and reconnects). Pure arithmetic
//! on durations, so callers sleep on tokio's clock and tests can pause it.

use std::time::Duration;

/// Pauses that double from `first` up to `max`, and start again from `first` on [`reset`].
///
/// [`reset`]: Backoff::reset
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Pauses from `first`, doubling, never above `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first,
        }
    }

    /// The pause to take now; the one after it is twice as long, up to the maximum.
    pub fn pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(self.max);
        pause
    }

    /// The pause [`Backoff::pause`] would take, without taking it.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// Starts again from the first pause (after a success).
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_maximum_and_reset() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(50), ms(300));
        let taken: Vec<_> = (0..5).map(|_| b.pause()).collect();
        assert_eq!(taken, [ms(50), ms(100), ms(200), ms(300), ms(300)]);
        assert_eq!(b.peek(), ms(300));
        b.reset();
        assert_eq!(b.pause(), ms(50));
    }

    /// A retry loop on tokio's clock: paused, the pauses add up exactly, and no time passes
    /// for real.
    #[tokio::test(start_paused = true)]
    async fn a_retry_loop_waits_the_sum_of_its_pauses() {
        let ms = Duration::from_millis;
        let started = tokio::time::Instant::now();
        let mut b = Backoff::new(ms(100), ms(400));
        for _ in 0..4 {
            tokio::time::sleep(b.pause()).await;
        }
        assert_eq!(started.elapsed(), ms(100 + 200 + 400 + 400));
    }
}
