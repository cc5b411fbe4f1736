//! `leasectl exec` against a real etcd and proxy: the command's environment, its exit status,
//! waiting behind another holder, the stop when the lease is lost, signal forwarding and the
//! release at the end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{alive, exit_status, wait_for_file, Stack};
use lease_proxy_testkit::signal_pid;

/// A script that records its lease environment in `env`, then runs until the file `go` exists
/// and exits with `code` (or until the stack's directory is gone: a failed test leaves nothing
/// running).
fn hold_until(stack: &Stack, name: &str, code: i32) -> String {
    let env = stack.path(&format!("{name}.env"));
    let go = stack.path(&format!("{name}.go"));
    format!(
        r#"echo "$LEASE_TOKEN $LEASE_ID $FENCING_RESOURCE $FENCING_TOKEN" > {env}.tmp && mv {env}.tmp {env}
           while [ ! -e {go} ] && [ -d {dir} ]; do sleep 0.05; done; exit {code}"#,
        env = env.display(),
        go = go.display(),
        dir = stack.dir.path().display(),
    )
}

/// The `(LEASE_TOKEN, LEASE_ID, FENCING_RESOURCE, FENCING_TOKEN)` a `hold_until` script saw.
async fn seen(stack: &Stack, name: &str) -> (u64, String, String, String) {
    let text = wait_for_file(&stack.path(&format!("{name}.env"))).await;
    let fields: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(fields.len(), 4, "{text:?}");
    (
        fields[0].parse().unwrap(),
        fields[1].to_owned(),
        fields[2].to_owned(),
        fields[3].to_owned(),
    )
}

fn go(stack: &Stack, name: &str) {
    std::fs::write(stack.path(&format!("{name}.go")), "").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_runs_with_the_lease_in_its_environment_and_its_status_is_passed_on() {
    let stack = Stack::start().await;
    let mut exec = stack.exec(
        "printer-1",
        30,
        &["--holder", "job-7"],
        &hold_until(&stack, "a", 3),
    );
    let (token, lease_id, resource, fencing_token) = seen(&stack, "a").await;
    assert_eq!(resource, "printer-1");
    let verified = stack.keys.verify("printer-1", &fencing_token).unwrap();
    assert_eq!(verified.revision, token, "FENCING_TOKEN signs LEASE_TOKEN");
    let (status, held) = stack.get("printer-1").await;
    assert_eq!(status, 200, "{held}");
    assert_eq!(held["holder"], "job-7");
    assert_eq!(held["token"].as_str().unwrap(), token.to_string());
    assert_eq!(held["lease_id"].as_str().unwrap(), lease_id);

    go(&stack, "a");
    assert_eq!(exit_status(&mut exec, Duration::from_secs(30)).await, 3);
    let (status, body) = stack.get("printer-1").await;
    assert_eq!(
        status, 404,
        "released on exit, long before its 30 s TTL: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_killed_by_a_signal_gives_128_plus_the_signal() {
    let stack = Stack::start().await;
    let mut exec = stack.exec("printer-2", 30, &[], "kill -USR1 $$");
    assert_eq!(
        exit_status(&mut exec, Duration::from_secs(30)).await,
        128 + 10
    );
    assert_eq!(stack.get("printer-2").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_exec_waits_for_the_first_then_runs_with_a_larger_token() {
    let stack = Stack::start().await;
    let mut first = stack.exec("printer-3", 30, &[], &hold_until(&stack, "first", 0));
    let (first_token, ..) = seen(&stack, "first").await;
    let mut second = stack.exec("printer-3", 30, &[], &hold_until(&stack, "second", 0));
    go(&stack, "second");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !stack.path("second.env").exists(),
        "the second command ran while the first held the lease"
    );
    assert!(
        second.try_wait().unwrap().is_none(),
        "the second leasectl gave up instead of waiting"
    );

    go(&stack, "first");
    assert_eq!(exit_status(&mut first, Duration::from_secs(30)).await, 0);
    let (second_token, ..) = seen(&stack, "second").await;
    assert!(
        second_token > first_token,
        "{second_token} after {first_token}"
    );
    assert_eq!(exit_status(&mut second, Duration::from_secs(30)).await, 0);
    assert_eq!(stack.get("printer-3").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_keeps_waiting_beyond_the_proxys_longest_wait() {
    let stack = Stack::start_with(|c| c.max_wait = Duration::from_millis(400)).await;
    let mut first = stack.exec("printer-8", 30, &[], &hold_until(&stack, "first", 0));
    seen(&stack, "first").await;
    let mut second = stack.exec("printer-8", 30, &[], &hold_until(&stack, "second", 4));
    go(&stack, "second");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(
        second.try_wait().unwrap().is_none(),
        "the second leasectl stopped waiting after the proxy's 400 ms --max-wait"
    );
    assert!(!stack.path("second.env").exists());
    go(&stack, "first");
    assert_eq!(exit_status(&mut first, Duration::from_secs(30)).await, 0);
    assert_eq!(exit_status(&mut second, Duration::from_secs(30)).await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_whose_wait_runs_out_exits_75_without_running_the_command() {
    let stack = Stack::start().await;
    let (status, _) = stack.acquire("printer-4", "someone", 30, 0).await;
    assert_eq!(status, 201);
    let ran = stack.path("ran");
    let started = tokio::time::Instant::now();
    let (code, _, stderr) = stack
        .run(&[
            "exec",
            "--resource",
            "printer-4",
            "--ttl",
            "30",
            "--wait",
            "700ms",
            "--",
            "touch",
            ran.to_str().unwrap(),
        ])
        .await;
    assert_eq!(code, 75, "{stderr}");
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert!(!ran.exists());
}

/// Starts an exec whose command records SIGTERM in `term` (ignoring it when `ignore_term`),
/// waits until it runs, SIGSTOPs leasectl until another client took the resource over (the
/// lease expired meanwhile), then SIGCONTs it: returns (leasectl, the command's pid, its
/// LEASE_TOKEN, the new holder's token, when SIGCONT was sent).
async fn stop_past_the_ttl(
    stack: &Stack,
    resource: &str,
    grace: &str,
    ignore_term: bool,
) -> (tokio::process::Child, u32, u64, u64, tokio::time::Instant) {
    let ready = stack.path("ready");
    let term = stack.path("term");
    let trap = if ignore_term {
        format!("trap 'echo TERM >> {}' TERM", term.display())
    } else {
        format!("trap 'echo TERM >> {}; exit 7' TERM", term.display())
    };
    let script = format!(
        r#"{trap}; echo "$$ $LEASE_TOKEN" > {ready}.tmp && mv {ready}.tmp {ready}
           while [ -d {dir} ]; do sleep 0.05; done"#,
        ready = ready.display(),
        dir = stack.dir.path().display(),
    );
    let exec = stack.exec(resource, 2, &["--grace", grace], &script);
    let text = wait_for_file(&ready).await;
    let (pid, token) = text.trim().split_once(' ').unwrap();
    let (pid, token): (u32, u64) = (pid.parse().unwrap(), token.parse().unwrap());

    let leasectl = exec.id().unwrap();
    signal_pid(leasectl, "STOP");
    let (status, grant) = stack.acquire(resource, "usurper", 30, 20_000).await;
    assert_eq!(status, 201, "{grant}");
    let new_token: u64 = grant["token"].as_str().unwrap().parse().unwrap();
    assert!(new_token > token);
    assert!(
        alive(pid),
        "the command kept running while leasectl was stopped"
    );
    assert!(!term.exists());
    let resumed = tokio::time::Instant::now();
    signal_pid(leasectl, "CONT");
    (exec, pid, token, new_token, resumed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_sends_the_command_sigterm_at_once() {
    let stack = Stack::start().await;
    let (mut exec, pid, _, new_token, resumed) =
        stop_past_the_ttl(&stack, "printer-5", "30s", false).await;
    assert_eq!(exit_status(&mut exec, Duration::from_secs(20)).await, 76);
    assert!(
        resumed.elapsed() < Duration::from_secs(5),
        "SIGTERM waited for the grace or a renewal: {:?}",
        resumed.elapsed()
    );
    assert_eq!(
        std::fs::read_to_string(stack.path("term")).unwrap(),
        "TERM\n"
    );
    assert!(!alive(pid));
    let (status, held) = stack.get("printer-5").await;
    assert_eq!(status, 200);
    assert_eq!(
        held["token"].as_str().unwrap(),
        new_token.to_string(),
        "the exiting leasectl released someone else's grant: {held}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_ignoring_sigterm_is_killed_after_the_grace() {
    let stack = Stack::start().await;
    let (mut exec, pid, ..) = stop_past_the_ttl(&stack, "printer-6", "1500ms", true).await;
    let term = stack.path("term");
    for _ in 0..400 {
        if term.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(term.exists(), "no SIGTERM after the loss");
    assert!(alive(pid), "killed with no grace");
    assert_eq!(exit_status(&mut exec, Duration::from_secs(20)).await, 76);
    assert!(
        resumed_at_least(&term, Duration::from_millis(1500)),
        "killed before the grace ran out"
    );
    assert!(!alive(pid), "still running after the grace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_revoked_in_etcd_stops_the_command_at_the_next_renewal() {
    let stack = Stack::start().await;
    let term = stack.path("term");
    let script = format!(
        r#"trap 'echo TERM >> {term}; exit 7' TERM; {hold}"#,
        term = term.display(),
        hold = hold_until(&stack, "a", 0),
    );
    let mut exec = stack.exec("printer-11", 3, &[], &script);
    let (_, lease_id, ..) = seen(&stack, "a").await;
    let revoked = tokio::time::Instant::now();
    stack.revoke_in_etcd(&lease_id).await;
    assert_eq!(exit_status(&mut exec, Duration::from_secs(20)).await, 76);
    assert!(
        revoked.elapsed() < Duration::from_secs(3),
        "stopped {:?} after the revocation: not at the next renewal (every ~1 s)",
        revoked.elapsed()
    );
    assert_eq!(std::fs::read_to_string(&term).unwrap(), "TERM\n");
}

/// Whether at least `grace` passed since `path` was last written.
fn resumed_at_least(path: &std::path::Path, grace: Duration) -> bool {
    let written = std::fs::metadata(path).unwrap().modified().unwrap();
    written.elapsed().unwrap() >= grace - Duration::from_millis(50)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_leasectl_is_forwarded_and_the_lease_released() {
    let stack = Stack::start().await;
    let ready = stack.path("ready");
    let script = format!(
        r#"trap 'exit 9' TERM; echo up > {}; while [ -d {} ]; do sleep 0.05; done"#,
        ready.display(),
        stack.dir.path().display()
    );
    let mut exec = stack.exec("printer-7", 30, &[], &script);
    wait_for_file(&ready).await;
    signal_pid(exec.id().unwrap(), "TERM");
    assert_eq!(exit_status(&mut exec, Duration::from_secs(20)).await, 9);
    assert_eq!(stack.get("printer-7").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_while_waiting_ends_leasectl_without_running_the_command() {
    let stack = Stack::start().await;
    let (status, _) = stack.acquire("printer-9", "someone", 30, 0).await;
    assert_eq!(status, 201);
    let ran = stack.path("ran");
    let mut exec = stack.exec("printer-9", 30, &[], &format!("touch {}", ran.display()));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(exec.try_wait().unwrap().is_none(), "gave up waiting");
    signal_pid(exec.id().unwrap(), "INT");
    assert_eq!(
        exit_status(&mut exec, Duration::from_secs(10)).await,
        128 + 2
    );
    assert!(!ran.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_cannot_start_gives_127_or_126_and_the_lease_back() {
    let stack = Stack::start().await;
    let missing = stack.path("no-such-program");
    let args = |program: &str| {
        [
            "exec",
            "--resource",
            "printer-10",
            "--ttl",
            "30",
            "--",
            program,
        ]
        .map(str::to_owned)
    };
    let (code, _, err) = stack
        .run(
            &args(missing.to_str().unwrap())
                .each_ref()
                .map(String::as_str),
        )
        .await;
    assert_eq!(code, 127, "{err}");
    assert_eq!(stack.get("printer-10").await.0, 404);
    let not_executable = stack.path("data.txt");
    std::fs::write(&not_executable, "x").unwrap();
    let (code, _, err) = stack
        .run(
            &args(not_executable.to_str().unwrap())
                .each_ref()
                .map(String::as_str),
        )
        .await;
    assert_eq!(code, 126, "{err}");
    assert_eq!(stack.get("printer-10").await.0, 404);
}
