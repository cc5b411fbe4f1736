//! The watch consumer: `GET /v1/watch` (Server-Sent Events) as a [`futures::Stream`] of
//! [`Event`]s that reconnects and resumes from the last event id it saw.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::error::{self, Error, Result};
use crate::sse;
use crate::Client;

/// The proxy sends a comment every 15 s: a stream silent for this long is dead.
const IDLE: Duration = Duration::from_secs(45);
/// First pause before reconnecting (doubled up to [`MAX_BACKOFF`]).
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest pause between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What happened to a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// Someone acquired it.
    Acquired,
    /// Its holder released it.
    Released,
    /// Its grant's lease expired (or its session ended).
    Expired,
}

/// One change of a resource's holder. Serializes as the stream's `data` with the message's
/// `id` first: `{"id", "type", "resource", "holder", "token", "revision", "lease_id",
/// "session"?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// The event's id: resume after it with [`Client::watch`]'s `last_event_id`.
    pub id: String,
    /// What happened.
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// The resource.
    pub resource: String,
    /// The holder of the grant that began or ended.
    pub holder: String,
    /// That grant's token (its create revision).
    #[serde(serialize_with = "crate::model::to_u64_string")]
    pub token: u64,
    /// The etcd revision of the change.
    pub revision: i64,
    /// That grant's etcd lease id (decimal).
    pub lease_id: String,
    /// The session the grant lived on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// An event's `data`, as the proxy writes it.
#[derive(Debug, Deserialize)]
struct Data {
    #[serde(rename = "type")]
    kind: EventKind,
    resource: String,
    holder: String,
    #[serde(deserialize_with = "crate::model::u64_string")]
    token: u64,
    revision: i64,
    lease_id: String,
    #[serde(default)]
    session: Option<String>,
}

impl Event {
    /// The event in message `data` with id `id`.
    fn parse(id: String, data: &str) -> Result<Event> {
        let d: Data = serde_json::from_str(data).map_err(|e| {
            let data: String = data.chars().take(500).collect();
            Error::Protocol(format!("watch event {id}: {e}: {data}"))
        })?;
        Ok(Event {
            id,
            kind: d.kind,
            resource: d.resource,
            holder: d.holder,
            token: d.token,
            revision: d.revision,
            lease_id: d.lease_id,
            session: d.session,
        })
    }
}

/// What the connection loop yields: an event, or an id-only message (a resume point: where
/// the stream starts, or progress on a stream with no event to show).
enum Item {
    Event(Event),
    Id(String),
}

/// The events of a watch, as a [`Stream`]. Reconnects after transport failures, any 5xx or 429
/// answer and silent connections (with a backoff from 100 ms up to 5 s, reset only once a
/// connection delivered an event), resuming after the last complete message seen, so nothing
/// is lost or repeated. Id-only messages (where the stream starts, and how far a stream with
/// no event to show has read) are never yielded; they move the resume point on, so a quiet
/// watch's resume point keeps up with etcd's compaction. A malformed event, or a line (or one message's data) over 1 MiB, is
/// yielded as an [`Error::Protocol`] item and the stream goes on (after an oversized line, on
/// a new connection). Ends after yielding an error that retrying cannot fix:
/// [`Error::Compacted`] (list again, then watch without a last event id), or a problem such
/// as 401/403.
pub struct EventStream {
    items: Pin<Box<dyn Stream<Item = Result<Item>> + Send>>,
    last_event_id: Option<String>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("last_event_id", &self.last_event_id)
            .finish_non_exhaustive()
    }
}

impl EventStream {
    /// The id of the last message received (event, or an id-only resume point: the start, or
    /// progress on a quiet stream): pass it to [`Client::watch`] to resume after it.
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }
}

impl Stream for EventStream {
    type Item = Result<Event>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match self.items.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(Item::Id(id)))) => self.last_event_id = Some(id),
                Poll::Ready(Some(Ok(Item::Event(event)))) => {
                    self.last_event_id = Some(event.id.clone());
                    return Poll::Ready(Some(Ok(event)));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Client {
    /// Watches the resources whose names start with `prefix` (all with `""`), after
    /// `last_event_id` when given (an id from an earlier [`EventStream`]), from now otherwise.
    /// Nothing is sent before the stream is first polled.
    pub fn watch(&self, prefix: &str, last_event_id: Option<String>) -> EventStream {
        let state = Watch {
            client: self.clone(),
            prefix: prefix.to_owned(),
            last_event_id: last_event_id.clone(),
            connection: None,
            ready: VecDeque::new(),
            backoff: FIRST_BACKOFF,
            pause_first: false,
            ended: false,
        };
        EventStream {
            items: Box::pin(futures::stream::unfold(state, Watch::next)),
            last_event_id,
        }
    }
}

/// The connection loop's state.
struct Watch {
    client: Client,
    prefix: String,
    last_event_id: Option<String>,
    connection: Option<(reqwest::Response, sse::Parser)>,
    /// Parsed items not yet yielded.
    ready: VecDeque<Result<Item>>,
    backoff: Duration,
    /// Back off before the next connection (set once the error that dropped the last one
    /// has been yielded).
    pause_first: bool,
    ended: bool,
}

impl Watch {
    async fn next(mut self) -> Option<(Result<Item>, Self)> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some((item, self));
            }
            if self.ended {
                return None;
            }
            let Some((response, parser)) = &mut self.connection else {
                if std::mem::take(&mut self.pause_first) {
                    self.pause().await;
                }
                match self.connect().await {
                    Ok(response) => self.connection = Some((response, sse::Parser::default())),
                    Err(e) if e.reconnects_watch() => self.pause().await,
                    Err(e) => {
                        self.ended = true;
                        return Some((Err(e), self));
                    }
                }
                continue;
            };
            match tokio::time::timeout(IDLE, response.chunk()).await {
                Ok(Ok(Some(bytes))) => {
                    let messages = parser.feed(&bytes);
                    let overflowed = parser.overflowed();
                    for message in messages {
                        self.receive(message);
                    }
                    if overflowed {
                        // Resumes after the last complete message on a new connection.
                        self.connection = None;
                        self.ready.push_back(Err(Error::Protocol(format!(
                            "watch: an event-stream line or message over {} bytes",
                            sse::MAX_LINE
                        ))));
                        self.pause_first = true;
                    }
                }
                // Ended, broken or silent: reconnect after the last id seen.
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                    self.connection = None;
                    self.pause().await;
                }
            }
        }
    }

    /// `GET /v1/watch`, resuming after the last event id.
    async fn connect(&self) -> Result<reqwest::Response> {
        let mut req = self
            .client
            .request_streaming(Method::GET, "/v1/watch")
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if !self.prefix.is_empty() {
            req = req.query(&[("prefix", &self.prefix)]);
        }
        if let Some(id) = &self.last_event_id {
            req = req.header("last-event-id", id);
        }
        let response = tokio::time::timeout(self.client.timeout(), req.send())
            .await
            .map_err(|_| Error::Timeout)??;
        let status = response.status().as_u16();
        if status == 200 {
            Ok(response)
        } else {
            let body = crate::client::read_body(response).await.unwrap_or_default();
            Err(error::from_answer(status, &body))
        }
    }

    /// Takes in one message: its id is the resume point; its data, if any, an event.
    fn receive(&mut self, message: sse::Message) {
        let Some(id) = message.id else {
            return; // the proxy ids every message; anything else is not an event of ours
        };
        self.last_event_id = Some(id.clone());
        let item = match message.data {
            Some(data) => {
                // An event (even a malformed one): this connection works, back off no more.
                self.backoff = FIRST_BACKOFF;
                Event::parse(id, &data).map(Item::Event)
            }
            None => Ok(Item::Id(id)),
        };
        self.ready.push_back(item);
    }

    async fn pause(&mut self) {
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_from_their_data() {
        let e = Event::parse(
            "1234.0".into(),
            r#"{"type":"acquired","resource":"aisle-1","holder":"robot-3","token":"1234","revision":1234,"lease_id":"7587","session":"7587"}"#,
        )
        .unwrap();
        assert_eq!(
            e,
            Event {
                id: "1234.0".into(),
                kind: EventKind::Acquired,
                resource: "aisle-1".into(),
                holder: "robot-3".into(),
                token: 1234,
                revision: 1234,
                lease_id: "7587".into(),
                session: Some("7587".into()),
            }
        );
        let e = Event::parse(
            "1240".into(),
            r#"{"type":"expired","resource":"a","holder":"h","token":"12","revision":1240,"lease_id":"9"}"#,
        )
        .unwrap();
        assert_eq!((e.kind, e.session), (EventKind::Expired, None));
        assert!(matches!(
            Event::parse("1".into(), r#"{"type":"stolen"}"#),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn ids_are_resume_points_and_data_are_events() {
        let mut w = Watch {
            client: Client::new("http://127.0.0.1:1").unwrap(),
            prefix: String::new(),
            last_event_id: None,
            connection: None,
            ready: VecDeque::new(),
            backoff: FIRST_BACKOFF,
            pause_first: false,
            ended: false,
        };
        let mut parser = sse::Parser::default();
        for m in parser.feed(b"id: 100\n\n: keepalive\n\nid: 101.0\nevent: released\ndata: {\"type\":\"released\",\"resource\":\"a\",\"holder\":\"h\",\"token\":\"90\",\"revision\":101,\"lease_id\":\"5\"}\n\n") {
            w.receive(m);
        }
        assert_eq!(w.last_event_id.as_deref(), Some("101.0"));
        assert!(matches!(w.ready.pop_front(), Some(Ok(Item::Id(id))) if id == "100"));
        assert!(
            matches!(w.ready.pop_front(), Some(Ok(Item::Event(e))) if e.token == 90 && e.kind == EventKind::Released)
        );
        assert!(w.ready.is_empty());
        // A quiet stream's progress: an id-only message moves the resume point on, no event.
        for m in parser.feed(b": keepalive\n\nid: 140\n\n") {
            w.receive(m);
        }
        assert_eq!(w.last_event_id.as_deref(), Some("140"));
        assert!(matches!(w.ready.pop_front(), Some(Ok(Item::Id(id))) if id == "140"));
        assert!(w.ready.is_empty());
    }

    /// The stream yields events only, and its resume point is the newest id of any message:
    /// progress after the last event included.
    #[tokio::test]
    async fn progress_ids_move_the_resume_point_and_are_never_yielded() {
        use futures::StreamExt as _;
        let event = Event::parse(
            "101.0".into(),
            r#"{"type":"acquired","resource":"a","holder":"h","token":"101","revision":101,"lease_id":"5"}"#,
        )
        .unwrap();
        let items = vec![
            Ok(Item::Id("100".into())),
            Ok(Item::Id("100.4".into())),
            Ok(Item::Event(event.clone())),
            Ok(Item::Id("130".into())),
            Ok(Item::Id("150".into())),
        ];
        let mut stream = EventStream {
            items: Box::pin(futures::stream::iter(items)),
            last_event_id: None,
        };
        assert_eq!(stream.next().await.map(|e| e.ok()), Some(Some(event)));
        assert_eq!(stream.last_event_id(), Some("101.0"));
        assert!(stream.next().await.is_none());
        assert_eq!(stream.last_event_id(), Some("150"));
    }
}
