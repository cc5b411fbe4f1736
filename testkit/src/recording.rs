//! A storage service for tests (feature `http`): it answers every request and records what
//! reached it — method, raw path and query, every header, the body — in the order it applied
//! them, so a test can see what an enforcer in front let through and with which headers.
//!
//! [`Storage::start`] answers `200 stored` at once; [`Storage::builder`] sets another answer,
//! echoes the body, adds headers, serves over a caller's listener (TLS), or applies writes
//! marked `x-mode: slow` or `early` late, as a real storage finishing work its client gave up on.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use http_body_util::BodyExt;

/// One request the storage applied.
#[derive(Debug, Clone)]
pub struct Received {
    /// The method.
    pub method: Method,
    /// The path as sent, not normalised.
    pub path: String,
    /// The query as sent, if any.
    pub query: Option<String>,
    /// Every header.
    pub headers: HeaderMap,
    /// The body (empty if the client broke it off).
    pub body: Bytes,
}

impl Received {
    /// The first value of header `name` as text, if it has one that is text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Every value of header `name`, as bytes.
    pub fn all(&self, name: &str) -> Vec<Vec<u8>> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect()
    }

    /// `Fencing-Resource`, or "" without one.
    pub fn resource(&self) -> &str {
        self.header("fencing-resource").unwrap_or_default()
    }

    /// `Fencing-Token` as sent, or "" without one.
    pub fn token(&self) -> &str {
        self.header("fencing-token").unwrap_or_default()
    }

    /// The revision a signed `Fencing-Token` carries (its fourth dot-separated field).
    pub fn revision(&self) -> Option<u64> {
        self.token().split('.').nth(3)?.parse().ok()
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// What a storage applied so far; cloned handles share it.
#[derive(Debug, Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Received>>>);

impl Log {
    /// Every request applied so far, in the order applied.
    pub fn all(&self) -> Vec<Received> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every request applied so far, emptying the log.
    pub fn take(&self) -> Vec<Received> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// How many requests were applied so far.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether nothing was applied yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push(&self, received: Received) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(received);
    }
}

/// A recording storage serving on a loopback port until the runtime ends.
#[derive(Debug, Clone)]
pub struct Storage {
    /// Its base URL.
    pub url: String,
    /// What it applied.
    pub log: Log,
}

impl Storage {
    /// One that answers `200 stored` to everything, on a free loopback port.
    pub async fn start() -> Storage {
        Storage::builder().start().await
    }

    /// One with other answers or timing.
    pub fn builder() -> Builder {
        Builder::default()
    }
}

/// How a [`Storage`] answers.
#[derive(Debug, Clone)]
pub struct Builder {
    answer: &'static str,
    echo: bool,
    headers: Vec<(HeaderName, HeaderValue)>,
    slow: Option<Duration>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            answer: "stored",
            echo: false,
            headers: Vec::new(),
            slow: None,
        }
    }
}

impl Builder {
    /// The body of every answer (default `stored`).
    pub fn answer(mut self, body: &'static str) -> Self {
        self.answer = body;
        self
    }

    /// Answers with the request's body instead.
    pub fn echo(mut self) -> Self {
        self.echo = true;
        self
    }

    /// Adds a header to every answer.
    pub fn header(mut self, name: &'static str, value: &'static str) -> Self {
        self.headers.push((
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        ));
        self
    }

    /// Applies each write in a task of its own, as a real storage would (a connection closed
    /// by the client does not undo work under way), by its `x-mode` header:
    /// - `slow`: reads the body (to its end, or until it breaks off), takes `apply`, applies
    ///   what it got, answers;
    /// - `early`: answers at once, then reads the body to its end and applies it;
    /// - anything else, or none: reads the body, applies, answers.
    pub fn modes(mut self, apply: Duration) -> Self {
        self.slow = Some(apply);
        self
    }

    /// The service and its log, for a caller serving it itself (over TLS, say).
    pub fn router(self) -> (axum::Router, Log) {
        let log = Log::default();
        let handle = log.clone();
        let this = Arc::new(self);
        let router = axum::Router::new().fallback(move |req: Request<Body>| {
            let (this, log) = (this.clone(), log.clone());
            async move { this.serve(req, log).await }
        });
        (router, handle)
    }

    /// Serves on a free loopback port until the runtime ends.
    pub async fn start(self) -> Storage {
        let (router, log) = self.router();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("the bound port"));
        tokio::spawn(async move { axum::serve(listener, router).await });
        Storage { url, log }
    }

    async fn serve(&self, req: Request<Body>, log: Log) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let mode = parts.headers.get("x-mode").map(HeaderValue::as_bytes);
        let (slow, early) = match (self.slow, mode) {
            (Some(apply), Some(b"slow")) => (Some(apply), false),
            (Some(_), Some(b"early")) => (None, true),
            _ => (None, false),
        };
        let applying = tokio::spawn(async move {
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            if let Some(apply) = slow {
                tokio::time::sleep(apply).await;
            }
            log.push(Received {
                method: parts.method,
                path: parts.uri.path().to_owned(),
                query: parts.uri.query().map(str::to_owned),
                headers: parts.headers,
                body: body.clone(),
            });
            body
        });
        let body = if early {
            Bytes::new()
        } else {
            applying.await.unwrap_or_default()
        };
        let mut answer = Response::new(if self.echo {
            Body::from(body)
        } else {
            Body::from(self.answer)
        });
        answer.headers_mut().extend(self.headers.iter().cloned());
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_what_arrived_and_answers_as_built() {
        let storage = Storage::builder()
            .echo()
            .header("x-storage", "yes")
            .start()
            .await;
        let answer = reqwest::Client::new()
            .put(format!("{}/counts/a%2Fb?x=1", storage.url))
            .header("fencing-resource", "aisle-1")
            .header("fencing-token", "v1.k1.0.42.sig")
            .header("fencing-token", "second")
            .body("count")
            .send()
            .await
            .expect("an answer");
        assert_eq!(answer.headers()["x-storage"], "yes");
        assert_eq!(answer.text().await.expect("a body"), "count");
        let [got] = storage.log.take().try_into().expect("one request");
        assert_eq!(got.method, Method::PUT);
        assert_eq!(
            (got.path.as_str(), got.query.as_deref()),
            ("/counts/a%2Fb", Some("x=1"))
        );
        assert_eq!((got.resource(), got.revision()), ("aisle-1", Some(42)));
        assert_eq!(got.all("fencing-token").len(), 2);
        assert_eq!(got.text(), "count");
        assert!(storage.log.is_empty(), "take empties the log");
    }

    #[tokio::test]
    async fn a_slow_write_is_applied_after_its_time_and_before_the_answer() {
        let apply = Duration::from_millis(300);
        let storage = Storage::builder().modes(apply).start().await;
        let started = tokio::time::Instant::now();
        let answer = reqwest::Client::new()
            .put(&storage.url)
            .header("x-mode", "slow")
            .send()
            .await
            .expect("an answer");
        assert!(started.elapsed() >= apply, "answered before applying");
        assert_eq!(answer.text().await.expect("a body"), "stored");
        assert_eq!(storage.log.len(), 1);
    }
}
