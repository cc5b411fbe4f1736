//! Telemetry both binaries share: logs filtered by `RUST_LOG`, traces exported over OTLP when the
//! standard `OTEL_*` variables ask for it, W3C trace context taken from requests and passed on,
//! and metrics through OpenTelemetry instruments, rendered as Prometheus text at `/metrics`.
//!
//! Without `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) no tracer is
//! installed: nothing is exported, the debug-level spans of etcd calls and forwards are never
//! created, and a client's `traceparent` is passed on untouched.

mod metrics;
mod process;
mod trace;

pub use metrics::{render, Metrics};
pub use trace::{propagate, server_span};

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Set by [`init`] when spans are exported; until then trace context is neither extracted nor
/// injected (a client's `traceparent` simply travels on with the other headers).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether this process exports spans.
pub(crate) fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The longest the final span export may hold up the exit (count it in a pod's termination grace
/// period, after the shutdown delay and the drain).
pub const FLUSH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// What [`init`] set up that must be flushed before the process exits.
#[must_use = "dropping it without `shutdown` may lose the last spans"]
#[derive(Debug)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered and stops the exporter, waiting at most
    /// [`FLUSH_DEADLINE`] for an unresponsive collector. Call outside the async runtime (the
    /// exporter's HTTP client blocks).
    pub fn shutdown(self) {
        if let Some(tracer) = self.tracer {
            if let Err(e) = tracer.shutdown_with_timeout(FLUSH_DEADLINE) {
                eprintln!("telemetry: flushing spans failed: {e}");
            }
        }
    }
}

/// Installs the process's telemetry: log lines to stderr in `format` (filtered by `RUST_LOG`,
/// default `info`), the W3C trace-context propagator, and — when OTLP export is asked for — a
/// tracer exporting the spans of this crate and of `service` over OTLP/HTTP (protobuf) as
/// `service` (unless `OTEL_SERVICE_NAME` names it otherwise). Call once, before the runtime
/// starts.
pub fn init(service: &'static str, format: LogFormat) -> Telemetry {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
    }
    .with_filter(filter);
    let (tracer, problem) = match otlp_requested() {
        Ok(true) => match tracer_provider(service) {
            Ok(provider) => (Some(provider), None),
            Err(e) => (None, Some(e)),
        },
        Ok(false) => (None, None),
        Err(e) => (None, Some(e)),
    };
    let spans = tracer.as_ref().map(|provider| {
        // Our own spans down to debug (etcd calls, forwards, mark-store calls); dependencies'
        // (h2, hyper, tonic) only at info and above, so a trace shows what we did.
        let crate_name = service.replace('-', "_");
        let targets = Targets::new()
            .with_target(crate_name, tracing::Level::DEBUG)
            .with_target("fencing", tracing::Level::DEBUG)
            .with_default(tracing::Level::INFO);
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(service))
            .with_filter(targets)
    });
    tracing_subscriber::registry().with(logs).with(spans).init();
    EXPORTING.store(tracer.is_some(), Ordering::Relaxed);
    if let Some(problem) = problem {
        tracing::warn!(%problem, "OTLP trace export is off");
    } else if tracer.is_some() {
        tracing::info!("exporting traces over OTLP/HTTP");
    }
    Telemetry { tracer }
}

/// Whether the standard variables ask for OTLP trace export: an endpoint is set, the SDK is not
/// disabled and no other trace exporter is named.
fn otlp_requested() -> Result<bool, String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    if var("OTEL_TRACES_EXPORTER").is_some_and(|v| v != "otlp") {
        return Ok(false);
    }
    if var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        && var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
    {
        return Ok(false);
    }
    let protocol = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|| "http/protobuf".into());
    if protocol != "http/protobuf" {
        return Err(format!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported; use http/protobuf"
        ));
    }
    Ok(true)
}

/// A tracer provider batching spans to the OTLP/HTTP endpoint the `OTEL_*` variables name
/// (`OTEL_EXPORTER_OTLP_{,TRACES_}{ENDPOINT,HEADERS,TIMEOUT}`, `OTEL_BSP_*`,
/// `OTEL_TRACES_SAMPLER{,_ARG}`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`).
fn tracer_provider(service: &'static str) -> Result<SdkTracerProvider, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| e.to_string())?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service);
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}
