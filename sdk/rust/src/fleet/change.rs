//! What a member's assignment stream carries: each change ([`AssignmentChange`]), the
//! hand-offs in it ([`Releasing`]), the stream itself ([`Assignments`]), and what a fleet
//! grant's guard and its hand-off share ([`Grip`]): the grant is given back once for both, and
//! only while the member still holds it.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tokio::time::Instant;

use super::book::MemberState;
use super::member::Shared;
use crate::liveness::{Liveness, LostReason};
use crate::{Client, Lease, Result};

/// One change of a member's assignment, as its [`crate::Member::assignments`] stream yields it.
#[derive(Debug)]
#[non_exhaustive]
pub struct AssignmentChange {
    /// The assignment's revision: it rises with every change.
    pub revision: u64,
    /// Where the member stands.
    pub state: MemberState,
    /// Every resource held and assigned now, in name order.
    pub held: Vec<String>,
    /// Newly granted: a guard each, lost when the resource leaves `held`, the session ends or
    /// the client's event stream tells its grant ended. Dropping one gives the resource back
    /// only once it was handed off; [`Lease::release`] gives it back at once (the service
    /// grants it again, usually to this member, under a new token).
    pub added: Vec<Lease>,
    /// Moved to another member: each guard was lost ([`LostReason::HandedOff`]); finish and
    /// release by its deadline, or the service revokes it then.
    pub releasing: Vec<Releasing>,
    /// Lost without a hand-off (revoked, the member evicted): their guards were lost
    /// ([`LostReason::Revoked`]).
    pub removed: Vec<String>,
    /// The first change under a new session, after the old one ended ([`crate::JoinOptions::rejoin`]):
    /// every guard of the old one was lost ([`LostReason::SessionLost`]).
    pub rejoined: bool,
}

/// A resource moved away from the member: finish with it by [`Releasing::deadline`], then
/// release it ([`Releasing::release`], or drop its [`Lease`]).
#[derive(Debug)]
pub struct Releasing {
    pub(super) client: Client,
    pub(super) grip: Arc<Grip>,
    pub(super) deadline: Instant,
}

impl Releasing {
    /// The resource.
    pub fn resource(&self) -> &str {
        &self.grip.resource
    }

    /// The token of the grant to release.
    pub fn token(&self) -> u64 {
        self.grip.token
    }

    /// When the work on it must be finished and the resource released, on the monotonic clock:
    /// the answer's arrival plus the service's `deadline_ms`, less a safety margin (a tenth of
    /// it, at least 100 ms). After the service's deadline it revokes the grant.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Releases the grant (once for it and its guard together; nothing is sent when the
    /// member no longer holds it).
    pub async fn release(&self) -> Result<()> {
        self.grip.give_back(&self.client).await
    }
}

/// What a fleet grant's guard and its [`Releasing`] entry share: the grant, its liveness, and
/// whether it was given back.
#[derive(Debug)]
pub(crate) struct Grip {
    pub(super) resource: String,
    pub(super) token: u64,
    /// The session's secret, which proves a fleet grant.
    pub(super) secret: String,
    pub(super) liveness: Arc<Liveness>,
    pub(super) released: AtomicBool,
    /// Whether its guard still exists (a hand-off of a grant nobody guards is released at once).
    pub(super) guarded: AtomicBool,
    pub(super) member: Weak<Shared>,
}

impl Grip {
    /// Its guard was dropped: a grant handed off is given back now, one still assigned stays
    /// the member's (nothing is sent).
    pub(crate) fn unguard(self: Arc<Self>, client: Client) {
        self.guarded.store(false, Ordering::SeqCst);
        if self.liveness.reason() == Some(LostReason::HandedOff) {
            tokio::spawn(async move { self.give_back(&client).await });
        }
    }

    /// Releases the grant once, if the member still holds it: a session's secret proves every
    /// grant under the session, so a release sent for a grant that already ended could end a
    /// later grant of the same resource to this member.
    pub(crate) async fn give_back(&self, client: &Client) -> Result<()> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let ours = self.member.upgrade().is_some_and(|member| {
            member
                .lock()
                .grips
                .get(&self.resource)
                .is_some_and(|g| std::ptr::eq(g.as_ref(), self))
        });
        if !ours {
            return Ok(());
        }
        client.release(&self.resource, &self.secret).await
    }
}

/// The stream of a member's assignment changes ([`crate::Member::assignments`]). It ends after the
/// member has ended: evicted (the last change says so), left, or failed — then its last item
/// is the error: [`crate::Error::SessionLost`] or 404 `no-member` (the session ended, without
/// [`crate::JoinOptions::rejoin`]), 404 `no-fleet` (the fleet was deleted), 403 `not-member` (another
/// session took the member's name).
pub struct Assignments {
    inner: BoxStream<'static, Result<AssignmentChange>>,
}

impl Assignments {
    pub(super) fn new(inner: BoxStream<'static, Result<AssignmentChange>>) -> Self {
        Self { inner }
    }
}

impl std::fmt::Debug for Assignments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assignments").finish_non_exhaustive()
    }
}

impl Stream for Assignments {
    type Item = Result<AssignmentChange>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}
