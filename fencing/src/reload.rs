//! Reloading files without a restart: on SIGHUP, and when any of them changes (modification
//! time or length, looked at every 2 s) — the token file of lease-proxy and the TLS files of
//! both binaries.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often the files' modification times and lengths are looked at.
pub const POLL: Duration = Duration::from_secs(2);

/// Calls `reload` with why (`"SIGHUP"` or `"file changed"`) whenever SIGHUP arrives or one of
/// `files` changes, until `cancel`; the task is `tracker`'s. Without a SIGHUP handler (it
/// cannot be installed) only changes are noticed, and that is logged. `reload` runs on the
/// blocking pool (it reads files), one call at a time.
pub fn on_change(
    files: Vec<PathBuf>,
    tracker: &TaskTracker,
    cancel: CancellationToken,
    reload: impl Fn(&'static str) + Send + Sync + 'static,
) {
    let reload = std::sync::Arc::new(reload);
    tracker.spawn(async move {
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "no SIGHUP handler; files are reloaded on change only");
                None
            }
        };
        let mut seen = stamps(&files);
        loop {
            let why = tokio::select! {
                () = cancel.cancelled() => return,
                Some(()) = async { match &mut hangup {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                } } => "SIGHUP",
                () = tokio::time::sleep(POLL) => {
                    if stamps(&files) == seen {
                        continue;
                    }
                    "file changed"
                }
            };
            seen = stamps(&files);
            let reload = reload.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || reload(why)).await {
                tracing::error!(error = %e, why, "reload failed");
            }
        }
    });
}

/// What is compared between polls: modification time and length (either changes on a
/// rewrite), per file.
fn stamps(files: &[PathBuf]) -> Vec<Option<(SystemTime, u64)>> {
    // Metadata only: never opens the file, so a FIFO or a device costs nothing here.
    files
        .iter()
        .map(|p| {
            let meta = std::fs::metadata(p).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        })
        .collect()
}
