//! `GET /v1/watch?prefix=`: ownership events as Server-Sent Events, resumable with
//! `Last-Event-ID` (see `lease::events` for what an event is and how ids work).
//!
//! Each stream is a tracked task that owns the etcd subscription and one slot of
//! `--max-watch-streams`, and hands messages to the response body through a channel of
//! [`BUFFERED`] messages. The reader drives it: an event is taken from etcd only when the
//! channel has room, so a slow reader holds back its own etcd watch (etcd buffers, not the
//! proxy) and memory stays bounded. The task, not the body, owns what matters, because a body
//! is polled only when the connection can send (an HTTP/2 stream whose reader stopped has no
//! window and is never polled again). The task ends, giving its slot back, when the client
//! left (the body was dropped), etcd ended the watch, the proxy began draining (so the drain
//! does not wait for streams), the stream reached `--watch-max-duration` (±10 %; the client
//! resumes), or the reader took nothing for `--client-write-timeout` while events waited. TCP
//! keepalive (set on every accepted connection) ends the streams of peers that vanished
//! without a trace within about a minute.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use utoipa::IntoParams;

use super::authz::{self, Caller, Peer};
use super::preamble::{Authorized, Reading};
use super::progress::{self, Pacer};
use super::schemas::{EventId, ResourcePrefix};
use super::AppState;
use crate::auth::Op;
use crate::lease::validate;
use crate::lease::Slot;
use crate::lease::{Next, OwnershipEvent, Position, Subscription};
use crate::{Error, Result};

/// How often a comment is sent on a quiet stream, so intermediaries keep it open and a gone
/// client is noticed.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// What a client waits before reconnecting (the SSE `retry` field), in milliseconds.
const RETRY_MS: u64 = 1000;

/// Messages a stream holds for its reader: what the channel between its task and the response
/// body carries at most.
const BUFFERED: usize = 8;

/// One message of the stream, for the OpenAPI document (its `text/event-stream` convention:
/// one object per message, with the SSE fields as properties).
pub(super) struct EventMessage;

impl utoipa::PartialSchema for EventMessage {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        let string = || ObjectBuilder::new().schema_type(Type::String);
        ObjectBuilder::new()
            .description(Some(
                "One SSE message: an event, or a message with only `id`: the first (with \
                 `retry`: where the stream starts) and, while the stream has no event to show, \
                 how far it has read (at most one a second). Every id is a resume point: \
                 resume with the newest",
            ))
            .property("id", <EventId as utoipa::PartialSchema>::schema())
            .property(
                "event",
                string().enum_values(Some(["acquired", "released", "expired"])),
            )
            .property(
                "data",
                string().description(Some(
                    "The event as one JSON object: `type` (as `event`), `resource`, `holder`, \
                     `token` (the grant's create revision, decimal string), `revision` (the \
                     event's, integer), `lease_id` (decimal string), `session` (for grants \
                     under a session)",
                )),
            )
            .property("retry", ObjectBuilder::new().schema_type(Type::Integer))
            .required("id")
            .into()
    }
}

impl utoipa::ToSchema for EventMessage {}

/// Query of `GET /v1/watch`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct WatchQuery {
    /// Only resources whose name starts with this (empty: all).
    #[serde(default)]
    #[param(value_type = ResourcePrefix, inline)]
    prefix: String,
    /// Where to resume, for clients that cannot set headers; `Last-Event-ID` wins when both
    /// are given.
    #[param(value_type = Option<EventId>, inline)]
    last_event_id: Option<String>,
}

/// Ownership events (`acquired`, `released`, `expired`) under `prefix`, in etcd's revision
/// order, as Server-Sent Events. The first message carries only an `id` (where the stream
/// starts), and so do the messages that tell a stream with no event to show how far it has
/// read; each event's `data` is one JSON object (`type`, `resource`, `holder`, `token`,
/// `revision`, `lease_id`, `session`). Resume with the last id seen (of any message) in
/// `Last-Event-ID`.
#[utoipa::path(
    get,
    path = "/v1/watch",
    operation_id = "watch",
    tag = "leases",
    params(
        WatchQuery,
        // `nullable = false`: an optional header is absent or a string, never `null`.
        ("Last-Event-ID" = inline(Option<EventId>), Header, nullable = false, description = "The id of the last message seen: the stream resumes after it, losing and repeating nothing"),
    ),
    responses(
        (status = 200, description = "The event stream (`text/event-stream`; comments every 15 s)", content_type = "text/event-stream", body = EventMessage),
        (status = 400, description = "Invalid prefix, query or Last-Event-ID"),
        (status = 410, description = "The resume point is no longer (or not) in etcd's history: list, then watch without an id"),
        (status = 429, description = "The principal has its share of this replica's streams open (`--quota-watch-streams`)", headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
)]
pub(super) async fn watch(
    State(app): State<Arc<AppState>>,
    by: Authorized<Reading>,
    query: std::result::Result<Query<WatchQuery>, QueryRejection>,
) -> Result<Response> {
    let Authorized {
        caller,
        headers,
        peer,
        ..
    } = by;
    let Query(q) = query.map_err(|e| Error::InvalidRequest(e.body_text()))?;
    validate::resource_prefix(&q.prefix)?;
    // Both forms are checked when both are given (the header wins): nothing malformed passes.
    let from_query = q
        .last_event_id
        .as_deref()
        .map(Position::parse)
        .transpose()?;
    let after = match headers.get("last-event-id") {
        Some(value) => Some(Position::parse(value.to_str().map_err(|_| {
            Error::InvalidField {
                field: "Last-Event-ID",
                reason: "must be ASCII".into(),
            }
        })?)?),
        None => from_query,
    };
    let slot = app
        .watch_slots
        .take(caller.as_deref().map(|p| p.name.as_str()))
        .inspect_err(|e| authz::audit_refusal(&app, &headers, &caller, Op::Read, &q.prefix, e))?;
    let subscription = app.leases.feed().subscribe(after, &q.prefix).await?;
    // What authenticated the stream, to check it again while it runs: a token removed from the
    // file (or a permission taken away) ends or narrows the stream within a second.
    let credentials = app.auth.clone().map(|auth| Credentials {
        auth,
        authorization: headers
            .get(axum::http::header::AUTHORIZATION)
            .into_iter()
            .map(|v| (axum::http::header::AUTHORIZATION, v.clone()))
            .collect(),
        peer,
    });
    let stream = events(
        &app,
        Watcher {
            subscription,
            prefix: q.prefix,
            caller,
            credentials,
            recheck: {
                let mut every =
                    tokio::time::interval_at(tokio::time::Instant::now() + RECHECK, RECHECK);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                every
            },
            ends_at: tokio::time::Instant::now() + jittered(app.watch_max_duration),
            stopping: app.leases.stopping().clone(),
            _slot: slot,
        },
    );
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEPALIVE).text("keepalive"))
        .into_response())
}

/// How often a stream's caller is authenticated and authorised again.
const RECHECK: Duration = Duration::from_secs(1);

/// What a stream's caller authenticated with.
struct Credentials {
    auth: Arc<crate::auth::Auth>,
    authorization: HeaderMap,
    peer: Peer,
}

/// One client's stream: its etcd subscription, what it may see, and its slot.
struct Watcher {
    subscription: Subscription,
    prefix: String,
    caller: Caller,
    credentials: Option<Credentials>,
    /// When to authenticate the caller again.
    recheck: tokio::time::Interval,
    /// When the stream ends (the client resumes).
    ends_at: tokio::time::Instant,
    stopping: CancellationToken,
    _slot: Slot,
}

impl Watcher {
    /// Authenticates the caller again against the current token table; `false` when it no
    /// longer authenticates or may read nothing (the stream ends).
    fn still_allowed(&mut self) -> bool {
        let Some(c) = &self.credentials else {
            return true;
        };
        match c.auth.authenticate(&c.authorization, c.peer.0.as_ref()) {
            Ok(principal) if principal.may_any(Op::Read) => {
                self.caller = Some(principal);
                true
            }
            _ => false,
        }
    }

    /// Whether the caller asked for, and may read, this event.
    fn shows(&self, event: &OwnershipEvent) -> bool {
        event.resource.starts_with(&self.prefix)
            && self
                .caller
                .as_ref()
                .is_none_or(|p| p.may(Op::Read, &event.resource))
    }

    /// The next event to send, or how far the stream has read without one (an event the
    /// caller does not see is read past); `None` ends the stream. Cancel-safe.
    async fn next(&mut self) -> Option<Next> {
        loop {
            // `Subscription::next` is cancel-safe: a tick loses no event.
            let next = tokio::select! {
                () = self.stopping.cancelled() => return None,
                () = tokio::time::sleep_until(self.ends_at) => return None,
                _ = self.recheck.tick() => {
                    if !self.still_allowed() {
                        return None;
                    }
                    continue;
                }
                next = self.subscription.next() => next,
            };
            match next {
                Ok(Some(Next::Event(event))) if self.shows(&event) => {
                    return Some(Next::Event(event))
                }
                Ok(Some(Next::Event(event))) => return Some(Next::Progress(event.position)),
                Ok(Some(progress @ Next::Progress(_))) => return Some(progress),
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

/// `d` ± 10 %, so streams opened together do not all end (and reconnect) together.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::random_range(0.9..1.1))
}

/// The SSE messages: first the position the stream starts after (an id with no data, which a
/// client stores as its last event id), then one message per event, and between them, on a
/// stream with no event to show, how far it has read (ids with no data, paced by
/// [`progress`]). They are made by a tracked task that owns `watcher` (its subscription and
/// slot) and ends as the module doc says.
fn events(
    app: &AppState,
    mut watcher: Watcher,
) -> impl Stream<Item = std::result::Result<Event, Infallible>> {
    let (tx, rx) = tokio::sync::mpsc::channel(BUFFERED);
    let write_timeout = app.watch_write_timeout;
    app.leases.spawn(async move {
        let mut message = Event::default()
            .id(watcher.subscription.start().to_string())
            .retry(Duration::from_millis(RETRY_MS));
        let mut pacer = Pacer::new(progress::EVERY);
        loop {
            // Handed over, or the stream ends: the reader left, or took nothing for the
            // write timeout, or the stream's life is over.
            let handed = tokio::select! {
                sent = tx.send(message) => sent.is_ok(),
                () = tokio::time::sleep(write_timeout) => {
                    tracing::debug!("event stream ended: its reader took nothing");
                    false
                }
                () = watcher.stopping.cancelled() => false,
                () = tokio::time::sleep_until(watcher.ends_at) => false,
            };
            if !handed {
                return;
            }
            pacer.sent();
            message = loop {
                let next = tokio::select! {
                    next = watcher.next() => next,
                    position = pacer.due() => break Event::default().id(position.to_string()),
                    () = tx.closed() => None,
                };
                match next {
                    Some(Next::Event(event)) => {
                        break Event::default()
                            .id(event.position.to_string())
                            .event(event.kind.as_str())
                            .json_data(&event)
                            .unwrap_or_else(|_| Event::default().comment("unserialisable event"))
                    }
                    Some(Next::Progress(position)) => pacer.read_through(position),
                    None => return,
                }
            };
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|message| (Ok(message), rx))
    })
}
