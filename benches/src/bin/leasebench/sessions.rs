//! Sessions: one lease kept alive by one heartbeat, holding many resources.
//!
//! - through the proxy: `POST /v1/sessions`, acquires under it (`"session": id` with the
//!   session's secret: one etcd transaction, no grant), `POST /v1/sessions/{id}/keepalive`,
//!   `DELETE /v1/sessions/{id}`;
//! - raw etcd, the best variant (what etcd's `concurrency.Session` does): one lease granted per
//!   session, one create-if-absent transaction on it per acquire, keepalives on the shared
//!   multiplexed stream, a compare-and-delete to release one resource, a revoke to close.
//!
//! `session-cycle` is `cycle` under a session: acquire → renewals → release of one resource,
//! with no lease granted or revoked per cycle. A renewal is the session's heartbeat, on both
//! sides (through the proxy `POST /v1/sessions/{id}/keepalive`; raw, a keepalive of the session's
//! lease): that is how a session is kept. (Renewing one grant of a session through
//! `/v1/leases/{r}/renew` also renews its session, but reads the grant's key linearizably first,
//! so that no replica renews a released grant.)

use std::future::Future;
use std::sync::Arc;

use anyhow::{bail, Context};
use futures::StreamExt;
use lease_proxy_benches::stats::Run;
use serde_json::json;

use crate::backend::Backend;
use crate::http::Proxy;
use crate::ops;
use crate::raw::RawEtcd;

/// A way to hold resources under sessions.
pub(crate) trait SessionBackend: Send + Sync + 'static {
    /// An open session.
    type Session: Send + Sync + 'static;

    /// Opens a session of `ttl` seconds.
    fn open(&self, ttl: u64) -> impl Future<Output = anyhow::Result<Self::Session>> + Send;

    /// One resource held under a session.
    type Grant: Send + Sync + 'static;

    /// Takes `resource` under `session`; `None` when someone holds it.
    fn acquire_in(
        &self,
        session: &Self::Session,
        resource: &str,
    ) -> impl Future<Output = anyhow::Result<Option<Self::Grant>>> + Send;

    /// Renews `grant`'s session (the heartbeat that keeps every grant of it).
    fn renew_in(
        &self,
        session: &Self::Session,
        grant: &Self::Grant,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Releases `grant` alone; the session and its other grants live on.
    fn release_in(&self, grant: &Self::Grant) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Renews the session (and so everything held under it); an error when it is gone.
    fn keepalive(&self, session: &Self::Session)
        -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Ends the session and everything held under it.
    fn close(&self, session: &Self::Session) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// A session opened through the proxy.
pub(crate) struct ProxySession {
    /// Its id (decimal).
    pub(crate) id: String,
    secret: String,
}

/// A grant under a session, through the proxy: its resource and its own secret.
pub(crate) struct ProxyGrant {
    resource: String,
    secret: String,
}

impl SessionBackend for Proxy {
    type Session = ProxySession;
    type Grant = ProxyGrant;

    async fn open(&self, ttl: u64) -> anyhow::Result<ProxySession> {
        let resp = self
            .request(reqwest::Method::POST, "/v1/sessions")
            .json(&json!({"holder": "leasebench", "ttl_seconds": ttl}))
            .send()
            .await?;
        let status = resp.status();
        let body: serde_json::Value = resp.json().await?;
        if status != 201 {
            bail!("session open answered {status}: {body}");
        }
        let field = |f: &str| {
            body[f]
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("session without {f}: {body}"))
        };
        Ok(ProxySession {
            id: field("session_id")?,
            secret: field("secret")?,
        })
    }

    async fn acquire_in(
        &self,
        session: &ProxySession,
        resource: &str,
    ) -> anyhow::Result<Option<ProxyGrant>> {
        let resp = self
            .request(reqwest::Method::POST, &format!("/v1/leases/{resource}"))
            .header("lease-secret", &session.secret)
            .json(&json!({"holder": "leasebench", "session": session.id}))
            .send()
            .await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        match status.as_u16() {
            201 => {
                let grant: serde_json::Value = serde_json::from_slice(&body)?;
                let secret = grant["secret"]
                    .as_str()
                    .with_context(|| format!("a grant without a secret: {grant}"))?;
                Ok(Some(ProxyGrant {
                    resource: resource.to_owned(),
                    secret: secret.to_owned(),
                }))
            }
            409 => Ok(None),
            _ => bail!(
                "acquire of {resource} under session {} answered {status}: {}",
                session.id,
                String::from_utf8_lossy(&body)
            ),
        }
    }

    async fn renew_in(&self, session: &ProxySession, _: &ProxyGrant) -> anyhow::Result<()> {
        self.keepalive(session).await
    }

    async fn release_in(&self, grant: &ProxyGrant) -> anyhow::Result<()> {
        let path = format!("/v1/leases/{}", grant.resource);
        self.with_secret(reqwest::Method::DELETE, &path, &grant.secret, 204)
            .await
    }

    async fn keepalive(&self, session: &ProxySession) -> anyhow::Result<()> {
        let path = format!("/v1/sessions/{}/keepalive", session.id);
        self.with_secret(reqwest::Method::POST, &path, &session.secret, 200)
            .await
    }

    async fn close(&self, session: &ProxySession) -> anyhow::Result<()> {
        let path = format!("/v1/sessions/{}", session.id);
        self.with_secret(reqwest::Method::DELETE, &path, &session.secret, 204)
            .await
    }
}

impl Proxy {
    /// The resources held under `session`, from `GET /v1/sessions/{id}`; `None` when the session
    /// has ended.
    pub(crate) async fn session_resources(
        &self,
        session: &ProxySession,
    ) -> anyhow::Result<Option<usize>> {
        let resp = self
            .request(
                reqwest::Method::GET,
                &format!("/v1/sessions/{}", session.id),
            )
            .send()
            .await?;
        let status = resp.status();
        let body: serde_json::Value = resp.json().await?;
        match status.as_u16() {
            200 => Ok(Some(
                body["resources"]
                    .as_array()
                    .with_context(|| format!("session view without resources: {body}"))?
                    .len(),
            )),
            404 => Ok(None),
            _ => bail!("session {} answered {status}: {body}", session.id),
        }
    }
}

impl SessionBackend for RawEtcd {
    /// The session's lease.
    type Session = i64;
    /// The resource and its key's create revision.
    type Grant = (String, i64);

    async fn open(&self, ttl: u64) -> anyhow::Result<i64> {
        self.grant(ttl).await
    }

    async fn acquire_in(
        &self,
        lease: &i64,
        resource: &str,
    ) -> anyhow::Result<Option<(String, i64)>> {
        Ok(self
            .create(resource, *lease)
            .await?
            .map(|revision| (resource.to_owned(), revision)))
    }

    async fn renew_in(&self, lease: &i64, _: &(String, i64)) -> anyhow::Result<()> {
        self.keep_alive(*lease).await
    }

    async fn release_in(&self, (resource, revision): &(String, i64)) -> anyhow::Result<()> {
        self.delete_created(resource, *revision).await
    }

    async fn keepalive(&self, lease: &i64) -> anyhow::Result<()> {
        self.keep_alive(*lease).await
    }

    async fn close(&self, lease: &i64) -> anyhow::Result<()> {
        self.revoke(*lease).await
    }
}

/// Sessions seen as leases, so the single-lease drivers (closed-loop `renew`, the open-loop
/// sustained schedule) can keep them alive: a renewal is a session keepalive. Sessions are
/// opened with [`open_all`], not acquired.
pub(crate) struct Heartbeats<S>(pub(crate) Arc<S>);

impl<S: SessionBackend> Backend for Heartbeats<S> {
    type Held = S::Session;

    async fn acquire(&self, resource: String, _ttl: u64) -> anyhow::Result<Option<S::Session>> {
        bail!("sessions are opened, not acquired ({resource})")
    }

    async fn renew(&self, session: &S::Session) -> anyhow::Result<()> {
        self.0.keepalive(session).await
    }

    async fn read(&self, _session: &S::Session) -> anyhow::Result<()> {
        bail!("a session holds no one resource to read")
    }

    async fn release(&self, session: &S::Session) -> anyhow::Result<()> {
        self.0.close(session).await
    }
}

/// Opens `n` sessions of `ttl` seconds on `in_flight` workers, untimed.
pub(crate) async fn open_all<S: SessionBackend>(
    backend: &Arc<S>,
    n: usize,
    ttl: u64,
    in_flight: usize,
) -> anyhow::Result<Vec<S::Session>> {
    let mut sessions = Vec::with_capacity(n);
    let mut opening =
        futures::stream::iter((0..n).map(|_| backend.open(ttl))).buffer_unordered(in_flight.max(1));
    while let Some(s) = opening.next().await {
        sessions.push(s?);
    }
    Ok(sessions)
}

/// Closes every session in `sessions` on `in_flight` workers, untimed.
pub(crate) async fn close_all<S: SessionBackend>(
    backend: &Arc<S>,
    sessions: &[S::Session],
    in_flight: usize,
) -> anyhow::Result<()> {
    let mut closing =
        futures::stream::iter((0..sessions.len()).map(|i| backend.close(&sessions[i])))
            .buffer_unordered(in_flight.max(1));
    while let Some(r) = closing.next().await {
        r?;
    }
    Ok(())
}

/// `session-acquire` (`cycle` `None`): `in_flight` workers each open one session (untimed)
/// and acquire their share of `ops` distinct resources under it back to back; the sessions are
/// closed afterwards (untimed), which ends their grants. `session-cycle` (`cycle` =
/// `Some(renewals)`): each operation is acquire → `renewals` renewals → release of one resource
/// under the worker's session.
pub(crate) async fn measure<S: SessionBackend>(
    backend: &Arc<S>,
    in_flight: usize,
    ops: usize,
    cycle: Option<usize>,
    tag: &str,
) -> anyhow::Result<Run> {
    let sessions = Arc::new(open_all(backend, in_flight.max(1), 600, 64).await?);
    let run = ops::closed_loop(in_flight, ops, {
        let (backend, sessions, tag) = (backend.clone(), sessions.clone(), tag.to_owned());
        move |w, i| {
            let (backend, sessions) = (backend.clone(), sessions.clone());
            let resource = format!("lb-{tag}-{w}-{i}");
            async move {
                let session = sessions.get(w).context("a worker without a session")?;
                let grant = backend
                    .acquire_in(session, &resource)
                    .await?
                    .with_context(|| format!("a fresh resource {resource} was held"))?;
                if let Some(renewals) = cycle {
                    for _ in 0..renewals {
                        backend.renew_in(session, &grant).await?;
                    }
                    backend.release_in(&grant).await?;
                }
                Ok(())
            }
        }
    })
    .await?;
    close_all(backend, &sessions, 64).await?;
    Ok(run)
}
