//! A fleet member: its session, the long poll that follows its assignment and turns each view
//! into guards ([`Lease`]) and hand-offs ([`Releasing`]), drain and leave.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use reqwest::Method;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::admin::{fleet_path, member_path, Standing};
use super::book::{Book, MemberState};
use super::change::{AssignmentChange, Assignments, Grip};
use super::follow::follow;
use crate::client::LEASE_SECRET;
use crate::model::whole_seconds;
use crate::{Client, Error, Lease, Result, Session};

/// How long one long poll of the assignment waits for a change unless told otherwise.
const DEFAULT_POLL: Duration = Duration::from_secs(20);

/// How to join a fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinOptions {
    /// The member's name (the resource grammar). Joining with the name of a live member of the
    /// same principal replaces it, and what it held is granted to the new session first.
    pub member: String,
    /// The member's session TTL (whole seconds are sent; a fraction is rounded up).
    pub ttl: Duration,
    /// Its share's weight, 1 to 1000 (`None`: the service's default, 1).
    pub weight: Option<u32>,
    /// How long one long poll of the assignment waits for a change (at most the proxy's
    /// `--max-wait`; default 20 s).
    pub poll: Duration,
    /// Whether a member whose session ended (its TTL passed without a keepalive, its etcd
    /// lease revoked: the service answers 404 `no-member`) joins again under the same name
    /// (`true`), or ends, its assignment stream reporting the loss (`false`, the default).
    pub rejoin: bool,
}

impl JoinOptions {
    /// Join as `member` with session TTL `ttl`, weight 1, not rejoining.
    pub fn new(member: impl Into<String>, ttl: Duration) -> Self {
        Self {
            member: member.into(),
            ttl,
            weight: None,
            poll: DEFAULT_POLL,
            rejoin: false,
        }
    }

    /// Ask for a share of weight `weight`.
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = Some(weight);
        self
    }

    /// Long-poll the assignment `poll` at a time.
    pub fn poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Join again when the session ends (see [`JoinOptions::rejoin`]).
    pub fn rejoin(mut self, rejoin: bool) -> Self {
        self.rejoin = rejoin;
        self
    }
}

/// This process in a fleet: a session the service grants the fleet's resources under, kept
/// alive in the background, and a long poll of its assignment delivered as a stream of
/// [`AssignmentChange`]s. Dropping it closes the session (its grants end).
#[derive(Debug)]
pub struct Member {
    shared: Arc<Shared>,
    stop: CancellationToken,
    changes: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Result<AssignmentChange>>>>,
}
/// The member's state, shared by its handle, its task and its grants' grips.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(super) client: Client,
    pub(super) fleet: String,
    pub(super) opts: JoinOptions,
    inner: Mutex<Inner>,
    pub(super) ended: CancellationToken,
}

#[derive(Debug)]
pub(super) struct Inner {
    /// `None` once left.
    pub(super) session: Option<Session>,
    pub(super) book: Book,
    /// The grip of each grant handed out and still the member's.
    pub(super) grips: HashMap<String, Arc<Grip>>,
    pub(super) state: Option<MemberState>,
    pub(super) held: Vec<String>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `201` of a join.
#[derive(Debug, Deserialize)]
struct Joined {
    session_id: String,
    secret: String,
    ttl_seconds: u64,
    expires_in_ms: u64,
}

impl Client {
    /// Joins `fleet` as `opts.member`: a session kept alive at a third of its TTL, and a task
    /// following the member's assignment ([`Member::assignments`]).
    pub async fn join_fleet(&self, fleet: &str, opts: JoinOptions) -> Result<Member> {
        let session = join(self, fleet, &opts).await?;
        let shared = Arc::new(Shared {
            client: self.clone(),
            fleet: fleet.to_owned(),
            opts,
            inner: Mutex::new(Inner {
                session: Some(session),
                book: Book::default(),
                grips: HashMap::new(),
                state: None,
                held: Vec::new(),
            }),
            ended: CancellationToken::new(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        tokio::spawn(follow(shared.clone(), stop.clone(), tx));
        Ok(Member {
            shared,
            stop,
            changes: Arc::new(tokio::sync::Mutex::new(rx)),
        })
    }
}

/// `POST /v1/fleets/{fleet}/members`: the member's session, kept alive from here on.
pub(super) async fn join(client: &Client, fleet: &str, opts: &JoinOptions) -> Result<Session> {
    let mut body = json!({"member": opts.member, "ttl_seconds": whole_seconds(opts.ttl)});
    if let Some(weight) = opts.weight {
        body["weight"] = json!(weight);
    }
    let sent = Instant::now();
    let joined: Joined = client
        .call(
            client
                .request(Method::POST, &format!("{}/members", fleet_path(fleet)))
                .json(&body),
        )
        .await?;
    Ok(Session::kept(
        client.clone(),
        joined.session_id,
        joined.secret,
        opts.member.clone(),
        (joined.ttl_seconds, joined.expires_in_ms),
        sent,
    ))
}

impl Member {
    /// The fleet.
    pub fn fleet(&self) -> &str {
        &self.shared.fleet
    }

    /// The member's name.
    pub fn name(&self) -> &str {
        &self.shared.opts.member
    }

    /// The id of its session now (`None` once left); a rejoin changes it.
    pub fn session_id(&self) -> Option<String> {
        self.shared
            .lock()
            .session
            .as_ref()
            .map(|s| s.id().to_owned())
    }

    /// Where it stands as last read (`None` before the first read).
    pub fn state(&self) -> Option<MemberState> {
        self.shared.lock().state
    }

    /// What it holds and is assigned as last read, in name order.
    pub fn held(&self) -> Vec<String> {
        self.shared.lock().held.clone()
    }

    /// A token cancelled once the member has ended (left, evicted, or failed: see
    /// [`Assignments`]).
    pub fn ended(&self) -> CancellationToken {
        self.shared.ended.clone()
    }

    /// The changes of its assignment, from the first read on. Every call reads the same one
    /// queue: each change is yielded once, to whichever stream asks first. Changes wait in the
    /// queue until read (their guards with them).
    pub fn assignments(&self) -> Assignments {
        let changes = self.changes.clone();
        Assignments::new(
            futures::stream::unfold(changes, |changes| async move {
                let item = changes.lock().await.recv().await;
                item.map(|item| (item, changes))
            })
            .boxed(),
        )
    }

    /// Runs `work` for each resource granted, each in a task of its own, given its guard: it
    /// should stop when [`Lease::lost`] fires (handed off, revoked, the session lost). The
    /// resource is given back when `work` returns (if the member still holds it). Returns once
    /// the member has ended and every `work` has returned: `Ok` after an eviction, else why it
    /// ended.
    pub async fn serve<F, Fut>(&self, mut work: F) -> Result<()>
    where
        F: FnMut(Lease) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut changes = self.assignments();
        let mut running = tokio::task::JoinSet::new();
        let outcome = loop {
            tokio::select! {
                change = changes.next() => match change {
                    Some(Ok(change)) => {
                        for lease in change.added {
                            let (grip, client) = (lease.grip(), self.shared.client.clone());
                            let done = work(lease);
                            running.spawn(async move {
                                done.await;
                                if let Some(grip) = grip {
                                    let _ = grip.give_back(&client).await;
                                }
                            });
                        }
                    }
                    Some(Err(e)) => break Err(e),
                    None => break Ok(()),
                },
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        };
        while running.join_next().await.is_some() {}
        outcome
    }

    /// Asks the service to hand off everything the member holds and give it nothing new
    /// (`POST …/drain` with its session's secret); its assignment then shows each hand-off.
    /// Its state after the call.
    pub async fn drain(&self) -> Result<MemberState> {
        let secret = self.shared.secret().ok_or(Error::SessionLost)?;
        let client = &self.shared.client;
        let standing: Standing = client
            .call(
                client
                    .request(
                        Method::POST,
                        &format!("{}/drain", member_path(self.fleet(), self.name())),
                    )
                    .header(LEASE_SECRET, secret),
            )
            .await?;
        Ok(standing.state)
    }

    /// Leaves the fleet: stops following the assignment and closes the session, which ends
    /// every grant under it at once (its guards are lost, [`crate::LostReason::SessionLost`]).
    pub async fn leave(self) -> Result<()> {
        self.stop.cancel();
        let session = self.shared.lock().session.take();
        self.shared.ended.cancel();
        match session {
            Some(session) => session.close().await,
            None => Ok(()),
        }
    }
}

impl Drop for Member {
    /// Stops following the assignment and closes the session from a task (as [`Session`]'s
    /// drop does).
    fn drop(&mut self) {
        self.stop.cancel();
        let session = self.shared.lock().session.take();
        self.shared.ended.cancel();
        drop(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_options_default_to_reporting_a_lost_session() {
        let o = JoinOptions::new("robot-1", Duration::from_millis(2500));
        assert_eq!((o.poll, o.rejoin, o.weight), (DEFAULT_POLL, false, None));
        assert_eq!(whole_seconds(o.ttl), 3);
        let o = o.weight(3).poll(Duration::from_secs(1)).rejoin(true);
        assert_eq!((o.weight, o.rejoin), (Some(3), true));
    }
}
