//! A binary of the workspace run as a child process whose standard error (its log) is
//! collected, so a test can wait for and assert on what it logged; killed when dropped.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A running child process and the lines it has written to standard error so far.
#[derive(Debug)]
pub struct Spawned {
    child: Mutex<Child>,
    log: Arc<Mutex<String>>,
}

impl Spawned {
    /// Starts `command` with standard output discarded and standard error collected.
    pub fn start(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the binary");
        let log: Arc<Mutex<String>> = Arc::default();
        if let Some(stderr) = child.stderr.take() {
            let lines = log.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stderr)
                    .lines()
                    .map_while(Result::ok)
                {
                    let mut log = lines.lock().unwrap_or_else(|e| e.into_inner());
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        Self {
            child: Mutex::new(child),
            log,
        }
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many times `needle` occurs in its log so far.
    pub fn logged(&self, needle: &str) -> usize {
        self.log().matches(needle).count()
    }

    /// Waits (polling, at most `within`) until `needle` occurs more than `seen` times in its
    /// log; panics with the log otherwise, or as soon as the process has exited.
    pub async fn wait_logged(&self, needle: &str, seen: usize, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.logged(needle) <= seen {
            let status = self.child().try_wait().ok().flatten();
            assert!(
                status.is_none(),
                "exited ({status:?}) before logging {needle:?}:\n{}",
                self.log()
            );
            assert!(
                tokio::time::Instant::now() < deadline,
                "{needle:?} not logged within {within:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends `signal` (`"HUP"`, `"TERM"`, …) to it.
    pub fn signal(&self, signal: &str) {
        crate::signal_pid(self.child().id(), signal);
    }

    /// Whether it is still running.
    pub fn alive(&self) -> bool {
        matches!(self.child().try_wait(), Ok(None))
    }

    fn child(&self) -> MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let mut child = self.child();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// How often [`exit_within`] looks.
const LOOK: Duration = Duration::from_millis(20);

/// The exit status of `child`, waiting at most `within` for it (blocking the thread: for
/// synchronous tests); `None` if it is still running then, for the caller to kill or judge.
pub fn exit_within(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let looks = within.as_millis() / LOOK.as_millis() + 1;
    for _ in 0..looks {
        if let Some(status) = child.try_wait().expect("the child's status") {
            return Some(status);
        }
        std::thread::sleep(LOOK);
    }
    child.try_wait().expect("the child's status")
}

/// The exit status of `child` once it exits, at most `within` (without blocking the runtime);
/// panics naming `what` otherwise.
pub async fn exited(child: &mut Child, within: Duration, what: &str) -> std::process::ExitStatus {
    let probe = || {
        let status = child.try_wait();
        async move {
            match status {
                Ok(Some(status)) => crate::poll::Probe::Done(status),
                Ok(None) => crate::poll::Probe::Not("running".into()),
                Err(e) => crate::poll::Probe::Not(format!("no status: {e}")),
            }
        }
    };
    crate::poll::eventually(within, what, probe).await.0
}
