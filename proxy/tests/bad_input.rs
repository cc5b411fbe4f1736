//! Every kind of bad input gets the right 4xx problem+json and leaves etcd exactly as it was.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends one raw HTTP/1.1 request (so paths like `..` reach the server unnormalised) and returns
/// the status, the content type and the body.
async fn raw(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        req.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    // The server may answer (and close) before reading an oversized body.
    let _ = stream.write_all(body).await;
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    (status, content_type, body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_problems_and_change_nothing() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let (_, held) = acquire(&proxy, "held-1", "owner", 60).await;
    let secret = str_field(&held, "secret");
    let mut forged = secret.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });
    let addr = proxy.url.trim_start_matches("http://").to_owned();

    let json = ("content-type", "application/json");
    let big = format!(
        r#"{{"holder":"a","ttl_seconds":10,"metadata":{{"x":"{}"}}}}"#,
        "y".repeat(70_000)
    );
    let deep = format!(
        r#"{{"holder":"a","ttl_seconds":10,"metadata":{{"x":{}1{}}}}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let long_name = format!("/v1/leases/{}", "r".repeat(201));
    let long_holder = format!(r#"{{"holder":"{}","ttl_seconds":10}}"#, "h".repeat(257));
    let big_meta = format!(
        r#"{{"holder":"a","ttl_seconds":10,"metadata":{{"x":"{}"}}}}"#,
        "m".repeat(5000)
    );
    let acquire_ok = r#"{"holder":"a","ttl_seconds":10}"#;

    /// (name, method, path, headers, body, expected status, expected problem slug)
    type Case<'a> = (
        &'a str,
        &'a str,
        String,
        Vec<(&'a str, &'a str)>,
        String,
        u16,
        &'a str,
    );
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("oversized body", "POST", "/v1/leases/new-1".into(), vec![json], big, 413, "body-too-large"),
        ("malformed json", "POST", "/v1/leases/new-1".into(), vec![json], "{\"holder\":".into(), 400, "invalid-request"),
        ("truncated json", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":10"#.into(), 400, "invalid-request"),
        ("not json", "POST", "/v1/leases/new-1".into(), vec![json], "holder=a".into(), 400, "invalid-request"),
        ("json null", "POST", "/v1/leases/new-1".into(), vec![json], "null".into(), 400, "invalid-request"),
        ("deeply nested", "POST", "/v1/leases/new-1".into(), vec![json], deep, 400, "invalid-request"),
        ("unknown field", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":10,"priority":1}"#.into(), 400, "invalid-request"),
        ("missing holder", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"ttl_seconds":10}"#.into(), 400, "invalid-request"),
        ("missing ttl", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a"}"#.into(), 400, "invalid-request"),
        ("empty body", "POST", "/v1/leases/new-1".into(), vec![json], String::new(), 400, "invalid-request"),
        ("ttl zero", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":0}"#.into(), 400, "invalid-ttl"),
        ("ttl one (below etcd minimum)", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":1}"#.into(), 400, "invalid-ttl"),
        ("ttl negative", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":-5}"#.into(), 400, "invalid-ttl"),
        ("ttl fractional", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":1.5}"#.into(), 400, "invalid-ttl"),
        ("ttl 1e309", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":1e309}"#.into(), 400, "invalid-request"),
        ("ttl above max", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":3601}"#.into(), 400, "invalid-ttl"),
        ("ttl huge", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":18446744073709551615}"#.into(), 400, "invalid-ttl"),
        ("ttl as string", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":"10"}"#.into(), 400, "invalid-request"),
        ("empty holder", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"","ttl_seconds":10}"#.into(), 400, "invalid-field"),
        ("control char holder", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a\u0000b","ttl_seconds":10}"#.into(), 400, "invalid-field"),
        ("long holder", "POST", "/v1/leases/new-1".into(), vec![json], long_holder, 400, "invalid-field"),
        ("metadata not object", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":10,"metadata":[1]}"#.into(), 400, "invalid-field"),
        ("metadata too big", "POST", "/v1/leases/new-1".into(), vec![json], big_meta, 400, "invalid-field"),
        ("wait too long", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":10,"wait_ms":600001}"#.into(), 400, "invalid-field"),
        ("wait negative", "POST", "/v1/leases/new-1".into(), vec![json], r#"{"holder":"a","ttl_seconds":10,"wait_ms":-1}"#.into(), 400, "invalid-request"),
        ("text content type", "POST", "/v1/leases/new-1".into(), vec![("content-type", "text/plain")], acquire_ok.into(), 415, "unsupported-media-type"),
        ("bad idempotency key", "POST", "/v1/leases/new-1".into(), vec![json, ("idempotency-key", "has space")], acquire_ok.into(), 400, "invalid-field"),
        ("empty resource", "POST", "/v1/leases/".into(), vec![json], acquire_ok.into(), 404, "no-route"),
        ("oversized resource", "POST", long_name, vec![json], acquire_ok.into(), 400, "invalid-resource"),
        ("control char resource", "POST", "/v1/leases/a%0Ab".into(), vec![json], acquire_ok.into(), 400, "invalid-resource"),
        ("dot-dot resource", "POST", "/v1/leases/..".into(), vec![json], acquire_ok.into(), 400, "invalid-resource"),
        ("encoded dot-dot", "POST", "/v1/leases/%2E%2E".into(), vec![json], acquire_ok.into(), 400, "invalid-resource"),
        ("embedded dot-dot", "POST", "/v1/leases/a..b".into(), vec![json], acquire_ok.into(), 400, "invalid-resource"),
        ("encoded slash", "POST", "/v1/leases/a%2Fb".into(), vec![json], acquire_ok.into(), 400, "invalid-resource"),
        ("invalid utf-8", "POST", "/v1/leases/%FF".into(), vec![json], acquire_ok.into(), 400, "invalid-resource"),
        ("wrong method on lease", "PUT", "/v1/leases/held-1".into(), vec![json], acquire_ok.into(), 405, "method-not-allowed"),
        ("wrong method on renew", "GET", "/v1/leases/held-1/renew".into(), vec![], String::new(), 405, "method-not-allowed"),
        ("wrong method on list", "POST", "/v1/leases".into(), vec![json], "{}".into(), 405, "method-not-allowed"),
        ("unknown route", "GET", "/v2/leases".into(), vec![], String::new(), 404, "no-route"),
        ("renew without secret", "POST", "/v1/leases/held-1/renew".into(), vec![], String::new(), 401, "missing-secret"),
        ("release without secret", "DELETE", "/v1/leases/held-1".into(), vec![], String::new(), 401, "missing-secret"),
        ("renew with empty secret", "POST", "/v1/leases/held-1/renew".into(), vec![("lease-secret", "")], String::new(), 401, "missing-secret"),
        ("renew with wrong secret", "POST", "/v1/leases/held-1/renew".into(), vec![("lease-secret", &forged)], String::new(), 403, "not-holder"),
        ("release with wrong secret", "DELETE", "/v1/leases/held-1".into(), vec![("lease-secret", &forged)], String::new(), 403, "not-holder"),
        ("renew with unknown body field", "POST", "/v1/leases/held-1/renew".into(), vec![json, ("lease-secret", &secret)], r#"{"ttl_seconds":100}"#.into(), 400, "invalid-request"),
        ("renew with two secrets", "POST", "/v1/leases/held-1/renew".into(), vec![("lease-secret", &secret), ("lease-secret", &secret)], String::new(), 400, "invalid-field"),
        ("list limit zero", "GET", "/v1/leases?limit=0".into(), vec![], String::new(), 400, "invalid-field"),
        ("list limit text", "GET", "/v1/leases?limit=ten".into(), vec![], String::new(), 400, "invalid-request"),
        ("list bad prefix", "GET", "/v1/leases?prefix=../x".into(), vec![], String::new(), 400, "invalid-field"),
        ("list bad cursor", "GET", "/v1/leases?cursor=!!!".into(), vec![], String::new(), 400, "invalid-field"),
        ("list unknown param", "GET", "/v1/leases?sort=desc".into(), vec![], String::new(), 400, "invalid-request"),
    ];

    let before = snapshot(&etcd).await;
    for (name, method, path, headers, body, want, slug) in cases {
        let (status, content_type, text) =
            raw(&addr, method, &path, &headers, body.as_bytes()).await;
        assert_eq!(status, want, "{name}: {text}");
        assert_eq!(content_type, "application/problem+json", "{name}");
        let problem: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{name}: body is not JSON ({e}): {text}"));
        assert_eq!(
            problem["type"],
            format!("{}{slug}", lease_proxy::PROBLEM_BASE),
            "{name}: {text}"
        );
        assert_eq!(problem["status"], want, "{name}");
        assert!(
            problem["title"].is_string() && problem["detail"].is_string(),
            "{name}"
        );
    }
    assert_eq!(
        snapshot(&etcd).await,
        before,
        "a rejected request changed etcd"
    );
    // The holder was not disturbed by any of it.
    assert_eq!(renew(&proxy, "held-1", &secret).await.0, 200);
}
