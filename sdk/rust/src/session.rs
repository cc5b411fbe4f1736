//! Sessions: one etcd lease kept alive by one heartbeat, holding any number of resources. A
//! lease acquired under a session is lost when the session is.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::AcquireRequest;
use crate::liveness::{Liveness, LostReason};
use crate::renewal::Target;
use crate::upkeep::{lifetime, Upkeep};
use crate::{Client, Error, Lease, Result, SessionAcquireOptions};

/// An open session, kept alive in the background (at a third of its TTL, ±10 %). Its leases
/// live on the session's etcd lease: they need no renewal of their own, and are lost
/// ([`LostReason::SessionLost`]) when the session is. Closed when dropped.
#[derive(Debug)]
pub struct Session {
    client: Client,
    id: String,
    secret: String,
    holder: String,
    upkeep: Upkeep,
    closed: bool,
}

impl Client {
    /// Opens a session of `holder` with time to live `ttl` (whole seconds, rounded up) and
    /// keeps it alive until it is closed or dropped.
    pub async fn open_session(&self, holder: &str, ttl: Duration) -> Result<Session> {
        let ttl_seconds = crate::AcquireOptions::new(holder, ttl).ttl_seconds();
        let sent = Instant::now();
        let opened = self.open(holder, ttl_seconds).await?;
        Ok(Session::kept(
            self.clone(),
            opened.session_id,
            opened.secret,
            opened.holder,
            (opened.ttl_seconds, opened.expires_in_ms),
            sent,
        ))
    }
}

impl Session {
    /// The session `id` proven by `secret`, opened by a request sent at `sent` whose answer
    /// granted `(ttl_seconds, expires_in_ms)`, kept alive from now on.
    pub(crate) fn kept(
        client: Client,
        id: String,
        secret: String,
        holder: String,
        (ttl_seconds, expires_in_ms): (u64, u64),
        sent: Instant,
    ) -> Session {
        let granted_for = lifetime(ttl_seconds, expires_in_ms, Duration::ZERO);
        let session = Session {
            client: client.clone(),
            upkeep: Upkeep::granted(sent, granted_for, client.safety_margin()),
            id,
            secret,
            holder,
            closed: false,
        };
        session.upkeep.renew(
            client,
            Target::Session {
                id: session.id.clone(),
                secret: session.secret.clone(),
            },
            granted_for,
            sent,
        );
        session
    }

    /// Its state, which its leases' live under.
    pub(crate) fn liveness(&self) -> &std::sync::Arc<Liveness> {
        self.upkeep.liveness()
    }

    /// The session id (its etcd lease id, decimal).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The session's secret (`Lease-Secret` of its keepalive and of acquires under it).
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// Who opened it.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The stop-by deadline on the monotonic clock, as [`crate::Lease::deadline`]'s (also that
    /// of its leases).
    pub fn deadline(&self) -> Instant {
        self.upkeep.deadline()
    }

    /// Whether the session is lost (reads the clock, like [`Lease::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.upkeep.is_lost()
    }

    /// A token cancelled when the session is lost.
    pub fn lost(&self) -> CancellationToken {
        self.upkeep.lost()
    }

    /// Waits until the session is lost and says why.
    pub async fn lost_reason(&self) -> LostReason {
        self.upkeep.lost_reason().await
    }

    /// Whether the session is lost and the client's test mode caused it
    /// ([`crate::ClientBuilder::test_mode`]): `false` while it is held, and for a real loss.
    pub fn lost_injected(&self) -> bool {
        self.upkeep.liveness().injected()
    }

    /// Acquires `resource` under this session. [`Error::SessionLost`] when the session is lost
    /// (without asking the proxy if it already knows).
    pub async fn acquire(&self, resource: &str, opts: SessionAcquireOptions) -> Result<Lease> {
        if self.is_lost() {
            return Err(Error::SessionLost);
        }
        let answer = self
            .client
            .grant_with(
                resource,
                &AcquireRequest {
                    holder: opts.holder.as_deref().unwrap_or(&self.holder),
                    ttl_seconds: None,
                    wait: opts.wait,
                    idempotency_key: opts.idempotency_key.as_deref(),
                    metadata: opts.metadata.as_ref(),
                    session: Some((&self.id, &self.secret)),
                },
            )
            .await;
        match answer {
            Ok((grant, _)) => Ok(Lease::new(
                self.client.clone(),
                grant,
                Upkeep::new(Liveness::under(self.upkeep.liveness())),
            )),
            Err(Error::SessionLost) => {
                self.upkeep.liveness().lose(LostReason::Revoked);
                Err(Error::SessionLost)
            }
            Err(e) => Err(e),
        }
    }

    /// Stops the heartbeat, marks the session (and so its leases) lost and closes it, which
    /// ends every grant under it.
    pub async fn close(mut self) -> Result<()> {
        self.closed = true;
        self.upkeep.end();
        self.client.close(&self.id, &self.secret).await
    }

    /// Test hook: stop (`true`) or resume (`false`) sending keepalives; the deadline timer
    /// keeps running.
    #[doc(hidden)]
    pub fn pause_keepalives(&self, paused: bool) {
        self.upkeep.pause(paused);
    }
}

impl Drop for Session {
    /// Not closed yet: stops the heartbeat, marks it lost and closes it from a task on the
    /// current Tokio runtime (never blocks; without a runtime the session simply lapses).
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        self.upkeep.end();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let id = std::mem::take(&mut self.id);
            let secret = std::mem::take(&mut self.secret);
            runtime.spawn(async move { client.close(&id, &secret).await });
        }
    }
}
