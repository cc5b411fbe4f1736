//! The protected storage: an HTTP service that applies every write it receives and keeps its
//! own apply log — the ground truth the checker judges. It trusts nobody and checks nothing:
//! whatever reaches it is applied, so whatever the enforcer lets through shows in the log.
//!
//! Like a real storage it takes time: once a write's body has been read in full, applying it
//! takes a processing time drawn between the configured bounds, and the answer comes only after
//! that, so "applied" ≠ "answered". The apply runs in a task of its own: a caller that goes away
//! (the gateway's timeout, a reset) does not stop it — as with a database that commits a
//! transaction whose client has disconnected. A body that never arrives whole is never applied.
//! A write may ask for its own processing time (`slow_ms` in its body): a slow transaction.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::put;
use axum::Router;
use fencing::Keyring;
use rand::rngs::StdRng;
use rand::Rng;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

/// One applied write.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The resource written.
    pub resource: String,
    /// The fencing token's revision presented with the write (0 if none or unreadable).
    pub revision: u64,
    /// The writing client, from the body.
    pub client: String,
    /// The client's operation id, from the body: with `client`, the write's id.
    pub op: u64,
    /// When its body had been read in full.
    pub received: Instant,
    /// When it was applied (the log is in this order).
    pub at: Instant,
}

#[derive(Deserialize)]
struct Write {
    client: String,
    op: u64,
    /// A processing time the write asks for instead of a drawn one (a slow transaction).
    #[serde(default)]
    slow_ms: Option<u64>,
}

struct Shared {
    keys: Keyring,
    log: Mutex<Vec<Applied>>,
    processing: (Duration, Duration),
    rng: Mutex<StdRng>,
    applying: TaskTracker,
}

/// The running storage; stops when dropped (writes being applied are abandoned then).
pub struct Storage {
    url: String,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for Storage {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Storage {
    /// Starts the storage on a free loopback port. `keys` reads the presented token's revision
    /// (for the log only: the storage itself refuses nothing). Each write takes a processing
    /// time drawn uniformly from `processing` (inclusive bounds) with `rng`.
    pub async fn start(
        keys: Keyring,
        processing: (Duration, Duration),
        rng: StdRng,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let shared = Arc::new(Shared {
            keys,
            log: Mutex::new(Vec::new()),
            processing: (processing.0, processing.1.max(processing.0)),
            rng: Mutex::new(rng),
            applying: TaskTracker::new(),
        });
        let app = Router::new()
            .route("/items/{*resource}", put(apply))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, shared, task })
    }

    /// Base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A copy of the apply log so far.
    pub fn log(&self) -> Vec<Applied> {
        self.shared
            .log
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    /// Waits until every write received so far has been applied.
    pub async fn settle(&self) {
        self.shared.applying.close();
        self.shared.applying.wait().await;
        self.shared.applying.reopen();
    }
}

async fn apply(
    State(shared): State<Arc<Shared>>,
    Path(resource): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let received = Instant::now();
    let Ok(write) = serde_json::from_slice::<Write>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    let revision = headers
        .get(fencing::TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|wire| shared.keys.verify(&resource, wire).ok())
        .map_or(0, |t| t.revision);
    let (lo, hi) = shared.processing;
    let drawn = shared
        .rng
        .lock()
        .map(|mut rng| rng.random_range(lo..=hi))
        .unwrap_or(hi);
    let processing = write.slow_ms.map_or(drawn, Duration::from_millis);
    let (done, applied) = tokio::sync::oneshot::channel();
    let state = shared.clone();
    // Its own task: dropping this handler (the caller went away) does not stop the apply.
    shared.applying.spawn(async move {
        tokio::time::sleep(processing).await;
        if let Ok(mut log) = state.log.lock() {
            log.push(Applied {
                resource,
                revision,
                client: write.client,
                op: write.op,
                received,
                at: Instant::now(),
            });
            let _ = done.send(());
        }
    });
    match applied.await {
        Ok(()) => StatusCode::NO_CONTENT,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rand::SeedableRng;
    use tokio::io::AsyncWriteExt;

    fn keys() -> Keyring {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k");
        Keyring::create_file(&file, &fencing::KeyId::parse("t").unwrap()).unwrap();
        Keyring::load(&file).unwrap()
    }

    #[tokio::test]
    async fn applies_after_processing_even_when_the_caller_is_gone() {
        let processing = Duration::from_millis(300);
        let storage = Storage::start(keys(), (processing, processing), StdRng::seed_from_u64(1))
            .await
            .unwrap();
        let addr = storage.url().trim_start_matches("http://").to_owned();
        let body = br#"{"client":"a","op":1}"#;
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "PUT /items/r HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(s);
        assert!(
            storage.log().is_empty(),
            "applied before its processing time"
        );
        storage.settle().await;
        let log = storage.log();
        assert_eq!(log.len(), 1);
        assert!(log[0].at - log[0].received >= processing);

        // An answer comes only once the write is applied.
        let sent = Instant::now();
        let status = reqwest::Client::new()
            .put(format!("{}/items/r", storage.url()))
            .body(r#"{"client":"b","op":2}"#)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 204);
        assert!(sent.elapsed() >= processing);
        assert_eq!(storage.log().len(), 2, "answered before applied");

        // Half a body, then gone: never applied.
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(&body[..5]).await.unwrap();
        drop(s);
        tokio::time::sleep(Duration::from_millis(100)).await;
        storage.settle().await;
        assert_eq!(storage.log().len(), 2);
    }
}
