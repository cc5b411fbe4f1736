//! The client against a hostile fake proxy (raw sockets, canned answers): watch reconnection
//! after a 500, absurd lifetimes, malformed and oversized answers, oversized event-stream lines,
//! and a server that accepts a watch and closes it at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::fake::{json, Fake};
use lease_proxy_client::{AcquireOptions, Client, Error};

fn opts() -> AcquireOptions {
    AcquireOptions::new("h", Duration::from_secs(3))
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
