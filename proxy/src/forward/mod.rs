//! Talking to protected storage on the holder's behalf: forwarding its writes with the fencing
//! token attached, and pre-fencing the enforcer when a new grant is made.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use fencing::gateway::strip_hop_by_hop;
use fencing::tls::{ClientFiles, Connector};
use fencing::{
    REJECTION_HEADER, RESOURCE_HEADER, STALE_REJECTION, TOKEN_HEADER, TOKEN_HEADER_LEGACY,
};
use http::header::{self, HeaderValue};
use http::{Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tracing::Instrument as _;

use crate::api::SECRET_HEADER;
use crate::metrics::{self, Metrics};
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
    ) -> std::result::Result<Self, fencing::Error> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        Ok(Self {
            client: Client::builder(TokioExecutor::new())
                .build(fencing::tls::https_connector(connector, tls, &base)?),
            base,
            timeout,
            metrics,
        })
    }

    /// `base` joined with `path_and_query` (which starts with `/` or is empty).
    /// Whether `path_and_query`, joined to the base, is an enforcer's pre-fence route
    /// (`/fence`, `/fence/…`): a holder's forward must not reach it, since the proxy presents
    /// its own client certificate upstream and fence-gateway's `--fence-principals` trusts it.
    pub(crate) fn is_prefence_route(&self, path_and_query: &str) -> bool {
        self.url(path_and_query).is_ok_and(|u| {
            let path = u.path();
            path == "/fence" || path.starts_with("/fence/")
        })
    }

    fn url(&self, path_and_query: &str) -> Result<Uri> {
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
    async fn send(&self, mut req: Request<Body>, name: &'static str) -> Result<Response<Body>> {
        let span = tracing::debug_span!("upstream", otel.name = name, otel.kind = "client",);
        async move {
            fencing::telemetry::propagate(req.headers_mut());
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

    /// Forwards the holder's request to `path_and_query` on the upstream, streaming both bodies,
    /// with `Fencing-Token` and `Fencing-Resource` set by the proxy (whatever the client sent in
    /// them is dropped) and the lease secret removed. End-to-end headers pass through (`traceparent`
    /// is replaced by the forward span's when traces are exported); hop-by-hop headers do not.
    pub(crate) async fn forward(
        &self,
        mut req: Request<Body>,
        path_and_query: &str,
        resource: &str,
        signed_token: &str,
    ) -> Result<Response<Body>> {
        *req.uri_mut() = self.url(path_and_query)?;
        *req.version_mut() = http::Version::HTTP_11;
        let headers = req.headers_mut();
        strip_hop_by_hop(headers);
        for name in [
            SECRET_HEADER,
            TOKEN_HEADER,
            TOKEN_HEADER_LEGACY,
            RESOURCE_HEADER,
        ] {
            headers.remove(name);
        }
        headers.remove(header::HOST);
        headers.insert(TOKEN_HEADER, header_value(signed_token)?);
        headers.insert(RESOURCE_HEADER, header_value(resource)?);
        let sent = self.send(req, "forward").await;
        self.count(&sent);
        let mut resp = sent?;
        strip_hop_by_hop(resp.headers_mut());
        Ok(resp)
    }

    fn count(&self, sent: &Result<Response<Body>>) {
        let outcome = match sent {
            Ok(resp) => {
                if resp.headers().get(REJECTION_HEADER).map(|v| v.as_bytes())
                    == Some(STALE_REJECTION.as_bytes())
                {
                    self.metrics.stale.add(1, &metrics::reason("enforcer"));
                }
                match resp.status().as_u16() {
                    200..=299 => "2xx",
                    300..=399 => "3xx",
                    400..=499 => "4xx",
                    _ => "5xx",
                }
            }
            Err(Error::UpstreamTimeout(_)) => "timeout",
            Err(_) => "unreachable",
        };
        self.metrics.forwards.add(1, &metrics::outcome(outcome));
    }

    /// Raises the enforcer's mark for `resource` to `signed_token` (`POST /fence/{resource}`).
    pub(crate) async fn prefence(&self, resource: &str, signed_token: &str) -> Result<()> {
        let req = Request::post(self.url(&format!("/fence/{resource}"))?)
            .header(TOKEN_HEADER, header_value(signed_token)?)
            .body(Body::empty())
            .map_err(|e| Error::PrefenceFailed(e.to_string()))?;
        let resp = self
            .send(req, "prefence")
            .await
            .map_err(|e| Error::PrefenceFailed(e.to_string()))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(Error::PrefenceFailed(format!(
                "the enforcer answered {}",
                resp.status()
            )))
        }
    }
}

fn header_value(s: &str) -> Result<HeaderValue> {
    HeaderValue::from_str(s).map_err(|_| Error::InvalidRequest("not a valid header value".into()))
}

/// The part of a forward route's raw path after `/v1/leases/{resource}/forward`, with the query,
/// taken from the raw URI so that percent-encoding reaches the upstream untouched.
pub(crate) fn forwarded_path(uri: &Uri) -> Option<String> {
    let rest = uri.path().strip_prefix("/v1/leases/")?;
    let (_, after_resource) = rest.split_once('/')?;
    let tail = after_resource.strip_prefix("forward")?;
    if !(tail.is_empty() || tail.starts_with('/')) {
        return None;
    }
    Some(match uri.query() {
        Some(q) => format!("{tail}?{q}"),
        None => tail.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_paths_keep_their_encoding() {
        let uri: Uri = "/v1/leases/aisle-1/forward/inv/a%2Fb?x=1&y=%20"
            .parse()
            .unwrap();
        assert_eq!(forwarded_path(&uri).unwrap(), "/inv/a%2Fb?x=1&y=%20");
        let uri: Uri = "/v1/leases/aisle-1/forward".parse().unwrap();
        assert_eq!(forwarded_path(&uri).unwrap(), "");
        let uri: Uri = "/v1/leases/aisle-1/forwarding".parse().unwrap();
        assert!(forwarded_path(&uri).is_none());
    }

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
}
