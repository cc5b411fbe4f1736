//! Metrics: OpenTelemetry instruments read by a Prometheus exporter, served as text.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::Resource;
use prometheus::{Encoder as _, TextEncoder};

/// One server's metrics: a meter whose instruments are collected into a Prometheus registry at
/// each scrape. One per server (not a process-wide global), so servers embedded side by side
/// count apart.
#[derive(Debug)]
pub struct Metrics {
    registry: prometheus::Registry,
    provider: SdkMeterProvider,
    service: &'static str,
}

impl Metrics {
    /// Metrics of `service` (its name and version go on `target_info`), with the process's
    /// memory, CPU time and open file descriptors.
    pub fn new(service: &'static str) -> Result<Self, crate::Error> {
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .scope_info_enabled(false)
            .build()
            .map_err(|e| crate::Error::Telemetry(e.to_string()))?;
        let resource = Resource::builder()
            .with_service_name(service)
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkMeterProvider::builder()
            .with_reader(exporter)
            .with_resource(resource)
            .build();
        super::process::register(&provider.meter(service));
        Ok(Self {
            registry,
            provider,
            service,
        })
    }

    /// The meter to make this server's instruments with.
    pub fn meter(&self) -> Meter {
        self.provider.meter(self.service)
    }

    /// Everything measured so far, in the Prometheus text format (0.0.4).
    pub fn text(&self) -> Result<String, crate::Error> {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .map_err(|e| crate::Error::Telemetry(e.to_string()))?;
        String::from_utf8(out).map_err(|e| crate::Error::Telemetry(e.to_string()))
    }
}

/// The `/metrics` answer.
pub fn render(metrics: &Metrics) -> Response {
    match metrics.text() {
        Ok(text) => (
            [(http::header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "rendering metrics failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instruments_render_with_prometheus_names_and_types() {
        let metrics = Metrics::new("demo").unwrap();
        let meter = metrics.meter();
        let writes = meter.u64_counter("demo.writes").build();
        let latency = meter
            .f64_histogram("demo.call.duration")
            .with_unit("s")
            .with_boundaries(crate::DURATION_BUCKETS.to_vec())
            .build();
        writes.add(2, &[KeyValue::new("outcome", "ok")]);
        latency.record(0.003, &[]);
        let text = metrics.text().unwrap();
        assert!(text.contains("# TYPE demo_writes_total counter"), "{text}");
        assert!(
            text.contains("demo_writes_total{outcome=\"ok\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE demo_call_duration_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("demo_call_duration_seconds_bucket{le=\"0.005\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("target_info{service_name=\"demo\","),
            "{text}"
        );
    }
}
