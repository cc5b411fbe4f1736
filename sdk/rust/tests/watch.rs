//! The watch stream against a real proxy: acquisitions, releases and expiries under a prefix,
//! in order, and a resumed watch that gets exactly what came after its last event id.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{start_proxy, Etcd};
use futures::StreamExt;
use lease_proxy_client::{AcquireOptions, Client, Event, EventKind, EventStream};

/// The next event, within 10 s.
async fn next(stream: &mut EventStream) -> Event {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("no event within 10 s")
        .expect("the stream ended")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_watch_reports_changes_in_order_and_resumes_after_an_id() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let client = Client::new(&proxy.url).unwrap();
    let mut stream = client.watch("aisle-", None);
    // Polled until its first message (the id it starts after) arrived: it is watching.
    while stream.last_event_id().is_none() {
        let _ = tokio::time::timeout(Duration::from_millis(100), stream.next()).await;
    }

    let held = client
        .acquire(
            "aisle-1",
            AcquireOptions::new("robot-a", Duration::from_secs(30)),
        )
        .await
        .unwrap();
    let brief = client
        .grant(
            "aisle-2",
            &AcquireOptions::new("robot-b", Duration::from_secs(2)),
        )
        .await
        .unwrap();
    client
        .grant(
            "dock-1",
            &AcquireOptions::new("robot-c", Duration::from_secs(30)),
        )
        .await
        .unwrap();
    let held_token = held.token();
    held.release().await.unwrap();

    let mut events = Vec::new();
    for _ in 0..4 {
        events.push(next(&mut stream).await);
    }
    let seen: Vec<(EventKind, &str, u64)> = events
        .iter()
        .map(|e| (e.kind, e.resource.as_str(), e.token))
        .collect();
    assert_eq!(
        seen,
        [
            (EventKind::Acquired, "aisle-1", held_token),
            (EventKind::Acquired, "aisle-2", brief.token),
            (EventKind::Released, "aisle-1", held_token),
            (EventKind::Expired, "aisle-2", brief.token),
        ]
    );
    assert_eq!(events[1].holder, "robot-b");
    assert_eq!(events[1].lease_id, brief.lease_id);
    assert!(events.windows(2).all(|w| w[0].revision < w[1].revision));
    assert_eq!(stream.last_event_id(), Some(events[3].id.as_str()));

    // Resumed after the first event: the three that followed, nothing else.
    drop(stream);
    let mut resumed = client.watch("aisle-", Some(events[0].id.clone()));
    for expected in &events[1..] {
        assert_eq!(&next(&mut resumed).await, expected);
    }
}

/// The connection breaks while changes happen: the stream reconnects on its own, resumes after
/// its last event id and misses nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_broken_watch_reconnects_and_misses_nothing() {
    let etcd = Etcd::shared().await;
    let proxy = start_proxy(&etcd).await;
    let relay = common::Relay::start(common::authority(&proxy.url), Duration::ZERO, false).await;
    let client = Client::new(&proxy.url).unwrap();
    let mut stream = Client::new(&relay.url).unwrap().watch("", None);
    while stream.last_event_id().is_none() {
        let _ = tokio::time::timeout(Duration::from_millis(100), stream.next()).await;
    }
    let ttl = Duration::from_secs(30);
    let a = client
        .grant("bay-1", &AcquireOptions::new("robot-a", ttl))
        .await
        .unwrap();
    assert_eq!(next(&mut stream).await.token, a.token);
    relay.cut();
    client.release("bay-1", &a.secret).await.unwrap();
    let b = client
        .grant("bay-2", &AcquireOptions::new("robot-b", ttl))
        .await
        .unwrap();
    let released = next(&mut stream).await;
    assert_eq!(
        (released.kind, released.token),
        (EventKind::Released, a.token)
    );
    let acquired = next(&mut stream).await;
    assert_eq!(
        (acquired.kind, acquired.token),
        (EventKind::Acquired, b.token)
    );
}

/// A resume point compacted away in etcd: the stream says so ([`Error::Compacted`]) and ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_compacted_resume_point_is_reported_and_ends_the_stream() {
    let etcd = Etcd::single().await;
    let proxy = start_proxy(&etcd).await;
    let client = Client::new(&proxy.url).unwrap();
    let mut stream = client.watch("", None);
    while stream.last_event_id().is_none() {
        let _ = tokio::time::timeout(Duration::from_millis(100), stream.next()).await;
    }
    let old = stream.last_event_id().unwrap().to_owned();
    drop(stream);
    let ttl = Duration::from_secs(30);
    for r in ["bay-1", "bay-2", "bay-3"] {
        client
            .grant(r, &AcquireOptions::new("robot-a", ttl))
            .await
            .unwrap();
    }
    let mut etcd_client = etcd.client().await;
    let revision = etcd_client
        .get("x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    etcd_client.compact(revision, None).await.unwrap();
    let mut stream = client.watch("", Some(old));
    let answer = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap();
    assert!(
        matches!(answer, Some(Err(lease_proxy_client::Error::Compacted))),
        "{answer:?}"
    );
    assert!(stream.next().await.is_none());
}

/// A watch whose prefix is quiet while others change: its resume point moves on with id-only
/// messages (never yielded as events), so after etcd compacted past its first id, resuming
/// from the newest one succeeds and delivers what came next.
#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_watch_keeps_a_resume_point_that_survives_compaction() {
    let etcd = Etcd::single().await;
    let proxy = start_proxy(&etcd).await;
    let client = Client::new(&proxy.url).unwrap();
    let mut stream = client.watch("aisle-", None);
    while stream.last_event_id().is_none() {
        let _ = tokio::time::timeout(Duration::from_millis(100), stream.next()).await;
    }
    let first = stream.last_event_id().unwrap().to_owned();
    let ttl = Duration::from_secs(30);
    let mut last = 0;
    for r in ["dock-1", "dock-2", "dock-3"] {
        last = client
            .grant(r, &AcquireOptions::new("robot-a", ttl))
            .await
            .unwrap()
            .token;
    }
    // Polled with no event to yield until its resume point reaches the last change.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let progress = loop {
        let polled = tokio::time::timeout(Duration::from_millis(200), stream.next()).await;
        assert!(polled.is_err(), "a quiet watch yielded {polled:?}");
        let id = stream.last_event_id().unwrap().to_owned();
        if id.parse::<u64>().is_ok_and(|r| r >= last) {
            break id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the resume point stayed at {id} (first {first}), the last change is {last}"
        );
    };
    drop(stream);
    let mut etcd_client = etcd.client().await;
    etcd_client
        .compact(progress.parse::<i64>().unwrap(), None)
        .await
        .unwrap();
    let mut resumed = client.watch("aisle-", Some(progress));
    let held = client
        .grant("aisle-1", &AcquireOptions::new("robot-b", ttl))
        .await
        .unwrap();
    let event = next(&mut resumed).await;
    assert_eq!(
        (event.kind, event.resource.as_str(), event.token),
        (EventKind::Acquired, "aisle-1", held.token)
    );
}
