//! `leasectl fleet` against a real etcd and proxy: `set` and `show` print what the API answers;
//! `join` prints its member's assignment as it changes and gives back at once what is moved
//! away, so a second `join` gets its share; `drain` and `evict` reach the members; SIGTERM
//! leaves (exit 0); a session revoked in etcd ends `join` with 76. One etcd for all of it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{exit_status, Stack};
use lease_proxy_testkit::signal_pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text:?}"))
}

/// A started `leasectl fleet join FLEET --member MEMBER --ttl 10 EXTRA…` and its output lines,
/// past the first (who joined), which is returned too.
async fn join(stack: &Stack, fleet: &str, member: &str, extra: &[&str]) -> (Child, Lines, Value) {
    let mut args = vec![
        "fleet", "join", fleet, "--member", member, "--ttl", "10", "--poll", "5s",
    ];
    args.extend_from_slice(extra);
    let mut child = stack.leasectl(&args).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let joined = json(&next_line(&mut lines).await);
    assert_eq!(
        (joined["fleet"].as_str(), joined["member"].as_str()),
        (Some(fleet), Some(member))
    );
    (child, lines, joined)
}

async fn next_line(lines: &mut Lines) -> String {
    tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("no line within 10 s")
        .unwrap()
        .expect("leasectl's output ended")
}

/// Change lines until one whose `held` has `n` resources; every line read.
async fn until_held(lines: &mut Lines, n: usize) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let change = json(&next_line(lines).await);
        let done = change["held"].as_array().unwrap().len() == n;
        seen.push(change);
        if done {
            return seen;
        }
    }
}

fn names(values: &Value) -> Vec<String> {
    values
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v.as_str()
                .or_else(|| v["resource"].as_str())
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_set_show_join_drain_evict() {
    let stack = Stack::start().await;
    let (code, _, err) = stack.run(&["fleet", "show", "aisles"]).await;
    assert_eq!(code, 1, "no such fleet: {err}");
    let (code, out, err) = stack
        .run(&[
            "fleet", "set", "aisles", "a-1", "a-2", "a-3", "a-4", "--drain", "30s",
        ])
        .await;
    assert_eq!(code, 0, "{err}");
    let written = json(&out);
    assert_eq!(written["drain_ms"], 30000); // longer than any wait here: hand-offs are released
    assert_eq!(names(&written["resources"]), ["a-1", "a-2", "a-3", "a-4"]);

    // One member gets everything, with tokens it can present to storage.
    let (mut a, mut a_lines, _) = join(&stack, "aisles", "robot-a", &[]).await;
    let seen = until_held(&mut a_lines, 4).await;
    let added: Vec<&Value> = seen
        .iter()
        .flat_map(|c| c["added"].as_array().unwrap())
        .collect();
    assert_eq!(added.len(), 4);
    for grant in &added {
        let resource = grant["resource"].as_str().unwrap();
        let verified = stack
            .keys
            .verify(resource, grant["fencing_token"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            verified.revision.to_string(),
            grant["token"].as_str().unwrap()
        );
    }

    // A second member joins: two are handed off, released by the first at once.
    let (mut b, mut b_lines, _) = join(&stack, "aisles", "robot-b", &[]).await;
    let moved = until_held(&mut a_lines, 2).await;
    let releasing: Vec<String> = moved.iter().flat_map(|c| names(&c["releasing"])).collect();
    assert_eq!(releasing.len(), 2, "{moved:?}");
    let got = until_held(&mut b_lines, 2).await;
    let b_added: Vec<String> = got.iter().flat_map(|c| names(&c["added"])).collect();
    assert_eq!(b_added, releasing);
    let (code, out, _) = stack.run(&["fleet", "show", "aisles"]).await;
    assert_eq!(code, 0);
    let view = json(&out);
    assert_eq!(view["members"].as_array().unwrap().len(), 2, "{view}");

    // An operator drains a: b takes everything.
    let (code, out, err) = stack.run(&["fleet", "drain", "aisles", "robot-a"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["state"], "draining");
    let drained = until_held(&mut a_lines, 0).await;
    assert_eq!(drained.last().unwrap()["state"], "draining");
    until_held(&mut b_lines, 4).await;

    // An operator evicts b: it is told, and exits 76.
    let (code, _, err) = stack.run(&["fleet", "evict", "aisles", "robot-b"]).await;
    assert_eq!(code, 0, "{err}");
    let last = until_held(&mut b_lines, 0).await;
    assert_eq!(last.last().unwrap()["state"], "evicted");
    assert_eq!(exit_status(&mut b, Duration::from_secs(10)).await, 76);

    // SIGTERM: a leaves (its session closed) and exits 0.
    signal_pid(a.id().unwrap(), "TERM");
    assert_eq!(exit_status(&mut a, Duration::from_secs(10)).await, 0);
    let (_, out, _) = stack.run(&["fleet", "show", "aisles"]).await;
    let members = json(&out)["members"].clone();
    assert!(
        members
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["member"] != "robot-a"),
        "a did not leave: {members}"
    );

    // A member whose session ends is told: exit 76 (or, with --rejoin, it joins again).
    let (mut c, mut c_lines, joined) = join(&stack, "aisles", "robot-c", &[]).await;
    until_held(&mut c_lines, 4).await;
    stack
        .revoke_in_etcd(joined["session_id"].as_str().unwrap())
        .await;
    assert_eq!(exit_status(&mut c, Duration::from_secs(10)).await, 76);
    let (mut d, mut d_lines, joined) = join(&stack, "aisles", "robot-d", &["--rejoin"]).await;
    until_held(&mut d_lines, 4).await;
    stack
        .revoke_in_etcd(joined["session_id"].as_str().unwrap())
        .await;
    let rejoined = loop {
        let change = json(&next_line(&mut d_lines).await);
        if change["rejoined"] == true {
            break change;
        }
    };
    // Static membership: the new session may be given everything before its first read.
    if rejoined["held"].as_array().unwrap().len() != 4 {
        until_held(&mut d_lines, 4).await;
    }
    signal_pid(d.id().unwrap(), "INT");
    assert_eq!(exit_status(&mut d, Duration::from_secs(10)).await, 0);

    let (code, _, err) = stack.run(&["fleet", "delete", "aisles"]).await;
    assert_eq!(code, 0, "{err}");
    let (code, _, _) = stack.run(&["fleet", "show", "aisles"]).await;
    assert_eq!(code, 1);
}
