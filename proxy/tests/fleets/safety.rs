//! The safety property end to end: a member paused (SIGSTOP) while it writes through
//! fence-gateway is drained (it cannot release: its grants are revoked at the deadline) and
//! stays paused past its TTL; its resources' new owner writes; once it resumes, its late writes
//! are refused; and the storage sees, per resource, tokens that never go down.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use lease_proxy_testkit::poll::{eventually, Probe};
use serde_json::{json, Value};

use super::common::fleet::*;
use super::common::*;

/// A member's writer: keeps the session alive and writes each of its resources through the
/// gateway with its token, forever, logging `loop N`, `keepalive CODE` and
/// `write RESOURCE CODE` lines.
const WRITER: &str = r#"#!/bin/bash
proxy="$1"; session="$2"; secret="$3"; gateway="$4"; log="$5"; shift 5
n=0
while true; do
  n=$((n+1))
  echo "loop $n" >> "$log"
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$proxy/v1/sessions/$session/keepalive" -H "lease-secret: $secret")
  echo "keepalive $code" >> "$log"
  for pair in "$@"; do
    resource="${pair%%=*}"; token="${pair#*=}"
    code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT "$gateway/items/$resource" \
      -H "fencing-resource: $resource" -H "fencing-token: $token" --data "$n")
    echo "write $resource $code" >> "$log"
  done
  sleep 0.1
done
"#;

/// The revision of a signed token `v1.KID.ERA.REVISION.MAC`.
fn revision(token: &str) -> u64 {
    token.split('.').nth(3).unwrap().parse().unwrap()
}

/// Resource → fencing token, from a member's view.
fn tokens(view: &Value) -> BTreeMap<String, String> {
    view["held"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| (str_field(h, "resource"), str_field(h, "fencing_token")))
        .collect()
}

fn group_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), "--".into(), format!("-{pid}")])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_member_cannot_write_what_it_lost() {
    let etcd = Etcd::shared().await;
    let prefix = lease_proxy_testkit::prefix("fleet-safety");
    let dir = tempfile::tempdir().unwrap();
    let keys = key_file(dir.path());
    let Storage {
        url: storage,
        log: received,
    } = Storage::start().await;
    let gateway = start_gateway(&storage, &keys).await;
    let tweak = |c: &mut lease_proxy::Config| {
        c.etcd_prefix = prefix.clone();
        c.prefence_url = Some(gateway.clone());
    };
    let r1 = Proxy::start_with_keys(etcd.endpoints(), keys.clone(), tweak).await;
    let r2 = r1.replica(etcd.endpoints(), tweak).await;
    let resources = names("sf", 4);
    make_fleet(&r1.url, "sf", &resources, json!({"drain_ms": 500})).await;
    let q = joined(&r2.url, "sf", "q", 30).await;
    let q_task = q.cooperate(None);
    rested(&r1.url, "sf", &[("q", 4)], Duration::from_secs(10)).await;
    let (_, view) = q.view().await;
    let first = tokens(&view);
    let p = joined(&r1.url, "sf", "p", 2).await;
    let p_beat = p.heartbeat(Duration::from_millis(400));
    let settle = Duration::from_secs(10);
    rested(&r1.url, "sf", &[("p", 2), ("q", 2)], settle).await;
    let (_, view) = p.view().await;
    let mine = tokens(&view);
    assert_eq!(mine.len(), 2, "{view}");
    // Handed over revoke-before-grant: p's grants are new ones, with higher tokens.
    for (resource, token) in &mine {
        assert!(revision(token) > revision(&first[resource]), "{resource}");
    }

    // p's writer runs in a process group of its own, then p's heartbeat is its alone.
    let log = dir.path().join("writer.log");
    let script = dir.path().join("writer.sh");
    std::fs::write(&script, WRITER).unwrap();
    let mut child = Command::new("bash")
        .arg(&script)
        .args([&r2.url, &p.session, &p.secret, &gateway])
        .arg(&log)
        .args(mine.iter().map(|(r, t)| format!("{r}={t}")))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    p_beat.abort();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    eventually(Duration::from_secs(10), "p writes", || async {
        let accepted = read_log().matches(" 200\n").count();
        if accepted >= 6 {
            Probe::Done(())
        } else {
            Probe::Not(read_log())
        }
    })
    .await;

    // Paused, then drained by an operator while its session still lives: it cannot release,
    // so its grants are revoked at the deadline and granted to q with higher tokens. Then it
    // stays paused past its TTL: its session lapses too.
    group_signal(child.id(), "STOP");
    let stopped_at_loop = read_log()
        .lines()
        .filter_map(|l| l.strip_prefix("loop ")?.parse::<u64>().ok())
        .max()
        .unwrap();
    let (status, body) =
        send(http().post(format!("{}/v1/fleets/sf/members/p/drain", r2.url))).await;
    assert_eq!(status, 202, "{body}");
    rested(&r1.url, "sf", &[("p", 0), ("q", 4)], Duration::from_secs(5)).await;
    eventually(Duration::from_secs(2 + 6), "p's session lapses", || async {
        let (_, view) = fleet_view(&r1.url, "sf").await;
        if counts(&view).contains_key("p") {
            Probe::Not(view.to_string())
        } else {
            Probe::Done(())
        }
    })
    .await;
    let (_, view) = q.view().await;
    let theirs = tokens(&view);
    for (resource, token) in &mine {
        assert!(revision(&theirs[resource]) > revision(token), "{resource}");
        let (status, body) = send(
            http()
                .put(format!("{gateway}/items/{resource}"))
                .header("fencing-resource", resource)
                .header("fencing-token", &theirs[resource])
                .body("q"),
        )
        .await;
        assert_eq!(status, 200, "the new owner writes {resource}: {body}");
    }

    // Resumed: every write p starts from now on is refused.
    group_signal(child.id(), "CONT");
    let after_resume = |log: &str| -> Vec<String> {
        let mut lines = Vec::new();
        let mut late = false;
        for line in log.lines() {
            if let Some(n) = line.strip_prefix("loop ") {
                late = n.parse::<u64>().unwrap() > stopped_at_loop;
            } else if late && line.starts_with("write ") {
                lines.push(line.to_owned());
            }
        }
        lines
    };
    let (late, _) = eventually(Duration::from_secs(10), "p writes late", || async {
        let late = after_resume(&read_log());
        if late.len() >= 6 {
            Probe::Done(late)
        } else {
            Probe::Not(read_log())
        }
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        late.iter().all(|l| l.ends_with(" 409")),
        "a late write of the paused member was not refused as stale: {late:?}"
    );
    // The storage saw, per resource, tokens that never went down.
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for write in received.all() {
        let (resource, t) = (write.resource(), revision(write.token()));
        let before = last.insert(resource.to_owned(), t).unwrap_or(0);
        assert!(t >= before, "{resource}: token {t} after {before}");
    }
    assert_eq!(last.len(), 2, "{last:?}");
    for resource in mine.keys() {
        let q_token = revision(&theirs[resource]);
        assert_eq!(last[resource], q_token, "{resource}: the last write is q's");
    }
    q_task.abort();
}
