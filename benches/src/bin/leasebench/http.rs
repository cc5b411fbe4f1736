//! lease-proxy over HTTP: `POST /v1/leases/{r}`, `POST …/renew`, `DELETE …` with the secret,
//! over HTTP/1.1 (a pool of connections) or cleartext HTTP/2 with prior knowledge (h2c: every
//! request a stream on one connection).

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use serde_json::json;

use crate::backend::Backend;

/// lease-proxy at a base URL.
pub(crate) struct Proxy {
    http: reqwest::Client,
    base: String,
    bearer: Option<String>,
}

/// A lease held through the proxy.
pub(crate) struct ProxyHeld {
    resource: String,
    secret: String,
}

/// An HTTP/1.1 client keeping up to 1,024 idle connections: one per request in flight, however
/// many a round sends.
pub(crate) fn pooled() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .build()
        .unwrap_or_default()
}

impl Proxy {
    /// A client for the proxy at `base` over HTTP/1.1.
    pub(crate) fn new(base: &str) -> Self {
        Self {
            http: pooled(),
            base: base.trim_end_matches('/').to_owned(),
            bearer: None,
        }
    }

    /// A client for the plain-HTTP proxy at `base` speaking HTTP/2 with prior knowledge (h2c).
    pub(crate) fn h2c(base: &str) -> anyhow::Result<Self> {
        Ok(Self {
            http: reqwest::Client::builder().http2_prior_knowledge().build()?,
            base: base.trim_end_matches('/').to_owned(),
            bearer: None,
        })
    }

    /// A client for the proxy at an `https://` `base` whose certificate `ca` (PEM) signed,
    /// authenticating with `bearer`.
    pub(crate) fn secure(base: &str, ca: &std::path::Path, bearer: &str) -> anyhow::Result<Self> {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(ca)?)?;
        Ok(Self {
            http: reqwest::Client::builder()
                .use_rustls_tls()
                .tls_built_in_root_certs(false)
                .add_root_certificate(ca)
                .pool_max_idle_per_host(1024)
                .build()?,
            base: base.trim_end_matches('/').to_owned(),
            bearer: Some(bearer.to_owned()),
        })
    }

    /// A request to `path` under the base URL, with the bearer token if any.
    pub(crate) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.bearer {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }
}

impl Proxy {
    /// The proxy's etcd request counters from `/metrics`: requests per etcd operation
    /// (`grant`, `batch`, `txn_create`, `keepalive`, …) and `batched` (transactions sent in
    /// batches, the sum of the batch-size histogram).
    pub(crate) async fn etcd_counters(&self) -> anyhow::Result<BTreeMap<String, f64>> {
        let text = self
            .request(reqwest::Method::GET, "/metrics")
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(parse_counters(&text))
    }
}

/// Picks the etcd request counts out of Prometheus text (see [`Proxy::etcd_counters`]).
fn parse_counters(text: &str) -> BTreeMap<String, f64> {
    let mut counters = BTreeMap::new();
    for line in text.lines() {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let key = if let Some(op) = name
            .strip_prefix("lease_proxy_etcd_request_duration_seconds_count{op=\"")
            .and_then(|rest| rest.strip_suffix("\"}"))
        {
            op.to_owned()
        } else if name == "lease_proxy_etcd_batch_size_sum" {
            "batched".to_owned()
        } else {
            continue;
        };
        counters.insert(key, value);
    }
    counters
}

impl Backend for Proxy {
    type Held = ProxyHeld;

    async fn acquire(&self, resource: String, ttl: u64) -> anyhow::Result<Option<ProxyHeld>> {
        let resp = self
            .request(reqwest::Method::POST, &format!("/v1/leases/{resource}"))
            .json(&json!({"holder": "leasebench", "ttl_seconds": ttl}))
            .send()
            .await?;
        let status = resp.status();
        let body: serde_json::Value = resp.json().await?;
        match status.as_u16() {
            201 => Ok(Some(ProxyHeld {
                resource,
                secret: body["secret"]
                    .as_str()
                    .context("grant without a secret")?
                    .to_owned(),
            })),
            409 => Ok(None),
            _ => bail!("acquire answered {status}: {body}"),
        }
    }

    async fn renew(&self, held: &ProxyHeld) -> anyhow::Result<()> {
        let path = format!("/v1/leases/{}/renew", held.resource);
        self.with_secret(reqwest::Method::POST, &path, &held.secret, 200)
            .await
    }

    async fn read(&self, held: &ProxyHeld) -> anyhow::Result<()> {
        let path = format!("/v1/leases/{}", held.resource);
        self.expect(self.request(reqwest::Method::GET, &path), 200)
            .await
    }

    async fn release(&self, held: &ProxyHeld) -> anyhow::Result<()> {
        let path = format!("/v1/leases/{}", held.resource);
        self.with_secret(reqwest::Method::DELETE, &path, &held.secret, 204)
            .await
    }
}

impl Proxy {
    /// A bodiless `method path` proving `secret` in `Lease-Secret`; an error unless it answers
    /// `expect`.
    pub(crate) async fn with_secret(
        &self,
        method: reqwest::Method,
        path: &str,
        secret: &str,
        expect: u16,
    ) -> anyhow::Result<()> {
        self.expect(
            self.request(method, path).header("lease-secret", secret),
            expect,
        )
        .await
    }

    /// Sends `request`; an error unless it answers `expect`.
    async fn expect(&self, request: reqwest::RequestBuilder, expect: u16) -> anyhow::Result<()> {
        let resp = request.send().await?;
        let status = resp.status();
        let url = resp.url().clone();
        // Read the body so the connection goes back to the pool.
        let body = resp.bytes().await?;
        if status.as_u16() != expect {
            bail!(
                "{url} answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_come_from_the_etcd_request_histogram() {
        let text = "# HELP x\n\
            lease_proxy_etcd_batch_size_sum 30\n\
            lease_proxy_etcd_batch_size_count 10\n\
            lease_proxy_etcd_request_duration_seconds_count{op=\"grant\"} 7\n\
            lease_proxy_etcd_request_duration_seconds_sum{op=\"grant\"} 0.5\n\
            lease_proxy_http_requests_total{route=\"x\"} 9\n";
        let c = parse_counters(text);
        assert_eq!(c.len(), 2);
        assert_eq!(c["batched"], 30.0);
        assert_eq!(c["grant"], 7.0);
    }
}
