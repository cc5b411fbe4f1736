//! etcd's gRPC Watch, Lock, Election and Auth services on the proxy's listener, and the lock
//! token exchange of client-side recipes, against real etcd in the same run: the same scripted
//! watches (prefix, prev_kv, history, filters, a user-chosen id, a failed create, cancel,
//! progress, compaction) and elections sent with the `etcdctl` and `etcd-client` clients to the
//! proxy and straight to etcd give the same answers once headers and revisions are dropped; no
//! watch or election touches a key outside the namespace; Lock and Campaign answers carry their
//! fencing tokens; one principal reaches nothing of another's (keys, watches, leases, locks,
//! elections); streams of a removed principal end; long calls hold the replica's
//! event-stream slots and end with the drain; a reader that stalls is cut off alone.
//!
//! Normalisation: one line per event (type, key, value, previous value, version) or per answer
//! without events (created, canceled, its reason, whether a compact revision is given, watch
//! id), so that etcd batching events of several revisions into one answer on one side and not
//! the other changes nothing.
//!
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "grpc_services/election.rs"]
mod election;
#[path = "grpc_services/etcdctl.rs"]
mod etcdctl;
#[path = "grpc_services/lock.rs"]
mod lock;
#[path = "grpc_services/principals.rs"]
mod principals;
#[path = "grpc_services/streams.rs"]
mod streams;
#[path = "grpc_services/watch.rs"]
mod watch;

use std::time::Duration;

use prost::Message;

use common::h2grpc::{self, unary};
use common::*;
use etcd_client::proto::{PbLockResponse, PbWatchRequest, PbWatchResponse};
use etcd_client::{Client, LockOptions, WatchFilterType, WatchOptions, WatchStream};
use lease_proxy_testkit::poll::until;

/// The Watch method's path.
const WATCH: &str = "/etcdserverpb.Watch/Watch";

async fn client(url: &str) -> Client {
    Client::connect([url], None).await.expect("connect")
}

/// One answer, as lines (see the module's documentation).
fn lines(r: &PbWatchResponse) -> Vec<String> {
    if r.events.is_empty() {
        return vec![format!(
            "answer watch={} created={} canceled={} reason={:?} compacted={}",
            r.watch_id,
            r.created,
            r.canceled,
            r.cancel_reason,
            r.compact_revision > 0
        )];
    }
    r.events
        .iter()
        .map(|e| {
            let kv = e.kv.clone().unwrap_or_default();
            let prev = e.prev_kv.as_ref().map(|p| {
                format!(
                    "{}={}",
                    String::from_utf8_lossy(&p.key),
                    String::from_utf8_lossy(&p.value)
                )
            });
            format!(
                "event watch={} type={} key={:?} value={:?} version={} prev={prev:?}",
                r.watch_id,
                e.r#type,
                String::from_utf8_lossy(&kv.key),
                String::from_utf8_lossy(&kv.value),
                kv.version
            )
        })
        .collect()
}

/// The next `n` lines from `s`, waiting at most 10 s for each answer.
async fn take(s: &mut WatchStream, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < n {
        let answer = tokio::time::timeout(Duration::from_secs(10), s.message())
            .await
            .unwrap_or_else(|_| panic!("no answer; so far {out:?}"))
            .unwrap()
            .expect("the stream ended");
        out.extend(lines(&answer.0));
    }
    out
}

/// The watch script on one side; `compact` compacts that side's etcd directly (a tenant may
/// not) at the given revision.
async fn script(c: &mut Client, compact: &mut Client) -> Vec<String> {
    let mut out = Vec::new();
    let base = c.put("w/base", "0", None).await.unwrap();
    let base = base.header().unwrap().revision();
    let prefix = WatchOptions::new().with_prefix().with_prev_key();
    let mut s = c.watch("w/", Some(prefix)).await.unwrap();
    out.extend(take(&mut s, 1).await);
    c.put("w/a", "1", None).await.unwrap();
    c.put("w/a", "2", None).await.unwrap();
    c.delete("w/a", None).await.unwrap();
    c.put("other", "x", None).await.unwrap();
    out.extend(take(&mut s, 3).await);

    // A second watch on the same stream: history from `base`, deletes only, its own id.
    let history = WatchOptions::new()
        .with_prefix()
        .with_start_revision(base)
        .with_filters([WatchFilterType::NoPut])
        .with_watch_id(7);
    s.watch("w/", Some(history)).await.unwrap();
    out.extend(take(&mut s, 2).await);
    // A create etcd refuses (the range is empty), then a cancel and a progress request.
    s.watch("b", Some(WatchOptions::new().with_range("a")))
        .await
        .unwrap();
    out.extend(take(&mut s, 1).await);
    s.cancel(7).await.unwrap();
    out.extend(take(&mut s, 1).await);
    s.request_progress().await.unwrap();
    out.extend(take(&mut s, 1).await);
    // A single key and a range, on the same stream.
    s.watch("w/k", Some(WatchOptions::new().with_watch_id(20)))
        .await
        .unwrap();
    s.watch(
        "w/m",
        Some(WatchOptions::new().with_range("w/o").with_watch_id(21)),
    )
    .await
    .unwrap();
    out.extend(take(&mut s, 2).await);
    c.put("w/k", "k", None).await.unwrap();
    c.put("w/n", "n", None).await.unwrap();
    // The prefix watch (0) sees both, the others one each.
    let mut four = take(&mut s, 4).await;
    four.sort();
    out.extend(four);

    // History that was compacted: created, then canceled with the compact revision.
    let now = c.put("w/last", "z", None).await.unwrap();
    compact
        .compact(now.header().unwrap().revision(), None)
        .await
        .unwrap();
    let old = WatchOptions::new().with_prefix().with_start_revision(base);
    let mut s = c.watch("w/", Some(old)).await.unwrap();
    out.extend(take(&mut s, 2).await);
    out
}

/// `v3lockpb.LockRequest`, as the test sends it.
#[derive(Clone, PartialEq, Message)]
struct LockRequest {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(int64, tag = "2")]
    lease: i64,
}

const ETCDCTL: &str = "/usr/bin/etcdctl";

/// etcdctl against `endpoint` (a URL), as a user runs it.
fn etcdctl(endpoint: &str) -> std::process::Command {
    assert!(
        std::path::Path::new(ETCDCTL).exists(),
        "{ETCDCTL} missing: scripts/deps.sh installs Debian's etcd-client"
    );
    let mut command = std::process::Command::new(ETCDCTL);
    command.env("ETCDCTL_API", "3").arg(format!(
        "--endpoints={}",
        endpoint.trim_start_matches("http://")
    ));
    command
}

/// What a command printed: exit code, stdout, stderr.
fn output(out: std::process::Output) -> String {
    format!(
        "{} | {} | {}",
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}
