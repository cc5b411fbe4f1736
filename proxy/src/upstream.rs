//! The client of protected storage's side: an HTTP client bound to the upstream (or the
//! enforcer's pre-fence route), with a deadline for every answer. Forwarding (`forward`) and
//! pre-fencing a new grant (`lease`) both call it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use fencing::TOKEN_HEADER;
use http::header::HeaderValue;
use http::{Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use runtime::tls::{ClientFiles, Connector};
use tracing::Instrument as _;

use crate::metrics::Metrics;
use crate::{Error, Result};

/// An HTTP client bound to one upstream base URL, with a deadline for the upstream's answer.
#[derive(Clone)]
pub(crate) struct Upstream {
    client: Client<Connector, Body>,
    base: Uri,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Upstream {
    /// A client for `base` (an `http(s)://host:port[/path]` URL), verifying `https://` servers
    /// as `tls` says.
    pub(crate) fn new(
        base: Uri,
        timeout: Duration,
        metrics: Arc<Metrics>,
        tls: &ClientFiles,
    ) -> std::result::Result<Self, runtime::Error> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        Ok(Self {
            client: Client::builder(TokioExecutor::new())
                .build(runtime::tls::https_connector(connector, tls, &base)?),
            base,
            timeout,
            metrics,
        })
    }

    /// Whether `path_and_query`, joined to the base, is one of the enforcer's routes for the
    /// proxy alone: pre-fence (`/fence`, `/fence/…`) and its feed (`/fence-gateway/…`, which
    /// names every tenant's resources). A holder's forward must not reach them, since the
    /// proxy presents its own client certificate upstream and fence-gateway's
    /// `--fence-principals` trusts it.
    pub(crate) fn is_enforcer_route(&self, path_and_query: &str) -> bool {
        self.url(path_and_query).is_ok_and(|u| {
            let path = u.path();
            ["/fence", "/fence-gateway"]
                .iter()
                .any(|route| path == *route || path.starts_with(&format!("{route}/")))
        })
    }

    /// `base` joined with `path_and_query` (which starts with `/` or is empty).
    pub(crate) fn url(&self, path_and_query: &str) -> Result<Uri> {
        let base_path = self.base.path().trim_end_matches('/');
        let path_and_query = if path_and_query.is_empty() || path_and_query.starts_with('?') {
            format!("{base_path}/{path_and_query}")
        } else {
            format!("{base_path}{path_and_query}")
        };
        Uri::builder()
            .scheme(self.base.scheme_str().unwrap_or("http"))
            .authority(
                self.base
                    .authority()
                    .map(|a| a.as_str())
                    .unwrap_or_default(),
            )
            .path_and_query(path_and_query)
            .build()
            .map_err(|e| Error::InvalidRequest(format!("cannot forward to that path: {e}")))
    }

    /// Sends `req` in a span of its own, passing the trace on in `traceparent`.
    pub(crate) async fn send(
        &self,
        mut req: Request<Body>,
        name: &'static str,
    ) -> Result<Response<Body>> {
        let span = tracing::debug_span!("upstream", otel.name = name, otel.kind = "client",);
        async move {
            runtime::telemetry::propagate(req.headers_mut());
            self.send_now(req).await
        }
        .instrument(span)
        .await
    }

    async fn send_now(&self, req: Request<Body>) -> Result<Response<Body>> {
        match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Ok(Ok(resp)) => Ok(resp.map(Body::new)),
            Ok(Err(e)) => Err(Error::UpstreamUnavailable(e.to_string())),
            Err(_) => Err(Error::UpstreamTimeout(self.timeout)),
        }
    }

    /// The enforcer's feed (`GET /fence-gateway/feed?after=N`): its body, at most
    /// [`FEED_LIMIT`] bytes, all of it within the deadline.
    pub(crate) async fn feed(&self, after: u64) -> Result<bytes::Bytes> {
        use http_body_util::BodyExt as _;
        let req = Request::get(self.url(&format!("/fence-gateway/feed?after={after}"))?)
            .body(Body::empty())
            .map_err(|e| Error::UpstreamUnavailable(e.to_string()))?;
        let read = async {
            let resp = self.ask_enforcer(req, "feed").await?.map_err(|status| {
                Error::UpstreamUnavailable(format!("the enforcer's feed answered {status}"))
            })?;
            let body = http_body_util::Limited::new(resp.into_body(), FEED_LIMIT);
            body.collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| Error::UpstreamUnavailable(format!("the enforcer's feed: {e}")))
        };
        tokio::time::timeout(self.timeout, read)
            .await
            .map_err(|_| Error::UpstreamTimeout(self.timeout))?
    }

    /// The proxy's metrics, for what a forward counts.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Raises the enforcer's mark for `resource` to `signed_token` (`POST /fence/{resource}`).
    pub(crate) async fn prefence(&self, resource: &str, signed_token: &str) -> Result<()> {
        let req = Request::post(self.url(&format!("/fence/{resource}"))?)
            .header(TOKEN_HEADER, header_value(signed_token)?)
            .body(Body::empty())
            .map_err(|e| Error::PrefenceFailed(e.to_string()))?;
        self.ask_enforcer(req, "prefence")
            .await
            .map_err(|e| Error::PrefenceFailed(e.to_string()))?
            .map(drop)
            .map_err(|status| Error::PrefenceFailed(format!("the enforcer answered {status}")))
    }

    /// Sends one of the proxy's own requests to the enforcer: its answer when it is a success,
    /// else the status it answered with.
    async fn ask_enforcer(
        &self,
        req: Request<Body>,
        name: &'static str,
    ) -> Result<std::result::Result<Response<Body>, http::StatusCode>> {
        let resp = self.send(req, name).await?;
        Ok(if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(resp.status())
        })
    }
}

/// The largest feed read from the enforcer (its window holds at most 1,024 marks and 256
/// refusals of names ≤ 200 bytes: well under).
const FEED_LIMIT: usize = 1 << 20;

/// `s` as a header value, or the request is refused.
pub(crate) fn header_value(s: &str) -> Result<HeaderValue> {
    HeaderValue::from_str(s).map_err(|_| Error::InvalidRequest("not a valid header value".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_join_the_base() {
        let up = Upstream::new(
            "http://127.0.0.1:9/base/".parse().unwrap(),
            Duration::from_secs(1),
            Arc::new(Metrics::new().unwrap()),
            &ClientFiles::default(),
        )
        .unwrap();
        assert_eq!(
            up.url("/x?y=1").unwrap().to_string(),
            "http://127.0.0.1:9/base/x?y=1"
        );
        assert_eq!(up.url("").unwrap().to_string(), "http://127.0.0.1:9/base/");
        assert_eq!(
            up.url("?q").unwrap().to_string(),
            "http://127.0.0.1:9/base/?q"
        );
    }

    #[test]
    fn the_enforcers_own_routes_are_told_apart() {
        let up = Upstream::new(
            "http://127.0.0.1:9/".parse().unwrap(),
            Duration::from_secs(1),
            Arc::new(Metrics::new().unwrap()),
            &ClientFiles::default(),
        )
        .unwrap();
        for own in [
            "/fence",
            "/fence/a",
            "/fence-gateway",
            "/fence-gateway/feed?after=1",
        ] {
            assert!(up.is_enforcer_route(own), "{own}");
        }
        for storage in ["/fences", "/fence-gatewayx", "/items/fence", "/"] {
            assert!(!up.is_enforcer_route(storage), "{storage}");
        }
    }
}
