//! `GET /openapi.json`: a valid OpenAPI 3.1 document that lists exactly what the router serves
//! — every documented (path, method) is answered by its handler, never by the router's
//! not-found or method-not-allowed fallbacks, and every other method on a documented path is
//! refused as not allowed — and documents every problem type.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::*;
use lease_proxy_testkit::{docs, openapi};
use reqwest::Method;
use serde_json::Value;

/// A request on `path` (templates filled in with valid values) with `method`: the problem type
/// slug of the answer if it is one, else the status.
async fn probe(base: &str, method: &str, path: &str) -> (u16, String) {
    let concrete = path
        .replace("{resource}", "drift-probe")
        .replace("{id}", "1")
        .replace("{fleet}", "drift-fleet")
        .replace("{member}", "drift-member")
        .replace("{path}", "x");
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let resp = http()
        .request(method, format!("{base}{concrete}"))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    // An event stream never ends: its answer is its status.
    if resp
        .headers()
        .get("content-type")
        .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"))
    {
        return (status, String::new());
    }
    let kind = resp
        .json::<Value>()
        .await
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned))
        .and_then(|t| t.rsplit('/').next().map(str::to_owned))
        .unwrap_or_default();
    (status, kind)
}

#[tokio::test]
async fn the_document_is_valid_and_matches_the_router() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let resp = http()
        .get(format!("{}/openapi.json", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let doc: Value = resp.json().await.unwrap();
    assert_eq!(openapi::problems(&doc), Vec::<String>::new());

    let operations = openapi::operations(&doc);
    let paths: BTreeSet<&str> = operations.keys().map(String::as_str).collect();
    for expected in [
        "/v1/leases",
        "/v1/leases/{resource}",
        "/v1/leases/{resource}/renew",
        "/v1/leases/{resource}/forward",
        "/v1/leases/{resource}/forward/{path}",
        "/v1/sessions",
        "/v1/sessions/{id}",
        "/v1/sessions/{id}/keepalive",
        "/v1/watch",
        "/v1/fleets/{fleet}",
        "/v1/fleets/{fleet}/members",
        "/v1/fleets/{fleet}/members/{member}",
        "/v1/fleets/{fleet}/members/{member}/drain",
        "/livez",
        "/readyz",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(paths.contains(expected), "{expected} is not documented");
    }
    for (path, methods) in &operations {
        for method in openapi::METHODS.map(|m| m.to_ascii_uppercase()) {
            let (status, kind) = probe(&proxy.url, &method, path).await;
            // HEAD is answered wherever GET is (RFC 9110 §9.3.2), as axum does.
            let served = methods.contains(&method) || (method == "HEAD" && methods.contains("GET"));
            if served {
                assert!(
                    kind != "no-route" && kind != "method-not-allowed" && status != 405,
                    "{method} {path} is documented but not served ({status} {kind})"
                );
            } else {
                // (A HEAD answer has no body to name the problem.)
                assert!(
                    status == 405 && (kind == "method-not-allowed" || method == "HEAD"),
                    "{method} {path} is served but not documented ({status} {kind})"
                );
            }
        }
    }
    // The etcd-compatible gateway is served but deliberately left out of the document.
    for (method, path) in [
        ("POST", "/v3/kv/range"),
        ("POST", "/v3beta/kv/range"),
        ("POST", "/v3alpha/lease/leases"),
        ("GET", "/version"),
        ("GET", "/health"),
        ("GET", "/ui"),
        ("GET", "/ui/app.js"),
    ] {
        let (status, kind) = probe(&proxy.url, method, path).await;
        assert!(kind != "no-route", "{path} is not served ({status})");
    }
    assert!(!operations.keys().any(|p| p.starts_with("/v3")
        || p.starts_with("/ui")
        || p == "/version"
        || p == "/health"));
    let (status, kind) = probe(&proxy.url, "GET", "/v2/nothing").await;
    assert_eq!((status, kind.as_str()), (404, "no-route"));

    // Every problem type is listed, each with its status, and responses narrow to theirs.
    let types: Vec<&str> = doc["components"]["schemas"]["Problem"]["properties"]["type"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    for slug in [
        "invalid-request",
        "lease-held",
        "lease-lost",
        "session-lost",
        "not-holder",
        "missing-secret",
        "unauthenticated",
        "quota-exceeded",
        "etcd-unavailable",
        "internal",
    ] {
        assert!(
            types.contains(&format!("{}{slug}", lease_proxy::PROBLEM_BASE).as_str()),
            "{slug} is not documented"
        );
    }
    // docs/API.md's error table says the same, neither more nor less.
    let api = docs::read("docs/API.md");
    let documented = docs::problem_table(&docs::section(&api, "## Errors"));
    let served = docs::document_problems(&doc);
    assert!(served.len() > 20, "{served:?}");
    assert_eq!(
        documented, served,
        "docs/API.md's error table (left) differs from the document's problem types (right)"
    );
    let description = doc["info"]["description"].as_str().unwrap();
    assert!(description.contains("| 409 | `https://lease-proxy.dev/problems/lease-held` |"));
    let held = &doc["paths"]["/v1/leases/{resource}"]["post"]["responses"]["409"];
    let narrowed = &held["content"]["application/problem+json"]["schema"]["allOf"][1];
    assert_eq!(
        narrowed["properties"]["type"]["enum"],
        // Narrowed by status: every 409 the proxy answers (the fleets' too).
        serde_json::json!([
            "https://lease-proxy.dev/problems/lease-held",
            "https://lease-proxy.dev/problems/idempotency-key-used",
            "https://lease-proxy.dev/problems/member-taken",
            "https://lease-proxy.dev/problems/fleet-full",
            "https://lease-proxy.dev/problems/fleet-changed"
        ])
    );
    proxy.stop().await;
}
