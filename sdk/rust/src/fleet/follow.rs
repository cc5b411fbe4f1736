//! The member's task: the long poll of its assignment, each view taken in ([`Shared::apply`]:
//! the book's plan acted on — guards made, lost, handed off, released), a session that ended
//! reported or replaced by a new join, the member ended.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::admin::member_path;
use super::book::{HeldGrant, MemberState, View};
use super::change::{AssignmentChange, Grip, Releasing};
use super::member::{join, Inner, Shared};
use crate::client::LEASE_SECRET;
use crate::liveness::{Liveness, LostReason};
use crate::model::whole_seconds;
use crate::upkeep::Upkeep;
use crate::{Error, Grant, Lease, Result, Session};

/// First pause before reading (or joining) again after a transient failure.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// Longest such pause.
const MAX_PAUSE: Duration = Duration::from_secs(2);

impl Shared {
    /// The session's secret, while it has one.
    pub(super) fn secret(&self) -> Option<String> {
        self.lock().session.as_ref().map(|s| s.secret().to_owned())
    }

    /// The session's `lost` token and secret, while it has one.
    fn session_handles(&self) -> Option<(CancellationToken, String)> {
        let inner = self.lock();
        let session = inner.session.as_ref()?;
        Some((session.lost(), session.secret().to_owned()))
    }

    /// One read of the assignment: at once (`after` `None`), or once it passes `after`,
    /// waiting up to the poll time. With the instant the answer arrived.
    async fn read(&self, after: Option<u64>, secret: &str) -> Result<(View, Instant)> {
        let client = &self.client;
        let mut req = client
            .request(Method::GET, &member_path(&self.fleet, &self.opts.member))
            .header(LEASE_SECRET, secret);
        if let Some(after) = after {
            let wait_ms = u64::try_from(self.opts.poll.as_millis()).unwrap_or(u64::MAX);
            req = req
                .query(&[("after", after), ("wait_ms", wait_ms)])
                .timeout(client.timeout() + self.opts.poll);
        }
        let view: View = client.call(req).await?;
        Ok((view, Instant::now()))
    }

    /// Takes in `view` (arrived at `received`): the guards it adds, hands off and removes, as
    /// one change.
    fn apply(self: &Arc<Self>, view: &View, received: Instant, rejoined: bool) -> AssignmentChange {
        let mut inner = self.lock();
        let plan = inner.book.apply(view);
        inner.state = Some(view.state);
        inner.held = plan.held.clone();
        let mut change = AssignmentChange {
            revision: view.revision,
            state: view.state,
            held: plan.held,
            added: Vec::new(),
            releasing: Vec::new(),
            removed: Vec::new(),
            rejoined,
        };
        for gone in plan.removed {
            if let Some(grip) = inner.grips.remove(&gone.resource) {
                grip.liveness.lose(LostReason::Revoked);
            }
            change.removed.push(gone.resource);
        }
        for moved in plan.handed_off {
            if let Some(grip) = inner.grips.get(&moved.grant.resource) {
                grip.liveness.lose(LostReason::HandedOff);
                if !grip.guarded.load(Ordering::SeqCst) {
                    // Nobody works on it: give it back now.
                    let (grip, client) = (grip.clone(), self.client.clone());
                    tokio::spawn(async move { grip.give_back(&client).await });
                }
                change.releasing.push(Releasing {
                    client: self.client.clone(),
                    grip: grip.clone(),
                    deadline: releasing_deadline(received, moved.deadline_ms),
                });
            }
        }
        let Some(session) = inner.session.as_ref() else {
            return change;
        };
        let secret = session.secret().to_owned();
        for resource in plan.release_now {
            let (client, secret) = (self.client.clone(), secret.clone());
            tokio::spawn(async move { client.release(&resource, &secret).await });
        }
        let leases: Vec<(Arc<Grip>, Lease)> = plan
            .added
            .into_iter()
            .map(|h| self.guard(session, h))
            .collect();
        for (grip, lease) in leases {
            inner.grips.insert(grip.resource.clone(), grip);
            change.added.push(lease);
        }
        let Inner { book, grips, .. } = &mut *inner;
        grips.retain(|resource, grip| book.holds(resource, grip.token));
        change
    }

    /// The guard of a held grant: it lives on the member's session, proven by its secret.
    fn guard(self: &Arc<Self>, session: &Session, h: HeldGrant) -> (Arc<Grip>, Lease) {
        let grant = Grant {
            resource: h.resource,
            holder: self.opts.member.clone(),
            lease_id: h.lease_id,
            secret: session.secret().to_owned(),
            token: h.token,
            fencing_token: h.fencing_token,
            ttl_seconds: whole_seconds(self.opts.ttl),
            expires_in_ms: 0,
            session: Some(session.id().to_owned()),
            metadata: None,
        };
        let liveness = Liveness::under(session.liveness());
        let grip = Arc::new(Grip {
            resource: grant.resource.clone(),
            token: grant.token,
            secret: grant.secret.clone(),
            liveness: liveness.clone(),
            released: AtomicBool::new(false),
            guarded: AtomicBool::new(true),
            member: Arc::downgrade(self),
        });
        let lease = Lease::in_fleet(
            self.client.clone(),
            grant,
            Upkeep::new(liveness),
            grip.clone(),
        );
        (grip, lease)
    }

    /// The session ended on the server (or was lost here): its guards are lost with it.
    fn lose_session(&self) {
        if let Some(session) = &self.lock().session {
            session.liveness().lose(LostReason::Revoked);
        }
    }

    /// Joins again under the same name, retrying transient failures; the old session's grants
    /// are forgotten (its guards were lost with it).
    async fn rejoin(&self, stop: &CancellationToken) -> Result<()> {
        let mut pause = FIRST_PAUSE;
        loop {
            match join(&self.client, &self.fleet, &self.opts).await {
                Ok(session) => {
                    let mut inner = self.lock();
                    if inner.session.is_none() {
                        return Ok(()); // left meanwhile: `session` is dropped, so closed
                    }
                    inner.session = Some(session);
                    inner.book.clear();
                    inner.grips.clear();
                    return Ok(());
                }
                Err(e) if e.reconnects_watch() => {
                    tokio::select! {
                        () = stop.cancelled() => return Ok(()),
                        () = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The member has ended: its session is closed (every grant under it ends).
    async fn end(&self) {
        self.ended.cancel();
        let session = self.lock().session.take();
        if let Some(session) = session {
            let _ = session.close().await;
        }
    }
}

/// Whether a read's failure means the member's session has ended.
fn session_ended(e: &Error) -> bool {
    matches!(e, Error::SessionLost) || e.slug() == Some("no-member")
}

/// The deadline of a hand-off told `deadline_ms` before the service revokes it, in an answer
/// that arrived at `received`: less a margin of a tenth of it, at least 100 ms.
fn releasing_deadline(received: Instant, deadline_ms: u64) -> Instant {
    let left = Duration::from_millis(deadline_ms);
    let margin = (left / 10).max(Duration::from_millis(100));
    received + left.saturating_sub(margin)
}

/// The member's task: reads its assignment until it ends, sending each change on `tx`.
pub(super) async fn follow(
    shared: Arc<Shared>,
    stop: CancellationToken,
    tx: mpsc::UnboundedSender<Result<AssignmentChange>>,
) {
    let mut after = None;
    let mut pause = FIRST_PAUSE;
    let mut rejoined = false;
    loop {
        let Some((lost, secret)) = shared.session_handles() else {
            return; // left
        };
        let answer = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = lost.cancelled() => Err(Error::SessionLost),
            answer = shared.read(after, &secret) => answer,
        };
        let failure = match answer {
            Ok((view, received)) => {
                pause = FIRST_PAUSE;
                if after.is_some_and(|a| view.revision <= a) {
                    continue; // the wait ended without a change
                }
                after = Some(view.revision);
                let change = shared.apply(&view, received, std::mem::take(&mut rejoined));
                let evicted = change.state == MemberState::Evicted;
                let _ = tx.send(Ok(change));
                if evicted {
                    shared.end().await;
                    return;
                }
                continue;
            }
            Err(e) if session_ended(&e) => {
                shared.lose_session();
                if !shared.opts.rejoin {
                    e
                } else {
                    match shared.rejoin(&stop).await {
                        Ok(()) => {
                            after = None;
                            rejoined = true;
                            continue;
                        }
                        Err(e) => e,
                    }
                }
            }
            Err(e) if e.reconnects_watch() => {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(MAX_PAUSE);
                continue;
            }
            Err(e) => e,
        };
        let _ = tx.send(Err(failure));
        shared.end().await;
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_off_deadline_keeps_a_margin() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(releasing_deadline(now, 5000), now + ms(4500));
        assert_eq!(releasing_deadline(now, 500), now + ms(400));
        assert_eq!(releasing_deadline(now, 50), now);
        assert_eq!(releasing_deadline(now, 0), now);
    }
}
