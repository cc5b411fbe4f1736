//! A minimal Server-Sent Events reader for the `/v1/watch` tests.

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::Value;
use tokio::time::{timeout, Instant};

/// One SSE message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: Option<Value>,
}

/// A minimal SSE reader over a streaming response.
pub struct Sse {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: Vec<u8>,
    /// The server ended the stream (as opposed to nothing arriving in time).
    pub ended: bool,
}

impl Sse {
    pub async fn open(url: &str, last_event_id: Option<&str>) -> Self {
        Self::open_as(url, last_event_id, None).await
    }

    pub async fn open_as(url: &str, last_event_id: Option<&str>, bearer: Option<&str>) -> Self {
        let mut tries = 0;
        let resp = loop {
            let mut req = reqwest::Client::new().get(url);
            if let Some(token) = bearer {
                req = req.bearer_auth(token);
            }
            if let Some(id) = last_event_id {
                req = req.header("last-event-id", id);
            }
            let resp = req.send().await.unwrap();
            // etcd without a leader for a moment: try again, as a client would.
            if resp.status() == 503 && tries < 100 {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            break resp;
        };
        assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Self {
            body: resp.bytes_stream().boxed(),
            buf: Vec::new(),
            ended: false,
        }
    }

    /// The next message (comments skipped), or `None` when the stream ended or `within` passed.
    pub async fn next(&mut self, within: Duration) -> Option<Message> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8(block).unwrap();
                let mut m = Message {
                    id: None,
                    event: None,
                    data: None,
                };
                let mut any = false;
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        m.id = Some(v.to_owned());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        m.event = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        m.data = Some(serde_json::from_str(v).unwrap());
                        any = true;
                    }
                }
                if any {
                    return Some(m);
                }
                continue;
            }
            match timeout(
                deadline.saturating_duration_since(Instant::now()),
                self.body.next(),
            )
            .await
            {
                Ok(Some(Ok(chunk))) => self.buf.extend_from_slice(&chunk),
                Ok(_) => {
                    self.ended = true;
                    return None;
                }
                Err(_) => return None,
            }
        }
    }

    /// The next event (a message with data); panics if none comes within `within`.
    pub async fn event(&mut self, within: Duration) -> Message {
        loop {
            let m = self.next(within).await.expect("an event");
            if m.data.is_some() {
                return m;
            }
        }
    }
}
