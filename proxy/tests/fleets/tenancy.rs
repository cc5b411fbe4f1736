//! Fleets shared by tenants, with authentication on: what another tenant's refusals tell it
//! (nothing of the fleet), the budgets a fleet counts against (the held quota, the acquire
//! rate), and the bounds that keep a fleet's records writable (members, names).

use std::time::Duration;

use serde_json::{json, Value};

use super::common::fleet::{make_fleet, names};
use super::common::*;
use super::{replicas, Replicas};
use lease_proxy_testkit::poll::{eventually, Probe};

const WITHIN: Duration = Duration::from_secs(15);

fn tokens(dir: &tempfile::TempDir, lines: &[(&str, &str, &str)]) -> std::path::PathBuf {
    let path = dir.path().join("tokens");
    let file: String = lines
        .iter()
        .map(|(name, token, perms)| token_line(name, token, perms))
        .collect();
    std::fs::write(&path, file).unwrap();
    path
}

fn slug(body: &Value) -> &str {
    body["type"]
        .as_str()
        .and_then(|t| t.rsplit('/').next())
        .unwrap_or_default()
}

/// `method url` as `token`, with `secret` in `Lease-Secret` if any.
async fn call(method: &str, url: &str, token: &str, secret: Option<&str>) -> (u16, Value) {
    let mut req = match method {
        "GET" => http().get(url),
        "POST" => http().post(url),
        "DELETE" => http().delete(url),
        other => panic!("{other}"),
    }
    .bearer_auth(token);
    if let Some(secret) = secret {
        req = req.header("lease-secret", secret);
    }
    send(req).await
}

/// `POST {url}/v1/fleets/{fleet}/members` as `token`.
async fn join_as(url: &str, fleet: &str, token: &str, member: &str, ttl: u64) -> (u16, Value) {
    let body = json!({"member": member, "ttl_seconds": ttl});
    send(
        http()
            .post(format!("{url}/v1/fleets/{fleet}/members"))
            .bearer_auth(token)
            .json(&body),
    )
    .await
}

/// `PUT {url}/v1/fleets/{fleet}` as `token`.
async fn put_as(url: &str, fleet: &str, token: &str, body: &Value) -> (u16, Value) {
    let req = http().put(format!("{url}/v1/fleets/{fleet}"));
    send(req.bearer_auth(token).json(body)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_learns_nothing_of_a_fleet_it_may_not_act_on() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens(
        &dir,
        &[
            ("alice", "alice-token", "acquire:tn-,read:tn-"),
            ("carol", "carol-token", "acquire:other-,read:other-"),
        ],
    );
    let Replicas {
        etcd: _etcd, r1, ..
    } = replicas("fleet-tenancy", |c| {
        c.auth_tokens = Some(tokens.clone());
    })
    .await;
    let url = &r1.url;
    let resources = names("tn-secret", 3);
    let (status, body) = put_as(url, "tn", "alice-token", &json!({"resources": resources})).await;
    assert_eq!(status, 200, "{body}");
    let (status, m1) = join_as(url, "tn", "alice-token", "m1", 30).await;
    assert_eq!(status, 201, "{m1}");
    let secret = str_field(&m1, "secret");

    // Every answer carol gets is the same refusal, whether the member exists or not, and none
    // names a resource of the fleet.
    let fleet = format!("{url}/v1/fleets/tn");
    let member = |name: &str| format!("{fleet}/members/{name}");
    let drain = |name: &str| format!("{fleet}/members/{name}/drain");
    let mut asked = vec![
        ("GET", fleet.clone(), None),
        ("DELETE", fleet.clone(), None),
        ("DELETE", member("m1"), None),
        ("DELETE", member("ghost"), None),
        ("POST", drain("m1"), None),
        ("POST", drain("ghost"), None),
        ("POST", drain("m1"), Some(secret.clone())),
        ("POST", drain("ghost"), Some(secret.clone())),
        ("GET", member("m1"), Some(secret.clone())),
        ("GET", member("ghost"), Some(secret.clone())),
    ];
    let mut answers = Vec::new();
    for (method, target, shown) in asked.drain(..) {
        let (status, body) = call(method, &target, "carol-token", shown.as_deref()).await;
        let detail = body["detail"].as_str().unwrap_or_default().to_owned();
        assert_eq!(
            (status, slug(&body)),
            (403, "forbidden"),
            "{method} {target}: {body}"
        );
        assert!(
            !detail.contains("tn-"),
            "{method} {target} names a resource: {detail}"
        );
        answers.push((method, target, detail));
    }
    let (_, _, first) = &answers[1];
    for (method, target, detail) in &answers[1..] {
        assert_eq!(detail, first, "{method} {target} tells the member apart");
    }
    let (status, body) = join_as(url, "tn", "carol-token", "m9", 30).await;
    assert_eq!((status, slug(&body)), (403, "forbidden"), "{body}");
    assert!(!body["detail"].as_str().unwrap().contains("tn-"), "{body}");
    // The member is untouched.
    let (status, view) = call("GET", &member("m1"), "alice-token", Some(&secret)).await;
    assert_eq!(
        (status, view["state"].as_str()),
        (200, Some("active")),
        "{view}"
    );
}
