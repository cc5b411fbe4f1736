//! `POST /fence/{resource}` against the fence-gateway binary: the route takes its resource the
//! way path mode does (canonical path, the resource grammar), so it can raise no mark that a
//! write could not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{key_file, GatewayProcess};
use fencing::Token;
use lease_proxy_testkit::recording::Storage;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefence_refuses_names_outside_the_resource_grammar() {
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path());
    let storage = Storage::start().await;
    let gw = GatewayProcess::start(&storage.url, &keys_path, &[]).await;
    let client = reqwest::Client::new();
    let prefence = |segment: &str, resource: &str| {
        client
            .post(format!("{}/fence/{segment}", gw.url))
            .header("fencing-token", keys.mint(resource, Token::new(0, 7)))
            .send()
    };
    // Each token is genuine for the name the segment decodes to, so only the grammar refuses.
    for (segment, decoded) in [
        ("lock%2F6162", "lock/6162"),
        ("lock%2f6162", "lock/6162"),
        ("a%20b", "a b"),
        ("a%2Db", "a-b"),
        ("-a", "-a"),
        ("a..b", "a..b"),
    ] {
        let resp = prefence(segment, decoded).await.unwrap();
        assert_eq!(resp.status(), 400, "{segment}");
        assert_eq!(
            resp.headers()["content-type"],
            "application/problem+json",
            "{segment}"
        );
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["status"], 400, "{segment}");
    }
    for good in ["aisle-3", "shard:12", "job_nightly.v2", "7"] {
        let resp = prefence(good, good).await.unwrap();
        assert_eq!(resp.status(), 200, "{good}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["resource"], good);
        assert_eq!(body["mark"]["revision"], "7");
    }
    assert!(
        storage.log.take().is_empty(),
        "a pre-fence reached the storage"
    );
}
