//! The protected storage: an HTTP service that applies every write it receives, in arrival
//! order, and keeps its own apply log — the ground truth the checker judges. It trusts nobody
//! and checks nothing: whatever reaches it is applied, so whatever the enforcer lets through
//! shows in the log.

use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::put;
use axum::Router;
use fencing::Keyring;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// One applied write.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The resource written.
    pub resource: String,
    /// The fencing token's revision presented with the write (0 if none or unreadable).
    pub revision: u64,
    /// The writing client, from the body.
    pub client: String,
    /// The client's operation id, from the body.
    pub op: u64,
    /// When it was applied.
    pub at: Instant,
}

#[derive(Deserialize)]
struct Write {
    client: String,
    op: u64,
}

struct Shared {
    keys: Keyring,
    log: Mutex<Vec<Applied>>,
}

/// The running storage; stops when dropped.
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
    /// (for the log only: the storage itself refuses nothing).
    pub async fn start(keys: Keyring) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let shared = Arc::new(Shared {
            keys,
            log: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/items/{resource}", put(apply))
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
}

async fn apply(
    State(shared): State<Arc<Shared>>,
    Path(resource): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let Ok(write) = serde_json::from_slice::<Write>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    let revision = headers
        .get(fencing::TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|wire| shared.keys.verify(&resource, wire).ok())
        .map_or(0, |t| t.revision);
    let Ok(mut log) = shared.log.lock() else {
        return StatusCode::INTERNAL_SERVER_ERROR;
    };
    log.push(Applied {
        resource,
        revision,
        client: write.client,
        op: write.op,
        at: Instant::now(),
    });
    StatusCode::NO_CONTENT
}
