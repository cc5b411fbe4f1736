//! The holder's writes forwarded to protected storage with its fencing token attached: what is
//! removed and set on the way, and what is counted.

use axum::body::Body;
use fencing::gateway::strip_hop_by_hop;
use fencing::{
    REJECTION_HEADER, RESOURCE_HEADER, STALE_REJECTION, TOKEN_HEADER, TOKEN_HEADER_LEGACY,
};
use http::header;
use http::{Request, Response, Uri};

use crate::headers::SECRET_HEADER;
use crate::metrics::{self, Metrics};
use crate::upstream::{header_value, Upstream};
use crate::{Error, Result};

/// Forwards the holder's request to `path_and_query` on the upstream, streaming both bodies,
/// with `Fencing-Token` and `Fencing-Resource` set by the proxy (whatever the client sent in
/// them is dropped) and the lease secret removed. End-to-end headers pass through (`traceparent`
/// is replaced by the forward span's when traces are exported); hop-by-hop headers do not.
pub(crate) async fn forward(
    upstream: &Upstream,
    mut req: Request<Body>,
    path_and_query: &str,
    resource: &str,
    signed_token: &str,
) -> Result<Response<Body>> {
    *req.uri_mut() = upstream.url(path_and_query)?;
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
    let sent = upstream.send(req, "forward").await;
    count(upstream.metrics(), &sent);
    let mut resp = sent?;
    strip_hop_by_hop(resp.headers_mut());
    Ok(resp)
}

fn count(counted: &Metrics, sent: &Result<Response<Body>>) {
    let outcome = match sent {
        Ok(resp) => {
            if resp.headers().get(REJECTION_HEADER).map(|v| v.as_bytes())
                == Some(STALE_REJECTION.as_bytes())
            {
                counted.stale.add(1, &metrics::reason("enforcer"));
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
    counted.forwards.add(1, &metrics::outcome(outcome));
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
}
