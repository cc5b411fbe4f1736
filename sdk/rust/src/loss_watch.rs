//! The loss watch: one `GET /v1/watch` stream per client, covering the resources its guards
//! hold, so that a guard learns of its loss when the proxy sees it (a revoked or expired etcd
//! lease, a release by someone else, a later grant) instead of at its next renewal. The renewal
//! stays the fallback: when the stream cannot be opened (the principal may not `read` the
//! resources, say), renewals still find every loss.
//!
//! The shape, the same in every SDK:
//! - one stream per client, opened when a guard first registers a grant, closed [`LINGER`]
//!   after the last one went; its prefix is the longest one every held resource starts with;
//! - it reads after the smallest token of the grants it must cover (a bare revision as
//!   `Last-Event-ID`: nothing of theirs is missed), then resumes after the last id it saw; a
//!   grant it does not cover (another prefix, an older token) reopens it, resuming from the
//!   smaller of the two;
//! - events are matched by resource and token (`losses.rs`); a grant registered after its end
//!   was read is lost at once (recent events are kept);
//! - transient failures reconnect with a backoff (100 ms doubling to 5 s, [`EventStream`]); a
//!   resume point compacted away reopens the stream from now (renewals cover the gap); a refusal
//!   (401, 403, …) stops it for [`REFUSED_PAUSE`].

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::liveness::{Liveness, LostReason};
use crate::losses::{Book, Coverage, Loss};
use crate::{Client, Error, Event, EventStream};

/// How long the stream stays open once nothing is held (a holder that releases and acquires
/// again soon keeps one stream).
const LINGER: Duration = Duration::from_secs(10);
/// How long a refused stream is not tried again (renewals alone find losses meanwhile).
const REFUSED_PAUSE: Duration = Duration::from_secs(60);

/// Whom a loss is told to: the grant's liveness, and its session's for a grant under one.
#[derive(Clone)]
struct Target {
    lease: Arc<Liveness>,
    session: Option<Arc<Liveness>>,
}

impl Target {
    /// An event ended the grant: its guard is lost (`Revoked`); an expiry of a grant under a
    /// session means the session's lease ended, so the session is lost (its leases with it). A
    /// guard already past its deadline (a process paused, the event read on resuming) was lost
    /// first by that (`Expired`).
    fn lose(&self, how: Loss) {
        if self.lease.check() {
            return;
        }
        match (&self.session, how) {
            (Some(session), Loss::Expired) => session.lose(LostReason::Revoked),
            _ => self.lease.lose(LostReason::Revoked),
        }
    }
}

struct Shared {
    book: Book<Target>,
    running: bool,
    refused_until: Option<Instant>,
}

/// A client's loss watch (see the module doc).
pub(crate) struct LossWatch {
    enabled: bool,
    shared: Mutex<Shared>,
    changed: Notify,
}

impl std::fmt::Debug for LossWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LossWatch")
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

/// A registered grant; dropping it deregisters it.
#[derive(Debug)]
pub(crate) struct Registration {
    watch: Arc<LossWatch>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.watch.lock().book.deregister(self.id);
        self.watch.changed.notify_one();
    }
}

impl LossWatch {
    pub(crate) fn new(enabled: bool) -> Arc<Self> {
        Arc::new(Self {
            enabled,
            shared: Mutex::new(Shared {
                book: Book::new(),
                running: false,
                refused_until: None,
            }),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Watches the grant of `resource` with `token` for `lease`'s guard until the registration
    /// is dropped; starts the stream if none runs. `None` when disabled, outside a Tokio
    /// runtime, or when an event already read ended the grant (then `lease` is lost now).
    pub(crate) fn register(
        self: &Arc<Self>,
        client: &Client,
        resource: &str,
        token: u64,
        lease: &Arc<Liveness>,
    ) -> Option<Registration> {
        if !self.enabled || lease.check() {
            return None;
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let target = Target {
            lease: lease.clone(),
            session: lease.session().cloned(),
        };
        let mut shared = self.lock();
        let (id, ended) = shared.book.register(resource, token, target.clone());
        if let Some(how) = ended {
            drop(shared);
            target.lose(how);
            return None;
        }
        let start = !shared.running
            && shared
                .refused_until
                .is_none_or(|until| Instant::now() >= until);
        shared.running |= start;
        drop(shared);
        if start {
            runtime.spawn(self.clone().run(client.clone()));
        } else {
            self.changed.notify_one();
        }
        Some(Registration {
            watch: self.clone(),
            id,
        })
    }

    /// The watch's task: streams while grants are held, lingers, stops.
    async fn run(self: Arc<Self>, client: Client) {
        let mut last: Option<String> = None;
        loop {
            if !self.linger().await {
                return;
            }
            let stream = {
                let mut shared = self.lock();
                let Some(wanted) = shared.book.wanted() else {
                    continue;
                };
                let resume = earliest(last.take(), shared.book.uncovered.take());
                shared.book.coverage = Some(Coverage {
                    prefix: wanted.prefix.clone(),
                    after: resume.as_deref().map(revision),
                });
                client.watch(&wanted.prefix, resume)
            };
            match self.read(stream).await {
                Ended::Reopen(at) => last = at,
                Ended::Compacted => last = None,
                Ended::Refused => {
                    let mut shared = self.lock();
                    shared.refused_until = Some(Instant::now() + REFUSED_PAUSE);
                    shared.running = false;
                    shared.book.coverage = None;
                    return;
                }
            }
        }
    }

    /// Waits while nothing is held, up to [`LINGER`]; `false` (the task ends) if still nothing.
    async fn linger(&self) -> bool {
        let until = Instant::now() + LINGER;
        loop {
            {
                let mut shared = self.lock();
                if !shared.book.is_empty() {
                    return true;
                }
                if Instant::now() >= until {
                    shared.running = false;
                    shared.book.coverage = None;
                    return false;
                }
            }
            tokio::select! {
                () = self.changed.notified() => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// Reads `stream` and tells losses until it must be reopened (nothing held, a grant it does
    /// not cover) or it ended.
    async fn read(&self, mut stream: EventStream) -> Ended {
        loop {
            let item = tokio::select! {
                item = stream.next() => item,
                () = self.changed.notified() => {
                    let mut shared = self.lock();
                    if let Some(coverage) = &mut shared.book.coverage {
                        if coverage.after.is_none() {
                            coverage.after = stream.last_event_id().map(revision);
                        }
                    }
                    if shared.book.is_empty() || shared.book.uncovered.is_some() {
                        shared.book.coverage = None;
                        return Ended::Reopen(stream.last_event_id().map(str::to_owned));
                    }
                    continue;
                }
            };
            match item {
                Some(Ok(event)) => self.tell(&event),
                Some(Err(Error::Protocol(_))) => {} // one bad event; the stream goes on
                Some(Err(Error::Compacted)) => return Ended::Compacted,
                Some(Err(_)) | None => return Ended::Refused,
            }
        }
    }

    /// Tells the guards whose grants `event` ended.
    fn tell(&self, event: &Event) {
        let lost = self
            .lock()
            .book
            .see(&event.resource, event.kind, event.token);
        for (target, how) in lost {
            target.lose(how);
        }
    }
}

/// Why a stream was left.
enum Ended {
    /// To open another, resuming after this id.
    Reopen(Option<String>),
    /// Its resume point left etcd's history: reopen from now.
    Compacted,
    /// Refused, or ended for good.
    Refused,
}

/// The revision of an event id (`R` or `R.n`); 0 for anything else (covers nothing).
fn revision(id: &str) -> u64 {
    id.split('.')
        .next()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// The earlier resume point of the id `last` and the bare revision `token`.
fn earliest(last: Option<String>, token: Option<u64>) -> Option<String> {
    match (last, token) {
        (Some(last), Some(token)) if token < revision(&last) => Some(token.to_string()),
        (Some(last), _) => Some(last),
        (None, token) => token.map(|t| t.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_resumes_from_the_earlier_point() {
        assert_eq!(earliest(None, None), None);
        assert_eq!(earliest(None, Some(7)).as_deref(), Some("7"));
        assert_eq!(earliest(Some("12.1".into()), None).as_deref(), Some("12.1"));
        assert_eq!(earliest(Some("12.1".into()), Some(9)).as_deref(), Some("9"));
        assert_eq!(
            earliest(Some("12.1".into()), Some(12)).as_deref(),
            Some("12.1")
        );
        assert_eq!(earliest(Some("12".into()), Some(30)).as_deref(), Some("12"));
        assert_eq!(
            (revision("41"), revision("41.3"), revision("x")),
            (41, 41, 0)
        );
    }
}
