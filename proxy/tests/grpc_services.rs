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

use std::time::Duration;

use prost::Message;

use common::h2grpc::{self, unary};
use common::*;
use etcd_client::proto::{PbLockResponse, PbWatchRequest, PbWatchResponse};
use etcd_client::{Client, LockOptions, WatchFilterType, WatchOptions, WatchStream};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_answers_equal_etcds() {
    let raw_etcd = Etcd::single().await;
    let behind = Etcd::single().await;
    let proxy = Proxy::start(behind.endpoints(), |_| {}).await;
    let mut raw = client(&raw_etcd.endpoint(0)).await;
    let etcd_side = script(&mut raw.clone(), &mut raw).await;
    let mut proxy_client = client(&proxy.url).await;
    let ours = script(&mut proxy_client, &mut behind.client().await).await;
    for (i, (etcd, ours)) in etcd_side.iter().zip(&ours).enumerate() {
        assert_eq!(
            ours, etcd,
            "answer line {i}: the proxy's (left) differs from etcd's"
        );
    }
    assert_eq!(ours.len(), etcd_side.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_see_nothing_outside_the_namespace() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.v3_namespace = Some("/tenant-a/".into());
    })
    .await;
    let mut raw = etcd.client().await;
    let outside = [
        "/tenant-b/k",
        "/tenant-a",
        "/tenant-a0",
        "\u{0}",
        "zzz",
        "/tenant-a.",
    ];
    for key in outside {
        raw.put(key, "before", None).await.unwrap();
    }
    let mut c = client(&proxy.url).await;
    // Every "everything" a client can name, live and from the first revision.
    let everything = [
        ("", WatchOptions::new().with_all_keys()),
        ("", WatchOptions::new().with_prefix()),
        ("", WatchOptions::new().with_from_key()),
        ("\u{0}", WatchOptions::new().with_range("\u{0}")),
        (
            "\u{0}",
            WatchOptions::new().with_range(vec![0xff, 0xff, 0xff]),
        ),
        (
            "",
            WatchOptions::new().with_all_keys().with_start_revision(1),
        ),
    ];
    let mut s = c
        .watch(
            "",
            Some(WatchOptions::new().with_all_keys().with_prev_key()),
        )
        .await
        .unwrap();
    for (key, options) in everything {
        s.watch(key, Some(options.with_prev_key())).await.unwrap();
    }
    // Created answers: the first watch and the six more.
    let created = take(&mut s, 7).await;
    assert!(
        created
            .iter()
            .all(|l| l.contains("created=true canceled=false")),
        "{created:?}"
    );
    for key in outside {
        raw.put(key, "during", None).await.unwrap();
        raw.delete(key, None).await.unwrap();
    }
    c.put("k", "inside", None).await.unwrap();
    c.put("k", "again", None).await.unwrap();
    // Each of the seven watches sees the two puts of `k`, and nothing else.
    let mut seen = Vec::new();
    while let Ok(Some(answer)) = tokio::time::timeout(Duration::from_secs(2), s.message())
        .await
        .map(|m| m.unwrap())
    {
        seen.extend(lines(&answer.0));
    }
    assert_eq!(seen.len(), 14, "{seen:#?}");
    for line in &seen {
        assert!(line.contains(r#"key="k""#), "{line}");
        assert!(
            line.contains("prev=None") || line.contains(r#"prev=Some("k=inside")"#),
            "{line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_over_grpc_excludes_and_carries_a_fencing_token() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.v3_namespace = Some("/tenant-a/".into());
    })
    .await;
    let mut c = client(&proxy.url).await;
    let first = c.lease_grant(30, None).await.unwrap().id();
    let second = c.lease_grant(30, None).await.unwrap().id();

    // The lock's answer: its key in the namespace, and a token in the lock's own domain.
    let (headers, answer) = unary(
        &proxy.url,
        "/v3lockpb.Lock/Lock",
        &LockRequest {
            name: b"L".to_vec(),
            lease: first,
        },
        None,
    )
    .await;
    let answer = PbLockResponse::decode(answer.as_slice()).unwrap();
    let key = answer.key.clone();
    assert!(key.starts_with(b"L/"), "{key:?}");
    assert_eq!(headers["fencing-resource"], "lock/4c");
    let token = headers["fencing-token"].to_str().unwrap().to_owned();
    assert!(!token.is_empty());
    let mut raw = etcd.client().await;
    let stored = raw
        .get([b"/tenant-a/".as_slice(), &key].concat(), None)
        .await
        .unwrap();
    assert_eq!(stored.kvs().len(), 1);

    // A second locker waits until the first unlocks.
    let mut other = client(&proxy.url).await;
    let waiting = tokio::spawn(async move {
        other
            .lock("L", Some(LockOptions::new().with_lease(second)))
            .await
            .unwrap()
            .key()
            .to_vec()
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!waiting.is_finished(), "two lockers hold L at once");
    c.unlock(key).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter never got the lock")
        .unwrap();
    assert!(next.starts_with(b"L/"));
    // A lease the proxy did not grant locks nothing.
    let foreign = raw.lease_grant(30, None).await.unwrap().id();
    let refused = c
        .lock("M", Some(LockOptions::new().with_lease(foreign)))
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("requested lease not found"),
        "{refused}"
    );

    // Each call is in the per-method metrics, with its code; a method not served is `unknown`.
    let (_, _) = unary(
        &proxy.url,
        "/etcdserverpb.KV/Nothing",
        &request_none(),
        None,
    )
    .await;
    let text = metrics_text(&proxy.url).await;
    let count = |method: &str, code: &str| {
        text.lines().any(|l| {
            l.starts_with("lease_proxy_grpc_request_duration_seconds_count")
                && l.contains(&format!("method=\"{method}\""))
                && l.contains(&format!("code=\"{code}\""))
        })
    };
    assert!(count("v3lockpb.Lock/Lock", "OK"), "{text}");
    assert!(count("v3lockpb.Lock/Lock", "Unknown"), "{text}");
    assert!(count("v3lockpb.Lock/Unlock", "OK"), "{text}");
    assert!(count("etcdserverpb.Lease/LeaseGrant", "OK"), "{text}");
    assert!(count("unknown", "Unimplemented"), "{text}");
}

/// An empty message.
fn request_none() -> LockRequest {
    LockRequest::default()
}

/// `v3lockpb.LockRequest`, as the test sends it.
#[derive(Clone, PartialEq, Message)]
struct LockRequest {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(int64, tag = "2")]
    lease: i64,
}

/// A watch stream opened by a principal whose line is then removed ends, as its keepalives do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_stream_ends_once_its_principal_is_removed() {
    const ACME: &str = "acme-token-77d1c0";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let line = |name: &str, token: &str| token_line(name, token, "v3:*");
    std::fs::write(
        &tokens,
        line("acme", ACME) + &line("other", "other-token-31"),
    )
    .unwrap();
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.auth_tokens = Some(tokens.clone())).await;

    // etcd-client sends `authorization` only after an Authenticate; metadata by hand instead.
    let create: PbWatchRequest = WatchOptions::new().with_key("k").with_prefix().into();
    let mut stream = h2grpc::Stream::open(&proxy.url, WATCH, &create, Some(ACME)).await;
    let created: PbWatchResponse = stream.next().await.expect("created");
    assert!(created.created && !created.canceled);

    let put = |token: &'static str, key: &'static str| {
        send(
            http()
                .post(format!("{}/v3/kv/put", proxy.url))
                .bearer_auth(token)
                .json(&serde_json::json!({"key": base64_of(key), "value": base64_of("v")})),
        )
    };
    assert_eq!(put(ACME, "k1").await.0, 200);
    let event: PbWatchResponse = stream.next().await.expect("an event");
    assert_eq!(event.events.len(), 1);

    // acme's line goes; once a new call of acme's is refused, the file is in force.
    let replaced = dir.path().join("tokens.new");
    std::fs::write(&replaced, line("other", "other-token-31")).unwrap();
    std::fs::rename(&replaced, &tokens).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while put(ACME, "k2").await.0 != 401 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the removal never took effect"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The stream ends (Unauthenticated in its trailers): what comes before the end can only
    // be the events of puts made before the removal took effect.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(answer) = stream.next::<PbWatchResponse>().await {
            assert!(answer
                .events
                .iter()
                .all(|e| e.kv.as_ref().unwrap().key == b"k2"));
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stream went on after its principal was removed"
    );
}

fn base64_of(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
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

/// Lease ids (16 hex digits) and timings replaced by placeholders.
fn shape(s: &str) -> String {
    s.split_inclusive(|c: char| c.is_whitespace() || c == '/' || c == '"')
        .map(|w| {
            let bare = w.trim_end_matches(|c: char| c.is_whitespace() || c == '/' || c == '"');
            let tail = &w[bare.len()..];
            if bare.len() >= 12 && bare.chars().all(|c| c.is_ascii_hexdigit()) {
                format!("ID{tail}")
            } else if is_go_duration(bare) {
                format!("TIME{tail}")
            } else {
                w.to_owned()
            }
        })
        .collect()
}

/// A Go `time.Duration` as printed: "730.989µs", "1.2ms", "3s", "1m2.5s".
fn is_go_duration(word: &str) -> bool {
    let units = ["ns", "µs", "us", "ms", "h", "m", "s"];
    let mut rest = word;
    let mut parts = 0;
    while !rest.is_empty() {
        let number = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.')
                .len();
        if number == 0 {
            return false;
        }
        rest = &rest[number..];
        match units.iter().find(|u| rest.starts_with(**u)) {
            Some(unit) => rest = &rest[unit.len()..],
            None => return false,
        }
        parts += 1;
    }
    parts > 0
}

#[test]
fn every_go_duration_is_shaped() {
    for took in ["730.989µs", "1.2ms", "3s", "1m2.5s", "850ns"] {
        assert_eq!(shape(&format!("took = {took}")), "took = TIME", "{took}");
    }
    for word in ["ms", "12", "1.5x", "m/"] {
        assert_eq!(shape(word), word);
    }
}

/// One side's run of etcdctl's streaming commands: watch, lock by two processes at once, elect.
async fn streaming_commands(endpoint: &str, dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let run = |args: &[&str]| output(etcdctl(endpoint).args(args).output().unwrap());

    // watch: started, then written to, then stopped.
    let watch = etcdctl(endpoint)
        .args(["watch", "--prefix", "--prev-kv", "w/"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for args in [
        &["put", "w/a", "1"][..],
        &["put", "w/a", "2"],
        &["put", "x", "outside the watch"],
        &["del", "w/a"],
    ] {
        out.push(run(args));
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    testkit_kill(&watch);
    out.push(output(watch.wait_with_output().unwrap()).replace("-1 | ", "killed | "));

    // lock: two processes, each holding L for a second; their sections must not overlap.
    let log = dir.join("lock.log");
    let section = format!(
        "echo in $ETCD_LOCK_KEY >> {log}; sleep 1; echo out >> {log}",
        log = log.display()
    );
    let (a, b) = tokio::join!(
        tokio::task::spawn_blocking({
            let mut c = etcdctl(endpoint);
            c.args(["lock", "L", "--", "sh", "-c", &section]);
            move || c.output().unwrap()
        }),
        tokio::task::spawn_blocking({
            let mut c = etcdctl(endpoint);
            c.args(["lock", "L", "--", "sh", "-c", &section]);
            move || c.output().unwrap()
        }),
    );
    out.push(output(a.unwrap()));
    out.push(output(b.unwrap()));
    out.push(shape(&std::fs::read_to_string(&log).unwrap()));

    // elect: a leader, then an observer who sees it.
    let leader = etcdctl(endpoint)
        .args(["elect", "E", "p1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let observer = etcdctl(endpoint)
        .args(["elect", "-l", "E"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    testkit_kill(&observer);
    testkit_kill(&leader);
    for child in [leader, observer] {
        out.push(shape(&output(child.wait_with_output().unwrap())));
    }

    // txn, read from standard input as etcdctl reads it.
    let mut txn = etcdctl(endpoint)
        .arg("txn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    txn.stdin
        .take()
        .unwrap()
        .write_all(b"value(\"w/b\") = \"\"\n\nput w/b first\n\nput w/b second\n\n")
        .unwrap();
    out.push(output(txn.wait_with_output().unwrap()));
    out.push(run(&["get", "w/b"]));
    out.push(
        shape(&run(&["endpoint", "health"]))
            .replace(endpoint.trim_start_matches("http://"), "HOST"),
    );
    out
}

fn testkit_kill(child: &std::process::Child) {
    lease_proxy_testkit::signal_pid(child.id(), "TERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_watch_lock_elect_and_txn_as_against_etcd() {
    let raw_etcd = Etcd::single().await;
    let behind = Etcd::single().await;
    let proxy = Proxy::start(behind.endpoints(), |_| {}).await;
    let (etcd_dir, proxy_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let etcd_side = streaming_commands(&raw_etcd.endpoint(0), etcd_dir.path()).await;
    let ours = streaming_commands(&proxy.url, proxy_dir.path()).await;
    for (i, (etcd, ours)) in etcd_side.iter().zip(&ours).enumerate() {
        assert_eq!(
            ours, etcd,
            "step {i}: the proxy's output (left) differs from etcd's"
        );
    }
    assert_eq!(ours.len(), etcd_side.len());
    // The two lockers' sections did not overlap.
    let log = std::fs::read_to_string(proxy_dir.path().join("lock.log")).unwrap();
    let steps: Vec<&str> = log.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(steps, ["in", "out", "in", "out"], "{log}");

    // endpoint status and member list: the proxy answers for itself where etcd would name its
    // members.
    let status = etcdctl(&proxy.url)
        .args(["endpoint", "status", "-w", "json"])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        status[0]["Status"]["version"].as_str().is_some(),
        "{status}"
    );
    let members = etcdctl(&proxy.url)
        .args(["member", "list", "-w", "json"])
        .output()
        .unwrap();
    let members: serde_json::Value = serde_json::from_slice(&members.stdout).unwrap();
    assert_eq!(
        members["members"][0]["clientURLs"],
        serde_json::json!([proxy.url]),
        "{members}"
    );
}

/// `POST /v3/lock/token` for `key`: the status, and the token if one was given.
async fn lock_token(proxy: &Proxy, key: &[u8]) -> (u16, Option<String>) {
    use base64::Engine;
    let key = base64::engine::general_purpose::STANDARD.encode(key);
    let resp = http()
        .post(format!("{}/v3/lock/token", proxy.url))
        .json(&serde_json::json!({ "key": key }))
        .send()
        .await
        .unwrap();
    let token = resp
        .headers()
        .get("fencing-token")
        .map(|v| v.to_str().unwrap().to_owned());
    (resp.status().as_u16(), token)
}

/// The docs' `etcdctl lock` example, run as written (its `export` line aside): the command
/// inside the lock exchanges `ETCD_LOCK_KEY` for a token and writes through fence-gateway. And
/// the exchange gives a token only to the key that holds its lock: the same token a `Lock` of
/// that key got, none for a waiter's key or a key gone, and a later holder's token shuts the
/// earlier one out at the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_side_lock_holders_exchange_their_key_for_a_token() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let (storage, received) = recording_storage().await;
    let gateway = start_gateway(&storage, &proxy.key_file).await;

    let doc = lease_proxy_testkit::docs::read("docs/API.md");
    let section = lease_proxy_testkit::docs::section(
        &doc,
        "### Fencing etcd's client-side locks (`etcdctl lock`, Go's Mutex and Election)",
    );
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the section's sh block");
    let script: String = block
        .lines()
        .filter(|l| !l.starts_with("export "))
        .map(|l| format!("{l}\n"))
        .collect();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .env("PROXY", &proxy.url)
        .env("GATEWAY", &gateway)
        .output()
        .unwrap();
    assert!(out.status.success(), "the example failed: {}", output(out));
    let writes = received.lock().unwrap().clone();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].0, format!("lock/{}", hex::encode("robot-arm")));
    assert!(!writes[0].1.is_empty());

    // The holder's key gets the token its Lock got; a waiter's key none.
    let mut c = client(&proxy.url).await;
    let first = c.lease_grant(30, None).await.unwrap().id();
    let second = c.lease_grant(30, None).await.unwrap().id();
    let request = LockRequest {
        name: b"L".to_vec(),
        lease: first,
    };
    let (headers, answer) = unary(&proxy.url, "/v3lockpb.Lock/Lock", &request, None).await;
    let held = PbLockResponse::decode(answer.as_slice()).unwrap().key;
    let locked = headers["fencing-token"].to_str().unwrap().to_owned();
    assert_eq!(lock_token(&proxy, &held).await, (200, Some(locked.clone())));
    let waiter = format!("L/{second:x}");
    let leased = etcd_client::PutOptions::new().with_lease(second);
    c.put(waiter.as_str(), "", Some(leased)).await.unwrap();
    assert_eq!(lock_token(&proxy, waiter.as_bytes()).await, (400, None));
    for not_a_lock in [b"L".as_slice(), b"/x", b"", b"nothing/here"] {
        assert_eq!(
            lock_token(&proxy, not_a_lock).await,
            (400, None),
            "{not_a_lock:?}"
        );
    }

    // The first holder unlocks: the waiter holds L, its token is higher, the old one is stale.
    c.unlock(held.clone()).await.unwrap();
    assert_eq!(lock_token(&proxy, &held).await, (400, None));
    let (status, next) = lock_token(&proxy, waiter.as_bytes()).await;
    assert_eq!(status, 200);
    let write = |token: String| {
        send(
            http()
                .put(format!("{gateway}/l"))
                .header("Fencing-Token", token)
                .header("Fencing-Resource", format!("lock/{}", hex::encode("L")))
                .body("x"),
        )
    };
    assert_eq!(write(next.unwrap()).await.0, 200);
    assert_eq!(
        write(locked).await.0,
        409,
        "the earlier holder's token was admitted"
    );
}

/// A client that opens a watch and stops reading holds at most the proxy's bound of answers:
/// its stream then ends (Unavailable, so it would resume from its last revision), and another
/// client's watch of the same keys, on the same proxy and etcd connection, gets every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watch_reader_is_cut_off_and_holds_back_no_one() {
    const VALUES: usize = 16;
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.v3_namespace = Some("/ns/".into())).await;
    let create: PbWatchRequest = WatchOptions::new().with_key("big/").with_prefix().into();
    let mut stalled = h2grpc::Stream::open(&proxy.url, WATCH, &create, None).await;
    let created: PbWatchResponse = stalled.next().await.expect("created");
    assert!(created.created);

    let mut reader = client(&proxy.url).await;
    let mut watching = reader
        .watch("big/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    take(&mut watching, 1).await;
    // The reader that reads, reading as the events come, gets every one.
    let reading = tokio::spawn(async move {
        let mut events = 0;
        while events < VALUES {
            let answer = tokio::time::timeout(Duration::from_secs(20), watching.message())
                .await
                .expect("the reading client was held back")
                .unwrap()
                .expect("its stream ended");
            events += answer.0.events.len();
        }
    });
    let mut raw = etcd.client().await;
    for i in 0..VALUES {
        raw.put(format!("/ns/big/{i}"), vec![b'x'; 1 << 20], None)
            .await
            .unwrap();
    }
    reading.await.unwrap();
    // The stalled one, read at last: part of the events, then the end.
    let mut got = 0;
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(answer) = stalled.next::<PbWatchResponse>().await {
            got += answer.events.len();
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stalled stream was never cut off (got {got} events)"
    );
    assert!(
        got < VALUES,
        "the stalled stream got all {got} events: nothing was bounded"
    );
}

/// etcd's Auth service as etcdctl meets it: with authentication off, `--user` is answered
/// "authentication is not enabled" and etcdctl goes on as against etcd; with `--auth-tokens`,
/// a principal's name and token as user and password authenticate, anything else is refused as
/// etcd refuses a wrong password, and user and role changes are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_users_authenticate_as_principals() {
    const ACME: &str = "acme-token-0f3e9a";
    let raw_etcd = Etcd::single().await;
    let behind = Etcd::single().await;
    let open = Proxy::start(behind.endpoints(), |_| {}).await;
    // stdout and the exit code: stderr carries a log line with a time and a random target.
    let run = |endpoint: &str, args: &[&str]| {
        let out = etcdctl(endpoint).args(args).output().unwrap();
        format!(
            "{} | {}",
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).trim()
        )
    };
    for args in [
        &["--user", "someone:secret", "put", "k", "v"][..],
        &["--user", "someone:secret", "get", "k"],
    ] {
        assert_eq!(
            run(&open.url, args),
            run(&raw_etcd.endpoint(0), args),
            "{args:?}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let lines =
        token_line("acme", ACME, "v3:*") + &token_line("lessee", "lessee-token", "acquire:*");
    std::fs::write(&tokens, lines).unwrap();
    let proxy = Proxy::start(behind.endpoints(), |c| c.auth_tokens = Some(tokens.clone())).await;
    let acme = format!("acme:{ACME}");
    assert_eq!(
        run(&proxy.url, &["--user", &acme, "put", "k", "acme's"]),
        "0 | OK"
    );
    assert_eq!(
        run(
            &proxy.url,
            &["--user", &acme, "get", "k", "--print-value-only"]
        ),
        "0 | acme's"
    );
    let mut raw = behind.client().await;
    let stored = raw.get("/lease-proxy/v3/kv/acme/k", None).await.unwrap();
    assert_eq!(
        stored.kvs().len(),
        1,
        "acme's key is not in acme's namespace"
    );
    let failed = "etcdserver: authentication failed, invalid user ID or password";
    // A principal without `v3:*` authenticates, as etcd's user without roles does, and is
    // refused at its call, as that user is.
    let denied = "etcdserver: permission denied";
    for (user, refusal) in [
        ("acme:wrong", failed),
        ("other:acme-token-0f3e9a", failed),
        ("lessee:lessee-token", denied),
    ] {
        let out = etcdctl(&proxy.url)
            .args(["--user", user, "get", "k"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{user} was let in");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(refusal), "{user}: {stderr}");
    }
    let out = etcdctl(&proxy.url)
        .args(["--user", &acme, "user", "add", "bob:pw"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("etcdserver: permission denied"));
}

/// One side's election script (jetcd's and etcd-client's election calls): answers as lines,
/// lease ids and the keys named after them replaced by their order of appearance.
async fn election_script(c: &mut Client) -> Vec<String> {
    use etcd_client::{LeaderKey, ProclaimOptions, ResignOptions};
    let first = c.lease_grant(30, None).await.unwrap().id();
    let second = c.lease_grant(30, None).await.unwrap().id();
    let names = |s: String| {
        s.replace(&format!("{first:x}"), "LEASE1")
            .replace(&format!("{second:x}"), "LEASE2")
    };
    let mut out = Vec::new();
    let leader_line = |r: Result<etcd_client::LeaderResponse, etcd_client::Error>| match r {
        Ok(r) => {
            let kv = r.kv().unwrap();
            format!(
                "leader {} = {}",
                kv.key_str().unwrap(),
                kv.value_str().unwrap()
            )
        }
        Err(etcd_client::Error::GRpcStatus(s)) => format!("error {:?} {}", s.code(), s.message()),
        Err(e) => format!("error {e}"),
    };
    out.push(leader_line(c.leader("E").await));
    let won = c.campaign("E", "v1", first).await.unwrap();
    let leader = won.leader().unwrap().clone();
    out.push(format!(
        "campaign {} rev>0:{}",
        leader.key_str().unwrap(),
        leader.rev() > 0
    ));
    let mut observe = c.observe("E").await.unwrap();
    let observed = |o: Option<etcd_client::LeaderResponse>| {
        let kv = o.unwrap();
        let kv = kv.kv().unwrap();
        format!(
            "observed {} = {}",
            kv.key_str().unwrap(),
            kv.value_str().unwrap()
        )
    };
    out.push(observed(observe.message().await.unwrap()));
    let proclaimed = ProclaimOptions::new().with_leader(leader.clone());
    c.proclaim("v2", Some(proclaimed)).await.unwrap();
    out.push(observed(observe.message().await.unwrap()));
    out.push(leader_line(c.leader("E").await));
    // A second candidate waits while the first leads.
    let mut other = c.clone();
    let waiting = tokio::spawn(async move { other.campaign("E", "w1", second).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(700)).await;
    out.push(format!("second waits: {}", !waiting.is_finished()));
    // A stale leader key proclaims nothing and resigns nothing.
    let stale = LeaderKey::new()
        .with_name("E")
        .with_key(leader.key().to_vec())
        .with_rev(leader.rev() + 1000)
        .with_lease(first);
    let refused = c
        .proclaim(
            "v3",
            Some(ProclaimOptions::new().with_leader(stale.clone())),
        )
        .await
        .unwrap_err();
    out.push(format!("stale proclaim: {refused}"));
    c.resign(Some(ResignOptions::new().with_leader(stale)))
        .await
        .unwrap();
    out.push(format!("still leads: {}", !waiting.is_finished()));
    c.resign(Some(ResignOptions::new().with_leader(leader)))
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the second candidate never led")
        .unwrap();
    out.push(format!(
        "second leads: {}",
        next.leader().unwrap().key_str().unwrap()
    ));
    out.push(observed(observe.message().await.unwrap()));
    out.into_iter().map(names).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_answers_equal_etcds() {
    let raw_etcd = Etcd::single().await;
    let behind = Etcd::single().await;
    let proxy = Proxy::start(behind.endpoints(), |c| c.v3_namespace = Some("/ns/".into())).await;
    let etcd_side = election_script(&mut client(&raw_etcd.endpoint(0)).await).await;
    let mut c = client(&proxy.url).await;
    let ours = election_script(&mut c).await;
    for (i, (etcd, ours)) in etcd_side.iter().zip(&ours).enumerate() {
        assert_eq!(
            ours, etcd,
            "step {i}: the proxy's (left) differs from etcd's"
        );
    }
    assert_eq!(ours.len(), etcd_side.len());
    // Every election key is inside the namespace.
    let mut raw = behind.client().await;
    let all = raw
        .get("E/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(
        all.kvs().is_empty(),
        "an election key outside the namespace"
    );
    // A campaign's answer carries the leader's fencing token.
    let lease = c.lease_grant(30, None).await.unwrap().id();
    let (headers, _) = unary(
        &proxy.url,
        "/v3electionpb.Election/Campaign",
        &CampaignRequest {
            name: b"F".to_vec(),
            lease,
            value: b"x".to_vec(),
        },
        None,
    )
    .await;
    assert_eq!(headers["fencing-resource"], "lock/46");
    assert!(headers.contains_key("fencing-token"));
}

/// `v3electionpb.CampaignRequest`, as the test sends it.
#[derive(Clone, PartialEq, Message)]
struct CampaignRequest {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(int64, tag = "2")]
    lease: i64,
    #[prost(bytes = "vec", tag = "3")]
    value: Vec<u8>,
}

/// One answer larger than the per-stream bound — a delete of many large keys with `prev_kv`, in
/// one revision and unfragmented — reaches a client that reads, as etcd sends it (it used to end the stream, and every resume again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_answer_larger_than_the_bound_reaches_a_reading_client() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.v3_namespace = Some("/ns/".into())).await;
    let mut raw = etcd.client().await;
    for i in 0..10 {
        raw.put(format!("/ns/big/{i}"), vec![b'x'; 1 << 20], None)
            .await
            .unwrap();
    }
    let create: PbWatchRequest = WatchOptions::new()
        .with_key("big/")
        .with_prefix()
        .with_prev_key()
        .into();
    let mut stream = h2grpc::Stream::open(&proxy.url, WATCH, &create, None).await;
    let created: PbWatchResponse = stream.next().await.expect("created");
    assert!(created.created);
    let mut c = client(&proxy.url).await;
    let all = etcd_client::DeleteOptions::new().with_prefix();
    c.delete("big/", Some(all)).await.unwrap();
    // One answer with the ten deletes and their 1 MiB previous values.
    let deleted = tokio::time::timeout(Duration::from_secs(20), stream.next::<PbWatchResponse>())
        .await
        .expect("no answer came")
        .expect("the stream ended");
    assert_eq!(deleted.events.len(), 10);
    assert!(deleted
        .events
        .iter()
        .all(|e| e.prev_kv.as_ref().unwrap().value.len() == 1 << 20));
}

/// The replica's event-stream slots count what holds an etcd watch, and nothing else: a watch
/// stream with no watch holds none; a waiting lock holds one, and is refused (its key removed)
/// when there is none; and a waiting lock ends with the drain, not at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_calls_hold_slots_and_end_with_the_drain() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.v3_namespace = Some("/ns/".into());
        c.max_watch_streams = 2;
        c.drain_timeout = Duration::from_secs(30);
        c.shutdown_delay = Duration::ZERO;
    })
    .await;
    // Five idle watch streams (an empty request, no create): /v1/watch still has its slots.
    let mut idle = Vec::new();
    for _ in 0..5 {
        let nothing = PbWatchRequest::default();
        idle.push(h2grpc::Stream::open(&proxy.url, WATCH, &nothing, None).await);
    }
    let events = http()
        .get(format!("{}/v1/watch", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        events.status(),
        200,
        "idle gRPC watch streams took the slots"
    );
    drop(events);

    // L held; two waiters take the two slots; a third is refused and leaves no key.
    let mut c = client(&proxy.url).await;
    let mut leases = Vec::new();
    for _ in 0..4 {
        leases.push(c.lease_grant(30, None).await.unwrap().id());
    }
    c.lock("L", Some(LockOptions::new().with_lease(leases[0])))
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for &lease in &leases[1..3] {
        let mut w = c.clone();
        waiters.push(tokio::spawn(async move {
            w.lock("L", Some(LockOptions::new().with_lease(lease)))
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let refused = c
        .lock("L", Some(LockOptions::new().with_lease(leases[3])))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("maximum of 2"), "{refused}");
    let mut raw = etcd.client().await;
    let key = format!("/ns/L/{:x}", leases[3]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !raw.get(key.as_str(), None).await.unwrap().kvs().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the refused waiter's key stayed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The drain ends the waiters at once: the proxy stops well before its drain deadline.
    drop(idle);
    let started = tokio::time::Instant::now();
    proxy.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the drain waited {:?} for waiting locks",
        started.elapsed()
    );
    for waiter in waiters {
        assert!(
            waiter.await.unwrap().is_err(),
            "a waiter got the lock during the drain"
        );
    }
}

/// A gRPC client authenticated as `user` (etcd-client's own `Authenticate`, then its `token`
/// metadata on every call, as Go's clientv3 does).
async fn client_as(url: &str, user: &str, token: &str) -> Client {
    let options = etcd_client::ConnectOptions::new().with_user(user, token);
    Client::connect([url], Some(options))
        .await
        .expect("connect")
}

/// Two principals on one proxy over gRPC: whatever the rival names — every range, a txn
/// comparing the other's keys, a watch of everything from revision 1, the other's lease in
/// every lease call and in Put and Lock, the other's lock key in Unlock, its election in Leader,
/// Observe and Resign — it reads, changes and renews nothing of the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_principal_reaches_nothing_of_anothers_over_grpc() {
    use etcd_client::{
        Compare, CompareOp, DeleteOptions, GetOptions, LeaderKey, PutOptions, ResignOptions, Txn,
        TxnOp,
    };
    const ACME: &str = "acme-token-5b7c1d";
    const RIVAL: &str = "rival-token-9e0a2f";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let lines = token_line("acme", ACME, "v3:*") + &token_line("rival", RIVAL, "v3:*");
    std::fs::write(&tokens, lines).unwrap();
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.auth_tokens = Some(tokens.clone());
        c.v3_namespace = Some("/ns/".into());
    })
    .await;

    // acme's state: keys, a lease with a key, a lock and an election it leads.
    let mut acme = client_as(&proxy.url, "acme", ACME).await;
    acme.put("shared/k", "acme's", None).await.unwrap();
    let lease = acme.lease_grant(60, None).await.unwrap().id();
    acme.put(
        "leased",
        "acme's",
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    let lock_key = acme
        .lock("door", Some(LockOptions::new().with_lease(lease)))
        .await
        .unwrap()
        .key()
        .to_vec();
    let leader = acme
        .campaign("boss", "acme", lease)
        .await
        .unwrap()
        .leader()
        .cloned()
        .unwrap();
    let mut raw = etcd.client().await;
    let snapshot = |kvs: &[etcd_client::KeyValue]| {
        kvs.iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision()))
            .collect::<Vec<_>>()
    };
    let everything = Some(GetOptions::new().with_prefix());
    let before = snapshot(
        raw.get("/ns/acme/", everything.clone())
            .await
            .unwrap()
            .kvs(),
    );
    assert_eq!(before.len(), 4, "{before:?}");

    let mut rival = client_as(&proxy.url, "rival", RIVAL).await;
    // Its watch of everything, from the first revision, opened before anything else it does.
    let mut watched = rival
        .watch(
            "",
            Some(WatchOptions::new().with_prefix().with_start_revision(1)),
        )
        .await
        .unwrap();

    // Reads of everything a range can name.
    for (key, options) in [
        ("", GetOptions::new().with_all_keys()),
        ("", GetOptions::new().with_from_key()),
        ("../acme/", GetOptions::new().with_prefix()),
        ("\u{0}", GetOptions::new().with_range(vec![0xff, 0xff])),
    ] {
        let got = rival.get(key, Some(options)).await.unwrap();
        assert!(got.kvs().is_empty(), "{key:?}: {:?}", got.kvs());
    }
    // A txn comparing acme's key (absent here: the compare fails) whose branches write.
    let txn = Txn::new()
        .when([Compare::value("shared/k", CompareOp::Equal, "acme's")])
        .and_then([TxnOp::put("shared/k", "pwned", None)])
        .or_else([
            TxnOp::delete("", Some(DeleteOptions::new().with_all_keys())),
            TxnOp::txn(
                Txn::new().and_then([TxnOp::get("", Some(GetOptions::new().with_all_keys()))]),
            ),
        ]);
    let answer = rival.txn(txn).await.unwrap();
    assert!(!answer.succeeded());
    rival
        .delete("", Some(DeleteOptions::new().with_all_keys()))
        .await
        .unwrap();

    // acme's lease, wherever a lease can be named.
    let not_found = "requested lease not found";
    let e = rival
        .put("k", "v", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains(not_found), "{e}");
    let e = rival.lease_revoke(lease).await.unwrap_err();
    assert!(e.to_string().contains(not_found), "{e}");
    assert_eq!(
        rival.lease_time_to_live(lease, None).await.unwrap().ttl(),
        -1
    );
    assert!(rival.leases().await.unwrap().leases().is_empty());
    assert!(rival.lease_keep_alive(lease).await.is_err());
    let e = rival
        .lock("door", Some(LockOptions::new().with_lease(lease)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains(not_found), "{e}");
    let e = rival.campaign("boss", "rival", lease).await.unwrap_err();
    assert!(e.to_string().contains(not_found), "{e}");

    // acme's lock key and election: names in rival's own namespace, which hold nothing.
    rival.unlock(lock_key.clone()).await.unwrap();
    let e = rival.leader("boss").await.unwrap_err();
    assert!(e.to_string().contains("election: no leader"), "{e}");
    let foreign = LeaderKey::new()
        .with_name(leader.name())
        .with_key(leader.key())
        .with_rev(leader.rev())
        .with_lease(leader.lease());
    let _ = rival
        .resign(Some(ResignOptions::new().with_leader(foreign)))
        .await;
    let mut observed = rival.observe("boss").await.unwrap();
    let nothing = tokio::time::timeout(Duration::from_millis(300), observed.message()).await;
    assert!(
        nothing.is_err(),
        "rival observed acme's leader: {nothing:?}"
    );
    // Its own lock of the same name is granted at once, in a fencing domain of its own.
    let own = rival.lease_grant(60, None).await.unwrap().id();
    let (headers, _) = unary(
        &proxy.url,
        "/v3lockpb.Lock/Lock",
        &LockRequest {
            name: b"door".to_vec(),
            lease: own,
        },
        Some(RIVAL),
    )
    .await;
    assert_eq!(
        headers["fencing-resource"],
        fencing::lock_resource(b"rival/door")
    );

    // acme writes again: rival's watch saw none of acme's events, before or now.
    acme.put("shared/k", "acme's again", None).await.unwrap();
    rival.put("mine", "rival's", None).await.unwrap();
    let mut seen = Vec::new();
    while let Ok(Ok(Some(answer))) =
        tokio::time::timeout(Duration::from_millis(500), watched.message()).await
    {
        for e in answer.events() {
            seen.push(e.kv().map(|kv| kv.key().to_vec()).unwrap_or_default());
        }
    }
    assert!(
        seen.iter()
            .all(|k| k.starts_with(b"mine") || k.starts_with(b"door/")),
        "rival's watch saw {seen:?}"
    );
    assert!(seen.iter().any(|k| k == b"mine"), "{seen:?}");

    // acme's keys are as they were but for its own new write; its lease lives on.
    let after = snapshot(raw.get("/ns/acme/", everything).await.unwrap().kvs());
    let unchanged = |all: &[(Vec<u8>, Vec<u8>, i64)]| {
        all.iter()
            .filter(|(k, _, _)| k != b"/ns/acme/shared/k")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(unchanged(&after), unchanged(&before));
    assert!(after
        .iter()
        .any(|(k, v, _)| k == b"/ns/acme/shared/k" && v == b"acme's again"));
    assert!(raw.lease_time_to_live(lease, None).await.unwrap().ttl() > 0);
    let outside = raw
        .get("/ns/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    for kv in outside.kvs() {
        assert!(
            kv.key().starts_with(b"/ns/acme/") || kv.key().starts_with(b"/ns/rival/"),
            "{:?}",
            kv.key()
        );
    }
}

/// etcd's own count of its watchers (`etcd_debugging_mvcc_watcher_total`).
async fn etcd_watchers(etcd: &Etcd) -> i64 {
    let text = reqwest::get(format!("{}/metrics", etcd.endpoint(0)))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("etcd reports its watchers") as i64
}

/// Waits up to 10 s for etcd's watcher count to be `want` (the count moves as etcd processes
/// creates and cancels); the last count seen.
async fn watchers_become(etcd: &Etcd, want: i64) -> i64 {
    let mut seen = etcd_watchers(etcd).await;
    for _ in 0..100 {
        if seen == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen = etcd_watchers(etcd).await;
    }
    seen
}

/// Watches "from now" of one range, from many streams and clients, are one etcd watch; each
/// stream gets every event after its created revision under its own watch id and filters; a
/// cancel or a stream gone leaves the others watching; the etcd watch goes with the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_of_one_range_share_one_etcd_watch() {
    const STREAMS: usize = 60;
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.v3_namespace = Some("/ns/".into())).await;
    // The proxy's own watches (its holder view), once they are all open.
    let mut before = etcd_watchers(&etcd).await;
    loop {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let now = etcd_watchers(&etcd).await;
        if now == before {
            break;
        }
        before = now;
    }
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(&proxy.url).await);
    }
    let mut streams = Vec::new();
    for i in 0..STREAMS {
        let c = &mut clients[i % 3];
        let mut options = WatchOptions::new().with_prefix();
        if i == 1 {
            options = options.with_filters([WatchFilterType::NoPut]);
        }
        let mut s = c.watch("room/", Some(options)).await.unwrap();
        let created = tokio::time::timeout(Duration::from_secs(10), s.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(created.created() && !created.canceled());
        streams.push((created.header().unwrap().revision(), s));
    }
    assert_eq!(
        watchers_become(&etcd, before + 1).await,
        before + 1,
        "{STREAMS} watches of one range are not one etcd watch"
    );
    // Another range, or the same one with prev_kv, is a watch of its own.
    let mut other = clients[0]
        .watch(
            "room/",
            Some(WatchOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    take(&mut other, 1).await;
    assert_eq!(watchers_become(&etcd, before + 2).await, before + 2);

    let mut raw = etcd.client().await;
    let put = raw.put("/ns/room/x", "1", None).await.unwrap();
    let put_revision = put.header().unwrap().revision();
    raw.delete("/ns/room/x", None).await.unwrap();
    raw.put("/ns/elsewhere", "1", None).await.unwrap();
    for (i, (created_at, s)) in streams.iter_mut().enumerate() {
        let want: &[&str] = if i == 1 {
            &["event watch=0 type=1 key=\"room/x\" value=\"\" version=0 prev=None"]
        } else {
            &[
                "event watch=0 type=0 key=\"room/x\" value=\"1\" version=1 prev=None",
                "event watch=0 type=1 key=\"room/x\" value=\"\" version=0 prev=None",
            ]
        };
        assert_eq!(take(s, want.len()).await, want, "stream {i}");
        assert!(
            *created_at < put_revision,
            "stream {i}: created at {created_at}"
        );
    }
    assert_eq!(
        take(&mut other, 2).await[1],
        "event watch=0 type=1 key=\"room/x\" value=\"\" version=0 prev=Some(\"room/x=1\")"
    );

    // A cancel answers that stream alone; the others go on.
    let (_, first) = &mut streams[0];
    first.cancel(0).await.unwrap();
    assert_eq!(
        take(first, 1).await,
        ["answer watch=0 created=false canceled=true reason=\"\" compacted=false"]
    );
    drop(streams.swap_remove(0));
    drop(streams.swap_remove(1));
    raw.put("/ns/room/y", "2", None).await.unwrap();
    for (_, s) in streams.iter_mut() {
        assert_eq!(
            take(s, 1).await,
            ["event watch=0 type=0 key=\"room/y\" value=\"2\" version=1 prev=None"]
        );
    }
    // A progress request on a stream with a shared watch: answered after what came before.
    let (_, s) = &mut streams[0];
    s.request_progress().await.unwrap();
    assert_eq!(
        take(s, 1).await,
        ["answer watch=-1 created=false canceled=false reason=\"\" compacted=false"]
    );
    // Creates answered in the order they came, shared or not (Go's client pairs its creates
    // with the created answers in order): one with history, one shared, one with progress
    // notifications, sent back to back.
    let history = WatchOptions::new()
        .with_prefix()
        .with_start_revision(put_revision);
    let mut mixed = clients[1]
        .watch("room/", Some(history.clone()))
        .await
        .unwrap();
    let notified = WatchOptions::new().with_prefix().with_progress_notify();
    for round in 0..4 {
        if round > 0 {
            mixed.watch("room/", Some(history.clone())).await.unwrap();
        }
        let shared = WatchOptions::new().with_prefix();
        mixed.watch("room/", Some(shared)).await.unwrap();
        mixed.watch("room/", Some(notified.clone())).await.unwrap();
    }
    let mut created = Vec::new();
    while created.len() < 12 {
        let answer = tokio::time::timeout(Duration::from_secs(10), mixed.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if answer.created() {
            created.push(answer.watch_id());
        }
    }
    assert_eq!(created, (0..12).collect::<Vec<i64>>());
    drop(mixed);

    // A member joining an idle shared watch is answered created at etcd's revision now, not the
    // shared watch's last event's (which a compaction may have removed: a client resuming from
    // it after a reconnect would be refused); a cancel frees its id at once.
    let mut idle = clients[2]
        .watch("quiet/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    take(&mut idle, 1).await;
    let mut now = 0;
    for i in 0..5 {
        let put = raw.put(format!("/ns/busy/{i}"), "x", None).await.unwrap();
        now = put.header().unwrap().revision();
    }
    let (_, joined) = &mut streams[0];
    let quiet = WatchOptions::new().with_prefix().with_watch_id(7);
    joined.watch("quiet/", Some(quiet.clone())).await.unwrap();
    let created = tokio::time::timeout(Duration::from_secs(10), joined.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(created.created() && created.watch_id() == 7);
    assert!(
        created.header().unwrap().revision() >= now,
        "created at {} after a put at {now}",
        created.header().unwrap().revision()
    );
    joined.cancel(7).await.unwrap();
    joined.watch("quiet/", Some(quiet)).await.unwrap();
    assert_eq!(
        take(joined, 2).await,
        [
            "answer watch=7 created=false canceled=true reason=\"\" compacted=false",
            "answer watch=7 created=true canceled=false reason=\"\" compacted=false"
        ]
    );

    // After a half-close the stream's watches go on, as etcd's do.
    let create: PbWatchRequest = WatchOptions::new().with_key("room/").with_prefix().into();
    let mut half = h2grpc::Stream::open(&proxy.url, WATCH, &create, None).await;
    let created: PbWatchResponse = half.next().await.expect("created");
    assert!(created.created);
    half.close();
    raw.put("/ns/room/z", "3", None).await.unwrap();
    let event: PbWatchResponse = tokio::time::timeout(Duration::from_secs(10), half.next())
        .await
        .expect("no event after the half-close")
        .expect("the stream ended at the half-close");
    assert_eq!(event.events.len(), 1);
    drop(half);
    drop(idle);
    drop(streams);
    drop(other);
    assert_eq!(
        watchers_become(&etcd, before).await,
        before,
        "the shared etcd watch outlived its last member"
    );
}

/// When etcd fails a shared watch, every member's stream ends Unavailable, as a stream whose
/// own etcd watch fails does (a member gone is a transport error, once answered Unknown): the
/// client resumes elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_shared_watch_ends_every_members_stream() {
    let mut etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.v3_namespace = Some("/ns/".into())).await;
    let mut c = client(&proxy.url).await;
    let mut members = Vec::new();
    // Two members of one shared watch, and a watch on its stream's own etcd watch (progress
    // notifications are per watch), which ends the same way.
    for i in 0..3 {
        let mut options = WatchOptions::new().with_prefix();
        if i == 2 {
            options = options.with_progress_notify();
        }
        let mut s = c.watch("room/", Some(options)).await.unwrap();
        take(&mut s, 1).await;
        members.push(s);
    }
    etcd.kill(0);
    for mut s in members {
        let end = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                match s.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return "ended OK".to_owned(),
                    Err(etcd_client::Error::GRpcStatus(status)) => {
                        return format!("{:?}", status.code())
                    }
                    Err(e) => return format!("{e}"),
                }
            }
        })
        .await
        .expect("a member's stream outlived its failed shared watch");
        assert_eq!(end, "Unavailable");
    }
}

/// Streams cut off for not reading give back what waited for them at once, even while their
/// clients hold them open unread: a tenant that stalls many members of one shared watch and
/// floods it cannot use up the replica's bound on waiting answers and so get another client's
/// stream — one reading, only a little behind — cut off (it could, before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_streams_held_open_hold_no_memory() {
    const STALLED: usize = 60;
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.v3_namespace = Some("/ns/".into());
        c.max_watch_streams = 300;
    })
    .await;
    let create: PbWatchRequest = WatchOptions::new().with_key("flood/").with_prefix().into();
    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        let mut s = h2grpc::Stream::open(&proxy.url, WATCH, &create, None).await;
        let created: PbWatchResponse = s.next().await.expect("created");
        assert!(created.created);
        stalled.push(s);
    }
    // 24 MiB to every stalled member: each one passes its 8 MiB bound (and what its connection
    // takes in) and is cut off; together they would hold more than the replica's 256 MiB if
    // what waited for them stayed.
    let mut raw = etcd.client().await;
    for i in 0..24 {
        raw.put(format!("/ns/flood/{i}"), vec![b'x'; 1 << 20], None)
            .await
            .unwrap();
    }
    // Another client, reading a little behind: it gets every event (5 MiB in all, more than
    // its connection takes in while it is behind, less than its own 8 MiB bound).
    let mut reader = client(&proxy.url).await;
    let mut watching = reader
        .watch("v/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    take(&mut watching, 1).await;
    let puts = tokio::spawn(async move {
        for round in 0..20 {
            let batch = (0..32).map(|i| {
                let mut raw = raw.clone();
                async move {
                    raw.put(format!("/ns/v/{round}-{i}"), vec![b'y'; 8 << 10], None)
                        .await
                        .unwrap();
                }
            });
            futures::future::join_all(batch).await;
        }
    });
    let mut events = 0;
    while events < 640 {
        let answer = tokio::time::timeout(Duration::from_secs(20), watching.message())
            .await
            .expect("the reader was held back")
            .unwrap_or_else(|e| panic!("the reader was cut off after {events} events: {e}"))
            .expect("its stream ended");
        events += answer.0.events.len();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    puts.await.unwrap();
    drop(stalled);
}

/// etcd's watch streams and observers last as long as their client, and not every client
/// resumes one the server ends (python-etcd3's watch fails): through the proxy they outlive
/// `--watch-max-duration` (the /v1 streams' bound) and end only at `--v3-watch-max-duration`
/// when it is set, Unavailable, so that a client resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_api_streams_end_only_at_their_own_max_duration() {
    let etcd = Etcd::single().await;
    for bound in [None, Some(Duration::from_secs(1))] {
        let proxy = Proxy::start(etcd.endpoints(), |c| {
            c.v3_namespace = Some("/ns/".into());
            c.watch_max_duration = Duration::from_secs(1);
            c.v3_watch_max_duration = bound;
        })
        .await;
        let mut c = client(&proxy.url).await;
        let mut stream = c.watch("long", None).await.unwrap();
        assert!(stream.message().await.unwrap().unwrap().created());
        let mut observed = c.observe("vote").await.unwrap();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        c.put("long", "later", None).await.unwrap();
        let watched = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
        let observer = tokio::time::timeout(Duration::from_millis(500), observed.message()).await;
        match bound {
            None => {
                let events = watched.expect("no answer").expect("the stream ended");
                assert_eq!(events.expect("ended").events().len(), 1);
                assert!(observer.is_err(), "the observer ended: {observer:?}");
            }
            Some(_) => {
                let ended = watched.expect("the stream went on").unwrap_err();
                assert!(
                    ended.to_string().contains("--v3-watch-max-duration"),
                    "{ended}"
                );
                let ended = observer.expect("the observer went on").unwrap_err();
                assert!(
                    ended.to_string().contains("--v3-watch-max-duration"),
                    "{ended}"
                );
            }
        }
        proxy.stop().await;
    }
}
