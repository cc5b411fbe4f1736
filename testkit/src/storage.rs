//! Protected storage for tests (feature `proxy`): fence-gateway in this process in front of a
//! storage service that records every write it is sent, so a test can write through the proxy's
//! forward or straight to the gateway and see what got through.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a starting gateway has to answer `/readyz` with 200.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// One request the storage received: the fencing headers the enforcer in front set, and the
/// body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// `Fencing-Resource`.
    pub resource: String,
    /// `Fencing-Token` (signed).
    pub token: String,
    /// The request's path.
    pub path: String,
    /// The body, as text.
    pub body: String,
}

/// A storage service that answers `200 stored` to every request and records it.
#[derive(Debug, Clone)]
pub struct Storage {
    /// Its base URL.
    pub url: String,
    writes: Arc<Mutex<Vec<Write>>>,
}

impl Storage {
    /// Starts one on a free loopback port, serving until the runtime ends.
    pub async fn start() -> Storage {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("the bound port"));
        let writes: Arc<Mutex<Vec<Write>>> = Arc::default();
        let log = writes.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    while let Some(write) = serve_one(&mut conn).await {
                        log.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(write);
                    }
                });
            }
        });
        Storage { url, writes }
    }

    /// Every write received so far, in arrival order.
    pub fn writes(&self) -> Vec<Write> {
        self.writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Reads one request from `conn` and answers it; `None` once the connection ends.
async fn serve_one(conn: &mut TcpStream) -> Option<Write> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let header = |name: &str| {
        head.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_owned())
            })
            .unwrap_or_default()
    };
    let length: usize = header("content-length").parse().unwrap_or(0);
    while buf.len() < head_end + length {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let write = Write {
        resource: header("fencing-resource"),
        token: header("fencing-token"),
        path: head.split(' ').nth(1).unwrap_or_default().to_owned(),
        body: String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned(),
    };
    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\ncontent-type: text/plain\r\n\r\nstored";
    conn.write_all(answer).await.ok()?;
    Some(write)
}

/// fence-gateway in this process, in header mode (a write's resource is its `Fencing-Resource`
/// header), its marks in memory, verifying tokens with `key_file` (the proxy's), in front of
/// `upstream`. Its base URL, once it is ready.
pub async fn start_gateway(upstream: &str, key_file: &Path) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("the bound port"));
    let config = fencing::gateway::GatewayConfig::new(upstream, "memory", key_file.to_owned());
    tokio::spawn(fencing::gateway::run(
        listener,
        config,
        std::future::pending(),
    ));
    let readyz = format!("{url}/readyz");
    crate::poll::answers(&reqwest::Client::new(), &readyz, 200, READY_WITHIN).await;
    url
}
