//! `GET /v1/watch?prefix=`: ownership events as Server-Sent Events, resumable with
//! `Last-Event-ID` (see `etcd::events` for what an event is and how ids work).
//!
//! The stream is driven by the client: an event is taken from etcd only when the connection can
//! take it, so a slow reader holds back its own etcd watch (etcd buffers, not the proxy) and
//! memory stays bounded. Each stream holds one slot of `--max-watch-streams` for as long as its
//! body lives; the slot goes back when the body is dropped — the client left, etcd ended the
//! watch, or the proxy began draining (streams end then, so the drain does not wait for them).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt as _};
use serde::Deserialize;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::authz::{self, Caller, Peer, Target};
use super::AppState;
use crate::auth::Op;
use crate::etcd::{OwnershipEvent, Position, Subscription};
use crate::lease::validate;
use crate::{Error, Result};

/// How often a comment is sent on a quiet stream, so intermediaries keep it open and a gone
/// client is noticed.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// What a client waits before reconnecting (the SSE `retry` field), in milliseconds.
const RETRY_MS: u64 = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WatchQuery {
    #[serde(default)]
    prefix: String,
    /// For clients that cannot set headers; `Last-Event-ID` wins when both are given.
    last_event_id: Option<String>,
}

pub(super) async fn watch(
    State(app): State<Arc<AppState>>,
    query: std::result::Result<Query<WatchQuery>, QueryRejection>,
    headers: HeaderMap,
    peer: Peer,
) -> Result<Response> {
    let caller = authz::authorize(&app, &headers, &peer, Op::Read, Target::Some)?;
    let Query(q) = query.map_err(|e| Error::InvalidRequest(e.body_text()))?;
    validate::resource_prefix(&q.prefix)?;
    let last = match headers.get("last-event-id") {
        Some(value) => Some(value.to_str().map_err(|_| Error::InvalidField {
            field: "Last-Event-ID",
            reason: "must be ASCII".into(),
        })?),
        None => q.last_event_id.as_deref(),
    };
    let after = last.map(Position::parse).transpose()?;
    let permit = app
        .watch_streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| Error::TooManyWatches(app.max_watch_streams))?;
    let subscription = app.leases.feed().subscribe(after).await?;
    let stream = events(Watcher {
        subscription,
        prefix: q.prefix,
        caller,
        stopping: app.leases.stopping().clone(),
        _permit: permit,
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEPALIVE).text("keepalive"))
        .into_response())
}

/// One client's stream: its etcd subscription, what it may see, and its slot.
struct Watcher {
    subscription: Subscription,
    prefix: String,
    caller: Caller,
    stopping: CancellationToken,
    _permit: OwnedSemaphorePermit,
}

impl Watcher {
    /// Whether the caller asked for, and may read, this event.
    fn shows(&self, event: &OwnershipEvent) -> bool {
        event.resource.starts_with(&self.prefix)
            && self
                .caller
                .as_ref()
                .is_none_or(|p| p.may(Op::Read, &event.resource))
    }

    /// The next event to send; `None` ends the stream.
    async fn next(&mut self) -> Option<OwnershipEvent> {
        loop {
            let next = tokio::select! {
                () = self.stopping.cancelled() => return None,
                next = self.subscription.next() => next,
            };
            match next {
                Ok(Some(event)) if self.shows(&event) => return Some(event),
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(e) => {
                    // The client resumes from its last id: on compaction that answers 410.
                    tracing::debug!(error = %e, "event stream ended by etcd");
                    return None;
                }
            }
        }
    }
}

/// The SSE messages: first the position the stream starts after (an id with no data, which a
/// client stores as its last event id), then one message per event.
fn events(watcher: Watcher) -> impl Stream<Item = std::result::Result<Event, Infallible>> {
    let first = Event::default()
        .id(watcher.subscription.start().to_string())
        .retry(Duration::from_millis(RETRY_MS));
    let rest = futures::stream::unfold(watcher, |mut watcher| async move {
        let event = watcher.next().await?;
        let message = Event::default()
            .id(event.position.to_string())
            .event(event.kind.as_str())
            .json_data(&event)
            .unwrap_or_else(|_| Event::default().comment("unserialisable event"));
        Some((Ok(message), watcher))
    });
    futures::stream::once(async move { Ok(first) }).chain(rest)
}
