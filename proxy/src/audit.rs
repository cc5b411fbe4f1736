//! The audit log (`--audit-log FILE`): one JSON line per grant, release, expiry (of grants this
//! replica made), refused renewal, refusal by authentication, authorisation or a quota, session
//! opened or closed, and fleet change — the kinds are [`Kind`] — appended by a background writer.
//!
//! A request never waits for the disk: events go through a bounded channel, and when it is full
//! the event is dropped and counted (`lease_proxy_audit_dropped_total`), never queued without
//! bound. On shutdown the writer drains what is queued, flushes and exits.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use axum::http::HeaderMap;
use serde::Serialize;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;

/// Events queued at most before new ones are dropped.
const QUEUE: usize = 4096;

/// What an audit line records: its `event` field. docs/API.md lists every one (tested below).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Kind {
    /// A grant made on `/v1` (acquire).
    Grant,
    /// A release that ended a grant.
    Release,
    /// A grant made here that ended without a release through this replica.
    Expire,
    /// A refused renewal.
    Renew,
    /// A refusal by authentication or authorisation.
    Authz,
    /// A refusal by a per-principal quota.
    Quota,
    /// A session not proven (wrong secret, another principal's, ended).
    Session,
    /// A session opened.
    SessionOpen,
    /// A session closed.
    SessionClose,
    /// A fleet made or changed (`PUT /v1/fleets/{fleet}`).
    FleetPut,
    /// A fleet ended.
    FleetDelete,
    /// A member joined.
    FleetJoin,
    /// A member drained (by itself or an operator).
    FleetDrain,
    /// A member evicted.
    FleetEvict,
    /// A member's request refused (e.g. `not-member`).
    Fleet,
    /// A resource granted by the fleet service to a member (no request: the replica whose
    /// grant succeeded writes it).
    FleetGrant,
    /// A member's grant ended by the fleet service; `outcome` says why (`deadline`, `evicted`,
    /// `removed`, `orphan`).
    FleetRevoke,
}

impl Kind {
    /// Every kind.
    #[cfg(test)]
    const ALL: [Kind; 17] = [
        Kind::Grant,
        Kind::Release,
        Kind::Expire,
        Kind::Renew,
        Kind::Authz,
        Kind::Quota,
        Kind::Session,
        Kind::SessionOpen,
        Kind::SessionClose,
        Kind::FleetPut,
        Kind::FleetDelete,
        Kind::FleetJoin,
        Kind::FleetDrain,
        Kind::FleetEvict,
        Kind::Fleet,
        Kind::FleetGrant,
        Kind::FleetRevoke,
    ];
}

/// One audit line.
#[derive(Debug, Serialize)]
pub(crate) struct Event {
    /// RFC 3339, UTC, milliseconds.
    pub(crate) time: String,
    /// What happened.
    pub(crate) event: Kind,
    /// `ok`, or why not: `unauthenticated`, `forbidden`, `other-principal`, `wrong-secret`, a
    /// problem slug.
    pub(crate) outcome: &'static str,
    /// The authenticated principal, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) principal: Option<String>,
    /// The operation asked for (`acquire`, `read`, `forward`, `v3`), for refusals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) op: Option<&'static str>,
    /// The resource concerned, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) resource: Option<String>,
    /// The grant's fencing token (revision), if known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) token: Option<String>,
    /// The session concerned, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) session: Option<String>,
    /// The fleet concerned, for the fleet service's own grants and revocations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fleet: Option<String>,
    /// The fleet member concerned, likewise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) member: Option<String>,
    /// The request's `X-Request-Id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) request_id: Option<String>,
}

impl Event {
    /// An event of `kind` with `outcome`, stamped now, carrying the request's id.
    pub(crate) fn new(event: Kind, outcome: &'static str, headers: &HeaderMap) -> Self {
        Self {
            request_id: headers
                .get(runtime::serve::REQUEST_ID_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            ..Self::unrequested(event, outcome)
        }
    }

    /// An event no request caused (an expiry), stamped now.
    pub(crate) fn unrequested(event: Kind, outcome: &'static str) -> Self {
        Self {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            event,
            outcome,
            principal: None,
            op: None,
            resource: None,
            token: None,
            session: None,
            fleet: None,
            member: None,
            request_id: None,
        }
    }
}

/// Where audit events go; a no-op without `--audit-log`. Clones share the writer.
#[derive(Clone)]
pub(crate) struct Audit {
    queue: Option<mpsc::Sender<Event>>,
    metrics: Arc<Metrics>,
}

impl Audit {
    /// Off: every event is discarded.
    pub(crate) fn off(metrics: Arc<Metrics>) -> Self {
        Self {
            queue: None,
            metrics,
        }
    }

    /// Opens `path` for appending and starts its writer on `tracker`; the writer ends once
    /// `cancel` fires and what was queued is written.
    pub(crate) async fn start(
        path: &Path,
        metrics: Arc<Metrics>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> std::io::Result<Self> {
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .await?;
        let (queue, events) = mpsc::channel(QUEUE);
        tracker.spawn(write(BufWriter::new(file), events, cancel));
        Ok(Self {
            queue: Some(queue),
            metrics,
        })
    }

    /// Queues `event` without waiting: a full queue drops it and counts the drop.
    pub(crate) fn record(&self, event: Event) {
        let Some(queue) = &self.queue else { return };
        if queue.try_send(event).is_err() {
            self.metrics.audit_dropped.add(1, &[]);
        }
    }
}

async fn write(
    mut out: BufWriter<tokio::fs::File>,
    mut events: mpsc::Receiver<Event>,
    cancel: CancellationToken,
) {
    loop {
        let event = tokio::select! {
            biased;
            event = events.recv() => event,
            () = cancel.cancelled() => {
                // Requests have drained by now: write what is queued, then stop.
                events.close();
                events.recv().await
            }
        };
        let Some(event) = event else { break };
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        let mut result = out.write_all(&line).await;
        // Flushed whenever the queue runs dry, so a line reaches the file within moments of
        // its event, and a burst still goes out in few writes.
        if result.is_ok() && events.is_empty() {
            result = out.flush().await;
        }
        if let Err(e) = result {
            tracing::error!(error = %e, "audit log write failed");
        }
    }
    if let Err(e) = out.flush().await {
        tracing::error!(error = %e, "audit log flush failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind's place in [`Kind::ALL`]: a kind added without a place there fails to
    /// compile here.
    fn place(kind: Kind) -> usize {
        match kind {
            Kind::Grant => 0,
            Kind::Release => 1,
            Kind::Expire => 2,
            Kind::Renew => 3,
            Kind::Authz => 4,
            Kind::Quota => 5,
            Kind::Session => 6,
            Kind::SessionOpen => 7,
            Kind::SessionClose => 8,
            Kind::FleetPut => 9,
            Kind::FleetDelete => 10,
            Kind::FleetJoin => 11,
            Kind::FleetDrain => 12,
            Kind::FleetEvict => 13,
            Kind::Fleet => 14,
            Kind::FleetGrant => 15,
            Kind::FleetRevoke => 16,
        }
    }

    #[test]
    fn the_api_reference_lists_every_audit_event() {
        let api = include_str!("../../docs/API.md");
        let start = api
            .find("**Audit log**")
            .expect("docs/API.md has an audit log paragraph");
        let section = &api[start..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        for (i, kind) in Kind::ALL.into_iter().enumerate() {
            assert_eq!(place(kind), i, "Kind::ALL is out of order at {kind:?}");
            let name = serde_json::to_value(kind).unwrap();
            let name = name.as_str().unwrap();
            assert!(
                section.contains(&format!("`{name}`")),
                "docs/API.md's audit log paragraph does not name the event `{name}`"
            );
        }
    }
}
