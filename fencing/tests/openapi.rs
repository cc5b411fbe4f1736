//! fence-gateway's `GET /openapi.json`: a valid OpenAPI 3.1 document listing exactly the
//! gateway's own routes — each documented (path, method) answered by the gateway itself, never
//! forwarded — and every problem type the gateway answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencing::{KeyId, Keyring};
use lease_proxy_testkit::{docs, free_port, openapi};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_fence-gateway");

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_document_is_valid_and_lists_exactly_the_gateways_routes() {
    // A storage that counts what reaches it: the gateway's own routes must not.
    let forwarded = Arc::new(AtomicUsize::new(0));
    let count = forwarded.clone();
    let storage = axum::Router::new().fallback(move || {
        count.fetch_add(1, Ordering::SeqCst);
        async { "storage" }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, storage).await.unwrap() });

    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("keys");
    std::fs::write(
        &key_file,
        Keyring::generate_file(&KeyId::parse("k1").unwrap()),
    )
    .unwrap();
    let port = free_port();
    let _gateway = Gateway(
        Command::new(BIN)
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--upstream",
                &upstream,
            ])
            .arg("--store")
            .arg(format!("sqlite:{}", dir.path().join("marks.db").display()))
            .arg("--key-file")
            .arg(&key_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let mut ready = false;
    for _ in 0..200 {
        if let Ok(r) = client.get(format!("{url}/readyz")).send().await {
            ready = r.status() == 200;
            if ready {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(ready, "fence-gateway did not become ready");

    let resp = client
        .get(format!("{url}/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let doc: Value = resp.json().await.unwrap();
    assert_eq!(openapi::problems(&doc), Vec::<String>::new());
    let operations = openapi::operations(&doc);
    assert_eq!(
        operations.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "/fence-gateway/feed",
            "/fence/{resource}",
            "/livez",
            "/metrics",
            "/openapi.json",
            "/readyz"
        ]
    );
    for (path, methods) in &operations {
        let concrete = path.replace("{resource}", "drift-probe");
        for method in openapi::METHODS.map(|m| m.to_ascii_uppercase()) {
            let before = forwarded.load(Ordering::SeqCst);
            let resp = client
                .request(
                    reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                    format!("{url}{concrete}"),
                )
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let reached_storage = forwarded.load(Ordering::SeqCst) > before;
            // HEAD is answered wherever GET is (RFC 9110 §9.3.2), as axum does.
            let documented =
                methods.contains(&method) || (method == "HEAD" && methods.contains("GET"));
            assert!(
                !reached_storage,
                "{method} {path} was forwarded: the gateway's own paths shadow the storage's"
            );
            if documented {
                assert_ne!(status, 405, "{method} {path} is documented but not served");
            } else {
                assert_eq!(status, 405, "{method} {path} is served but not documented");
            }
        }
    }
    // Everything else is the storage's.
    let resp = client.get(format!("{url}/anything")).send().await.unwrap();
    assert_eq!(resp.text().await.unwrap(), "storage");

    // Every problem type, the enforcer's and the gateway's, with its status.
    let description = doc["info"]["description"].as_str().unwrap();
    for row in [
        "| 428 | `https://lease-proxy.dev/problems/missing-fencing-token` |",
        "| 409 | `https://lease-proxy.dev/problems/stale-fencing-token` |",
        "| 401 | `https://lease-proxy.dev/problems/invalid-fencing-token` |",
        "| 503 | `https://lease-proxy.dev/problems/fence-store-unavailable` |",
        "| 502 | `https://lease-proxy.dev/problems/upstream-unavailable` |",
        "| 403 | `https://lease-proxy.dev/problems/client-certificate-required` |",
    ] {
        assert!(description.contains(row), "{row}");
    }
    // docs/API.md's table of the gateway's problem types says the same, neither more nor less.
    let api = docs::read("docs/API.md");
    let documented = docs::problem_table(&docs::section(&api, "## fence-gateway"));
    let served = docs::document_problems(&doc);
    assert!(served.len() > 10, "{served:?}");
    assert_eq!(
        documented, served,
        "docs/API.md's fence-gateway problem table (left) differs from the document's (right)"
    );
    let stale = &doc["paths"]["/fence/{resource}"]["post"]["responses"]["409"];
    assert_eq!(
        stale["content"]["application/problem+json"]["schema"]["allOf"][1]["properties"]["type"]
            ["enum"],
        serde_json::json!(["https://lease-proxy.dev/problems/stale-fencing-token"])
    );
}
