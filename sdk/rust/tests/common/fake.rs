//! A hostile fake proxy for the SDK's tests: a raw TCP listener that reads each request and
//! answers with canned bytes chosen by the test (one request per connection, then closed).
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request received: method, path (with its query) and header lines (lowercase names).
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the fake answers to one request.
pub enum Reply {
    /// These bytes, then the connection is closed.
    Raw(Vec<u8>),
    /// These bytes, then `filler` repeated until `limit` bytes were written in all (or the
    /// client went away), then closed. Counts what it wrote in [`Fake::written`].
    Endless {
        head: Vec<u8>,
        filler: Vec<u8>,
        limit: usize,
    },
}

/// `HTTP/1.1 {status}` with a JSON body.
pub fn json(status: u16, body: &str) -> Reply {
    Reply::Raw(
        format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

/// A `200` event stream whose body is `body`, closed after it.
pub fn events(body: &str) -> Reply {
    Reply::Raw(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{body}"
        )
        .into_bytes(),
    )
}

/// A grant answer of `POST /v1/leases/{resource}` with these timings.
pub fn grant(resource: &str, ttl_seconds: u64, expires_in_ms: &str) -> Reply {
    json(
        201,
        &format!(
            r#"{{"resource":"{resource}","holder":"h","lease_id":"7","secret":"s","token":"12","fencing_token":"v1.x","ttl_seconds":{ttl_seconds},"expires_in_ms":{expires_in_ms}}}"#
        ),
    )
}

/// A renewal answer.
pub fn renewal(ttl_seconds: u64, expires_in_ms: u64) -> Reply {
    json(
        200,
        &format!(r#"{{"ttl_seconds":{ttl_seconds},"expires_in_ms":{expires_in_ms},"token":"12"}}"#),
    )
}

type Handler = dyn Fn(&Request, usize) -> Reply + Send + Sync;

/// A running fake: its URL, the requests it got, the bytes its endless answers wrote.
pub struct Fake {
    pub url: String,
    requests: Arc<Mutex<Vec<Request>>>,
    written: Arc<AtomicUsize>,
}

impl Fake {
    /// Serves `handler(request, n)` (`n`: how many requests came before it) until dropped
    /// with the runtime.
    pub async fn start(handler: impl Fn(&Request, usize) -> Reply + Send + Sync + 'static) -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::new(AtomicUsize::new(0));
        let handler: Arc<Handler> = Arc::new(handler);
        let (reqs, wrote) = (requests.clone(), written.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (handler, reqs, wrote) = (handler.clone(), reqs.clone(), wrote.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, &*handler, &reqs, &wrote).await;
                });
            }
        });
        Fake {
            url,
            requests,
            written,
        }
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// How many requests came in whose path starts with `prefix`.
    pub fn count(&self, method: &str, prefix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method == method && r.path.starts_with(prefix))
            .count()
    }

    /// Bytes written by [`Reply::Endless`] answers.
    pub fn written(&self) -> usize {
        self.written.load(Ordering::SeqCst)
    }
}

async fn serve(
    mut stream: TcpStream,
    handler: &Handler,
    requests: &Mutex<Vec<Request>>,
    written: &AtomicUsize,
) -> std::io::Result<()> {
    // The head, then as much body as content-length says.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let method = first.next().unwrap_or("").to_owned();
    let path = first.next().unwrap_or("").to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let request = Request {
        method,
        path,
        headers,
    };
    let n = {
        let mut reqs = requests.lock().unwrap();
        reqs.push(request.clone());
        reqs.len() - 1
    };
    match handler(&request, n) {
        Reply::Raw(bytes) => {
            stream.write_all(&bytes).await?;
        }
        Reply::Endless {
            head,
            filler,
            limit,
        } => {
            stream.write_all(&head).await?;
            let mut total = head.len();
            while total < limit {
                stream.write_all(&filler).await?;
                total += filler.len();
                written.store(total, Ordering::SeqCst);
            }
        }
    }
    stream.flush().await?;
    // Let the client read everything before the close.
    let _ = stream.shutdown().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(())
}
