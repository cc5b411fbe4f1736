//! One etcd list-and-watch over every ownership key: a local view of who holds what, and
//! wakeups for the requests waiting for a resource.
//!
//! The task lists `{prefix}holders/` at one revision (in pages), then watches from the next
//! revision, so the view misses nothing between the two. Every deletion (release or lease
//! expiry) becomes a [`Wakeup::Released`]; whenever the watch had to be re-opened, events may
//! have been missed, so the view is rebuilt and [`Wakeup::All`] sent.
//!
//! The view is a fast path only: a lookup that finds nothing, or a record that does not match,
//! must be confirmed by a linearizable read. It is never the last word on safety — the fencing
//! token checked by the enforcer is.

use std::collections::HashSet;
use std::sync::Arc;

use dashmap::DashMap;
use etcd_client::{EventType, WatchOptions};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::HolderRecord;
use crate::audit::{Audit, Event, Kind};
use crate::etcd::{prefix_end, reopening, Etcd, RangePage};
use crate::metrics::Metrics;

const CHANNEL: usize = 4096;
const PAGE: i64 = 1000;

/// Why a waiter should try to acquire again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wakeup {
    /// The ownership key of this resource was deleted.
    Released(String),
    /// Events may have been missed; everyone retry.
    All,
}

impl Wakeup {
    /// Whether a waiter for `resource` should retry.
    pub(crate) fn concerns(&self, resource: &str) -> bool {
        match self {
            Wakeup::Released(r) => r == resource,
            Wakeup::All => true,
        }
    }
}

/// A change of ownership keys, for those who follow a set of resources (the fleets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Changed {
    /// The ownership key of this resource was created or deleted.
    Resource(String),
    /// Changes may have been missed; look at everything again.
    All,
}

/// An ownership key as last seen: its value and create revision.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) value: Vec<u8>,
    pub(crate) create_revision: i64,
}

/// The watch-fed view of ownership keys, and the wakeups derived from it.
#[derive(Clone)]
pub(crate) struct Holders {
    tx: broadcast::Sender<Wakeup>,
    /// Every creation and deletion (for the fleets), apart from the waiters' wakeups.
    changes: broadcast::Sender<Changed>,
    view: Arc<DashMap<String, Seen>>,
    /// Grants this replica made and has not released: resource → create revision. One that
    /// disappears from etcd while still here has expired (counted and audited here, once; why
    /// this is not read from the end markers: `marker.rs`).
    granted_here: Arc<DashMap<String, i64>>,
    metrics: Arc<Metrics>,
    /// Where the expiries of those grants are written.
    audit: Audit,
}

impl Holders {
    /// Starts the list-and-watch task on `tracker`; it stops when `cancel` fires. Expiries of
    /// grants made here go to `audit`, and are counted in `metrics`.
    pub(crate) fn start(
        etcd: &Etcd,
        holders_prefix: String,
        audit: Audit,
        metrics: Arc<Metrics>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let (tx, _) = broadcast::channel(CHANNEL);
        let (changes, _) = broadcast::channel(CHANNEL);
        let holders = Self {
            tx,
            changes,
            view: Arc::default(),
            granted_here: Arc::default(),
            metrics,
            audit,
        };
        let view = holders.view.clone();
        holders
            .metrics
            .meter()
            .u64_observable_gauge("lease_proxy.leases.held")
            .with_description("Resources held, cluster-wide, as this replica's watch sees them.")
            .with_callback(move |o| o.observe(view.len() as u64, &[]))
            .build();
        let (etcd, watching) = (etcd.clone(), holders.clone());
        tracker.spawn(async move {
            reopening(cancel, || list_and_watch(&etcd, &holders_prefix, &watching)).await;
        });
        holders
    }

    /// A receiver of every wakeup from now on. Subscribe *before* checking the resource, so a
    /// release between the check and the wait is not missed. A lagging receiver should treat
    /// the lag as [`Wakeup::All`].
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Wakeup> {
        self.tx.subscribe()
    }

    /// A receiver of every creation and deletion of an ownership key from now on (a lagging
    /// receiver should treat the lag as [`Changed::All`]).
    pub(crate) fn changes(&self) -> broadcast::Receiver<Changed> {
        self.changes.subscribe()
    }

    /// The ownership key of `resource` as the watch last saw it (possibly stale).
    pub(crate) fn seen(&self, resource: &str) -> Option<Seen> {
        self.view.get(resource).map(|s| s.clone())
    }

    /// Notes a grant made by this replica, so its expiry is counted.
    pub(crate) fn granted(&self, resource: &str, create_revision: i64) {
        self.granted_here
            .insert(resource.to_owned(), create_revision);
    }

    /// Notes that this replica is releasing the grant: its end is no expiry.
    pub(crate) fn releasing(&self, resource: &str, create_revision: i64) {
        self.granted_here
            .remove_if(resource, |_, revision| *revision == create_revision);
    }

    /// Drops the view's entry for this incarnation of `resource` (this replica has just ended
    /// it), so the view never confirms it again.
    pub(crate) fn forget(&self, resource: &str, create_revision: i64) {
        self.view
            .remove_if(resource, |_, seen| seen.create_revision == create_revision);
    }

    /// The ownership key of `resource` is gone from etcd (deleted, or missing after a re-list).
    fn ended(&self, resource: &str) {
        let Some((_, seen)) = self.view.remove(resource) else {
            return;
        };
        if self
            .granted_here
            .remove_if(resource, |_, revision| *revision == seen.create_revision)
            .is_some()
        {
            self.metrics.expirations.add(1, &[]);
            // The record as last seen names the principal; a value that does not parse still
            // leaves resource and token.
            let principal = HolderRecord::decode(resource, &seen.value)
                .ok()
                .and_then(|r| r.principal);
            self.expired(resource, seen.create_revision, principal);
        }
    }

    /// Audits the expiry of a grant made here.
    fn expired(&self, resource: &str, create_revision: i64, principal: Option<String>) {
        self.audit.record(Event {
            principal,
            resource: Some(resource.to_owned()),
            token: Some(create_revision.to_string()),
            ..Event::unrequested(Kind::Expire, "ok")
        });
    }
}

/// Rebuilds the view and follows the watch until it fails; whether the watch delivered anything.
async fn list_and_watch(etcd: &Etcd, prefix: &str, holders: &Holders) -> bool {
    let revision = match list(etcd, prefix, holders).await {
        Ok(revision) => revision,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list ownership keys");
            return false;
        }
    };
    // Whatever changed while the watch was down is in the new view; waiters re-check.
    let _ = holders.tx.send(Wakeup::All);
    let _ = holders.changes.send(Changed::All);
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision + 1);
    etcd.follow(prefix, options, "holder", |resp| {
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            let Some(resource) = kv
                .key()
                .strip_prefix(prefix.as_bytes())
                .and_then(|r| std::str::from_utf8(r).ok())
            else {
                continue;
            };
            if event.event_type() == EventType::Delete {
                holders.ended(resource);
                let _ = holders.tx.send(Wakeup::Released(resource.to_owned()));
                let _ = holders.changes.send(Changed::Resource(resource.to_owned()));
            } else {
                if kv.version() == 1 {
                    let _ = holders.changes.send(Changed::Resource(resource.to_owned()));
                }
                holders.view.insert(
                    resource.to_owned(),
                    Seen {
                        value: kv.value().to_vec(),
                        create_revision: kv.create_revision(),
                    },
                );
            }
        }
    })
    .await
}

/// Replaces the view with every ownership key at one revision, read in pages; returns it.
async fn list(etcd: &Etcd, prefix: &str, holders: &Holders) -> crate::Result<i64> {
    let end = prefix_end(prefix.as_bytes());
    let mut start = prefix.as_bytes().to_vec();
    let mut at_revision = 0;
    let mut fresh: Vec<(String, Seen)> = Vec::new();
    loop {
        let RangePage {
            kvs,
            more,
            revision,
        } = etcd.range_at(&start, &end, PAGE, at_revision).await?;
        at_revision = revision;
        for kv in &kvs {
            if let Some(resource) = kv
                .key()
                .strip_prefix(prefix.as_bytes())
                .and_then(|r| std::str::from_utf8(r).ok())
            {
                fresh.push((
                    resource.to_owned(),
                    Seen {
                        value: kv.value().to_vec(),
                        create_revision: kv.create_revision(),
                    },
                ));
            }
        }
        match kvs.last() {
            Some(last) if more => {
                start = last.key().to_vec();
                start.push(0);
            }
            _ => break,
        }
    }
    let names: HashSet<&str> = fresh.iter().map(|(r, _)| r.as_str()).collect();
    let gone: Vec<String> = holders
        .view
        .iter()
        .filter(|e| !names.contains(e.key().as_str()))
        .map(|e| e.key().clone())
        .collect();
    for resource in gone {
        holders.ended(&resource);
    }
    // Grants of this replica made and gone while the watch was down never reached the view;
    // not released by this replica (that forgets them), so they expired. Grants newer than the
    // listing are not judged by it.
    let alive: std::collections::HashMap<&str, i64> = fresh
        .iter()
        .map(|(r, seen)| (r.as_str(), seen.create_revision))
        .collect();
    let mut expired = 0;
    holders.granted_here.retain(|resource, revision| {
        let keep = *revision > at_revision || alive.get(resource.as_str()) == Some(revision);
        if !keep {
            // Gone while the watch was down: its last record was never seen, so no principal.
            holders.expired(resource, *revision, None);
            expired += 1;
        }
        keep
    });
    if expired > 0 {
        holders.metrics.expirations.add(expired, &[]);
    }
    for (resource, seen) in fresh {
        holders.view.insert(resource, seen);
    }
    Ok(at_revision)
}
