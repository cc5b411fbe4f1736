//! What schemathesis (`scripts/schemathesis.sh`) found where the proxy and its OpenAPI document
//! disagreed, each fixed in the proxy and pinned here: requests the document calls valid are
//! accepted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::json;

/// `ttl_seconds: 44.0` is the number 44 (JSON does not tell them apart, JSON Schema calls it an
/// integer, and a client whose numbers are all floats writes it so): it was refused as "not a
/// whole number of seconds", and `wait_ms: 6.0` as "expected u64". A fraction is still refused.
#[tokio::test]
async fn a_ttl_written_with_a_zero_fraction_is_accepted() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let (status, grant) = send(
        http()
            .post(format!("{}/v1/leases/float-ttl", proxy.url))
            .header("content-type", "application/json")
            .body(r#"{"holder":"h","ttl_seconds":44.0,"wait_ms":6.0}"#),
    )
    .await;
    assert_eq!(status, 201, "{grant}");
    assert_eq!(grant["ttl_seconds"], 44);
    let (status, opened) = send(
        http()
            .post(format!("{}/v1/sessions", proxy.url))
            .header("content-type", "application/json")
            .body(r#"{"holder":"h","ttl_seconds":1.34e2}"#),
    )
    .await;
    assert_eq!(status, 201, "{opened}");
    assert_eq!(opened["ttl_seconds"], 134);
    for fraction in ["44.5", "2.000001"] {
        let (status, problem) = send(
            http()
                .post(format!("{}/v1/leases/float-ttl-2", proxy.url))
                .header("content-type", "application/json")
                .body(format!(r#"{{"holder":"h","ttl_seconds":{fraction}}}"#)),
        )
        .await;
        assert_eq!(status, 400, "{fraction}: {problem}");
        assert_eq!(
            problem["type"],
            format!("{}invalid-ttl", lease_proxy::PROBLEM_BASE)
        );
    }
    proxy.stop().await;
}

/// A renewal's and a keepalive's body is optional (the document: nothing, or an object, or
/// JSON `null`): `null` was refused as "expected struct RenewBody".
#[tokio::test]
async fn an_optional_body_may_be_json_null() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let (status, grant) = acquire(&proxy, "null-body", "h", 30).await;
    assert_eq!(status, 201, "{grant}");
    let (status, renewed) = send(
        http()
            .post(format!("{}/v1/leases/null-body/renew", proxy.url))
            .header("lease-secret", str_field(&grant, "secret"))
            .header("content-type", "application/json")
            .body("null"),
    )
    .await;
    assert_eq!(status, 200, "{renewed}");
    let session = session(&proxy, "h", 30).await;
    let (status, beat) = send(
        http()
            .post(format!("{}/v1/sessions/{}/keepalive", proxy.url, session.0))
            .header("lease-secret", &session.1)
            .header("content-type", "application/json")
            .body("null"),
    )
    .await;
    assert_eq!(status, 200, "{beat}");
    // Anything else than nothing, `null` or an object is still refused.
    for body in [json!([]), json!(1), json!("")] {
        let (status, problem) = send(
            http()
                .post(format!("{}/v1/leases/null-body/renew", proxy.url))
                .header("lease-secret", str_field(&grant, "secret"))
                .json(&body),
        )
        .await;
        assert_eq!(status, 400, "{body}: {problem}");
    }
    proxy.stop().await;
}

/// A body must be a JSON object: serde reads a struct from an array too, field by field in
/// order, so `["robot", 30]` was a valid acquire and `[]` a valid renewal body.
#[tokio::test]
async fn an_array_is_not_a_body() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    for (path, body) in [
        ("/v1/leases/array-body", json!(["robot", 30])),
        ("/v1/sessions", json!(["robot", 30])),
    ] {
        let (status, problem) = send(http().post(format!("{}{path}", proxy.url)).json(&body)).await;
        assert_eq!(status, 400, "{path}: {problem}");
        assert_eq!(
            problem["type"],
            format!("{}invalid-request", lease_proxy::PROBLEM_BASE)
        );
    }
    let (status, _) = send(http().get(format!("{}/v1/leases/array-body", proxy.url))).await;
    assert_eq!(status, 404, "nothing was acquired");
    proxy.stop().await;
}

/// An acquire under a session with an invalid field is 400 whatever the session's state: the
/// session was looked up first, so a `wait_ms` over `--max-wait` under an ended session was
/// answered 410 `session-lost`, an invalid request read as a valid one that met a lost session.
#[tokio::test]
async fn an_invalid_acquire_is_refused_before_its_session_is_looked_up() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |c| {
        c.max_wait = std::time::Duration::from_secs(1);
    })
    .await;
    for (body, field) in [
        (
            json!({"holder": "h", "session": "12345", "wait_ms": 1001}),
            "wait_ms",
        ),
        (
            json!({"holder": "h", "session": "12345", "metadata": [1]}),
            "metadata",
        ),
    ] {
        let (status, problem) = send(
            http()
                .post(format!("{}/v1/leases/ended-session", proxy.url))
                .header("lease-secret", "some-secret")
                .json(&body),
        )
        .await;
        assert_eq!(status, 400, "{body}: {problem}");
        assert_eq!(
            problem["type"],
            format!("{}invalid-field", lease_proxy::PROBLEM_BASE)
        );
        assert!(
            problem["detail"].as_str().unwrap().contains(field),
            "{problem}"
        );
    }
    // A valid one meets the ended session.
    let (status, problem) = send(
        http()
            .post(format!("{}/v1/leases/ended-session", proxy.url))
            .header("lease-secret", "some-secret")
            .json(&json!({"holder": "h", "session": "12345", "wait_ms": 1000})),
    )
    .await;
    assert_eq!(status, 410, "{problem}");
    proxy.stop().await;
}
