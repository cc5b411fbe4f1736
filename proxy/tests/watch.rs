//! `GET /v1/watch`: ownership events as Server-Sent Events against real etcd — acquired,
//! released (release, session grant release, session close) and expired (lease lapsed, session
//! lapsed), in revision order; resuming with `Last-Event-ID` loses and repeats nothing, also
//! inside one revision; a compacted or future resume point is 410; 1,000 events/s through one
//! stream, with a reader that stalls, keep the proxy's memory bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::sse::{Message, Sse};
use common::*;
use lease_proxy_testkit::poll::{eventually, Probe};
use serde_json::Value;
use tokio::time::Instant;

/// (type, resource, holder, token) of an event.
fn summary(m: &Message) -> (String, String, String, String) {
    let d = m.data.as_ref().unwrap();
    assert_eq!(d["type"].as_str(), m.event.as_deref(), "{m:?}");
    (
        d["type"].as_str().unwrap().to_owned(),
        d["resource"].as_str().unwrap().to_owned(),
        d["holder"].as_str().unwrap().to_owned(),
        d["token"].as_str().unwrap().to_owned(),
    )
}

fn watch_url(proxy: &Proxy, prefix: &str) -> String {
    format!("{}/v1/watch?prefix={prefix}", proxy.url)
}

/// `(revision, index)` of an event id `R.n`.
fn position(id: &str) -> (i64, u32) {
    let (r, n) = id.split_once('.').unwrap();
    (r.parse().unwrap(), n.parse().unwrap())
}

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn events_name_every_grant_and_how_it_ended_in_revision_order() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let mut sse = Sse::open(&watch_url(&proxy, "ev-"), None).await;
    let first = sse.next(WAIT).await.unwrap();
    assert!(first.data.is_none() && first.id.is_some(), "{first:?}");
    let mut expected = Vec::new();
    let grant = |body: &Value| (str_field(body, "resource"), str_field(body, "token"));

    // An own-lease grant released.
    let (s, a) = acquire(&proxy, "ev-a", "alice", 30).await;
    assert_eq!(s, 201, "{a}");
    release(&proxy, "ev-a", &str_field(&a, "secret")).await;
    // A session: one grant released, another ended by closing the session.
    let sess = session(&proxy, "bob", 30).await;
    let (_, b) = acquire_in(&proxy, "ev-b", "bob", &sess).await;
    let (_, c) = acquire_in(&proxy, "ev-c", "bob", &sess).await;
    release(&proxy, "ev-b", &str_field(&b, "secret")).await;
    assert_eq!(close_session(&proxy, &sess).await.0, 204);
    // Outside the prefix: never shown.
    let (s, _) = acquire(&proxy, "other", "eve", 30).await;
    assert_eq!(s, 201);
    // A lapsing session whose resource was released and acquired again under it: the new grant
    // expires (the old release's marker names the old grant only).
    let lapsing = session(&proxy, "carol", 2).await;
    let (_, d1) = acquire_in(&proxy, "ev-d", "carol", &lapsing).await;
    release(&proxy, "ev-d", &str_field(&d1, "secret")).await;
    let (_, d2) = acquire_in(&proxy, "ev-d", "carol", &lapsing).await;
    // An own-lease grant that lapses.
    let (_, e) = acquire(&proxy, "ev-e", "dave", 2).await;

    for (kind, body, holder) in [
        ("acquired", &a, "alice"),
        ("released", &a, "alice"),
        ("acquired", &b, "bob"),
        ("acquired", &c, "bob"),
        ("released", &b, "bob"),
        ("released", &c, "bob"),
        ("acquired", &d1, "carol"),
        ("released", &d1, "carol"),
        ("acquired", &d2, "carol"),
        ("acquired", &e, "dave"),
    ] {
        let (resource, token) = grant(body);
        expected.push((kind.to_owned(), resource, holder.to_owned(), token));
    }
    let mut seen = Vec::new();
    let mut last = (0, 0);
    for _ in 0..expected.len() + 2 {
        let m = sse.event(WAIT).await;
        let at = position(m.id.as_deref().unwrap());
        assert!(at > last, "ids not rising: {at:?} after {last:?}");
        assert_eq!(
            m.data.as_ref().unwrap()["revision"].as_i64(),
            Some(at.0),
            "{m:?}"
        );
        last = at;
        seen.push(summary(&m));
    }
    // The two lapses come last, in whichever order etcd expired them.
    let (done, lapsed) = seen.split_at(expected.len());
    assert_eq!(done, expected.as_slice());
    let mut lapsed = lapsed.to_vec();
    lapsed.sort();
    let (rd, td) = grant(&d2);
    let (re, te) = grant(&e);
    assert_eq!(
        lapsed,
        vec![
            ("expired".to_owned(), rd, "carol".to_owned(), td),
            ("expired".to_owned(), re, "dave".to_owned(), te),
        ]
    );
    // The session fields: grants under a session name it, own-lease grants do not.
    let _ = (b, c);
}

#[tokio::test]
async fn a_resumed_stream_loses_and_repeats_nothing_even_inside_one_revision() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let url = watch_url(&proxy, "");
    let mut whole = Sse::open(&url, None).await;
    let start = whole.next(WAIT).await.unwrap().id.unwrap();

    // Three grants on one session, ended together by its close: three events of one revision.
    let sess = session(&proxy, "s", 30).await;
    for r in ["r1", "r2", "r3"] {
        assert_eq!(acquire_in(&proxy, r, "s", &sess).await.0, 201);
    }
    assert_eq!(close_session(&proxy, &sess).await.0, 204);

    let mut all = Vec::new();
    for _ in 0..6 {
        all.push(whole.event(WAIT).await);
    }
    let closed: Vec<_> = all[3..]
        .iter()
        .map(|m| position(m.id.as_deref().unwrap()))
        .collect();
    assert!(
        closed.iter().all(|p| p.0 == closed[0].0),
        "one close, one revision: {closed:?}"
    );

    // A reader that saw the first of the three, then lost its connection.
    let mut partial = Sse::open(&url, Some(&start)).await;
    partial.next(WAIT).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(partial.event(WAIT).await);
    }
    let cut = got.last().unwrap().id.clone().unwrap();
    drop(partial);
    // Meanwhile more happens.
    let (s, later) = acquire(&proxy, "r4", "t", 30).await;
    assert_eq!(s, 201);
    all.push(whole.event(WAIT).await);
    let mut resumed = Sse::open(&url, Some(&cut)).await;
    let hello = resumed.next(WAIT).await.unwrap();
    assert_eq!(hello.id.as_deref(), Some(cut.as_str()));
    for _ in 0..3 {
        got.push(resumed.event(WAIT).await);
    }
    assert_eq!(
        got, all,
        "resumed stream differs from the uninterrupted one"
    );
    assert!(
        resumed.next(Duration::from_millis(500)).await.is_none(),
        "an event repeated"
    );
    assert_eq!(summary(got.last().unwrap()).3, str_field(&later, "token"));

    // The query form of the id works too, and a bare revision resumes after all of it.
    let revision = closed[0].0;
    let resp = reqwest::get(format!("{url}&last_event_id={revision}"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn bad_and_unavailable_resume_points_are_refused() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let url = watch_url(&proxy, "");
    let client = reqwest::Client::new();
    for bad in ["x", "1.", "-3", "0", "1.2.3", "99999999999999999999"] {
        let r = client
            .get(&url)
            .header("last-event-id", bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
    for bad in ["a b", "%2F", "-x"] {
        let r = client
            .get(format!("{}/v1/watch?prefix={bad}", proxy.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "prefix {bad}");
    }
    // A malformed query id is refused even beside a valid header.
    for query in ["last_event_id=", "last_event_id=x", "last_event_id=0"] {
        let r = client
            .get(format!("{url}&{query}"))
            .header("last-event-id", "1")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{query}");
    }
    let r = client.get(format!("{url}&since=1")).send().await.unwrap();
    assert_eq!(r.status(), 400, "unknown parameter");

    let mut sse = Sse::open(&url, None).await;
    let start = sse.next(WAIT).await.unwrap().id.unwrap();
    drop(sse);
    for i in 0..5 {
        assert_eq!(acquire(&proxy, &format!("c{i}"), "h", 30).await.0, 201);
    }
    // The future: not this etcd's history — also just one revision ahead, inside it or not.
    let now = {
        let mut kv = etcd.client().await;
        kv.get("x", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision()
    };
    for future in [
        format!("{}", now + 1_000_000),
        format!("{}", now + 1),
        format!("{}.0", now + 1),
        format!("{}.3", now + 2),
    ] {
        let r = client
            .get(&url)
            .header("last-event-id", &future)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 410, "{future}");
    }
    // Compacted away.
    let mut kv = etcd.client().await;
    let now = kv
        .get("x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    kv.compact(now, None).await.unwrap();
    for gone in ["1.0", "1.7", "2.0", "2"] {
        let r = client
            .get(&url)
            .header("last-event-id", gone)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 410, "{gone}");
    }
    let r = client
        .get(&url)
        .header("last-event-id", &start)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 410);
    let problem: Value = r.json().await.unwrap();
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("events-compacted"),
        "{problem}"
    );
    // From the compaction point on it works again.
    assert_eq!(
        client
            .get(&url)
            .header("last-event-id", now.to_string())
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

/// A record as the proxy stores it, for keys written straight into etcd, with a 4 KiB holder
/// name (longer than an acquire allows), so that a backlog in the proxy would show: 20,000 such
/// events are 80 MiB.
fn record(holder: &str) -> String {
    let holder = format!("{holder}-{}", "h".repeat(4096));
    serde_json::json!({
        "holder": holder, "lease_id": "0", "secret_hash": "x", "acquired_at": 0, "ttl_seconds": 30
    })
    .to_string()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn a_thousand_events_a_second_through_one_stream_with_a_stalled_reader_stay_bounded() {
    let etcd = Etcd::single().await;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let port = lease_proxy_testkit::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut child =
        std::process::Command::new(lease_proxy_testkit::workspace_binary("lease-proxy"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--etcd-endpoints", &etcd.endpoints().join(",")])
            // The reader stalls for 20 s on purpose and must then get everything.
            .args(["--client-write-timeout", "120s"])
            .arg("--key-file")
            .arg(&key)
            .arg("--data-dir")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
    wait_ready(&url).await;
    let pid = child.id();

    let mut reader = Sse::open(&format!("{url}/v1/watch"), None).await;
    reader.next(WAIT).await.unwrap();
    let baseline = rss_kib(pid);

    // 1,000 events a second for 20 s, 100 per revision, straight into etcd: 100 grants made,
    // then the same 100 ended, five times a second (so the proxy's own view of held resources
    // stays small). The reader reads nothing meanwhile.
    let mut kv = etcd.client().await;
    let value = record("bulk");
    let total = 20_000usize;
    let started = Instant::now();
    let name = |i: usize| format!("/lease-proxy/holders/bulk-{i:05}");
    for second in 0..20usize {
        for batch in 0..5usize {
            let base = second * 500 + batch * 100;
            let puts: Vec<_> = (base..base + 100)
                .map(|i| etcd_client::TxnOp::put(name(i), value.as_str(), None))
                .collect();
            kv.txn(etcd_client::Txn::new().and_then(puts))
                .await
                .unwrap();
            let deletes: Vec<_> = (base..base + 100)
                .map(|i| etcd_client::TxnOp::delete(name(i), None))
                .collect();
            kv.txn(etcd_client::Txn::new().and_then(deletes))
                .await
                .unwrap();
        }
        tokio::time::sleep_until(started + Duration::from_secs(second as u64 + 1)).await;
    }
    let stalled = rss_kib(pid);
    // Everything arrives, in order, once the reader reads.
    let mut last = (0, 0);
    for n in 0..total {
        let m = reader.event(Duration::from_secs(30)).await;
        let at = position(m.id.as_deref().unwrap());
        assert!(at > last);
        last = at;
        let d = m.data.unwrap();
        let (i, kind) = (
            (n / 200) * 100 + n % 100,
            if n % 200 < 100 { "acquired" } else { "expired" },
        );
        assert_eq!(d["resource"].as_str().unwrap(), format!("bulk-{i:05}"));
        assert_eq!(d["type"], kind);
    }
    let after = rss_kib(pid);
    eprintln!("proxy RSS: {baseline} KiB at the start, {stalled} KiB stalled, {after} KiB after");
    let _ = child.kill();
    let _ = child.wait();
    // The proxy must not be what holds the 80 MiB back. What it may hold: the shared feed's
    // ring (at most 1 MiB of messages, here about 250 of these 4 KiB ones, in more of the
    // allocator's pages), the stream's own watch while it catches up (etcd's responses of up to
    // 1.5 MiB, decoded), and what mimalloc keeps of the pages freed since.
    assert!(
        stalled < baseline + 40 * 1024 && after < baseline + 40 * 1024,
        "proxy RSS grew from {baseline} KiB to {stalled} KiB (stalled reader) and {after} KiB"
    );
}

#[tokio::test]
async fn streams_are_bounded_and_end_when_the_proxy_drains() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |c| c.max_watch_streams = 2).await;
    let url = watch_url(&proxy, "");
    let mut one = Sse::open(&url, None).await;
    let two = Sse::open(&url, None).await;
    let r = reqwest::get(&url).await.unwrap();
    assert_eq!(r.status(), 503);
    let problem: Value = r.json().await.unwrap();
    assert!(problem["type"]
        .as_str()
        .unwrap()
        .ends_with("too-many-watches"));
    // A slot comes back when a client leaves.
    drop(two);
    let mut again = None;
    for _ in 0..100 {
        let r = reqwest::get(&url).await.unwrap();
        if r.status() == 200 {
            again = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again.is_some(), "the slot never came back");
    drop(again);
    // Draining ends the open streams, so the drain does not wait for them.
    one.next(WAIT).await.unwrap();
    let stopped = Instant::now();
    proxy.stop().await;
    assert!(one.next(WAIT).await.is_none());
    assert!(
        stopped.elapsed() < Duration::from_secs(3),
        "drain waited for the stream"
    );
}

/// A stream whose etcd member dies ends; resuming from the last id on another proxy replica loses
/// and repeats nothing: every acquire answered 201 is one `acquired` event, in token order.
#[tokio::test]
async fn resuming_across_a_leader_kill_and_replicas_loses_nothing() {
    let mut etcd = Etcd::cluster(3).await;
    let a = Proxy::start(etcd.endpoints(), |_| {}).await;
    let b = a.replica(etcd.endpoints(), |_| {}).await;
    let urls = [watch_url(&a, "k-"), watch_url(&b, "k-")];
    let mut sse = Sse::open(&urls[0], None).await;
    let mut last = sse.next(WAIT).await.unwrap().id.unwrap();
    let mut tokens = Vec::new();
    let mut seen = Vec::new();
    let mut opened = 1;
    let mut killed = None;
    // Reads what has arrived; an ended stream is resumed from the last id on the other replica.
    async fn drain(
        sse: &mut Sse,
        last: &mut String,
        seen: &mut Vec<String>,
        opened: &mut usize,
        urls: &[String; 2],
        within: Duration,
    ) {
        loop {
            match sse.next(within).await {
                Some(m) => {
                    *last = m.id.clone().unwrap();
                    if m.data.is_some() {
                        seen.push(summary(&m).3);
                    }
                }
                None if sse.ended => {
                    *opened += 1;
                    *sse = Sse::open(&urls[*opened % 2], Some(last)).await;
                }
                None => return,
            }
        }
    }
    for i in 0..60 {
        if i == 20 {
            let leader = etcd.wait_leader(Duration::from_secs(10)).await.unwrap();
            etcd.kill(leader);
            killed = Some(leader);
        }
        if i == 40 {
            etcd.restart(killed.unwrap()).await;
        }
        let proxy = if i % 2 == 0 { &a } else { &b };
        for _ in 0..100 {
            let (s, body) = acquire(proxy, &format!("k-{i:02}"), "h", 30).await;
            if s == 201 {
                tokens.push(str_field(&body, "token"));
                break;
            }
            assert_eq!(s, 503, "{body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        drain(
            &mut sse,
            &mut last,
            &mut seen,
            &mut opened,
            &urls,
            Duration::from_millis(50),
        )
        .await;
        if i % 10 == 9 {
            // A client that reconnects on its own, to the other replica.
            opened += 1;
            sse = Sse::open(&urls[opened % 2], Some(&last)).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < tokens.len() && Instant::now() < deadline {
        drain(
            &mut sse,
            &mut last,
            &mut seen,
            &mut opened,
            &urls,
            Duration::from_secs(1),
        )
        .await;
    }
    assert_eq!(tokens.len(), 60);
    assert_eq!(seen, tokens, "events differ from the grants");
}

/// With `--auth-tokens`: a stream needs `read` somewhere and shows only what its caller may read.
#[tokio::test]
async fn a_principal_sees_only_the_resources_it_may_read() {
    use sha2::{Digest, Sha256};
    let hash = |t: &str| hex::encode(Sha256::digest(t.as_bytes()));
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!(
            "writer {} acquire:*\nreader {} read:aisle-\nall {} read:*\n",
            hash("w-token-0123456789"),
            hash("r-token-0123456789"),
            hash("a-token-0123456789"),
        ),
    )
    .unwrap();
    let proxy = Proxy::on(&etcd, |c| c.auth_tokens = Some(tokens.clone())).await;
    let url = watch_url(&proxy, "");
    let client = reqwest::Client::new();
    for (token, status) in [
        (None, 401),
        (Some("w-token-0123456789"), 403),
        (Some("nobody-0123456789"), 401),
    ] {
        let mut req = client.get(&url);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        assert_eq!(req.send().await.unwrap().status(), status, "{token:?}");
    }
    let mut reader = Sse::open_as(&url, None, Some("r-token-0123456789")).await;
    let mut all = Sse::open_as(&url, None, Some("a-token-0123456789")).await;
    reader.next(WAIT).await.unwrap();
    all.next(WAIT).await.unwrap();
    for r in ["dock-1", "aisle-1", "dock-2", "aisle-2"] {
        let (s, body) = send(
            http()
                .post(format!("{}/v1/leases/{r}", proxy.url))
                .bearer_auth("w-token-0123456789")
                .json(&serde_json::json!({"holder": "w", "ttl_seconds": 30})),
        )
        .await;
        assert_eq!(s, 201, "{body}");
    }
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(summary(&all.event(WAIT).await).1);
    }
    assert_eq!(seen, ["dock-1", "aisle-1", "dock-2", "aisle-2"]);
    let mut filtered = Vec::new();
    for _ in 0..2 {
        filtered.push(summary(&reader.event(WAIT).await).1);
    }
    assert_eq!(filtered, ["aisle-1", "aisle-2"]);
    assert!(reader.next(Duration::from_millis(500)).await.is_none());

    // The reader's token is removed and `all` narrowed to docks: the open streams follow.
    let aside = dir.path().join("tokens.new");
    std::fs::write(
        &aside,
        format!(
            "writer {} acquire:*\nall {} read:dock-\n",
            hash("w-token-0123456789"),
            hash("a-token-0123456789"),
        ),
    )
    .unwrap();
    std::fs::rename(&aside, &tokens).unwrap();
    let reloaded = Instant::now() + Duration::from_secs(20);
    while client
        .get(format!("{}/v1/leases", proxy.url))
        .bearer_auth("r-token-0123456789")
        .send()
        .await
        .unwrap()
        .status()
        != 401
    {
        assert!(
            Instant::now() < reloaded,
            "the token file was never reloaded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Within the recheck period, the revoked token's stream ends.
    let ended = Instant::now() + Duration::from_secs(5);
    while !reader.ended {
        assert!(Instant::now() < ended, "a revoked token's stream goes on");
        let _ = reader.next(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for r in ["aisle-3", "dock-3"] {
        let (s, _) = send(
            http()
                .post(format!("{}/v1/leases/{r}", proxy.url))
                .bearer_auth("w-token-0123456789")
                .json(&serde_json::json!({"holder": "w", "ttl_seconds": 30})),
        )
        .await;
        assert_eq!(s, 201);
    }
    assert_eq!(summary(&all.event(WAIT).await).1, "dock-3");
    assert!(all.next(Duration::from_millis(500)).await.is_none());
}

/// Grants created in one group-commit batch share their create revision (each resource's token
/// is still its own): a release of one of them must not label the others' lapse a release.
#[tokio::test]
async fn grants_of_one_batch_are_told_apart_when_one_is_released_and_the_rest_lapse() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |c| {
        c.batch_linger = Duration::from_millis(50);
    })
    .await;
    let mut sse = Sse::open(&watch_url(&proxy, "b-"), None).await;
    sse.next(WAIT).await.unwrap();
    let sess = session(&proxy, "s", 2).await;
    let acquires = (0..8).map(|i| {
        let (proxy, sess) = (&proxy, &sess);
        async move { acquire_in(proxy, &format!("b-{i}"), "s", sess).await }
    });
    let grants: Vec<Value> = futures::future::join_all(acquires)
        .await
        .into_iter()
        .map(|(s, body)| {
            assert_eq!(s, 201, "{body}");
            body
        })
        .collect();
    let released = &grants[0];
    let sharing = grants
        .iter()
        .filter(|g| str_field(g, "token") == str_field(released, "token"))
        .count();
    assert!(
        sharing > 1,
        "no batch formed: every grant has its own revision"
    );
    assert_eq!(
        release(&proxy, "b-0", &str_field(released, "secret"))
            .await
            .0,
        204
    );
    let mut ends = std::collections::BTreeMap::new();
    while ends.len() < 8 {
        let m = sse.event(WAIT).await;
        let (kind, resource, _, _) = summary(&m);
        if kind != "acquired" {
            ends.insert(resource, kind);
        }
    }
    for (resource, kind) in ends {
        let expected = if resource == "b-0" {
            "released"
        } else {
            "expired"
        };
        assert_eq!(kind, expected, "{resource}");
    }
}

/// A client that stops reading (paused, or gone without a trace) holds its slot no longer than
/// `--watch-max-duration`; a reading client resumes where the stream ended and loses nothing.
#[tokio::test]
async fn streams_end_at_their_longest_life_and_resume_without_loss() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |c| {
        c.max_watch_streams = 1;
        c.watch_max_duration = Duration::from_secs(2);
    })
    .await;
    let url = watch_url(&proxy, "");
    // Holds the only slot and never reads.
    let silent = reqwest::get(&url).await.unwrap();
    assert_eq!(silent.status(), 200);
    assert_eq!(reqwest::get(&url).await.unwrap().status(), 503);
    let mut sse = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while sse.is_none() {
        assert!(Instant::now() < deadline, "the silent client kept its slot");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = reqwest::get(&url).await.unwrap();
        if r.status() == 200 {
            drop(r);
            sse = Some(Sse::open(&url, None).await);
        }
    }
    drop(silent);
    let mut sse = sse.unwrap();
    let mut last = sse.next(WAIT).await.unwrap().id.unwrap();
    let mut tokens = Vec::new();
    let mut seen = Vec::new();
    let mut resumed = 0;
    for i in 0..12 {
        let (s, body) = acquire(&proxy, &format!("life-{i}"), "h", 30).await;
        assert_eq!(s, 201);
        tokens.push(str_field(&body, "token"));
        tokio::time::sleep(Duration::from_millis(500)).await;
        loop {
            match sse.next(Duration::from_millis(100)).await {
                Some(m) => {
                    last = m.id.clone().unwrap();
                    if m.data.is_some() {
                        seen.push(summary(&m).3);
                    }
                }
                None if sse.ended => {
                    resumed += 1;
                    sse = Sse::open(&url, Some(&last)).await;
                }
                None => break,
            }
        }
    }
    assert!(resumed >= 2, "the stream never reached its longest life");
    assert_eq!(seen, tokens);
}

/// A client that stops reading while events keep coming fills the socket buffers; the stream's
/// own timers are then never polled (hyper waits on the write), and TCP never gives up on a
/// peer whose kernel still acknowledges. `--client-write-timeout` is what ends the connection:
/// the slot comes back long before `--watch-max-duration`.
#[tokio::test]
async fn a_reader_that_stops_while_events_flow_loses_its_slot_at_the_write_deadline() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let etcd = Etcd::single().await;
    let proxy = one_stream_proxy(&etcd).await;
    let url = watch_url(&proxy, "");
    // A raw connection with a small receive buffer: it reads the head of the answer, then
    // nothing, and stays open (its kernel keeps acknowledging).
    let address: std::net::SocketAddr = proxy.url.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(address).await.unwrap();
    stalled
        .write_all(format!("GET /v1/watch HTTP/1.1\r\nHost: {address}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stalled.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    assert_eq!(reqwest::get(&url).await.unwrap().status(), 503);

    flood(&etcd).await;
    // The write deadline (2 s) frees the slot; the stream's longest life (10 min) would not.
    slot_comes_back(
        &url,
        "a reader that stopped while events flowed kept its slot",
    )
    .await;
    drop(stalled);
}

/// The same over HTTP/2, where the connection stays busy and writable: a stream whose reader
/// stopped has no flow-control window left, so the proxy never even polls its body (no write
/// waits, the connection's write deadline never starts). The stream must still end once its
/// reader has taken nothing for `--client-write-timeout`.
#[tokio::test]
async fn an_http2_stream_whose_reader_stops_loses_its_slot_at_the_write_deadline() {
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let etcd = Etcd::single().await;
    let proxy = one_stream_proxy(&etcd).await;
    let url = watch_url(&proxy, "");
    let address = proxy.url.trim_start_matches("http://").to_owned();
    let tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .adaptive_window(false)
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(1 << 24)
        .handshake::<_, http_body_util::Empty<bytes::Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    // The connection lives on (and answers the server's pings); only the stream is not read.
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get(format!("http://{address}/v1/watch"))
        .body(http_body_util::Empty::new())
        .unwrap();
    let stalled = sender.send_request(request).await.unwrap();
    assert_eq!(stalled.status(), 200);
    assert_eq!(reqwest::get(&url).await.unwrap().status(), 503);

    flood(&etcd).await;
    slot_comes_back(&url, "an HTTP/2 stream whose reader stopped kept its slot").await;
    drop(stalled);
    driver.abort();
}

/// A proxy serving one event stream at a time, with a 2 s write deadline and streams that
/// would otherwise live 10 minutes.
async fn one_stream_proxy(etcd: &Etcd) -> Proxy {
    Proxy::start(etcd.endpoints(), |c| {
        c.max_watch_streams = 1;
        c.watch_max_duration = Duration::from_secs(600);
        c.client_write_timeout = Duration::from_secs(2);
    })
    .await
}

/// ~12 MiB of events (4 KiB holders) straight into etcd: far more than socket buffers and an
/// HTTP/2 window hold.
async fn flood(etcd: &Etcd) {
    let mut kv = etcd.client().await;
    let value = record("flood");
    let name = |i: usize| format!("/lease-proxy/holders/flood-{i:05}");
    for round in 0..15usize {
        let keys = round * 100..round * 100 + 100;
        let puts: Vec<_> = keys
            .clone()
            .map(|i| etcd_client::TxnOp::put(name(i), value.as_str(), None))
            .collect();
        kv.txn(etcd_client::Txn::new().and_then(puts))
            .await
            .unwrap();
        let deletes: Vec<_> = keys
            .map(|i| etcd_client::TxnOp::delete(name(i), None))
            .collect();
        kv.txn(etcd_client::Txn::new().and_then(deletes))
            .await
            .unwrap();
    }
}

/// Waits up to 20 s for the only stream slot of the proxy at `url` to be free again.
async fn slot_comes_back(url: &str, failure: &str) {
    eventually(Duration::from_secs(20), failure, || async {
        let r = reqwest::get(url).await.unwrap();
        match r.status().as_u16() {
            200 => Probe::Done(()),
            503 => Probe::Not("503".into()),
            other => panic!("{failure}: {other}"),
        }
    })
    .await;
}

/// A client that resets its connection right after sending a release: once the release has
/// begun it runs to its end (marker written, lease revoked), so the grant is either ended or
/// untouched — never alive with a release marker on it (it would lapse later labelled
/// `released`, after renewing on for as long as its holder liked).
#[tokio::test]
async fn a_release_whose_client_resets_mid_request_is_finished_or_never_started() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let address = proxy.url.trim_start_matches("http://").to_owned();
    let mut kv = etcd.client().await;
    let (mut ended, mut untouched) = (0, 0);
    for i in 0..40u64 {
        let resource = format!("reset-{i}");
        let (status, grant) = acquire(&proxy, &resource, "h", 10).await;
        assert_eq!(status, 201);
        let secret = str_field(&grant, "secret");
        let lease = str_field(&grant, "lease_id");
        delete_then_reset(&address, &format!("/v1/leases/{resource}"), &secret, i).await;
        let marker = kv
            .get(format!("{}ended/released/{lease}", proxy.prefix), None)
            .await
            .unwrap()
            .kvs()
            .len();
        match renew(&proxy, &resource, &secret).await.0 {
            410 => ended += 1,
            200 => {
                assert_eq!(
                    marker, 0,
                    "{resource}: a release marker on a grant that is still alive"
                );
                untouched += 1;
            }
            other => panic!("{resource}: renew answered {other}"),
        }
    }
    eprintln!("{ended} releases finished, {untouched} never started");
}

/// The same for closing a session: it ends with all its grants, or not at all — never a close
/// marker on a session that lives on.
#[tokio::test]
async fn a_session_close_whose_client_resets_mid_request_is_finished_or_never_started() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let address = proxy.url.trim_start_matches("http://").to_owned();
    let mut kv = etcd.client().await;
    for i in 0..40u64 {
        let (status, session) = open_session(&proxy, "h", 10).await;
        assert_eq!(status, 201);
        let id = str_field(&session, "session_id");
        let secret = str_field(&session, "secret");
        delete_then_reset(&address, &format!("/v1/sessions/{id}"), &secret, i).await;
        let marker = kv
            .get(format!("{}ended/closed/{id}", proxy.prefix), None)
            .await
            .unwrap()
            .kvs()
            .len();
        if session_keepalive(&proxy, &(id.clone(), secret.clone()))
            .await
            .0
            == 200
        {
            assert_eq!(marker, 0, "session {id}: a close marker on a live session");
        }
    }
}

/// Sends `DELETE path` with `secret` and resets the connection `i % 4` ms later, cutting the
/// request somewhere along its way; then waits for the proxy to have done what it will.
async fn delete_then_reset(address: &str, path: &str, secret: &str, i: u64) {
    use tokio::io::AsyncWriteExt as _;

    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket
        .write_all(
            format!("DELETE {path} HTTP/1.1\r\nhost: x\r\nlease-secret: {secret}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_micros(i % 4 * 1000)).await;
    // A zero linger resets at once (it is a non-zero one that would block the drop).
    #[allow(deprecated)]
    socket.set_linger(Some(Duration::ZERO)).unwrap();
    drop(socket);
    tokio::time::sleep(Duration::from_millis(300)).await;
}
