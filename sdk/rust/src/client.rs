//! The HTTP client: its builder (TLS, bearer token, timeout) and the one-shot calls of the API.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, RequestBuilder};
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::error::{self, Error, Result};
use crate::loss_watch::LossWatch;
use crate::model::{Grant, Heartbeat, Holding, Opened, Page, Renewal};
use crate::test_mode::{Fault, Faults, TestMode};

/// The header carrying a grant's or a session's secret.
pub(crate) const LEASE_SECRET: &str = "lease-secret";
/// How long a request may take unless the builder says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts of an acquire carrying an `Idempotency-Key` that fails transiently.
const IDEMPOTENT_ATTEMPTS: u32 = 4;
/// First pause between those attempts (doubled each time).
const IDEMPOTENT_BACKOFF: Duration = Duration::from_millis(100);
/// The most bytes the body of an answer of the API may have (not a forwarded request's: that
/// is the upstream's data); a longer one is an [`Error::Protocol`].
pub(crate) const MAX_BODY: usize = 1 << 20;

/// `value` as one URL path segment: letters, digits and `._:-` as they are, every other byte
/// (UTF-8) as `%XX`, so that the proxy sees the name as given (`x/../victim` stays one
/// segment, `job?x` is no query). The names a URL cannot carry as a segment (empty, `.`, `..`:
/// the URL parser would drop or fold them, `..` and `%2E%2E` alike) are sent as `...`, a
/// segment the proxy refuses just as it refuses them (400 `invalid-resource`: a name starts
/// with a letter or digit and has no `..`), never as the path around them.
pub(crate) fn segment(value: &str) -> String {
    if matches!(value, "" | "." | "..") {
        return "...".to_owned();
    }
    let mut out = String::with_capacity(value.len());
    for &b in value.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `/v1/leases/{resource}`, the resource as one segment.
fn lease_path(resource: &str) -> String {
    format!("/v1/leases/{}", segment(resource))
}

/// `/v1/sessions/{id}`, the id as one segment.
fn session_path(id: &str) -> String {
    format!("/v1/sessions/{}", segment(id))
}

/// Reads the body of `resp` chunk by chunk, refusing it past [`MAX_BODY`] bytes
/// ([`Error::Protocol`]) without reading the rest.
pub(crate) async fn read_body(mut resp: reqwest::Response) -> Result<Bytes> {
    let status = resp.status().as_u16();
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(Error::Protocol(format!(
            "{status} answer: body over {MAX_BODY} bytes"
        )));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(Error::Protocol(format!(
                "{status} answer: body over {MAX_BODY} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(body))
}

/// A lease-proxy client. Cheap to clone: clones share one connection pool.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    base: String,
    bearer: Option<String>,
    timeout: Duration,
    losses: Arc<LossWatch>,
    safety_margin: Option<Duration>,
    faults: Option<Faults>,
}

/// Sets up a [`Client`]: TLS trust and identity, bearer token, timeout, user agent.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base_url: String,
    bearer: Option<String>,
    ca_files: Vec<PathBuf>,
    identity: Option<(PathBuf, PathBuf)>,
    timeout: Duration,
    user_agent: String,
    loss_watch: bool,
    safety_margin: Option<Duration>,
    test_mode: Option<TestMode>,
}

impl ClientBuilder {
    /// How long before the server's earliest possible expiry a guard counts as lost — its
    /// stop-by deadline ([`crate::Lease::deadline`]): time for the work to notice and stop
    /// before anyone else can be granted the resource, even when the proxy cannot be reached.
    /// Default: a tenth of the lifetime granted, at least 100 ms (never more than the lifetime).
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = Some(margin);
        self
    }

    /// Whether the guards learn of a loss from the proxy's event stream when it happens (the
    /// default), or only from their renewals: one `GET /v1/watch` per client, over the held
    /// resources (with `--auth-tokens` it needs `read` on them; refused, renewals alone tell).
    pub fn loss_watch(mut self, enabled: bool) -> Self {
        self.loss_watch = enabled;
        self
    }

    /// For an application's own tests: inject faults at the rates of `mode` ([`TestMode`]) —
    /// guards lost at a renewal due, renewals sent late or failed unsent, fencing tokens
    /// refused unsent — through this client's own renewal, loss and fencing code, so the
    /// application's on-lost and on-refused paths run. An injected loss reaches the guard as a
    /// real one does ([`crate::Lease::lost_injected`] tells them apart). Never in production.
    pub fn test_mode(mut self, mode: TestMode) -> Self {
        self.test_mode = Some(mode);
        self
    }

    /// Send `Authorization: Bearer {token}` with every request.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer = Some(token.into());
        self
    }

    /// Trust the CA certificates in this PEM file (in addition to the system's roots).
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_files.push(path.into());
        self
    }

    /// Present this client certificate and key (PEM files) to a proxy that asks for one (mTLS).
    pub fn identity_files(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.identity = Some((cert.into(), key.into()));
        self
    }

    /// The longest one request may take (default 10 s). An acquire that waits gets its wait on
    /// top; a watch is bounded by its own idle check instead.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The `User-Agent` header.
    pub fn user_agent(mut self, agent: impl Into<String>) -> Self {
        self.user_agent = agent.into();
        self
    }

    /// The client, or [`Error::Config`] for a bad URL or unreadable certificate files.
    pub fn build(self) -> Result<Client> {
        let base = self.base_url.trim_end_matches('/').to_owned();
        let url = reqwest::Url::parse(&base)
            .map_err(|e| Error::Config(format!("base URL {base:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Error::Config(format!(
                "base URL {base:?}: the scheme must be http or https"
            )));
        }
        let mut http = reqwest::Client::builder()
            .use_rustls_tls()
            .user_agent(self.user_agent)
            .connect_timeout(self.timeout);
        for path in &self.ca_files {
            let pem = read(path)?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| Error::Config(format!("CA file {}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(Error::Config(format!(
                    "CA file {}: no certificate in it",
                    path.display()
                )));
            }
            for cert in certs {
                http = http.add_root_certificate(cert);
            }
        }
        if let Some((cert, key)) = &self.identity {
            let mut pem = read(cert)?;
            pem.push(b'\n');
            pem.extend(read(key)?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| Error::Config(format!("client identity {}: {e}", cert.display())))?;
            http = http.identity(identity);
        }
        let http = http
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base,
                bearer: self.bearer,
                timeout: self.timeout,
                losses: LossWatch::new(self.loss_watch),
                safety_margin: self.safety_margin,
                faults: self.test_mode.map(Faults::new),
            }),
        })
    }
}

fn read(path: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
}

/// What an acquire sends, with or without a session.
pub(crate) struct AcquireRequest<'a> {
    pub(crate) holder: &'a str,
    pub(crate) ttl_seconds: Option<u64>,
    pub(crate) wait: Option<Duration>,
    pub(crate) idempotency_key: Option<&'a str>,
    pub(crate) metadata: Option<&'a Value>,
    /// The session id and its secret.
    pub(crate) session: Option<(&'a str, &'a str)>,
}

impl Client {
    /// A builder for a client of the proxy at `base_url` (e.g. `http://127.0.0.1:7070`).
    pub fn builder(base_url: &str) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.to_owned(),
            bearer: None,
            ca_files: Vec::new(),
            identity: None,
            timeout: DEFAULT_TIMEOUT,
            user_agent: concat!("lease-proxy-client/", env!("CARGO_PKG_VERSION")).to_owned(),
            loss_watch: true,
            safety_margin: None,
            test_mode: None,
        }
    }

    /// The safety margin set on the builder (None: the default of `upkeep::deadline_after`).
    pub(crate) fn safety_margin(&self) -> Option<Duration> {
        self.inner.safety_margin
    }

    /// Whether the test mode injects `fault` at this chance, for `resource` (never without a
    /// test mode).
    pub(crate) fn injects(&self, fault: Fault, resource: &str) -> bool {
        self.inner
            .faults
            .as_ref()
            .is_some_and(|faults| faults.fires(fault, resource))
    }

    /// How late the test mode sends a late renewal of a guard granted `lifetime`.
    pub(crate) fn late_by(&self, lifetime: Duration) -> Duration {
        self.inner
            .faults
            .as_ref()
            .map_or(Duration::ZERO, |faults| faults.late_by(lifetime))
    }

    /// A client of the proxy at `base_url` with the defaults.
    pub fn new(base_url: &str) -> Result<Client> {
        Self::builder(base_url).build()
    }

    /// The request `method` to `{base}{path}`, with the bearer token and the default timeout.
    pub(crate) fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.request_streaming(method, path)
            .timeout(self.inner.timeout)
    }

    /// The client's loss watch.
    pub(crate) fn losses(&self) -> &Arc<LossWatch> {
        &self.inner.losses
    }

    /// The client's request timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The request `method` to `{base}{path}` with the bearer token and no overall timeout
    /// (a watch stays open; connecting is still bounded by the timeout).
    pub(crate) fn request_streaming(&self, method: Method, path: &str) -> RequestBuilder {
        let mut req = self
            .inner
            .http
            .request(method, format!("{}{path}", self.inner.base));
        if let Some(token) = &self.inner.bearer {
            req = req.bearer_auth(token);
        }
        req
    }

    /// Sends `req`; a non-success status becomes its [`Error`]. The body is read up to
    /// [`MAX_BODY`] bytes ([`Error::Protocol`] past it).
    pub(crate) async fn send(&self, req: RequestBuilder) -> Result<(u16, Bytes)> {
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let body = read_body(resp).await?;
        if (200..300).contains(&status) {
            Ok((status, body))
        } else {
            Err(error::from_answer(status, &body))
        }
    }

    /// Sends `req` and reads its JSON answer.
    pub(crate) async fn call<T: DeserializeOwned>(&self, req: RequestBuilder) -> Result<T> {
        let (status, body) = self.send(req).await?;
        serde_json::from_slice(&body)
            .map_err(|e| Error::Protocol(format!("unexpected {status} answer: {e}")))
    }

    /// Acquires `resource` once and returns the grant, without renewing it (see
    /// [`Client::acquire`] for a guard that does). With an idempotency key, a transport error
    /// or a 502–504 is retried with the same key (a few times, with a short backoff).
    pub async fn grant(&self, resource: &str, opts: &crate::AcquireOptions) -> Result<Grant> {
        self.grant_sent(resource, opts)
            .await
            .map(|(grant, _)| grant)
    }

    /// [`Client::grant`], and the instant read just before sending the attempt that succeeded.
    pub(crate) async fn grant_sent(
        &self,
        resource: &str,
        opts: &crate::AcquireOptions,
    ) -> Result<(Grant, Instant)> {
        self.grant_with(
            resource,
            &AcquireRequest {
                holder: &opts.holder,
                ttl_seconds: Some(opts.ttl_seconds()),
                wait: opts.wait,
                idempotency_key: opts.idempotency_key.as_deref(),
                metadata: opts.metadata.as_ref(),
                session: None,
            },
        )
        .await
    }

    /// `POST /v1/leases/{resource}`, retried with its idempotency key when it has one; with
    /// the instant read just before sending the attempt that succeeded.
    pub(crate) async fn grant_with(
        &self,
        resource: &str,
        req: &AcquireRequest<'_>,
    ) -> Result<(Grant, Instant)> {
        let mut body = Map::new();
        body.insert("holder".into(), json!(req.holder));
        if let Some(ttl) = req.ttl_seconds {
            body.insert("ttl_seconds".into(), json!(ttl));
        }
        if let Some(wait) = req.wait {
            let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
            body.insert("wait_ms".into(), json!(ms));
        }
        if let Some(m) = req.metadata {
            body.insert("metadata".into(), m.clone());
        }
        if let Some((id, _)) = req.session {
            body.insert("session".into(), json!(id));
        }
        let body = Value::Object(body);
        let timeout = self.inner.timeout + req.wait.unwrap_or_default();
        let mut backoff = IDEMPOTENT_BACKOFF;
        let mut attempt = 1;
        loop {
            let mut http = self
                .request(Method::POST, &lease_path(resource))
                .timeout(timeout)
                .json(&body);
            if let Some(key) = req.idempotency_key {
                http = http.header("idempotency-key", key);
            }
            if let Some((_, secret)) = req.session {
                http = http.header(LEASE_SECRET, secret);
            }
            let sent = Instant::now();
            match self.call(http).await.map(|grant| (grant, sent)) {
                Err(e)
                    if e.is_transient()
                        && req.idempotency_key.is_some()
                        && attempt < IDEMPOTENT_ATTEMPTS =>
                {
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Renews the grant of `resource` proven by `secret` once. [`Error::Lost`] when it has
    /// ended.
    pub async fn renew(&self, resource: &str, secret: &str) -> Result<Renewal> {
        self.call(
            self.request(Method::POST, &format!("{}/renew", lease_path(resource)))
                .header(LEASE_SECRET, secret),
        )
        .await
    }

    /// Releases the grant of `resource` proven by `secret`. Idempotent: releasing an ended
    /// grant succeeds.
    pub async fn release(&self, resource: &str, secret: &str) -> Result<()> {
        self.send(
            self.request(Method::DELETE, &lease_path(resource))
                .header(LEASE_SECRET, secret),
        )
        .await
        .map(drop)
    }

    /// Who holds `resource`, or `None` when it is free.
    pub async fn get(&self, resource: &str) -> Result<Option<Holding>> {
        match self
            .call(self.request(Method::GET, &lease_path(resource)))
            .await
        {
            Ok(holding) => Ok(Some(holding)),
            Err(e) if e.slug() == Some("not-found") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every held resource whose name starts with `prefix`, in name order (all pages).
    pub async fn list(&self, prefix: &str) -> Result<Vec<Holding>> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut query = vec![("prefix", prefix.to_owned()), ("limit", "1000".to_owned())];
            if let Some(c) = cursor.take() {
                query.push(("cursor", c));
            }
            let page: Page = self
                .call(self.request(Method::GET, "/v1/leases").query(&query))
                .await?;
            all.extend(page.leases);
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// A request through the forward route of `resource`'s grant proven by `secret`: `method`
    /// to the upstream's `path` (query included), with the secret, the bearer token and the
    /// client's timeout set. Add a body or headers, then send it; the answer is the upstream's
    /// (or the proxy's problem: 410 when the grant ended).
    pub fn forward_request(
        &self,
        resource: &str,
        secret: &str,
        method: Method,
        path: &str,
    ) -> RequestBuilder {
        let path = path.trim_start_matches('/');
        self.request(method, &format!("{}/forward/{path}", lease_path(resource)))
            .header(LEASE_SECRET, secret)
    }

    /// `POST /v1/sessions`.
    pub(crate) async fn open(&self, holder: &str, ttl_seconds: u64) -> Result<Opened> {
        self.call(
            self.request(Method::POST, "/v1/sessions")
                .json(&json!({"holder": holder, "ttl_seconds": ttl_seconds})),
        )
        .await
    }

    /// `POST /v1/sessions/{id}/keepalive`.
    pub(crate) async fn keepalive(&self, id: &str, secret: &str) -> Result<Heartbeat> {
        self.call(
            self.request(Method::POST, &format!("{}/keepalive", session_path(id)))
                .header(LEASE_SECRET, secret),
        )
        .await
    }

    /// `DELETE /v1/sessions/{id}`.
    pub(crate) async fn close(&self, id: &str, secret: &str) -> Result<()> {
        self.send(
            self.request(Method::DELETE, &session_path(id))
                .header(LEASE_SECRET, secret),
        )
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(segment("aisle-1.a_b:c"), "aisle-1.a_b:c");
        assert_eq!(segment("x/../victim"), "x%2F..%2Fvictim");
        assert_eq!(segment("job?x#y z%"), "job%3Fx%23y%20z%25");
        assert_eq!(segment("é"), "%C3%A9");
        for dots in ["", ".", ".."] {
            assert_eq!(segment(dots), "...");
        }
    }

    #[test]
    fn bad_configuration_is_refused() {
        assert!(matches!(Client::new("not a url"), Err(Error::Config(_))));
        assert!(matches!(Client::new("ftp://host"), Err(Error::Config(_))));
        assert!(matches!(
            Client::builder("http://127.0.0.1:1")
                .ca_file("/nonexistent/ca.pem")
                .build(),
            Err(Error::Config(_))
        ));
        assert!(Client::new("http://127.0.0.1:7070/").is_ok());
    }
}
