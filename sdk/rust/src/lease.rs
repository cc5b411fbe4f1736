//! The lease guard: a grant kept alive by a background task, with the `lost` signal, forward
//! and release (explicit or on drop).

use bytes::Bytes;
use reqwest::Method;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use crate::fleet::Grip;
use crate::liveness::LostReason;
use crate::loss_watch::Registration;
use crate::renewal::Target;
use crate::test_mode::{self, Fault};
use crate::upkeep::{lifetime, Upkeep};
use crate::{AcquireOptions, Client, Error, Grant, Result};

/// A held resource. Renews itself in the background (at a third of the TTL, ±10 %), says when it
/// is lost — no later than its conservative deadline — and is released when dropped.
///
/// Check [`Lease::is_lost`] (or select on [`Lease::lost`]) before every action the lease
/// protects, and present [`Lease::fencing_token`] to the storage so that a write made after
/// the loss anyway is refused there.
///
/// A fleet's grant ([`crate::AssignmentChange::added`]) lives on its member's session and is
/// not renewed on its own; dropped, it is released only once it was handed off (a grant still
/// assigned stays the member's); [`Lease::release`] gives it back at once.
#[derive(Debug)]
pub struct Lease {
    client: Client,
    grant: Grant,
    upkeep: Upkeep,
    released: bool,
    /// A fleet grant's: released through its member, once for the guard and its hand-off.
    grip: Option<Arc<Grip>>,
    /// The client's loss watch follows the grant while this is kept.
    _watched: Option<Registration>,
}

impl Client {
    /// Acquires `resource` and returns a guard that keeps it (see [`Lease`]). The deadline
    /// counts from the instant read just before the request that succeeded was sent: its
    /// `expires_in_ms`, but no more than its `ttl_seconds` plus the wait allowed. An answer
    /// with `ttl_seconds` 0 gives a guard already lost ([`LostReason::Expired`]), not renewed
    /// (still released when dropped).
    pub async fn acquire(&self, resource: &str, opts: AcquireOptions) -> Result<Lease> {
        let (grant, sent) = self.grant_sent(resource, &opts).await?;
        let granted_for = lifetime(
            grant.ttl_seconds,
            grant.expires_in_ms,
            opts.wait.unwrap_or_default(),
        );
        let upkeep = Upkeep::granted(sent, granted_for, self.safety_margin());
        let lease = Lease::new(self.clone(), grant, upkeep);
        lease.upkeep.renew(
            self.clone(),
            Target::Grant {
                resource: lease.grant.resource.clone(),
                secret: lease.grant.secret.clone(),
            },
            granted_for,
            sent,
        );
        Ok(lease)
    }
}

impl Lease {
    /// A guard for `grant` whose state is `upkeep` (renewed by whoever made it).
    pub(crate) fn new(client: Client, grant: Grant, upkeep: Upkeep) -> Self {
        let watched =
            client
                .losses()
                .register(&client, &grant.resource, grant.token, upkeep.liveness());
        Self {
            client,
            grant,
            upkeep,
            released: false,
            grip: None,
            _watched: watched,
        }
    }

    /// A fleet grant's grip.
    pub(crate) fn grip(&self) -> Option<Arc<Grip>> {
        self.grip.clone()
    }

    /// The guard of a fleet grant, living on its member's session.
    pub(crate) fn in_fleet(client: Client, grant: Grant, upkeep: Upkeep, grip: Arc<Grip>) -> Self {
        let mut lease = Self::new(client, grant, upkeep);
        lease.grip = Some(grip);
        lease
    }

    /// The resource held.
    pub fn resource(&self) -> &str {
        &self.grant.resource
    }

    /// The holder named in the grant.
    pub fn holder(&self) -> &str {
        &self.grant.holder
    }

    /// The etcd lease id (decimal; the session id under a session).
    pub fn lease_id(&self) -> &str {
        &self.grant.lease_id
    }

    /// The fencing token's revision: larger for every later grant of the resource.
    pub fn token(&self) -> u64 {
        self.grant.token
    }

    /// The signed fencing token, for the `Fencing-Token` header of writes to protected storage.
    pub fn fencing_token(&self) -> &str {
        &self.grant.fencing_token
    }

    /// The grant's secret (`Lease-Secret`).
    pub fn secret(&self) -> &str {
        &self.grant.secret
    }

    /// The grant as the proxy answered it.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// The stop-by deadline on the monotonic clock: the instant read before sending the last
    /// successful acquire or renewal, plus the lifetime it granted, less the client's safety
    /// margin ([`crate::ClientBuilder::safety_margin`]) — so the lease is held at least until
    /// then, with the margin to spare, unless reported lost earlier. Moves on with every
    /// successful renewal.
    pub fn deadline(&self) -> Instant {
        self.upkeep.deadline()
    }

    /// Whether the lease is lost. Reads the clock: past the deadline this is `true` even if no
    /// background task has run since (say, the process was stopped and resumed).
    pub fn is_lost(&self) -> bool {
        self.upkeep.is_lost()
    }

    /// A token cancelled when the lease is lost (for `select!`, or to derive child tokens).
    pub fn lost(&self) -> CancellationToken {
        self.upkeep.lost()
    }

    /// Waits until the lease is lost and says why.
    pub async fn lost_reason(&self) -> LostReason {
        self.upkeep.lost_reason().await
    }

    /// Whether the lease is lost and the client's test mode caused it
    /// ([`crate::ClientBuilder::test_mode`]; for a lease under a session, the session's loss).
    /// `false` while it is held, and for every real loss.
    pub fn lost_injected(&self) -> bool {
        self.upkeep.liveness().injected()
    }

    /// Sends a request through the proxy's forward route to its upstream, which receives it
    /// with this grant's fencing token. [`Error::Lost`] without sending when the lease is lost.
    /// The answer is the upstream's, whatever its status (under the test mode, an injected
    /// token refusal is fence-gateway's 409, nothing sent: [`crate::Fault::TokenRefusal`]).
    pub async fn forward(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<reqwest::Response> {
        if self.is_lost() {
            return Err(Error::Lost);
        }
        if self.client.injects(Fault::TokenRefusal, self.resource()) {
            return Ok(test_mode::refusal_response(self.resource()));
        }
        let mut req = self.forward_request_unchecked(method, path);
        if let Some(body) = body {
            req = req.body(body);
        }
        Ok(req.send().await?)
    }

    /// The request [`Lease::forward`] sends, to add headers or a JSON body to before sending it
    /// ([`Client::forward_request`]). [`Error::Lost`] when the lease is lost (under the test
    /// mode, an injected token refusal is fence-gateway's 409 problem as an [`Error::Problem`]).
    pub fn forward_request(&self, method: Method, path: &str) -> Result<reqwest::RequestBuilder> {
        self.refuse_unless_held()?;
        Ok(self.forward_request_unchecked(method, path))
    }

    fn forward_request_unchecked(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .forward_request(&self.grant.resource, &self.grant.secret, method, path)
    }

    /// [`Error::Lost`] when the lease is lost; under the test mode, at the rate set, the token
    /// refused as stale ([`crate::Fault::TokenRefusal`]). For what sends the token.
    pub(crate) fn refuse_unless_held(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::Lost);
        }
        if self.client.injects(Fault::TokenRefusal, self.resource()) {
            return Err(test_mode::refusal_error(self.resource()));
        }
        Ok(())
    }

    /// Stops renewing, marks the lease lost ([`LostReason::Released`]) and releases it.
    /// A fleet grant's guard gives the resource back to the service (which grants it again,
    /// usually to the same member under a new token), and sends nothing once the member no
    /// longer holds it (handed off and released already, or revoked).
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        self.upkeep.end();
        if let Some(grip) = self.grip.take() {
            return grip.give_back(&self.client).await;
        }
        self.client
            .release(&self.grant.resource, &self.grant.secret)
            .await
    }

    /// Test hook: stop (`true`) or resume (`false`) sending renewals, as if the process were
    /// stopped; the deadline timer keeps running.
    #[doc(hidden)]
    pub fn pause_renewals(&self, paused: bool) {
        self.upkeep.pause(paused);
    }
}

impl Drop for Lease {
    /// Not released yet: stops renewing, marks it lost and sends the release from a task on the
    /// current Tokio runtime (never blocks; without a runtime the lease simply expires).
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.upkeep.end();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            if let Some(grip) = self.grip.take() {
                let _enter = runtime.enter();
                grip.unguard(client);
                return;
            }
            let resource = std::mem::take(&mut self.grant.resource);
            let secret = std::mem::take(&mut self.grant.secret);
            runtime.spawn(async move { client.release(&resource, &secret).await });
        }
    }
}
