//! Running the command of `leasectl exec` while the lease is held: the command runs in a process
//! group of its own, receives the signals forwarded to leasectl, is sent SIGTERM the moment the
//! lease is lost and SIGKILL if it still runs after the grace period. Whatever the command
//! started in its group is stopped the same way — on a loss, and also when the command itself
//! exits (a background writer it left must not outlive the lease, which is released next).

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::Error;

/// How the command was ended after the lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// It exited within the grace period after SIGTERM.
    Terminated,
    /// It was still running when the grace period ran out and was sent SIGKILL.
    Killed,
}

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Its exit status.
    pub(crate) status: ExitStatus,
    /// `Some` when the lease was lost while it ran (and so it was stopped).
    pub(crate) lost: Option<Stopped>,
}

/// Starts `program` with `args` and `env` added to leasectl's environment, in a new process
/// group (so that a stop reaches whatever it started too).
pub(crate) fn spawn(
    program: &OsString,
    args: &[OsString],
    env: &[(&str, String)],
) -> Result<Child, Error> {
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .process_group(0)
        .kill_on_drop(true);
    command.spawn().map_err(|source| Error::Spawn {
        command: program.to_string_lossy().into_owned(),
        source,
    })
}

/// Waits for `child` to exit. Every signal received on `forward` is sent to its process group.
/// When `lost` is cancelled the group is sent SIGTERM and, if the child has not exited `grace`
/// later, SIGKILL.
pub(crate) async fn supervise(
    child: &mut Child,
    lost: CancellationToken,
    grace: Duration,
    forward: &mut mpsc::Receiver<Signal>,
) -> Result<Outcome, Error> {
    let group = group_of(child)?;
    let mut forwarding = true;
    loop {
        tokio::select! {
            biased;
            () = lost.cancelled() => break,
            status = child.wait() => {
                let status = status.map_err(Error::Wait)?;
                // What it left running in its group ends before the lease is released.
                if group_running(group) {
                    stop_group(group, grace).await?;
                }
                return Ok(Outcome { status, lost: None });
            }
            signal = forward.recv(), if forwarding => match signal {
                Some(signal) => send(group, signal)?,
                None => forwarding = false,
            },
        }
    }
    let (status, stopped) = stop(child, group, grace).await?;
    Ok(Outcome {
        status,
        lost: Some(stopped),
    })
}

/// Stops `child`, the leader of process group `group`, and everything else in the group (the
/// leader counts as running until it exits: a zombie runs nothing). Returns the child's exit
/// status and how the group was stopped.
async fn stop(
    child: &mut Child,
    group: Pid,
    grace: Duration,
) -> Result<(ExitStatus, Stopped), Error> {
    let stopped = stop_group(group, grace).await?;
    let status = child.wait().await.map_err(Error::Wait)?;
    Ok((status, stopped))
}

/// Stops what runs in `group`: SIGTERM, then SIGKILL if anything still runs `grace` later (and
/// a short wait for it to go: SIGKILL cannot be ignored).
async fn stop_group(group: Pid, grace: Duration) -> Result<Stopped, Error> {
    send(group, Signal::SIGTERM)?;
    if tokio::time::timeout(grace, gone(group)).await.is_ok() {
        return Ok(Stopped::Terminated);
    }
    send(group, Signal::SIGKILL)?;
    let _ = tokio::time::timeout(KILL_SETTLE, gone(group)).await;
    Ok(Stopped::Killed)
}

/// Resolves once nothing in `group` runs any more.
async fn gone(group: Pid) {
    while group_running(group) {
        tokio::time::sleep(POLL).await;
    }
}

/// How often a group is looked at while waiting for it to end.
const POLL: Duration = Duration::from_millis(10);

/// Longest wait for a SIGKILLed group to be gone.
const KILL_SETTLE: Duration = Duration::from_secs(2);

/// Whether any process of group `group` still runs. On Linux, from `/proc`: a zombie (exited,
/// not yet reaped by whoever adopted it) runs nothing. Elsewhere, whether the group can still
/// be signalled.
fn group_running(group: Pid) -> bool {
    match std::fs::read_dir("/proc") {
        Ok(entries) => entries.flatten().any(|entry| {
            let is_pid = entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit()));
            is_pid
                && std::fs::read_to_string(entry.path().join("stat"))
                    .is_ok_and(|stat| runs_in_group(&stat, group.as_raw()))
        }),
        Err(_) => killpg(group, None).is_ok(),
    }
}

/// Whether a `/proc/PID/stat` line is of a live (not zombie or dead) process in `group`: the
/// fields after the command name's closing parenthesis are the state, the parent and the group.
fn runs_in_group(stat: &str, group: i32) -> bool {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next();
    let pgrp = fields.nth(1).and_then(|g| g.parse::<i32>().ok());
    pgrp == Some(group) && !matches!(state, Some("Z" | "X" | "x"))
}

/// The process group `child` leads (it was spawned with `process_group(0)`).
fn group_of(child: &Child) -> Result<Pid, Error> {
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| Error::Wait(io::Error::other("the command has no process id")))?;
    Ok(Pid::from_raw(pid))
}

/// Sends `signal` to process group `group`; a group that is already gone is no error.
fn send(group: Pid, signal: Signal) -> Result<(), Error> {
    match killpg(group, signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(e) => Err(Error::Signal(signal, e)),
    }
}

/// The exit status leasectl passes on for a command that ended with `status`: its exit code, or
/// 128 + the signal number when a signal ended it (as shells report it).
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + (signal & 0x7f)).unwrap_or(255),
        (None, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn sh(script: &str) -> Child {
        spawn(
            &OsString::from("sh"),
            &[OsString::from("-c"), OsString::from(script)],
            &[("LEASE_TEST_VALUE", "forty-two".to_owned())],
        )
        .unwrap()
    }

    async fn wait_for_file(path: &Path) -> String {
        for _ in 0..200 {
            if let Ok(text) = std::fs::read_to_string(path) {
                if !text.is_empty() {
                    return text;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{} never written", path.display());
    }

    #[tokio::test]
    async fn passes_the_environment_and_the_exit_status() {
        let mut child = sh(r#"test "$LEASE_TEST_VALUE" = forty-two && exit 3; exit 1"#);
        let (_tx, mut rx) = mpsc::channel(1);
        let out = supervise(
            &mut child,
            CancellationToken::new(),
            Duration::ZERO,
            &mut rx,
        )
        .await
        .unwrap();
        assert_eq!(out.lost, None);
        assert_eq!(exit_code(out.status), 3);
    }

    #[tokio::test]
    async fn a_signal_death_is_128_plus_the_signal() {
        let mut child = sh("kill -KILL $$");
        let (_tx, mut rx) = mpsc::channel(1);
        let out = supervise(
            &mut child,
            CancellationToken::new(),
            Duration::ZERO,
            &mut rx,
        )
        .await
        .unwrap();
        assert_eq!(exit_code(out.status), 128 + 9);
    }

    /// SIGHUP rather than SIGINT: a test run started in the background by a non-interactive
    /// shell has SIGINT ignored, the command inherits that, and a shell cannot trap a signal
    /// that was ignored when it started — its trap would never run. The forwarding does not
    /// depend on which signal it is.
    #[tokio::test]
    async fn forwards_signals_to_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let mut child = sh(&format!(
            r#"trap 'exit 5' HUP; echo up > {}; while :; do sleep 0.05; done"#,
            ready.display()
        ));
        let (tx, mut rx) = mpsc::channel(1);
        let run = tokio::spawn(async move {
            supervise(
                &mut child,
                CancellationToken::new(),
                Duration::ZERO,
                &mut rx,
            )
            .await
        });
        wait_for_file(&ready).await;
        tx.send(Signal::SIGHUP).await.unwrap();
        let out = run.await.unwrap().unwrap();
        assert_eq!((exit_code(out.status), out.lost), (5, None));
    }

    #[tokio::test]
    async fn loss_sends_sigterm_and_waits_for_the_exit() {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let mut child = sh(&format!(
            r#"trap 'exit 7' TERM; echo up > {}; while :; do sleep 0.05; done"#,
            ready.display()
        ));
        let lost = CancellationToken::new();
        let (_tx, mut rx) = mpsc::channel(1);
        let fire = lost.clone();
        let run = tokio::spawn(async move {
            supervise(&mut child, lost, Duration::from_secs(30), &mut rx).await
        });
        wait_for_file(&ready).await;
        let at = tokio::time::Instant::now();
        fire.cancel();
        let out = run.await.unwrap().unwrap();
        assert_eq!(out.lost, Some(Stopped::Terminated));
        assert_eq!(exit_code(out.status), 7);
        assert!(at.elapsed() < Duration::from_secs(5), "{:?}", at.elapsed());
    }

    #[tokio::test]
    async fn loss_kills_a_command_ignoring_sigterm_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let mut child = sh(&format!(
            r#"trap '' TERM; echo up > {}; while :; do sleep 0.05; done"#,
            ready.display()
        ));
        let lost = CancellationToken::new();
        let (_tx, mut rx) = mpsc::channel(1);
        let fire = lost.clone();
        let grace = Duration::from_millis(600);
        let run = tokio::spawn(async move { supervise(&mut child, lost, grace, &mut rx).await });
        wait_for_file(&ready).await;
        let at = tokio::time::Instant::now();
        fire.cancel();
        let out = run.await.unwrap().unwrap();
        let took = at.elapsed();
        assert_eq!(out.lost, Some(Stopped::Killed));
        assert_eq!(exit_code(out.status), 128 + 9);
        assert!(took >= grace, "killed before the grace ran out: {took:?}");
        assert!(took < grace + Duration::from_secs(5), "{took:?}");
    }

    #[tokio::test]
    async fn loss_stops_what_the_command_started_too() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let mut child = sh(&format!(
            "sleep 300 & echo $! > {}; wait",
            pid_file.display()
        ));
        let lost = CancellationToken::new();
        let (_tx, mut rx) = mpsc::channel(1);
        let fire = lost.clone();
        let run = tokio::spawn(async move {
            supervise(&mut child, lost, Duration::from_secs(30), &mut rx).await
        });
        let grandchild = wait_for_file(&pid_file).await;
        let proc_stat = format!("/proc/{}/stat", grandchild.trim());
        fire.cancel();
        run.await.unwrap().unwrap();
        for _ in 0..200 {
            match std::fs::read_to_string(&proc_stat) {
                Err(_) => return,
                Ok(stat) if stat.contains(") Z") => return,
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        panic!("the command's background sleep survived the loss");
    }

    /// Kills a command's whole group when dropped, so that a failing test leaves nothing
    /// running (a leftover would hold the test runner's output open).
    struct Reaper(Pid);

    impl Drop for Reaper {
        fn drop(&mut self) {
            let _ = killpg(self.0, Signal::SIGKILL);
        }
    }

    /// Whether process `pid` still runs (not gone, not a zombie).
    fn runs(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
            .is_ok_and(|stat| !stat.contains(") Z") && !stat.contains(") X"))
    }

    #[tokio::test]
    async fn an_exit_stops_what_the_command_left_running_before_returning() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        // A background writer left behind by a command that exits at once.
        let mut child = sh(&format!(
            "sleep 300 & echo $! > {}; exit 0",
            pid_file.display()
        ));
        let _reaper = Reaper(group_of(&child).unwrap());
        let (_tx, mut rx) = mpsc::channel(1);
        let out = supervise(
            &mut child,
            CancellationToken::new(),
            Duration::from_secs(30),
            &mut rx,
        )
        .await
        .unwrap();
        assert_eq!((exit_code(out.status), out.lost), (0, None));
        // Already gone when supervise returns: the lease is released right after.
        let background = std::fs::read_to_string(&pid_file).unwrap();
        assert!(
            !runs(&background),
            "the background process outlived the command"
        );
    }

    #[tokio::test]
    async fn a_loss_kills_a_background_process_that_ignores_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        // The background process writes its own pid once its trap is set (CI once sent TERM
        // before a subshell had set it, so the group ended at TERM: `Terminated`).
        let mut child = sh(&format!(
            "sh -c 'trap \"\" TERM; echo $$ > {}; while :; do sleep 0.05; done' & \
             trap 'exit 7' TERM; while :; do sleep 0.05; done",
            pid_file.display()
        ));
        let _reaper = Reaper(group_of(&child).unwrap());
        let background = wait_for_file(&pid_file).await;
        let lost = CancellationToken::new();
        lost.cancel();
        let (_tx, mut rx) = mpsc::channel(1);
        let grace = Duration::from_millis(300);
        let out = supervise(&mut child, lost, grace, &mut rx).await.unwrap();
        assert_eq!(out.lost, Some(Stopped::Killed));
        assert!(
            !runs(&background),
            "a TERM-proof background process survived the loss"
        );
    }

    #[test]
    fn reads_state_and_group_from_proc_stat() {
        let live = "123 (a (odd) name) S 1 4242 4242 0 -1 4194560";
        assert!(runs_in_group(live, 4242));
        assert!(!runs_in_group(live, 4243));
        assert!(!runs_in_group("123 (sh) Z 1 4242 4242 0", 4242));
        assert!(!runs_in_group("garbage", 4242));
    }

    #[tokio::test]
    async fn a_loss_before_anything_ran_still_stops_the_command() {
        let mut child = sh("while :; do sleep 0.05; done");
        let lost = CancellationToken::new();
        lost.cancel();
        let (_tx, mut rx) = mpsc::channel(1);
        let out = supervise(&mut child, lost, Duration::from_secs(30), &mut rx)
            .await
            .unwrap();
        assert_eq!(out.lost, Some(Stopped::Terminated));
        assert_eq!(exit_code(out.status), 128 + 15);
    }
}
