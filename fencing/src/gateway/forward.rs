//! Forwarding to the upstream: streaming bodies both ways, hop-by-hop headers removed.

use std::time::Duration;

use axum::body::Body;
use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tracing::Instrument as _;

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including those named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    headers.remove("proxy-connection");
}

/// A forwarder to one upstream base URL: the gateway without its enforcement (the benchmarks'
/// bare pass-through proxy is this, on the same serving stack).
#[derive(Clone)]
pub struct Forwarder {
    client: Client<HttpConnector, Body>,
    base: Uri,
    timeout: Duration,
}

impl Forwarder {
    /// A forwarder to `base` (an `http://host:port[/path]` URI).
    pub fn new(base: Uri, timeout: Duration) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base,
            timeout,
        }
    }

    fn target(&self, uri: &Uri) -> Option<Uri> {
        let base_path = self.base.path().trim_end_matches('/');
        let path_and_query = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        Uri::builder()
            .scheme(self.base.scheme_str().unwrap_or("http"))
            .authority(self.base.authority()?.as_str())
            .path_and_query(format!("{base_path}{path_and_query}"))
            .build()
            .ok()
    }

    /// Sends `req` upstream and returns its answer; 502/504 problem+json when the upstream
    /// cannot be reached or does not answer in time. The call is a span of its own, and the
    /// trace goes on upstream in `traceparent`.
    pub async fn forward(&self, req: Request<Body>) -> Response<Body> {
        let span = tracing::debug_span!(
            "upstream",
            otel.name = %format_args!("upstream {}", req.method()),
            otel.kind = "client",
        );
        self.send(req).instrument(span).await
    }

    async fn send(&self, mut req: Request<Body>) -> Response<Body> {
        let Some(target) = self.target(req.uri()) else {
            return problem(
                StatusCode::BAD_REQUEST,
                "invalid-target",
                "request target cannot be forwarded",
            );
        };
        *req.uri_mut() = target;
        strip_hop_by_hop(req.headers_mut());
        // The client sets Host from the target URI.
        req.headers_mut().remove(header::HOST);
        crate::telemetry::propagate(req.headers_mut());
        match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, Body::new(body))
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "upstream unreachable");
                problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream-unavailable",
                    "the upstream could not be reached",
                )
            }
            Err(_) => problem(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "the upstream did not answer in time",
            ),
        }
    }
}

/// A problem+json response.
pub(super) fn problem(status: StatusCode, slug: &str, detail: &str) -> Response<Body> {
    let body = serde_json::json!({
        "type": format!("{}{slug}", crate::layer::PROBLEM_BASE),
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/problem+json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, x-private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-end-to-end", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-end-to-end"));
    }
}
