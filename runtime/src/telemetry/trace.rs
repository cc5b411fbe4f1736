//! W3C trace context in and out of HTTP requests.

use axum::extract::MatchedPath;
use http::{HeaderMap, Request};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Readies a request's server span for export: names it by method and route template (never
/// the path itself, so resource names stay out of span names) and makes it a child of the
/// client's trace. Does nothing — not even the naming — when spans are not exported.
pub fn server_span<B>(span: &tracing::Span, req: &Request<B>) {
    if !super::exporting() {
        return;
    }
    let name = match req.extensions().get::<MatchedPath>() {
        Some(route) => format!("{} {}", req.method(), route.as_str()),
        None => req.method().to_string(),
    };
    span.record("otel.name", name);
    span.record("otel.kind", "server");
    continue_trace(span, req.headers());
}

/// Makes `span` a child of the trace the request's `traceparent` (and `tracestate`) names, so its
/// spans carry the client's trace id. No-op without a tracer or without the header.
fn continue_trace(span: &tracing::Span, headers: &HeaderMap) {
    if !super::exporting() {
        return;
    }
    let parent =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    if parent.span().span_context().is_valid() {
        // Fails only when the span is disabled, and then there is nothing to join.
        let _ = span.set_parent(parent);
    }
}

/// Passes the trace on to the next hop: writes the current span's context as `traceparent`
/// (replacing the incoming one, so the next hop's spans are children of ours). When no span is
/// being recorded (no tracer), `headers` are left as they are, so a client's `traceparent`
/// travels through unchanged and the trace still joins up downstream.
pub fn propagate(headers: &mut HeaderMap) {
    if !super::exporting() {
        return;
    }
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return;
    }
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&context, &mut HeaderInjector(headers))
    });
}
