//! The client against a hostile fake proxy (raw sockets, canned answers): watch reconnection
//! after a 500, absurd lifetimes, malformed and oversized answers, oversized event-stream lines,
//! and a server that accepts a watch and closes it at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::fake::{events, grant, json, renewal, Fake, Reply};
use futures::StreamExt;
use lease_proxy_client::{
    AcquireOptions, Client, Error, Event, EventKind, EventStream, LostReason,
};
use tokio::time::Instant;

fn opts() -> AcquireOptions {
    AcquireOptions::new("h", Duration::from_secs(3))
}

fn event(id: &str, resource: &str) -> String {
    format!(
        "id: {id}\nevent: acquired\ndata: {{\"type\":\"acquired\",\"resource\":\"{resource}\",\"holder\":\"h\",\"token\":\"9\",\"revision\":9,\"lease_id\":\"5\"}}\n\n"
    )
}

/// The next item of `stream`, within 10 s.
async fn next(stream: &mut EventStream) -> Result<Event, Error> {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("nothing within 10 s")
        .expect("the stream ended")
}

const HTTP_200_JSON: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";

/// A principal past its share of a replica's event streams gets 429 (`quota-exceeded`,
/// `Retry-After`): its watch waits and tries again, as after a 5xx, instead of ending.
#[tokio::test]
async fn the_watch_reconnects_after_a_429() {
    let fake = Fake::start(|_, n| match n {
        0 => json(
            429,
            r#"{"type":"https://lease-proxy.dev/problems/quota-exceeded","title":"Too Many Requests","status":429,"detail":"watch streams"}"#,
        ),
        1 => events(&event("11", "a")),
        _ => events(": idle\n\n"),
    })
    .await;
    let client = Client::new(&fake.url).unwrap();
    let mut stream = client.watch("", None);
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("nothing within 5 s")
        .expect("the stream ended");
    let event = first.expect("the 429 ended the watch instead of a reconnection");
    assert_eq!(
        (event.kind, event.resource.as_str()),
        (EventKind::Acquired, "a")
    );
}

#[tokio::test]
async fn the_watch_reconnects_after_a_500() {
    let fake = Fake::start(|_, n| match n {
        0 => json(
            500,
            r#"{"type":"https://lease-proxy.dev/problems/internal","title":"Internal","status":500,"detail":"boom"}"#,
        ),
        1 => events(&event("11", "a")),
        _ => events(": idle\n\n"),
    })
    .await;
    let client = Client::new(&fake.url).unwrap();
    let mut stream = client.watch("", None);
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("nothing within 5 s")
        .expect("the stream ended");
    let event = first.expect("the 500 ended the watch instead of a reconnection");
    assert_eq!(
        (event.kind, event.resource.as_str()),
        (EventKind::Acquired, "a")
    );
}

#[tokio::test]
async fn an_expires_in_ms_beyond_the_ttl_is_capped_by_the_ttl() {
    for expires in ["1000000000000000", "18446744073709551615"] {
        let fake = Fake::start(move |r, _| match r.path.ends_with("/renew") {
            true => renewal(3, 3000),
            false => grant("a", 3, expires),
        })
        .await;
        let client = Client::new(&fake.url).unwrap();
        let before = Instant::now();
        let lease = client.acquire("a", opts()).await.unwrap();
        assert!(
            lease.deadline() <= before + Duration::from_secs(3) + Duration::from_millis(200),
            "expires_in_ms {expires}: the deadline is {:?} away",
            lease.deadline() - before
        );
        assert!(!lease.is_lost());
    }
}

#[tokio::test]
async fn a_queued_acquire_may_last_its_ttl_plus_the_wait() {
    let fake = Fake::start(|r, _| match r.path.ends_with("/renew") {
        true => renewal(3, 3000),
        false => grant("a", 3, "7000"),
    })
    .await;
    let client = Client::new(&fake.url).unwrap();
    let before = Instant::now();
    let lease = client
        .acquire("a", opts().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(lease.deadline() > before + Duration::from_secs(6));
    assert!(lease.deadline() <= Instant::now() + Duration::from_secs(7));
}

#[tokio::test]
async fn a_grant_of_ttl_zero_is_lost_at_once_and_never_renewed() {
    let fake = Fake::start(|r, _| match r.path.ends_with("/renew") {
        true => renewal(0, 5000),
        false => grant("a", 0, "5000"),
    })
    .await;
    let client = Client::new(&fake.url).unwrap();
    let lease = client.acquire("a", opts()).await.unwrap();
    assert!(lease.is_lost(), "a grant of no time is held");
    assert_eq!(lease.lost_reason().await, LostReason::Expired);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.count("POST", "/v1/leases/a/renew"), 0);
}

#[tokio::test]
async fn a_renewal_answering_ttl_zero_loses_the_lease_at_once() {
    let fake = Fake::start(|r, _| match r.path.ends_with("/renew") {
        true => renewal(0, 3000),
        false => grant("a", 3, "3000"),
    })
    .await;
    let client = Client::new(&fake.url).unwrap();
    let lease = client.acquire("a", opts()).await.unwrap();
    let deadline = lease.deadline();
    // The first renewal comes at about 1 s.
    tokio::time::timeout(Duration::from_secs(2), lease.lost().cancelled())
        .await
        .expect("a renewal granting no time kept the lease");
    assert!(Instant::now() < deadline);
    assert_eq!(lease.lost_reason().await, LostReason::Expired);
    assert_eq!(fake.count("POST", "/v1/leases/a/renew"), 1);
}

#[tokio::test]
async fn renewals_are_at_least_100_ms_apart() {
    let fake = Fake::start(|r, _| match r.path.ends_with("/renew") {
        true => renewal(1, 1),
        false => grant("a", 1, "1000"),
    })
    .await;
    let client = Client::new(&fake.url).unwrap();
    let lease = client.acquire("a", opts()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    let renewals = fake.count("POST", "/v1/leases/a/renew");
    // The first at about 333 ms, then one every 100 ms at most.
    assert!(renewals <= 7, "{renewals} renewals in 900 ms");
    drop(lease);
}

#[tokio::test]
async fn malformed_answers_are_protocol_errors() {
    let fake = Fake::start(|r, _| match r.method.as_str() {
        "POST" if r.path == "/v1/leases/held" => json(
            409,
            r#"{"type":"https://lease-proxy.dev/problems/lease-held","title":"Lease held","status":409,"holder":"bob","token":"not a number"}"#,
        ),
        "POST" => json(201, r#"{"nonsense":1}"#),
        _ => json(200, "not json"),
    })
    .await;
    let client = Client::new(&fake.url).unwrap();
    for result in [
        client.grant("a", &opts()).await.map(drop),
        client.acquire("a", opts()).await.map(drop),
        client.get("a").await.map(drop),
        client.list("").await.map(drop),
        client.grant("held", &opts()).await.map(drop),
    ] {
        assert!(matches!(result, Err(Error::Protocol(_))), "{result:?}");
    }
}

#[tokio::test]
async fn an_answer_over_1_mib_is_refused_without_reading_it_all() {
    const LIMIT: usize = 64 << 20;
    let fake = Fake::start(|_, _| Reply::Endless {
        head: HTTP_200_JSON.as_bytes().to_vec(),
        filler: vec![b' '; 64 << 10],
        limit: LIMIT,
    })
    .await;
    let client = Client::new(&fake.url).unwrap();
    let result = client.get("a").await;
    assert!(matches!(result, Err(Error::Protocol(_))), "{result:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        fake.written() < 24 << 20,
        "{} bytes were sent before the client gave up",
        fake.written()
    );

    // A length announced over the limit is refused before reading.
    let fake = Fake::start(|_, _| {
        Reply::Raw(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2000000000\r\n\r\n{"
                .to_vec(),
        )
    })
    .await;
    let client = Client::new(&fake.url).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(5), client.get("a"))
        .await
        .unwrap();
    assert!(matches!(result, Err(Error::Protocol(_))), "{result:?}");
}

#[tokio::test]
async fn an_event_stream_line_over_1_mib_is_an_error_and_the_watch_resumes_after_it() {
    let fake = Fake::start(|_, n| match n {
        0 => Reply::Endless {
            head: format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{}data: ",
                event("1", "first")
            )
            .into_bytes(),
            filler: vec![b'a'; 64 << 10],
            limit: 8 << 20,
        },
        1 => events(&event("2", "second")),
        _ => events(": idle\n\n"),
    })
    .await;
    let client = Client::new(&fake.url).unwrap();
    let mut stream = client.watch("", None);
    assert_eq!(next(&mut stream).await.unwrap().resource, "first");
    let error = next(&mut stream).await;
    assert!(matches!(error, Err(Error::Protocol(_))), "{error:?}");
    assert_eq!(next(&mut stream).await.unwrap().resource, "second");
    let requests = fake.requests();
    assert_eq!(requests[1].header("last-event-id"), Some("1"));
}

#[tokio::test]
async fn a_server_that_closes_every_watch_at_once_is_not_hammered() {
    // Each connection: 200, a resume point and a comment (data, but no event), closed.
    let fake = Fake::start(|_, _| events("id: 7\n\n: hello\n\n")).await;
    let client = Client::new(&fake.url).unwrap();
    let mut stream = client.watch("", None);
    let _ = tokio::time::timeout(Duration::from_secs(2), stream.next()).await;
    let connections = fake.count("GET", "/v1/watch");
    // Backing off 100, 200, 400, 800 ms…: 5 connections in 2 s.
    assert!(connections <= 7, "{connections} connections in 2 s");
    assert_eq!(
        fake.requests().last().unwrap().header("last-event-id"),
        Some("7")
    );
}
