//! Ownership events for `GET /v1/watch`: every grant made (`acquired`) and ended (`released`,
//! `expired`), in etcd's revision order, read from one etcd watch ([`Watch`]). The replica's
//! streams share one such watch (`feed.rs`); a stream that falls behind it reads its own.
//!
//! A grant is made by creating its ownership key `{prefix}holders/{resource}`; it ends when that
//! key is deleted, `released` or `expired` as the end markers of its revision say (`marker.rs`).
//!
//! Positions: an event's id is `R.n` — its revision `R` and its index `n` among the events of
//! revision `R` in this key range (etcd never splits a revision across watch responses, and
//! replays a revision's events in the same order). A subscriber resumes after `R.n` by watching
//! from `R` and skipping indices up to `n`, or after a bare `R` (everything up to `R` seen) by
//! watching from `R + 1`.
//!
//! Progress: a subscription also says how far it has read when that is past its last event
//! ([`Next::Progress`], a bare `R`), so a subscriber whose keys are quiet holds a resume point
//! that etcd's compaction does not overtake. `R` is the last revision whose events it has
//! classified (those it yields none for included), or the revision of one of etcd's timed
//! progress notifications (`progress_notify`, every `--experimental-watch-progress-notify-interval`
//! of etcd, 10 min by default). Those come through the same channel as the watch's events, and
//! only to a watcher that has been sent every event up to that revision, so they claim nothing
//! unsent. Progress *requested* from etcd is not used: before etcd 3.4.25 and 3.5.8 its answer
//! could overtake events still queued (etcd#15220).

use std::collections::VecDeque;

use etcd_client::{EventType, WatchOptions, WatchStream};
use serde::Serialize;

use super::marker::{EndMarkers, MarkerEvent};
use super::{HolderRecord, Position};
use crate::etcd::{prefix_end, Etcd};
use crate::keys::Layout;
use crate::{Error, Result};

/// What happened to a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    /// A grant was made.
    Acquired,
    /// Its holder released it (or closed its session).
    Released,
    /// It ended without a release: its lease lapsed, or the proxy withdrew it.
    Expired,
}

impl Kind {
    /// The SSE event name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Acquired => "acquired",
            Kind::Released => "released",
            Kind::Expired => "expired",
        }
    }
}

/// What a subscription yields, in revision order.
#[derive(Debug, Clone)]
pub(crate) enum Next {
    /// An ownership event.
    Event(OwnershipEvent),
    /// Every event up to this position has been yielded, and the subscription has read further
    /// than its last event.
    Progress(Position),
}

impl Next {
    /// Where a reader stands once it has this: the event's position, or the progress.
    pub(crate) fn position(&self) -> Position {
        match self {
            Next::Event(event) => event.position,
            Next::Progress(position) => *position,
        }
    }
}

/// One ownership event, as sent in an SSE `data` line.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OwnershipEvent {
    /// Its position (the SSE id); not in the data.
    #[serde(skip)]
    pub(crate) position: Position,
    /// `acquired`, `released` or `expired`.
    #[serde(rename = "type")]
    pub(crate) kind: Kind,
    /// The resource.
    pub(crate) resource: String,
    /// The grant's holder.
    pub(crate) holder: String,
    /// The grant's token: its create revision (decimal string, as in a grant).
    pub(crate) token: String,
    /// The etcd revision of this event.
    pub(crate) revision: i64,
    /// The grant's etcd lease (decimal string).
    #[serde(with = "crate::lease::i64_string")]
    pub(crate) lease_id: i64,
    /// The session the grant lived on.
    #[serde(
        skip_serializing_if = "Option::is_none",
        with = "crate::lease::opt_i64_string"
    )]
    pub(crate) session: Option<i64>,
}

/// Where ownership events are read from: the ownership keys and end markers of a layout.
#[derive(Clone)]
pub(super) struct Source {
    etcd: Etcd,
    holders: String,
    ended: String,
    markers: EndMarkers,
}

impl Source {
    /// The events of the ownership keys and the end markers of `layout`.
    pub(super) fn new(etcd: Etcd, layout: &Layout) -> Self {
        Self {
            etcd,
            holders: layout.holders().to_owned(),
            ended: layout.ended().to_owned(),
            markers: EndMarkers::new(layout),
        }
    }

    /// The replica's metrics.
    pub(super) fn metrics(&self) -> &crate::metrics::Metrics {
        self.etcd.metrics()
    }

    /// Watches the events after `after` (or after now, when `None`).
    /// [`Error::EventsUnavailable`] when `after` is no longer (or not yet) in etcd's history.
    pub(super) async fn watch(&self, after: Option<Position>) -> Result<Watch> {
        let start = self.start(after).await?;
        self.watch_from(start).await
    }

    /// Watches the events after `start`, a position [`Source::start`] answered.
    pub(super) async fn watch_from(&self, start: Position) -> Result<Watch> {
        let options = WatchOptions::new()
            .with_range(prefix_end(self.holders.as_bytes()))
            .with_prev_key()
            .with_fragment()
            .with_progress_notify()
            .with_start_revision(start.watch_from());
        let (index, stream) = self
            .etcd
            .open_watch(self.ended.as_str(), options, "event")
            .await
            .ok_or(Error::EtcdTimeout(self.etcd.timeout()))?;
        // Everything up to here has been seen: `R` bare, or the revision before `R.n`.
        let through = match start.index {
            Some(_) => start.revision - 1,
            None => start.revision,
        };
        Ok(Watch {
            source: self.clone(),
            start,
            through,
            told: through,
            skip: start.index.map(|n| (start.revision, n)),
            stream,
            pinned: index,
            partial: Vec::new(),
            ready: VecDeque::new(),
        })
    }

    /// Where events after `after` (or after now) start: `after` once it is checked to be in
    /// etcd's history, or etcd's current revision.
    pub(super) async fn start(&self, after: Option<Position>) -> Result<Position> {
        Ok(match after {
            Some(after) => {
                // Revision 1 is etcd's empty start: no event ever has it.
                if after.index.is_some() && after.revision < 2 {
                    return Err(Error::EventsUnavailable(
                        "revision 1 holds no events".into(),
                    ));
                }
                // A range read at a revision fails when it is compacted or in the future. A watch
                // must start *after* the compaction revision: etcd accepts one from it, but has
                // dropped that revision's deletions. `R.n` (a watch from `R`): `R` must be in the
                // history and so must the revision before it. Bare `R` (a watch from `R + 1`): `R`
                // must be.
                self.in_history(after.revision).await?;
                if after.index.is_some() {
                    self.in_history(after.revision - 1).await?;
                }
                after
            }
            None => Position {
                revision: self.etcd.header().await?.revision,
                index: None,
            },
        })
    }

    /// Whether `revision` can still be read: [`Error::EventsUnavailable`] when etcd has
    /// compacted it away or has not reached it.
    async fn in_history(&self, revision: i64) -> Result<()> {
        let end = prefix_end(self.holders.as_bytes());
        self.etcd
            .range_at(self.holders.as_bytes(), &end, 1, revision)
            .await
            .map(|_| ())
            .map_err(|e| match e {
                Error::Etcd(etcd_client::Error::GRpcStatus(status))
                    if status.code() == tonic::Code::OutOfRange =>
                {
                    Error::EventsUnavailable(status.message().to_owned())
                }
                other => other,
            })
    }

    /// The events of one revision's etcd events (in etcd's order), from index `skip_through`
    /// on exclusive.
    fn classify(
        &self,
        revision: i64,
        events: &[&etcd_client::Event],
        skip_through: Option<u32>,
    ) -> Vec<OwnershipEvent> {
        let ends = self
            .markers
            .read(events.iter().filter_map(|e| MarkerEvent::of(e)));
        let mut out = Vec::new();
        for (index, event) in events.iter().enumerate() {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            if skip_through.is_some_and(|n| index <= n) {
                continue;
            }
            let Some(kv) = event.kv() else { continue };
            let Some(name) = kv.key().strip_prefix(self.holders.as_bytes()) else {
                continue;
            };
            let Ok(resource) = std::str::from_utf8(name) else {
                continue;
            };
            let (kind, stored) = match event.event_type() {
                // Only a create makes a grant; nothing else writes an ownership key.
                EventType::Put if kv.create_revision() == kv.mod_revision() => (Kind::Acquired, kv),
                EventType::Put => continue,
                EventType::Delete => {
                    let Some(prev) = event.prev_kv() else {
                        tracing::warn!(%resource, revision, "a deleted ownership key came without its previous value; event skipped");
                        continue;
                    };
                    let marked = ends.released(resource, prev.create_revision(), prev.lease());
                    (
                        if marked {
                            Kind::Released
                        } else {
                            Kind::Expired
                        },
                        prev,
                    )
                }
            };
            let Ok(record) = HolderRecord::decode(resource, stored.value()) else {
                tracing::warn!(%resource, revision, "an ownership key that does not parse; event skipped");
                continue;
            };
            out.push(OwnershipEvent {
                position: Position {
                    revision,
                    index: Some(index),
                },
                kind,
                resource: resource.to_owned(),
                holder: record.holder,
                token: stored.create_revision().to_string(),
                revision,
                lease_id: stored.lease(),
                session: record.session.then_some(record.lease_id),
            });
        }
        out
    }
}

/// One etcd watch of the ownership events.
pub(super) struct Watch {
    source: Source,
    /// Where the subscription starts (the first SSE id).
    start: Position,
    /// Every event of the revisions up to this one has been read from etcd and classified (it
    /// is in `ready`, or was yielded, or was none of the watch's).
    through: i64,
    /// The `through` last yielded as [`Next::Progress`] (or covered by the start).
    told: i64,
    /// Events of this revision up to this index were seen before (a resume inside a revision).
    /// Kept for the subscription's life: responses before that revision's (etcd's "created")
    /// carry no events, and later revisions never match.
    skip: Option<(i64, u32)>,
    stream: WatchStream,
    pinned: usize,
    /// Events of the revision being read, when a fragment ended inside it.
    partial: Vec<(i64, etcd_client::Event)>,
    ready: VecDeque<OwnershipEvent>,
}

impl Watch {
    /// The position the watch starts after.
    pub(super) fn start(&self) -> Position {
        self.start
    }

    /// The next event or progress, in revision order; `Ok(None)` when etcd ended the watch,
    /// [`Error::EventsUnavailable`] when it cancelled it for compaction. Cancel-safe.
    pub(super) async fn next(&mut self) -> Result<Option<Next>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(Some(Next::Event(event)));
            }
            if self.through > self.told {
                self.told = self.through;
                return Ok(Some(Next::Progress(Position {
                    revision: self.through,
                    index: None,
                })));
            }
            let resp = match self.stream.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => return Ok(None),
                Err(e) => {
                    self.source.etcd.unpin(self.pinned);
                    return Err(Error::Etcd(e));
                }
            };
            if resp.canceled() {
                if resp.compact_revision() > 0 {
                    return Err(Error::EventsUnavailable(format!(
                        "compacted up to revision {}",
                        resp.compact_revision()
                    )));
                }
                return Ok(None);
            }
            if resp.events().is_empty() {
                // A timed progress notification: every event up to its revision was sent
                // before it. (The watch's "created" answer says nothing of the kind: events
                // from an older start revision follow it. A fragment never ends empty.)
                if !resp.created() && !resp.0.fragment && self.partial.is_empty() {
                    let revision = resp.header().map_or(0, |h| h.revision());
                    self.through = self.through.max(revision);
                }
                continue;
            }
            // A fragment (etcd splits responses over its request size limit) may end inside a
            // revision: that revision's events wait for the rest. Only the revision being read
            // is held, never the backlog.
            let last_fragment = !resp.0.fragment;
            for event in resp.events() {
                let revision = event.kv().map(|kv| kv.mod_revision()).unwrap_or(0);
                if self.partial.first().is_some_and(|(r, _)| *r != revision) {
                    self.flush();
                }
                self.partial.push((revision, event.clone()));
            }
            if last_fragment {
                self.flush();
            }
        }
    }

    /// Classifies the events of the revision held in `partial`.
    fn flush(&mut self) {
        let Some(&(revision, _)) = self.partial.first() else {
            return;
        };
        let group: Vec<&etcd_client::Event> = self.partial.iter().map(|(_, e)| e).collect();
        let skip = match self.skip {
            Some((r, n)) if r == revision => Some(n),
            _ => None,
        };
        let events = self.source.classify(revision, &group, skip);
        self.ready.extend(events);
        self.partial.clear();
        self.through = self.through.max(revision);
    }
}
