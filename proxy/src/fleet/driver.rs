//! What makes a replica decide, and when: one task per replica that follows
//! - a watch of `{prefix}fleets/` (a spec, a member or an assignment changed; on every
//!   (re)opening, the fleets listed again and all decided),
//! - the creations and deletions of ownership keys (`lease::Changed`, from the replica's
//!   holder watch), mapped to the fleets naming the resource,
//! - each fleet's next hand-off deadline, and a resync of every fleet every [`RESYNC`] (what a
//!   lost event or a token-file reload would otherwise leave undecided).
//!
//! Beside it, a task finishes the fleets' ends that a replica began and did not finish.
//!
//! A fleet marked while its decision runs is decided once more after it, so a burst of events
//! costs one more decision, not one per event. Each decision waits a random moment of up to
//! [`JITTER`] first, so the replicas woken by one event seldom decide at once (when they do,
//! the compares settle it). Every change also wakes the fleet's long polls.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::WatchOptions;
use rand::Rng as _;
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::reconcile::Pass;
use super::Fleets;
use crate::etcd::reopening;
use crate::lease::Changed;
use crate::Result;

/// Every fleet is decided at least this often.
const RESYNC: Duration = Duration::from_secs(5);
/// A decision waits a random moment of up to this first.
const JITTER: Duration = Duration::from_millis(20);
/// A decision that failed is tried again after this.
const RETRY: Duration = Duration::from_millis(500);
/// A fleet's end still unfinished this long after it began is finished by whichever replica
/// sees it (its own replica has stopped, or stalls); ending 10,000 grants takes under a second.
const ENDING_GRACE: Duration = Duration::from_secs(10);

/// What the fleet watch reports.
enum Seen {
    /// This fleet's keys changed.
    Fleet(String),
    /// The watch was (re)opened: these are the fleets there are.
    All(Vec<String>),
}

/// Starts the replica's driver on `tracker`.
pub(super) fn start(fleets: Fleets, tracker: &TaskTracker) {
    let (seen, events) = mpsc::unbounded_channel();
    let watching = fleets.clone();
    let cancel = fleets.inner.stopping.clone();
    tracker.spawn(async move {
        reopening(cancel, || watch(&watching, &seen)).await;
    });
    let changes = fleets.inner.parts.leases.holder_changes();
    let fleets_for_ends = fleets.clone();
    let driver = Driver {
        fleets,
        tracker: tracker.clone(),
        known: HashMap::new(),
        index: HashMap::new(),
        dirty: BTreeSet::new(),
        running: HashSet::new(),
    };
    tracker.spawn(driver.run(events, changes));
    tracker.spawn(finish_ends(fleets_for_ends));
}

/// Every [`RESYNC`], finishes the fleets' ends a replica left half-way.
async fn finish_ends(fleets: Fleets) {
    let mut every = tokio::time::interval(RESYNC);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stopping = fleets.inner.stopping.clone();
    loop {
        tokio::select! {
            () = stopping.cancelled() => return,
            _ = every.tick() => {}
        }
        if let Err(e) = fleets.finish_ends(ENDING_GRACE).await {
            tracing::warn!(error = %e, "cannot finish the fleets' ends; trying again");
        }
    }
}

/// Lists the fleets, then follows the watch of their keys until it fails; whether it delivered.
async fn watch(fleets: &Fleets, seen: &mpsc::UnboundedSender<Seen>) -> bool {
    let prefix = fleets.inner.parts.layout.fleets().to_owned();
    let (keys, revision) = match fleets.inner.parts.etcd.list_keys(&prefix).await {
        Ok(listed) => listed,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the fleets");
            return false;
        }
    };
    let names: BTreeSet<String> = keys.iter().filter_map(|k| fleet_of(&prefix, k)).collect();
    let _ = seen.send(Seen::All(names.into_iter().collect()));
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision + 1);
    fleets
        .inner
        .parts
        .etcd
        .follow(&prefix, options, "fleet", |resp| {
            for event in resp.events() {
                if let Some(name) = event.kv().and_then(|kv| fleet_of(&prefix, kv.key())) {
                    let _ = seen.send(Seen::Fleet(name));
                }
            }
        })
        .await
}

/// The fleet a key under `{prefix}fleets/` belongs to.
fn fleet_of(prefix: &str, key: &[u8]) -> Option<String> {
    let rest = key.strip_prefix(prefix.as_bytes())?;
    let end = rest.iter().position(|&b| b == b'/')?;
    String::from_utf8(rest[..end].to_vec()).ok()
}

/// A fleet this replica knows of.
#[derive(Default)]
struct Known {
    /// Its resources, as last read.
    resources: Arc<BTreeSet<String>>,
    /// When to decide again (Unix ms), if a hand-off deadline is pending.
    due: Option<u64>,
    /// Whether a failed decision waits for its retry.
    retry_at: Option<Instant>,
}

struct Driver {
    fleets: Fleets,
    tracker: TaskTracker,
    known: HashMap<String, Known>,
    /// Resource → the fleets naming it.
    index: HashMap<String, Vec<String>>,
    dirty: BTreeSet<String>,
    running: HashSet<String>,
}

impl Driver {
    async fn run(
        mut self,
        mut seen: mpsc::UnboundedReceiver<Seen>,
        mut changes: broadcast::Receiver<Changed>,
    ) {
        let (done_tx, mut done) = mpsc::unbounded_channel::<(String, Result<Pass>)>();
        let mut resync = tokio::time::interval(RESYNC);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stopping = self.fleets.inner.stopping.clone();
        loop {
            let wake = self.next_wake();
            tokio::select! {
                () = stopping.cancelled() => return,
                Some(event) = seen.recv() => match event {
                    Seen::Fleet(name) => self.mark(&name),
                    Seen::All(names) => {
                        for name in names {
                            self.known.entry(name).or_default();
                        }
                        self.mark_all();
                    }
                },
                change = changes.recv() => match change {
                    Ok(Changed::Resource(resource)) => {
                        let fleets = self.index.get(&resource).cloned().unwrap_or_default();
                        for name in fleets {
                            self.mark(&name);
                        }
                    }
                    Ok(Changed::All) | Err(broadcast::error::RecvError::Lagged(_)) => self.mark_all(),
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                Some((name, result)) = done.recv() => self.finished(&name, result),
                _ = resync.tick() => self.mark_all(),
                () = sleep_until(wake) => self.mark_due(),
            }
            self.start_decisions(&done_tx);
        }
    }

    /// `name` changed: decide, and wake its waiters.
    fn mark(&mut self, name: &str) {
        self.fleets.inner.signals.bump(name);
        self.known.entry(name.to_owned()).or_default();
        self.dirty.insert(name.to_owned());
    }

    fn mark_all(&mut self) {
        self.fleets.inner.signals.bump_all();
        self.dirty.extend(self.known.keys().cloned());
    }

    /// Marks the fleets whose deadline or retry has come.
    fn mark_due(&mut self) {
        let (now_ms, now) = (crate::lease::unix_millis(), Instant::now());
        let due: Vec<String> = self
            .known
            .iter_mut()
            .filter_map(|(name, k)| {
                let deadline = k.due.is_some_and(|d| d <= now_ms);
                let retry = k.retry_at.is_some_and(|at| at <= now);
                if deadline {
                    k.due = None;
                }
                if retry {
                    k.retry_at = None;
                }
                (deadline || retry).then(|| name.clone())
            })
            .collect();
        self.dirty.extend(due);
    }

    /// The earliest deadline or retry of a known fleet.
    fn next_wake(&self) -> Option<Instant> {
        let (now_ms, now) = (crate::lease::unix_millis(), Instant::now());
        self.known
            .values()
            .flat_map(|k| {
                let deadline = k
                    .due
                    .map(|d| now + Duration::from_millis(d.saturating_sub(now_ms)));
                [deadline, k.retry_at]
            })
            .flatten()
            .min()
    }

    /// Starts a decision of every marked fleet that is not being decided already.
    fn start_decisions(&mut self, done: &mpsc::UnboundedSender<(String, Result<Pass>)>) {
        let ready: Vec<String> = self
            .dirty
            .iter()
            .filter(|name| !self.running.contains(*name))
            .cloned()
            .collect();
        for name in ready {
            self.dirty.remove(&name);
            self.running.insert(name.clone());
            let (fleets, done) = (self.fleets.clone(), done.clone());
            self.tracker.spawn(async move {
                let pause = rand::rng().random_range(Duration::ZERO..=JITTER);
                tokio::time::sleep(pause).await;
                let result = fleets.reconcile(&name).await;
                let _ = done.send((name, result));
            });
        }
    }

    /// A decision of `name` ended.
    fn finished(&mut self, name: &str, result: Result<Pass>) {
        self.running.remove(name);
        match result {
            Ok(Pass::Gone) => {
                self.forget(name);
                self.dirty.remove(name);
            }
            Ok(Pass::Raced) => {
                self.dirty.insert(name.to_owned());
            }
            Ok(Pass::Done {
                resources,
                next_deadline,
                complete,
            }) => {
                self.reindex(name, resources);
                let known = self.known.entry(name.to_owned()).or_default();
                known.due = next_deadline;
                known.retry_at = (!complete).then(|| Instant::now() + RETRY);
            }
            Err(e) => {
                tracing::warn!(fleet = %name, error = %e, "fleet decision failed; trying again");
                self.known.entry(name.to_owned()).or_default().retry_at =
                    Some(Instant::now() + RETRY);
            }
        }
    }

    /// Points the index at `name`'s resources as just read.
    fn reindex(&mut self, name: &str, resources: BTreeSet<String>) {
        let known = self.known.entry(name.to_owned()).or_default();
        if *known.resources == resources {
            return;
        }
        let old = std::mem::replace(&mut known.resources, Arc::new(resources));
        for r in old.iter() {
            if let Some(fleets) = self.index.get_mut(r) {
                fleets.retain(|f| f != name);
                if fleets.is_empty() {
                    self.index.remove(r);
                }
            }
        }
        let new = self.known[name].resources.clone();
        for r in new.iter() {
            self.index
                .entry(r.clone())
                .or_default()
                .push(name.to_owned());
        }
    }

    fn forget(&mut self, name: &str) {
        self.reindex(name, BTreeSet::new());
        self.known.remove(name);
    }
}

/// Sleeps until `at`, or for ever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::fleet_of;

    #[test]
    fn a_key_names_its_fleet() {
        let p = "/p/fleets/";
        assert_eq!(
            fleet_of(p, b"/p/fleets/aisles/spec").as_deref(),
            Some("aisles")
        );
        assert_eq!(
            fleet_of(p, b"/p/fleets/a.b/members/m").as_deref(),
            Some("a.b")
        );
        assert_eq!(fleet_of(p, b"/p/fleets/aisles"), None);
        assert_eq!(fleet_of(p, b"/q/fleets/aisles/spec"), None);
    }
}
