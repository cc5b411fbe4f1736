//! A small client for lease-proxy's `/v1` API, used by the example scenarios.
//!
//! It shows what a client in any language has to do: acquire (optionally waiting), renew well
//! within the TTL with the secret, and release on the way out. Deadlines are computed from a
//! monotonic clock read *before* each request, so the client never trusts a server's or its own
//! wall clock.
#![forbid(unsafe_code)]

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

/// What can go wrong talking to the proxy.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The resource is held by someone else.
    #[error("held by {holder} (token {token}), free in at most {expires_in_ms} ms")]
    Held {
        /// The current holder.
        holder: String,
        /// Its token.
        token: String,
        /// Remaining TTL of its lease.
        expires_in_ms: u64,
    },
    /// The lease is gone (expired or released): stop acting as the holder.
    #[error("lease lost")]
    Lost,
    /// Any other answer.
    #[error("unexpected answer {status}: {body}")]
    Unexpected {
        /// HTTP status.
        status: u16,
        /// Response body.
        body: String,
    },
    /// The request did not get an answer.
    #[error("request failed: {0}")]
    Http(#[from] reqwest::Error),
    /// A setting (a CA file) is unusable.
    #[error("{0}")]
    Config(String),
}

/// A grant as returned by `POST /v1/leases/{resource}`.
#[derive(Debug, Clone, Deserialize)]
pub struct Grant {
    /// The resource held.
    pub resource: String,
    /// The holder.
    pub holder: String,
    /// Proof of holding.
    pub secret: String,
    /// The fencing token's revision.
    pub token: String,
    /// The signed fencing token.
    pub fencing_token: String,
    /// The TTL granted.
    pub ttl_seconds: u64,
    /// Lifetime from when the request reached the proxy.
    pub expires_in_ms: u64,
}

#[derive(Deserialize)]
struct Renewed {
    expires_in_ms: u64,
}

#[derive(Deserialize)]
struct Problem {
    holder: Option<String>,
    token: Option<String>,
    expires_in_ms: Option<u64>,
}

/// A lease held through the proxy, with a conservative local deadline.
#[derive(Debug, Clone)]
pub struct Held {
    /// The grant.
    pub grant: Grant,
    /// Before this instant the lease is certainly still held (measured from before the request).
    pub deadline: Instant,
}

/// Client for one proxy.
#[derive(Debug, Clone)]
pub struct LeaseClient {
    base: String,
    http: reqwest::Client,
    bearer: Option<String>,
}

/// An HTTP client that, for `https://` URLs, trusts the CAs in `ca` (PEM) when given (the
/// system's otherwise).
pub fn http_client(ca: Option<&std::path::Path>) -> Result<reqwest::Client, Error> {
    let mut builder = reqwest::Client::builder().use_rustls_tls();
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).map_err(|e| Error::Config(format!("{}: {e}", ca.display())))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)? {
            builder = builder.add_root_certificate(cert);
        }
    }
    Ok(builder.build()?)
}

impl LeaseClient {
    /// A client for the proxy at `base` (e.g. `http://127.0.0.1:7070`).
    pub fn new(base: impl Into<String>) -> Self {
        Self::with_http(base, reqwest::Client::new(), None)
    }

    /// A client for the proxy at `base` over `http` (see [`http_client`]), presenting `bearer`
    /// as `Authorization: Bearer …` when the proxy has authentication on.
    pub fn with_http(
        base: impl Into<String>,
        http: reqwest::Client,
        bearer: Option<String>,
    ) -> Self {
        Self {
            base: base.into().trim_end_matches('/').to_owned(),
            http,
            bearer,
        }
    }

    /// A request to the proxy, with the bearer token when there is one.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.bearer {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Acquires `resource`, waiting up to `wait` for it to become free.
    pub async fn acquire(
        &self,
        resource: &str,
        holder: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Held, Error> {
        let sent = Instant::now();
        let resp = self
            .request(reqwest::Method::POST, &format!("/v1/leases/{resource}"))
            .json(&serde_json::json!({
                "holder": holder,
                "ttl_seconds": ttl.as_secs(),
                "wait_ms": u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            }))
            .send()
            .await?;
        let status = resp.status().as_u16();
        let body = resp.text().await?;
        match status {
            201 => {
                let grant: Grant = serde_json::from_str(&body).map_err(|_| Error::Unexpected {
                    status,
                    body: body.clone(),
                })?;
                let deadline = sent + Duration::from_millis(grant.expires_in_ms);
                Ok(Held { grant, deadline })
            }
            409 => {
                let p: Problem = serde_json::from_str(&body).map_err(|_| Error::Unexpected {
                    status,
                    body: body.clone(),
                })?;
                Err(Error::Held {
                    holder: p.holder.unwrap_or_default(),
                    token: p.token.unwrap_or_default(),
                    expires_in_ms: p.expires_in_ms.unwrap_or_default(),
                })
            }
            _ => Err(Error::Unexpected { status, body }),
        }
    }

    /// Renews a held lease and moves its deadline.
    pub async fn renew(&self, held: &mut Held) -> Result<(), Error> {
        let sent = Instant::now();
        let resp = self
            .request(
                reqwest::Method::POST,
                &format!("/v1/leases/{}/renew", held.grant.resource),
            )
            .header("lease-secret", &held.grant.secret)
            .send()
            .await?;
        let status = resp.status().as_u16();
        let body = resp.text().await?;
        match status {
            200 => {
                let r: Renewed = serde_json::from_str(&body).map_err(|_| Error::Unexpected {
                    status,
                    body: body.clone(),
                })?;
                held.deadline = sent + Duration::from_millis(r.expires_in_ms);
                Ok(())
            }
            410 => Err(Error::Lost),
            _ => Err(Error::Unexpected { status, body }),
        }
    }

    /// Releases a held lease (idempotent).
    pub async fn release(&self, held: &Held) -> Result<(), Error> {
        let resp = self
            .request(
                reqwest::Method::DELETE,
                &format!("/v1/leases/{}", held.grant.resource),
            )
            .header("lease-secret", &held.grant.secret)
            .send()
            .await?;
        match resp.status().as_u16() {
            204 => Ok(()),
            status => Err(Error::Unexpected {
                status,
                body: resp.text().await?,
            }),
        }
    }
}
