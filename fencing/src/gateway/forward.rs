//! Forwarding to the upstream: streaming bodies both ways, hop-by-hop headers removed.

use std::time::Duration;

use axum::body::Body;
use http::header;

use crate::layer::{problem, strip_hop_by_hop, ExchangeIncomplete};
use http::Version;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::LengthLimitError;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use runtime::tls::{ClientFiles, Connector};
use tracing::Instrument as _;

/// A forwarder to one upstream base URL: the gateway without its enforcement (the benchmarks'
/// bare pass-through proxy is this, on the same serving stack).
#[derive(Clone)]
pub struct Forwarder {
    client: Client<Connector, Body>,
    base: Uri,
    timeout: Duration,
}

impl Forwarder {
    /// A forwarder to `base` (an `http(s)://host:port[/path]` URI), verifying an `https://`
    /// upstream as `tls` says.
    pub fn new(base: Uri, timeout: Duration, tls: &ClientFiles) -> Result<Self, runtime::Error> {
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(runtime::tls::https_connector(
                HttpConnector::new(),
                tls,
                &base,
            )?),
            base,
            timeout,
        })
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
        // The upstream client speaks HTTP/1.1, whatever the client spoke to us (h2c included).
        *req.version_mut() = Version::HTTP_11;
        strip_hop_by_hop(req.headers_mut());
        // The client sets Host from the target URI.
        req.headers_mut().remove(header::HOST);
        runtime::telemetry::propagate(req.headers_mut());
        let mut failed = match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                return Response::from_parts(parts, Body::new(body));
            }
            Ok(Err(e)) if caused_by::<LengthLimitError>(&e) => problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "request body too large",
            ),
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
        };
        // The upstream may have received (part of) the write before the exchange failed.
        failed.extensions_mut().insert(ExchangeIncomplete);
        failed
    }
}

/// Whether `E` is somewhere in `error`'s chain of sources.
fn caused_by<E: std::error::Error + 'static>(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<E>() {
            return true;
        }
        current = e.source();
    }
    false
}
