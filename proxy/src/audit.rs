//! The audit log (`--audit-log FILE`): one JSON line per grant, release, expiry (of grants this
//! replica made), refused renewal and refusal by authentication or authorisation, appended by a
//! background writer.
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

/// One audit line.
#[derive(Debug, Serialize)]
pub(crate) struct Event {
    /// RFC 3339, UTC, milliseconds.
    pub(crate) time: String,
    /// `grant`, `release`, `expire`, `renew`, `authz` or `session` (a session not proven).
    pub(crate) event: &'static str,
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
    /// The request's `X-Request-Id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) request_id: Option<String>,
}

impl Event {
    /// An event of `kind` with `outcome`, stamped now, carrying the request's id.
    pub(crate) fn new(event: &'static str, outcome: &'static str, headers: &HeaderMap) -> Self {
        Self {
            request_id: headers
                .get(fencing::serve::REQUEST_ID_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            ..Self::unrequested(event, outcome)
        }
    }

    /// An event no request caused (an expiry), stamped now.
    pub(crate) fn unrequested(event: &'static str, outcome: &'static str) -> Self {
        Self {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            event,
            outcome,
            principal: None,
            op: None,
            resource: None,
            token: None,
            session: None,
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
