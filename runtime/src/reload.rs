//! Reloading files without a restart: on SIGHUP, and when any of them changes — the token file
//! of lease-proxy, the fencing key file and the TLS files of both binaries.
//!
//! A change is noticed by polling every [`POLL`] what [`stamps`] compares (device, inode,
//! modification time, length), and acted on only once that stamp has stayed the same for one
//! whole poll ([`Settle`]): a file rewritten in place is read only after its writer has paused
//! for a poll, never on the poll that caught it half-written. SIGHUP is the operator's explicit
//! request and reloads at once. Replacing a file by rename (write a temporary file in the same
//! directory, then `mv` it over) is still the only way to make a change atomic.
//!
//! Every reload is counted by file and outcome ([`Reloads`]), so that an operator can alert on
//! a file that was changed and refused: the service goes on with what it had, and only the log
//! and the counter say so.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use opentelemetry::metrics::{Counter, Meter};
use opentelemetry::KeyValue;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often the files' stamps are looked at.
pub const POLL: Duration = Duration::from_secs(2);

/// What one reload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The files were read and are in force.
    Loaded,
    /// They could not be taken; what was in force stays.
    Refused,
}

impl Outcome {
    /// The `outcome` label.
    fn label(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::Refused => "refused",
        }
    }
}

/// A server's reloads, by `file` and `outcome` (`loaded`, `refused`): one counter per server,
/// named by it (`lease_proxy.reloads` is exported as `lease_proxy_reloads_total`).
#[derive(Debug, Clone)]
pub struct Reloads(Counter<u64>);

impl Reloads {
    /// The counter `name` on `meter`.
    pub fn new(meter: &Meter, name: &'static str) -> Self {
        Self(
            meter
                .u64_counter(name)
                .with_description("Files reloaded without a restart, by file and outcome.")
                .build(),
        )
    }

    /// The reloads of one kind of file (`tls`, `key-file`, …); both of its series exist from
    /// now on, at 0.
    pub fn of(&self, file: &'static str) -> FileReloads {
        for outcome in [Outcome::Loaded, Outcome::Refused] {
            self.0.add(0, &FileReloads::labels(file, outcome));
        }
        FileReloads {
            counter: self.0.clone(),
            file,
        }
    }
}

/// The reloads of one kind of file: what [`on_change`] counts into.
#[derive(Debug, Clone)]
pub struct FileReloads {
    counter: Counter<u64>,
    file: &'static str,
}

impl FileReloads {
    fn labels(file: &'static str, outcome: Outcome) -> [KeyValue; 2] {
        [
            KeyValue::new("file", file),
            KeyValue::new("outcome", outcome.label()),
        ]
    }

    fn count(&self, outcome: Outcome) {
        self.counter.add(1, &Self::labels(self.file, outcome));
    }
}

/// Calls `reload` with why (`"SIGHUP"` or `"file changed"`) whenever SIGHUP arrives or one of
/// `files` has changed and then stayed unchanged for one [`POLL`], until `cancel`; the task is
/// `tracker`'s. The SIGHUP handler is installed before this returns, so from then on SIGHUP
/// never terminates the process (that is the signal's default action); if it cannot be
/// installed, only changes are noticed, and that is logged. `reload` runs on the blocking pool
/// (it reads files), one call at a time; what it says it did is counted into `counted`.
pub fn on_change(
    files: Vec<PathBuf>,
    counted: FileReloads,
    tracker: &TaskTracker,
    cancel: CancellationToken,
    reload: impl Fn(&'static str) -> Outcome + Send + Sync + 'static,
) {
    let reload = std::sync::Arc::new(reload);
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "no SIGHUP handler; files are reloaded on change only");
            None
        }
    };
    let mut settle = Settle::new(stamps(&files));
    tracker.spawn(async move {
        loop {
            let why = tokio::select! {
                () = cancel.cancelled() => return,
                Some(()) = async { match &mut hangup {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                } } => {
                    settle.reloaded(stamps(&files));
                    "SIGHUP"
                }
                () = tokio::time::sleep(POLL) => {
                    if !settle.poll(stamps(&files)) {
                        continue;
                    }
                    "file changed"
                }
            };
            let reload = reload.clone();
            match tokio::task::spawn_blocking(move || reload(why)).await {
                Ok(outcome) => counted.count(outcome),
                Err(e) => {
                    counted.count(Outcome::Refused);
                    tracing::error!(error = %e, why, "reload failed");
                }
            }
        }
    });
}

/// Per file: device, inode, modification time and length — any of them changes on a rewrite
/// in place (time, length) or on a replacement by rename (inode), and a file that is absent
/// has none.
type Stamp = Option<(u64, u64, SystemTime, u64)>;

/// What is compared between polls, per file.
fn stamps(files: &[PathBuf]) -> Vec<Stamp> {
    use std::os::unix::fs::MetadataExt;
    // Metadata only: never opens the file, so a FIFO or a device costs nothing here.
    files
        .iter()
        .map(|p| {
            let meta = std::fs::metadata(p).ok()?;
            Some((meta.dev(), meta.ino(), meta.modified().ok()?, meta.len()))
        })
        .collect()
}

/// When a change seen by polling is acted on: once the stamp that differs from the loaded one
/// has been seen unchanged on two polls in a row (stable for one poll). A writer still at work
/// changes it between polls, so its half-written file is never read on a poll.
#[derive(Debug)]
struct Settle<S> {
    /// The stamp of what was last read.
    loaded: S,
    /// A different stamp seen on the last poll, waiting to be seen once more.
    changing: Option<S>,
}

impl<S: PartialEq> Settle<S> {
    fn new(loaded: S) -> Self {
        Self {
            loaded,
            changing: None,
        }
    }

    /// A poll saw `now`: whether to reload (then `now` counts as loaded).
    fn poll(&mut self, now: S) -> bool {
        if now == self.loaded {
            // Changed back (or never changed): nothing to read.
            self.changing = None;
            return false;
        }
        if self.changing.as_ref() == Some(&now) {
            self.changing = None;
            self.loaded = now;
            return true;
        }
        self.changing = Some(now);
        false
    }

    /// Reloaded on request, with the files as `now`.
    fn reloaded(&mut self, now: S) {
        self.loaded = now;
        self.changing = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;

    #[test]
    fn a_change_is_acted_on_once_it_has_held_for_a_poll() {
        let mut s = Settle::new(0);
        assert!(!s.poll(0), "nothing changed");
        assert!(!s.poll(1), "first seen: the writer may still be at it");
        assert!(s.poll(1), "the same on the next poll: read it");
        assert!(!s.poll(1), "read once");
        // A writer that changes the file between every two polls is never read meanwhile.
        for half in [2, 3, 4, 5] {
            assert!(!s.poll(half));
        }
        assert!(s.poll(5));
        // Changed and changed back before it settled: nothing to read.
        assert!(!s.poll(6));
        assert!(!s.poll(5));
        assert!(!s.poll(5));
        // A reload on request counts as loaded, and forgets what was settling.
        assert!(!s.poll(7));
        s.reloaded(7);
        assert!(!s.poll(7));
    }

    type Reads = Arc<Mutex<Vec<&'static str>>>;

    /// Starts watching `file`; each reload's reason is recorded.
    fn watch(file: &std::path::Path) -> (Reads, CancellationToken) {
        let seen: Reads = Arc::default();
        let log = seen.clone();
        let cancel = CancellationToken::new();
        let meter = opentelemetry::global::meter("reload-tests");
        on_change(
            vec![file.to_owned()],
            Reloads::new(&meter, "test.reloads").of("f"),
            &TaskTracker::new(),
            cancel.clone(),
            move |why| {
                log.lock().unwrap().push(why);
                Outcome::Loaded
            },
        );
        (seen, cancel)
    }

    /// Gives the watcher and the blocking pool real time to act, without moving the paused
    /// clock (a task that yields keeps the runtime from auto-advancing it).
    async fn settle() {
        for _ in 0..5 {
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Runs the watcher up to `at` (paused clock) in steps of 100 ms, letting each poll finish.
    async fn run_until(at: Instant) {
        while Instant::now() < at {
            tokio::time::sleep(Duration::from_millis(100)).await;
            settle().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_file_written_in_two_halves_is_read_once_whole() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "one\n").unwrap();
        let start = Instant::now();
        let (seen, cancel) = watch(&file);
        // Polls at 2, 4, 6 …: the first half is there for the poll at 2 s, the whole from 3 s.
        run_until(start + Duration::from_millis(1000)).await;
        std::fs::write(&file, "one\ntw").unwrap();
        run_until(start + Duration::from_millis(3000)).await;
        assert!(seen.lock().unwrap().is_empty(), "half a file was read");
        std::fs::write(&file, "one\ntwo\n").unwrap();
        run_until(start + Duration::from_millis(4500)).await;
        assert!(
            seen.lock().unwrap().is_empty(),
            "read on the poll that first saw it"
        );
        run_until(start + Duration::from_millis(6500)).await;
        // Read on the poll at 6 s, the second to see the whole file.
        assert_eq!(*seen.lock().unwrap(), ["file changed"]);
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_replacement_by_rename_is_seen_by_its_inode() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "same\n").unwrap();
        let modified = std::fs::metadata(&file).unwrap().modified().unwrap();
        let start = Instant::now();
        let (seen, cancel) = watch(&file);
        // Same length and (set back) the same modification time: only the inode differs.
        let tmp = dir.path().join("f.tmp");
        std::fs::write(&tmp, "SAME\n").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&tmp)
            .unwrap()
            .set_modified(modified)
            .unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        run_until(start + Duration::from_millis(4500)).await;
        assert_eq!(seen.lock().unwrap().len(), 1, "the rename went unnoticed");
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn sighup_reloads_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x\n").unwrap();
        let start = Instant::now();
        let (seen, cancel) = watch(&file);
        std::fs::write(&file, "half").unwrap();
        run_until(start + Duration::from_millis(2500)).await;
        // The poll at 2 s saw the change and waits for it to hold; SIGHUP does not wait.
        let _ = std::process::Command::new("kill")
            .args(["-HUP", &std::process::id().to_string()])
            .status();
        // Real time, not the paused clock's: about 10 s of settling at most.
        for _ in 0..1000 {
            if !seen.lock().unwrap().is_empty() {
                break;
            }
            settle().await;
        }
        assert!(!seen.lock().unwrap().is_empty(), "SIGHUP not acted on");
        assert!(
            Instant::now() - start < Duration::from_secs(4),
            "waited for a poll"
        );
        assert_eq!(*seen.lock().unwrap(), ["SIGHUP"]);
        // Counted as read: the next polls do not read it again.
        run_until(start + Duration::from_millis(8500)).await;
        assert_eq!(seen.lock().unwrap().len(), 1);
        cancel.cancel();
    }
}
