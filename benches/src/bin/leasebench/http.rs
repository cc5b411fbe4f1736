//! lease-proxy over HTTP: `POST /v1/leases/{r}`, `POST …/renew`, `DELETE …` with the secret.

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

impl Proxy {
    /// A client for the proxy at `base`.
    pub(crate) fn new(base: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(1024)
                .build()
                .unwrap_or_default(),
            base: base.trim_end_matches('/').to_owned(),
            bearer: None,
        }
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

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.bearer {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }
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
        let resp = self
            .request(
                reqwest::Method::POST,
                &format!("/v1/leases/{}/renew", held.resource),
            )
            .header("lease-secret", &held.secret)
            .send()
            .await?;
        let status = resp.status();
        // Read the body so the connection goes back to the pool.
        let body = resp.bytes().await?;
        if status != 200 {
            bail!(
                "renew of {} answered {status}: {}",
                held.resource,
                String::from_utf8_lossy(&body)
            );
        }
        Ok(())
    }

    async fn release(&self, held: &ProxyHeld) -> anyhow::Result<()> {
        let resp = self
            .request(
                reqwest::Method::DELETE,
                &format!("/v1/leases/{}", held.resource),
            )
            .header("lease-secret", &held.secret)
            .send()
            .await?;
        let status = resp.status();
        if status != 204 {
            bail!("release answered {status}");
        }
        Ok(())
    }
}
