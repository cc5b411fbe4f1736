//! Who may call (DESIGN §5.1 "Who may call"): bearer tokens checked against the token file
//! (`--auth-tokens`), permissions per operation and resource-name prefix. Off unless the flag is
//! given; then every route but the operational ones needs a principal.
//!
//! The table is swapped whole on reload (SIGHUP, or the file's modification time or length
//! changing), so a request sees either the old table or the new one; connections are not
//! touched, each request is judged by the table current when it arrives.

mod table;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use axum::http::{header, HeaderMap};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use table::{Op, Principal, Table};

/// How often the token file's modification time and length are looked at.
const POLL: Duration = Duration::from_secs(2);

/// Why a request is not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unauthenticated {
    /// No `Authorization` header.
    Missing,
    /// An `Authorization` header that is not `Bearer TOKEN`.
    Malformed,
    /// A bearer token that is in no line of the token file.
    Unknown,
}

impl Unauthenticated {
    /// For the problem detail and audit lines.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Unauthenticated::Missing => "no Authorization header",
            Unauthenticated::Malformed => "the Authorization header is not `Bearer TOKEN`",
            Unauthenticated::Unknown => "unknown bearer token",
        }
    }
}

/// The current token table and where it comes from.
pub(crate) struct Auth {
    path: PathBuf,
    table: RwLock<Arc<Table>>,
}

impl Auth {
    /// Loads the token file; an unusable file is refused (the proxy does not start).
    pub(crate) fn load(path: &Path) -> Result<Self, String> {
        let table = Table::load(path)?;
        tracing::info!(path = %path.display(), principals = table.len(), "token file loaded");
        Ok(Self {
            path: path.to_owned(),
            table: RwLock::new(Arc::new(table)),
        })
    }

    /// The principal the request's `Authorization: Bearer TOKEN` names.
    pub(crate) fn authenticate(
        &self,
        headers: &HeaderMap,
    ) -> Result<Arc<Principal>, Unauthenticated> {
        let value = headers
            .get(header::AUTHORIZATION)
            .ok_or(Unauthenticated::Missing)?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then_some(token.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or(Unauthenticated::Malformed)?;
        self.current()
            .authenticate(token)
            .ok_or(Unauthenticated::Unknown)
    }

    fn current(&self) -> Arc<Table> {
        // A poisoned lock only means a reload panicked mid-swap of an Arc: the value is whole.
        self.table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Reads the file again; a file that does not parse leaves the current table in force.
    fn reload(&self, why: &'static str) {
        match Table::load(&self.path) {
            Ok(table) => {
                tracing::info!(path = %self.path.display(), principals = table.len(), why, "token file reloaded");
                *self
                    .table
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(table);
            }
            Err(e) => {
                tracing::error!(error = %e, why, "token file NOT reloaded; the previous table stays in force");
            }
        }
    }

    /// Reloads on SIGHUP and when the file changes, until `cancel`; the task is `tracker`'s.
    pub(crate) fn watch(self: &Arc<Self>, tracker: &TaskTracker, cancel: CancellationToken) {
        let auth = self.clone();
        tracker.spawn(async move {
            let mut hangup = match signal(SignalKind::hangup()) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "no SIGHUP handler; the token file is reloaded on change only");
                    None
                }
            };
            let mut seen = stamp(&auth.path);
            loop {
                let why = tokio::select! {
                    () = cancel.cancelled() => return,
                    Some(()) = async { match &mut hangup {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    } } => "SIGHUP",
                    () = tokio::time::sleep(POLL) => {
                        let now = stamp(&auth.path);
                        if now == seen {
                            continue;
                        }
                        "file changed"
                    }
                };
                seen = stamp(&auth.path);
                auth.reload(why);
            }
        });
    }
}

/// What is compared between polls: modification time and length (either changes on a rewrite).
fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}
