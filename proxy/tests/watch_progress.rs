//! `GET /v1/watch` on quiet streams against real etcd: a stream with nothing to show still
//! moves its id on (id-only messages, from etcd's progress notifications and from the events
//! the client may not see), so a resume after etcd compacted past its last *event* succeeds
//! when nothing was missed — and still answers 410 when an event really was compacted away.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::sse::Sse;
use common::*;
use tokio::time::Instant;

/// How long a test waits for a message it expects.
const WAIT: Duration = Duration::from_secs(10);

/// etcd's timed watch progress notifications, fast enough for a test (etcd's default is 10 min).
const FAST_PROGRESS: &str = "--experimental-watch-progress-notify-interval=300ms";

fn watch_url(proxy: &Proxy, prefix: &str) -> String {
    format!("{}/v1/watch?prefix={prefix}", proxy.url)
}

/// etcd's current revision.
async fn revision(kv: &mut etcd_client::Client) -> i64 {
    kv.get("x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
}

/// Reads the stream until an id-only message names a position at or after revision `at`
/// (every message before it must be id-only too: the stream has no event to show); its id.
async fn progress_through(sse: &mut Sse, at: i64, last: &str) -> String {
    let deadline = Instant::now() + WAIT;
    let mut last = last.to_owned();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(m) = sse.next(left).await else {
            panic!("no id at or after revision {at} within {WAIT:?}: the last id was {last}");
        };
        assert!(
            m.event.is_none() && m.data.is_none(),
            "a quiet stream showed {m:?}"
        );
        let id = m.id.expect("every message has an id");
        // A bare revision: everything up to it has been read.
        let r: i64 = id.parse().unwrap_or_else(|_| panic!("progress id {id}"));
        assert!(r >= last.split('.').next().unwrap().parse().unwrap());
        if r >= at {
            return id;
        }
        last = id;
    }
}

/// Answers `Last-Event-ID: id` with (only its status).
async fn resume_status(url: &str, id: &str) -> u16 {
    http()
        .get(url)
        .header("last-event-id", id)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Nothing under the stream's keys for a while (etcd's revision moves on elsewhere): etcd's
/// progress notifications move the stream's id on, so after a compaction past the stream's
/// first id the resume succeeds, and the next event arrives on the resumed stream.
#[tokio::test]
async fn a_quiet_stream_resumes_after_compaction_when_nothing_was_missed() {
    let etcd = Etcd::single_with(&[FAST_PROGRESS]).await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let url = watch_url(&proxy, "");
    let mut sse = Sse::open(&url, None).await;
    let start = sse.next(WAIT).await.unwrap().id.unwrap();
    let mut kv = etcd.client().await;
    for i in 0..5 {
        kv.put(format!("/elsewhere/{i}"), "x", None).await.unwrap();
    }
    let moved = revision(&mut kv).await;
    let progress = progress_through(&mut sse, moved, &start).await;
    drop(sse);
    let at: i64 = progress.parse().unwrap();
    kv.compact(at, None).await.unwrap();
    assert_eq!(
        resume_status(&url, &start).await,
        410,
        "compacted past {start}"
    );
    let mut resumed = Sse::open(&url, Some(&progress)).await;
    assert_eq!(
        resumed.next(WAIT).await.unwrap().id.as_deref(),
        Some(progress.as_str())
    );
    let (status, grant) = acquire(&proxy, "after-compaction", "h", 30).await;
    assert_eq!(status, 201, "{grant}");
    let event = resumed.event(WAIT).await;
    assert_eq!(event.event.as_deref(), Some("acquired"));
    assert_eq!(event.data.unwrap()["token"], grant["token"]);
}

/// Events the client does not see (another prefix) move its id on too — without etcd's
/// progress notifications (here at etcd's default of 10 min).
#[tokio::test]
async fn events_a_stream_does_not_show_move_its_id_on() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let url = watch_url(&proxy, "a-");
    let mut sse = Sse::open(&url, None).await;
    let start = sse.next(WAIT).await.unwrap().id.unwrap();
    let mut last_token = 0;
    for i in 0..5 {
        let (status, grant) = acquire(&proxy, &format!("b-{i}"), "h", 30).await;
        assert_eq!(status, 201, "{grant}");
        last_token = token(&grant);
    }
    let progress = progress_through(&mut sse, i64::try_from(last_token).unwrap(), &start).await;
    drop(sse);
    let mut kv = etcd.client().await;
    kv.compact(progress.parse::<i64>().unwrap(), None)
        .await
        .unwrap();
    assert_eq!(resume_status(&url, &start).await, 410);
    let mut resumed = Sse::open(&url, Some(&progress)).await;
    let (status, grant) = acquire(&proxy, "a-1", "h", 30).await;
    assert_eq!(status, 201, "{grant}");
    let event = resumed.event(WAIT).await;
    assert_eq!(event.data.unwrap()["resource"], "a-1");
}

/// The control: a progress id never claims an event the client did not get. Before an event
/// every id is below its revision (on a stream getting both kinds of progress), and an event
/// after the last id a client saw, compacted away, makes its resume 410.
#[tokio::test]
async fn progress_ids_never_pass_an_event_and_a_compacted_event_is_still_410() {
    let etcd = Etcd::single_with(&[FAST_PROGRESS]).await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let mut kv = etcd.client().await;
    let url = watch_url(&proxy, "a-");
    let mut sse = Sse::open(&url, None).await;
    let start = sse.next(WAIT).await.unwrap().id.unwrap();
    let (status, grant) = acquire(&proxy, "b-1", "h", 30).await;
    assert_eq!(status, 201, "{grant}");
    let mut before =
        progress_through(&mut sse, i64::try_from(token(&grant)).unwrap(), &start).await;
    // The event, between changes the stream does not show.
    let (status, grant) = acquire(&proxy, "a-seen", "h", 30).await;
    assert_eq!(status, 201, "{grant}");
    let at = i64::try_from(token(&grant)).unwrap();
    assert_eq!(acquire(&proxy, "b-2", "h", 30).await.0, 201);
    kv.put("/elsewhere/k", "x", None).await.unwrap();
    let event = loop {
        let m = sse.next(WAIT).await.expect("the event");
        let id = m.id.clone().unwrap();
        if m.data.is_some() {
            break m;
        }
        assert!(
            id.parse::<i64>().unwrap() < at,
            "progress {id} passed the event at {at}"
        );
        before = id;
    };
    assert_eq!(event.data.unwrap()["resource"], "a-seen");
    drop(sse);
    // A client that stopped at `before` missed it; once it is compacted away: 410.
    kv.put("/elsewhere/k", "y", None).await.unwrap();
    let now = revision(&mut kv).await;
    kv.compact(now, None).await.unwrap();
    assert_eq!(resume_status(&url, &before).await, 410, "{before}");
}

/// A resume from `R` watches from `R + 1`; compacted at `R + 1`, etcd has dropped that revision's
/// deletions and cannot say whether any ended a grant (here an unrelated write made it): the
/// resume is refused, failing closed (a grant ended at the compaction revision was
/// otherwise lost without a word). Compacted at `R` it resumes.
#[tokio::test]
async fn a_resume_from_just_before_the_compaction_is_refused() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let url = watch_url(&proxy, "b-");
    let mut sse = Sse::open(&url, None).await;
    let start = sse.next(WAIT).await.unwrap().id.unwrap();
    drop(sse);
    let at: i64 = start.parse().unwrap();
    let mut kv = etcd.client().await;
    kv.compact(at, None).await.unwrap();
    assert_eq!(
        resume_status(&url, &start).await,
        200,
        "a resume from {start}, compacted at {at}"
    );
    kv.put("/elsewhere/one", "x", None).await.unwrap();
    assert_eq!(revision(&mut kv).await, at + 1);
    kv.compact(at + 1, None).await.unwrap();
    assert_eq!(
        resume_status(&url, &start).await,
        410,
        "a resume from {start}, compacted at {}",
        at + 1
    );
}
