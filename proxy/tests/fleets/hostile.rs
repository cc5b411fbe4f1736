//! Hostile input against fleets, with authentication on: each refused with a clear problem and
//! nothing changed in etcd.

use std::time::Duration;

use serde_json::{json, Value};

use super::common::fleet::names;
use super::common::*;
use super::{replicas, Replicas};

/// Every key under the test's `prefix`, with its revisions and value.
async fn state(etcd: &Etcd, prefix: &str) -> Vec<(Vec<u8>, i64, i64, Vec<u8>)> {
    let mut client = etcd.client().await;
    let resp = client
        .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.value().to_vec(),
            )
        })
        .collect()
}

fn as_(req: reqwest::RequestBuilder, token: &str) -> reqwest::RequestBuilder {
    req.bearer_auth(token)
}

/// The problem slug of an answer.
fn slug(body: &Value) -> &str {
    body["type"]
        .as_str()
        .and_then(|t| t.rsplit('/').next())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        [
            token_line("alice", "alice-token", "acquire:ho-,read:ho-"),
            token_line("bob", "bob-token", "acquire:ho-,read:ho-"),
            token_line("carol", "carol-token", "acquire:other-,read:other-"),
        ]
        .concat(),
    )
    .unwrap();
    let Replicas {
        etcd,
        r1,
        r2,
        prefix,
    } = replicas("fleet-hostile", |c| {
        c.auth_tokens = Some(tokens.clone());
        c.quota_acquire_rate = Some(2.0);
    })
    .await;
    let url = &r1.url;
    let put = |who: &'static str, body: Value| {
        let url = url.clone();
        async move { send(as_(http().put(format!("{url}/v1/fleets/ho")), who).json(&body)).await }
    };
    let resources = names("ho", 6);
    let refused = |status: u16, body: &Value, want: (u16, &str)| {
        assert_eq!((status, slug(body)), want, "{body}");
    };
    // A principal making a fleet over resources it may not acquire.
    let before = state(&etcd, &prefix).await;
    let (status, body) = put("carol-token", json!({"resources": resources})).await;
    refused(status, &body, (403, "forbidden"));
    // Names outside the grammar, twice the same, too many, a body of a million names.
    let (status, body) = put("alice-token", json!({"resources": ["ho-1", "../etc"]})).await;
    refused(status, &body, (400, "invalid-resource"));
    let (status, body) = put("alice-token", json!({"resources": ["ho-1", "ho-1"]})).await;
    refused(status, &body, (400, "invalid-field"));
    let (status, body) = put("alice-token", json!({"resources": names("ho", 10_001)})).await;
    refused(status, &body, (400, "invalid-field"));
    let million = json!({"resources": names("ho", 1_000_000)}).to_string();
    let (status, body) = raw_put(url, "/v1/fleets/ho", "alice-token", million).await;
    refused(status, &body, (413, "body-too-large"));
    assert_eq!(
        state(&etcd, &prefix).await,
        before,
        "a refused spec wrote something"
    );

    // alice makes it; bob may not change or end it.
    let (status, body) = put(
        "alice-token",
        json!({"resources": resources, "drain_ms": 0}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = put("bob-token", json!({"resources": ["ho-9"]})).await;
    refused(status, &body, (403, "other-principal"));
    let (status, body) = send(as_(
        http().delete(format!("{url}/v1/fleets/ho")),
        "bob-token",
    ))
    .await;
    refused(status, &body, (403, "other-principal"));

    // bob is member m1; alice naming m1 is refused, m1 stays bob's.
    let join_as = |who: &'static str, member: &'static str| {
        let url = r2.url.clone();
        async move {
            send(
                as_(http().post(format!("{url}/v1/fleets/ho/members")), who)
                    .json(&json!({"member": member, "ttl_seconds": 30})),
            )
            .await
        }
    };
    let (status, m1) = join_as("bob-token", "m1").await;
    assert_eq!(status, 201, "{m1}");
    let (status, m2) = join_as("alice-token", "m2").await;
    assert_eq!(status, 201, "{m2}");
    let before = settled(&etcd, &prefix).await;
    let (status, body) = join_as("alice-token", "m1").await;
    refused(status, &body, (409, "member-taken"));
    // A principal that may not acquire the fleet's resources cannot join it.
    let (status, body) = join_as("carol-token", "m3").await;
    refused(status, &body, (403, "forbidden"));
    // Reading an assignment: another member's secret, another principal's session, a
    // non-member that may not acquire the fleet's resources (even with a member's secret), no
    // secret.
    let member = |name: &str| format!("{url}/v1/fleets/ho/members/{name}");
    let secret = |v: &Value| str_field(v, "secret");
    for (who, name, shown, want) in [
        ("bob-token", "m2", secret(&m1), "not-member"),
        ("bob-token", "m2", secret(&m2), "not-member"),
        ("carol-token", "m1", secret(&m1), "forbidden"),
        ("carol-token", "m9", secret(&m1), "forbidden"),
    ] {
        let (status, body) =
            send(as_(http().get(member(name)), who).header("lease-secret", shown)).await;
        refused(status, &body, (403, want));
    }
    let (status, body) = send(as_(http().get(member("m1")), "carol-token")).await;
    refused(status, &body, (401, "missing-secret"));
    let (status, body) =
        send(as_(http().get(member("m9")), "bob-token").header("lease-secret", secret(&m1))).await;
    refused(status, &body, (404, "no-member"));
    // Draining another's member with one's own secret; an operator without the right.
    let (status, body) = send(
        as_(http().post(format!("{}/drain", member("m2"))), "bob-token")
            .header("lease-secret", secret(&m1)),
    )
    .await;
    refused(status, &body, (403, "not-member"));
    let (status, body) = send(as_(
        http().post(format!("{}/drain", member("m2"))),
        "carol-token",
    ))
    .await;
    refused(status, &body, (403, "forbidden"));
    let (status, body) = send(as_(http().delete(member("m2")), "carol-token")).await;
    refused(status, &body, (403, "forbidden"));
    // Names outside the grammar in the path and the body.
    let (status, body) = send(as_(
        http().get(format!("{url}/v1/fleets/a..b")),
        "alice-token",
    ))
    .await;
    refused(status, &body, (400, "invalid-field"));
    let (status, body) = send(
        as_(
            http().post(format!("{url}/v1/fleets/ho/members")),
            "alice-token",
        )
        .json(&json!({"member": "no/slash", "ttl_seconds": 30})),
    )
    .await;
    refused(status, &body, (400, "invalid-field"));
    // A revision past 63 bits, signed, or with a leading zero: refused, as the schema says.
    let view_after = |after: &str| {
        as_(
            http().get(format!("{}?after={after}&wait_ms=0", member("m1"))),
            "bob-token",
        )
        .header("lease-secret", secret(&m1))
    };
    for after in ["9223372036854775808", "-1", "+1", "01", ""] {
        let (status, body) = send(view_after(after)).await;
        refused(status, &body, (400, "invalid-field"));
    }
    let (status, body) = send(view_after("9223372036854775807")).await;
    assert_eq!(status, 200, "the largest revision was refused: {body}");
    assert_eq!(
        state(&etcd, &prefix).await,
        before,
        "a refused request changed the fleet"
    );

    // Joining and leaving in a tight loop: the acquire rate (2/s) holds it back.
    let mut limited = 0;
    for _ in 0..12 {
        let (status, body) = join_as("bob-token", "loop").await;
        match status {
            201 => {
                let id = str_field(&body, "session_id");
                let (status, _) = send(
                    as_(
                        http().delete(format!("{}/v1/sessions/{id}", r2.url)),
                        "bob-token",
                    )
                    .header("lease-secret", secret(&body)),
                )
                .await;
                assert_eq!(status, 204);
            }
            429 => {
                assert_eq!(slug(&body), "quota-exceeded", "{body}");
                limited += 1;
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert!(limited >= 6, "only {limited} of 12 joins limited at 2/s");
}

/// A `PUT` written on a socket of its own: the answer is read while the body is still being
/// sent, since the proxy answers an oversized body at its headers and reads no more of it.
async fn raw_put(url: &str, path: &str, token: &str, body: String) -> (u16, Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = url.trim_start_matches("http://");
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let sending = tokio::spawn(async move {
        let _ = write.write_all(head.as_bytes()).await;
        let _ = write.write_all(body.as_bytes()).await;
    });
    let mut answer = Vec::new();
    let _ = read.read_to_end(&mut answer).await;
    sending.abort();
    let answer = String::from_utf8_lossy(&answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let json = answer
        .find('{')
        .and_then(|at| serde_json::from_str(answer[at..].trim_end_matches(|c| c != '}')).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

/// The state once the fleet has stopped changing (three readings alike, 100 ms apart).
async fn settled(etcd: &Etcd, prefix: &str) -> Vec<(Vec<u8>, i64, i64, Vec<u8>)> {
    let (state, _) = lease_proxy_testkit::poll::eventually(
        Duration::from_secs(10),
        "the fleet settles",
        || async move {
            let first = state(etcd, prefix).await;
            for _ in 0..2 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if state(etcd, prefix).await != first {
                    return lease_proxy_testkit::poll::Probe::Not("still changing".into());
                }
            }
            lease_proxy_testkit::poll::Probe::Done(first)
        },
    )
    .await;
    state
}
