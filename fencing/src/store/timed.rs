//! Timing of mark-store calls: the `fence.mark_store.duration` histogram (seconds, by `op`),
//! and a debug span per call so traces show the store's share of a write.

use std::future::Future;

use futures::future::BoxFuture;
use opentelemetry::metrics::{Histogram, Meter};
use opentelemetry::KeyValue;
use runtime::DURATION_BUCKETS;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::{HighWaterMarks, StoreError};
use crate::Token;

/// Records how long mark-store calls take.
#[derive(Clone, Debug)]
pub struct StoreLatency(Histogram<f64>);

impl StoreLatency {
    /// The histogram on `meter`.
    pub fn new(meter: &Meter) -> Self {
        Self(
            meter
                .f64_histogram("fence.mark_store.duration")
                .with_unit("s")
                .with_description("Time taken by calls to the high-water-mark store, by operation.")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build(),
        )
    }

    /// The histogram on the process-wide meter provider (a no-op unless the application
    /// installed one).
    pub fn global() -> Self {
        Self::new(&opentelemetry::global::meter("fencing"))
    }

    /// Runs `call` (the store operation `op`), recording its duration whatever its outcome.
    pub async fn time<T>(&self, op: &'static str, call: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = call
            .instrument(tracing::debug_span!("mark_store", otel.name = op, op))
            .await;
        self.0
            .record(started.elapsed().as_secs_f64(), &[KeyValue::new("op", op)]);
        out
    }
}

/// A store whose calls are timed.
#[derive(Debug)]
pub struct Timed<S> {
    inner: S,
    latency: StoreLatency,
}

impl<S> Timed<S> {
    /// Times every call to `inner` into `latency`.
    pub fn new(inner: S, latency: StoreLatency) -> Self {
        Self { inner, latency }
    }
}

impl<S: HighWaterMarks> HighWaterMarks for Timed<S> {
    fn get<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        Box::pin(self.latency.time("get", self.inner.get(resource)))
    }

    fn raise<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<Token, StoreError>> {
        Box::pin(
            self.latency
                .time("raise", self.inner.raise(resource, token)),
        )
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.latency.time("probe", self.inner.probe()))
    }

    fn failed(&self) -> Option<StoreError> {
        self.inner.failed()
    }
}
