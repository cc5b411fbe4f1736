//! The lease guard against a real proxy on a real etcd: renewals, the lost signal (paused
//! renewals and a takeover, a process stopped past its deadline, a lease revoked in etcd),
//! release on drop, waiting and the one-shot calls.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{revoke_in_etcd, start_proxy, start_proxy_with, Etcd};
use lease_proxy_client::{AcquireOptions, Client, Error, LostReason};
use tokio::time::Instant;

/// How late a tokio timer and the task waiting on it may run on a busy machine.
const TIMER_SLACK: Duration = Duration::from_millis(250);

fn opts(holder: &str, ttl_secs: u64) -> AcquireOptions {
    AcquireOptions::new(holder, Duration::from_secs(ttl_secs))
}

/// When `lease`'s lost token fires, measured by a task waiting on it.
fn lost_at(lease: &lease_proxy_client::Lease) -> tokio::task::JoinHandle<Instant> {
    let lost = lease.lost();
    tokio::spawn(async move {
        lost.cancelled().await;
        Instant::now()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn paused_renewals_lose_the_lease_at_its_deadline_before_anyone_takes_over() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let client = Client::new(&proxy.url).unwrap();
    let lease = client.acquire("aisle-1", opts("robot-a", 3)).await.unwrap();
    let first_deadline = lease.deadline();
    // Renewals run (a third of the TTL): the deadline moves on, the lease is held past its
    // first TTL.
    tokio::time::sleep_until(first_deadline + Duration::from_millis(500)).await;
    assert!(!lease.is_lost());
    assert!(lease.deadline() > first_deadline);

    lease.pause_renewals(true);
    let lost = lost_at(&lease);
    let taker = Client::new(&proxy.url).unwrap();
    let taken = taker
        .grant("aisle-1", &opts("robot-b", 3).wait(Duration::from_secs(10)))
        .await
        .unwrap();
    let taken_at = Instant::now();
    assert!(
        lease.is_lost(),
        "someone else holds it and the guard does not know"
    );
    let lost_at = tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("never lost")
        .unwrap();
    // The last deadline (a renewal in flight when paused may have moved it; none after the
    // loss can).
    let deadline = lease.deadline();
    assert!(
        deadline <= taken_at,
        "taken over {:?} before the deadline",
        deadline - taken_at
    );
    assert!(
        lost_at <= deadline + TIMER_SLACK,
        "lost {:?} after the deadline",
        lost_at - deadline
    );
    assert_eq!(lease.lost_reason().await, LostReason::Expired);
    assert!(lease.token() < taken.token);

    // Renewals resumed: the lease stays lost.
    lease.pause_renewals(false);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(lease.is_lost());
    assert_eq!(lease.lost_reason().await, LostReason::Expired);
    assert_eq!(
        client.get("aisle-1").await.unwrap().unwrap().token,
        taken.token
    );
}

/// etcd and a proxy on a thread and runtime of their own; stopped (etcd killed) when dropped,
/// also when the test panics.
struct Elsewhere {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Elsewhere {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A process stopped past its deadline (here: its whole runtime frozen, as by SIGSTOP) sees
/// the loss on its first look after resuming, before any task has had a chance to run.
#[test]
fn a_guard_frozen_past_its_deadline_is_lost_on_its_first_look() {
    let (url_tx, url_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let etcd = Etcd::shared().await;
            let proxy = start_proxy(&etcd).await;
            url_tx.send(proxy.url.clone()).unwrap();
            let _ = stop_rx.await;
        });
    });
    let _server = Elsewhere {
        stop: Some(stop_tx),
        thread: Some(thread),
    };
    let url = url_rx.recv().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = Client::new(&url).unwrap();
        let lease = client.acquire("dock-1", opts("robot-a", 2)).await.unwrap();
        let deadline = lease.deadline();
        assert!(!lease.is_lost());
        // Freeze: nothing on this runtime runs (no renewal, no timer) past the deadline.
        std::thread::sleep(deadline - Instant::now() + Duration::from_millis(300));
        assert!(lease.is_lost(), "resumed past the deadline but not lost");
        assert!(lease.lost().is_cancelled());
        assert_eq!(lease.lost_reason().await, LostReason::Expired);
        let taken = Client::new(&url)
            .unwrap()
            .grant("dock-1", &opts("robot-b", 2).wait(Duration::from_secs(10)))
            .await
            .unwrap();
        assert!(lease.token() < taken.token);
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lease_revoked_in_etcd_is_lost_at_the_next_renewal() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    // The renewal's 410, not the loss watch (tests/losses.rs), tells here.
    let client = Client::builder(&proxy.url)
        .loss_watch(false)
        .build()
        .unwrap();
    let lease = client.acquire("aisle-2", opts("robot-a", 6)).await.unwrap();
    let lost = lost_at(&lease);
    revoke_in_etcd(&etcd, lease.lease_id()).await;
    let deadline = lease.deadline();
    let lost_at = tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("never lost")
        .unwrap();
    // The next renewal (at about 2 s) answers 410: lost then, long before the deadline.
    assert!(
        lost_at + Duration::from_secs(2) < deadline,
        "lost only {:?} before the deadline",
        deadline - lost_at
    );
    assert_eq!(lease.lost_reason().await, LostReason::Revoked);
    assert!(matches!(
        client.renew("aisle-2", lease.secret()).await,
        Err(Error::Lost)
    ));
    assert!(matches!(
        lease.forward(reqwest::Method::GET, "/x", None).await,
        Err(Error::Lost)
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn release_frees_the_resource_and_so_does_drop() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let client = Client::new(&proxy.url).unwrap();

    let lease = client
        .acquire("aisle-3", opts("robot-a", 30))
        .await
        .unwrap();
    let lost = lease.lost();
    let held = client.get("aisle-3").await.unwrap().unwrap();
    assert_eq!(
        (held.holder.as_str(), held.token),
        ("robot-a", lease.token())
    );
    lease.release().await.unwrap();
    assert!(lost.is_cancelled());
    assert_eq!(client.get("aisle-3").await.unwrap(), None);

    let lease = client
        .acquire("aisle-3", opts("robot-a", 30))
        .await
        .unwrap();
    let lost = lease.lost();
    drop(lease);
    assert!(lost.is_cancelled());
    let start = Instant::now();
    while client.get("aisle-3").await.unwrap().is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "a dropped lease was not released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_waits_for_the_holder_when_asked_to() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let client = Client::new(&proxy.url).unwrap();
    let first = client
        .acquire("aisle-4", opts("robot-a", 30))
        .await
        .unwrap();
    match client.acquire("aisle-4", opts("robot-b", 30)).await {
        Err(Error::Held { holder, token, .. }) => {
            assert_eq!((holder.as_str(), token), ("robot-a", first.token()))
        }
        other => panic!("{other:?}"),
    }
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .acquire("aisle-4", opts("robot-b", 30).wait(Duration::from_secs(10)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished());
    let first_token = first.token();
    first.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert!(second.token() > first_token);
    assert_eq!(second.holder(), "robot-b");
    assert!(!second.is_lost());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_one_shot_calls_speak_the_api() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let client = Client::new(&proxy.url).unwrap();
    let meta = serde_json::json!({"zone": "north"});
    // A TTL long enough that a loaded machine's slow etcd commit still leaves most of it.
    let sent = Instant::now();
    let g = client
        .grant("bay-1", &opts("robot-a", 30).metadata(meta.clone()))
        .await
        .unwrap();
    let took = u64::try_from(sent.elapsed().as_millis()).unwrap();
    assert_eq!((g.resource.as_str(), g.ttl_seconds), ("bay-1", 30));
    // Counted from when the request reached the proxy to the lease's end, and the lease counts
    // from its grant, which comes after: the TTL plus at most what the call took, and most of
    // the TTL.
    assert!(
        g.expires_in_ms <= 30_000 + took && g.expires_in_ms > 20_000,
        "{} ms, the call took {took} ms",
        g.expires_in_ms
    );
    client.grant("bay-2", &opts("robot-b", 5)).await.unwrap();
    client.grant("other", &opts("robot-c", 5)).await.unwrap();
    let r = client.renew("bay-1", &g.secret).await.unwrap();
    assert_eq!((r.token, r.ttl_seconds), (g.token, 30));
    let h = client.get("bay-1").await.unwrap().unwrap();
    assert_eq!(
        (h.holder.as_str(), h.token, h.lease_id.as_str()),
        ("robot-a", g.token, g.lease_id.as_str())
    );
    assert_eq!(h.metadata, Some(meta));
    let listed: Vec<String> = client
        .list("bay-")
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.resource)
        .collect();
    assert_eq!(listed, ["bay-1", "bay-2"]);
    client.release("bay-1", &g.secret).await.unwrap();
    client.release("bay-1", &g.secret).await.unwrap(); // idempotent
    assert_eq!(client.get("bay-1").await.unwrap(), None);
    assert!(matches!(
        client.renew("bay-1", &g.secret).await,
        Err(Error::Lost)
    ));
    match client.grant("bad name", &opts("robot-a", 5)).await {
        Err(e @ Error::Problem { status: 400, .. }) => {
            assert_eq!(e.slug(), Some("invalid-resource"))
        }
        other => panic!("{other:?}"),
    }
}

/// Answers that take long to come back: the deadline counts from before each request was sent,
/// so the loss is still reported before the proxy's lease can end and someone take over.
#[tokio::test(flavor = "multi_thread")]
async fn over_a_slow_network_the_loss_is_reported_before_a_takeover() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let slow = common::relay(
        common::authority(&proxy.url),
        Duration::from_millis(1000),
        false,
    )
    .await;
    let client = Client::new(&slow).unwrap();
    let before = Instant::now();
    let lease = client.acquire("aisle-5", opts("robot-a", 6)).await.unwrap();
    let took = before.elapsed();
    assert!(
        lease.deadline() <= before + Duration::from_millis(lease.grant().expires_in_ms + 10),
        "deadline {:?} after the acquire was sent, {:?} after it returned ({:?}), for {} ms",
        lease.deadline() - before,
        lease.deadline() - before - took,
        took,
        lease.grant().expires_in_ms
    );
    // Some renewals over the slow path, then none.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(!lease.is_lost());
    lease.pause_renewals(true);
    let lost = lost_at(&lease);
    let taker = Client::new(&proxy.url).unwrap();
    let taken = taker
        .grant("aisle-5", &opts("robot-b", 6).wait(Duration::from_secs(20)))
        .await
        .unwrap();
    let taken_at = Instant::now();
    assert!(
        lease.is_lost(),
        "someone else holds it and the guard does not know"
    );
    let lost_at = tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("never lost")
        .unwrap();
    let deadline = lease.deadline();
    assert!(
        deadline <= taken_at,
        "taken over {:?} before the deadline",
        deadline - taken_at
    );
    assert!(lost_at <= deadline + TIMER_SLACK);
    assert!(lease.token() < taken.token);
}

/// The first answer is lost on the way back (the grant was made): the acquire is retried with
/// the same `Idempotency-Key` and gets the same grant, not a 409 from its own grant.
#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_with_an_idempotency_key_is_retried_after_a_transport_error() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let flaky = common::relay(common::authority(&proxy.url), Duration::ZERO, true).await;
    let client = Client::new(&flaky).unwrap();
    let lease = client
        .acquire(
            "aisle-6",
            opts("robot-a", 30).idempotency_key("k-6b1d0e4f9a2c7d35"),
        )
        .await
        .unwrap();
    let held = client.get("aisle-6").await.unwrap().unwrap();
    assert_eq!(
        (held.token, held.lease_id.as_str()),
        (lease.token(), lease.lease_id())
    );
    assert!(!lease.is_lost());
    lease.release().await.unwrap();

    // Without a key nothing is retried: the transport error is the answer.
    let flaky = common::relay(common::authority(&proxy.url), Duration::ZERO, true).await;
    let client = Client::new(&flaky).unwrap();
    assert!(matches!(
        client.acquire("aisle-7", opts("robot-a", 30)).await,
        Err(Error::Http(_))
    ));
}

/// An upstream that answers every request with what it received: `Fencing-Token`, method,
/// path and body, separated by `|`.
async fn echo_upstream() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    let n = conn.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "request cut short");
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                let header = |name: &str| {
                    head.lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                        })
                        .unwrap_or_default()
                };
                let length: usize = header("content-length").parse().unwrap_or(0);
                while buf.len() < head_end + length {
                    let n = conn.read(&mut chunk).await.unwrap();
                    buf.extend_from_slice(&chunk[..n]);
                }
                let request_line = head.lines().next().unwrap_or_default().to_owned();
                let mut parts = request_line.split(' ');
                let (method, path) = (parts.next().unwrap(), parts.next().unwrap());
                let body = format!(
                    "{}|{method}|{path}|{}",
                    header("fencing-token"),
                    String::from_utf8_lossy(&buf[head_end..head_end + length])
                );
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                conn.write_all(answer.as_bytes()).await.unwrap();
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread")]
async fn forward_reaches_the_upstream_with_the_fencing_token_until_released() {
    let etcd = Etcd::shared().await;
    let upstream = echo_upstream().await;
    let proxy = start_proxy_with(&etcd, &reqwest::Client::new(), |c| {
        c.upstream = Some(upstream.clone())
    })
    .await;
    let client = Client::new(&proxy.url).unwrap();
    let lease = client
        .acquire("aisle-8", opts("robot-a", 30))
        .await
        .unwrap();
    let answer = lease
        .forward(
            reqwest::Method::PUT,
            "/counts/aisle-8?v=1",
            Some(bytes::Bytes::from_static(b"42")),
        )
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.text().await.unwrap(),
        format!("{}|PUT|/counts/aisle-8?v=1|42", lease.fencing_token())
    );
    let secret = lease.secret().to_owned();
    lease.release().await.unwrap();
    // Released: the proxy refuses the secret (the guard itself is gone).
    let refused = client
        .renew("aisle-8", &secret)
        .await
        .expect_err("renewed after release");
    assert!(matches!(refused, Error::Lost), "{refused:?}");
}

/// More held resources than one page of the listing (1000): `list` follows the cursor.
#[tokio::test(flavor = "multi_thread")]
async fn list_follows_the_cursor_past_one_page() {
    use futures::StreamExt;
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let client = Client::new(&proxy.url).unwrap();
    let names: Vec<String> = (0..1003).map(|i| format!("bin-{i:04}")).collect();
    let granted: Vec<_> = futures::stream::iter(names.iter().map(|name| {
        let client = client.clone();
        async move { client.grant(name, &opts("robot-a", 60)).await }
    }))
    .buffer_unordered(32)
    .collect()
    .await;
    assert!(granted.iter().all(Result::is_ok));
    client.grant("other", &opts("robot-a", 60)).await.unwrap();
    let listed: Vec<String> = client
        .list("bin-")
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.resource)
        .collect();
    assert_eq!(listed.len(), names.len());
    assert!(listed == names, "not the held resources in name order");
}

/// Names with `/`, `..` or `?` reach the proxy as given (one path segment) and are refused
/// there, instead of being read as another resource (`victim`, `job`).
#[tokio::test(flavor = "multi_thread")]
async fn resource_names_are_one_path_segment_and_odd_ones_are_refused() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let client = Client::new(&proxy.url).unwrap();
    for (name, other) in [
        ("x/../victim", "victim"),
        ("job?x", "job"),
        ("job#x", "job"),
        ("a/b", "a"),
    ] {
        let refused = client.acquire(name, opts("robot-a", 30)).await;
        assert!(
            matches!(
                &refused,
                Err(e @ Error::Problem { status: 400, .. }) if e.slug() == Some("invalid-resource")
            ),
            "{name}: {refused:?}"
        );
        assert!(
            client.get(other).await.unwrap().is_none(),
            "{name} took {other}"
        );
        let granted = client.grant(other, &opts("robot-b", 30)).await.unwrap();
        client.release(other, &granted.secret).await.unwrap();
    }
    // Names a URL cannot carry as a segment: refused too, never sent as the path around them
    // (`./renew` would be `/v1/leases/renew`, an acquire of `renew`).
    for name in ["", ".", ".."] {
        let refused = client.acquire(name, opts("robot-a", 30)).await;
        let renewed = client.renew(name, "secret").await;
        for result in [refused.map(drop), renewed.map(drop)] {
            assert!(
                matches!(
                    &result,
                    Err(e @ Error::Problem { status: 400, .. }) if e.slug() == Some("invalid-resource")
                ),
                "{name:?}: {result:?}"
            );
        }
    }
    assert!(client.get("renew").await.unwrap().is_none());
    // The forward route: the resource is one segment, the storage path stays a path.
    let req = client
        .forward_request("x/../y", "s", reqwest::Method::GET, "/shelf/a b")
        .build()
        .unwrap();
    assert_eq!(
        req.url().path(),
        "/v1/leases/x%2F..%2Fy/forward/shelf/a%20b"
    );
}
