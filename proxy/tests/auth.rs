//! Who may call (`--auth-tokens`): a permission matrix of principals × routes × resource
//! prefixes, grants bound to the principal that acquired them, reload of the token file (SIGHUP
//! and file change) without dropping connections, a bad file at start, and the audit log.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use axum::http::Method;
use common::*;
use lease_proxy_testkit::poll::until;
use lease_proxy_testkit::process::exit_within;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const BIN: &str = env!("CARGO_BIN_EXE_lease-proxy");

const ALICE: &str = "alice-0f3b9c2d7e";
const BOB: &str = "bob-5a1e8d4c22";
const CAROL: &str = "carol-77c0e1f9ab";
const DAVE: &str = "dave-3d9e0a6b15";
const ERIN: &str = "erin-91b2c4e6f0";

fn sha256_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// alice: her aisles, reads everything; bob: reads aisles; carol: acquires anything and /v3;
/// erin: /v3 only (another tenant of it).
fn token_file() -> String {
    format!(
        "# principals of the matrix\n\
         alice {} acquire:aisle-,read:*,forward:aisle-\n\
         \n\
         bob   {} read:aisle-   # read only\n\
         carol {} acquire:*,v3:*\n\
         erin  {} v3:*\n",
        sha256_hex(ALICE),
        sha256_hex(BOB),
        sha256_hex(CAROL),
        sha256_hex(ERIN),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Alice,
    Bob,
    Carol,
    Erin,
    /// No `Authorization` header.
    Anonymous,
    /// A bearer token in no line of the file.
    WrongToken,
    /// An `Authorization` header of another scheme.
    NotBearer,
}

const EVERYONE: [Who; 6] = [
    Who::Alice,
    Who::Bob,
    Who::Carol,
    Who::Anonymous,
    Who::WrongToken,
    Who::NotBearer,
];
const NOBODY: [Who; 3] = [Who::Anonymous, Who::WrongToken, Who::NotBearer];

impl Who {
    fn authorization(self) -> Option<String> {
        match self {
            Who::Alice => Some(format!("Bearer {ALICE}")),
            Who::Bob => Some(format!("Bearer {BOB}")),
            Who::Carol => Some(format!("Bearer {CAROL}")),
            Who::Erin => Some(format!("Bearer {ERIN}")),
            Who::Anonymous => None,
            Who::WrongToken => Some("Bearer not-a-known-token".into()),
            // The right token under the wrong scheme is no authentication either.
            Who::NotBearer => Some(format!("Basic {ALICE}")),
        }
    }
}

/// One request of the matrix.
struct Req<'a> {
    method: Method,
    path: String,
    secret: Option<&'a str>,
    body: Option<Value>,
    idempotency_key: Option<&'a str>,
}

fn req<'a>(method: Method, path: impl Into<String>) -> Req<'a> {
    Req {
        method,
        path: path.into(),
        secret: None,
        body: None,
        idempotency_key: None,
    }
}

impl<'a> Req<'a> {
    fn secret(mut self, secret: &'a str) -> Self {
        self.secret = Some(secret);
        self
    }
    fn body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }
    fn key(mut self, key: &'a str) -> Self {
        self.idempotency_key = Some(key);
        self
    }
}

fn acquire_req<'a>(resource: &str) -> Req<'a> {
    req(Method::POST, format!("/v1/leases/{resource}"))
        .body(json!({"holder": "worker", "ttl_seconds": 30}))
}

/// Every cell asserted; mismatches are collected so one run shows them all.
struct Matrix {
    url: String,
    client: reqwest::Client,
    cells: usize,
    wrong: Vec<String>,
}

impl Matrix {
    async fn cell(&mut self, who: Who, r: Req<'_>, want: u16) -> Value {
        self.cells += 1;
        let mut b = self
            .client
            .request(r.method.clone(), format!("{}{}", self.url, r.path));
        if let Some(a) = who.authorization() {
            b = b.header("authorization", a);
        }
        if let Some(s) = r.secret {
            b = b.header("lease-secret", s);
        }
        if let Some(k) = r.idempotency_key {
            b = b.header("idempotency-key", k);
        }
        if let Some(body) = &r.body {
            b = b.json(body);
        }
        let resp = b.send().await.unwrap();
        let status = resp.status().as_u16();
        let challenge = resp
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned());
        let text = resp.text().await.unwrap();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        let cell = format!("{who:?} {} {}", r.method, r.path);
        if status != want {
            self.wrong
                .push(format!("{cell}: want {want}, got {status}: {body}"));
            return body;
        }
        // The refusal's shape: problem+json on /v1, etcd's error on /v3.
        let v3 = r.path.starts_with("/v3/");
        match status {
            401 => {
                if challenge.as_deref() != Some("Bearer realm=\"lease-proxy\"") {
                    self.wrong
                        .push(format!("{cell}: 401 without the Bearer challenge"));
                }
                let ok = if v3 {
                    body["code"] == 16
                } else {
                    body["type"] == "https://lease-proxy.dev/problems/unauthenticated"
                };
                if !ok {
                    self.wrong.push(format!("{cell}: 401 body {body}"));
                }
            }
            403 => {
                let ok = if v3 {
                    body["code"] == 7
                } else {
                    let t = body["type"].as_str().unwrap_or_default();
                    t.ends_with("/forbidden") || t.ends_with("/other-principal")
                };
                if !ok {
                    self.wrong.push(format!("{cell}: 403 body {body}"));
                }
            }
            _ => {}
        }
        body
    }

    /// Like `cell`, and the 403 must be the grant-ownership refusal (the route was permitted).
    async fn other_principal(&mut self, who: Who, r: Req<'_>) {
        let cell = format!("{who:?} {} {}", r.method, r.path);
        let body = self.cell(who, r, 403).await;
        if body["type"] != "https://lease-proxy.dev/problems/other-principal" {
            self.wrong.push(format!(
                "{cell}: not refused as another principal's grant: {body}"
            ));
        }
    }
}

fn names(list: &Value) -> Vec<String> {
    list["leases"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|h| h["resource"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The value of the `lease_proxy_auth_requests_total` series with these labels.
fn auth_count(metrics: &str, outcome: &str, route: &str) -> f64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("lease_proxy_auth_requests_total{")
                && l.contains(&format!("outcome=\"{outcome}\""))
                && l.contains(&format!("route=\"{route}\""))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no auth series {outcome}/{route}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_matrix() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, token_file()).unwrap();
    let Storage {
        url: upstream,
        log: forwarded,
    } = Storage::start().await;
    let proxy = Proxy::on(&etcd, |c| {
        c.auth_tokens = Some(tokens.clone());
        c.upstream = Some(upstream.clone());
    })
    .await;
    let mut m = Matrix {
        url: proxy.url.clone(),
        client: http(),
        cells: 0,
        wrong: Vec::new(),
    };
    use Who::*;

    // Acquire: alice on her aisles only; bob never; carol anywhere; nobody without a token.
    let alice_aisle = m.cell(Alice, acquire_req("aisle-alice"), 201).await;
    m.cell(Alice, acquire_req("dock-alice"), 403).await;
    m.cell(Bob, acquire_req("aisle-bob"), 403).await;
    m.cell(Bob, acquire_req("dock-bob"), 403).await;
    let carol_aisle = m.cell(Carol, acquire_req("aisle-carol"), 201).await;
    let carol_dock = m.cell(Carol, acquire_req("dock-carol"), 201).await;
    for who in NOBODY {
        m.cell(who, acquire_req("aisle-anon"), 401).await;
        m.cell(who, acquire_req("dock-anon"), 401).await;
    }
    let alice_secret = str_field(&alice_aisle, "secret");
    let carol_aisle_secret = str_field(&carol_aisle, "secret");
    let carol_dock_secret = str_field(&carol_dock, "secret");

    // Get: read:* sees everything, read:aisle- only aisles, no read permission nothing.
    for (who, aisle, dock) in [(Alice, 200, 200), (Bob, 200, 403), (Carol, 403, 403)] {
        m.cell(who, req(Method::GET, "/v1/leases/aisle-alice"), aisle)
            .await;
        m.cell(who, req(Method::GET, "/v1/leases/dock-carol"), dock)
            .await;
    }
    for who in NOBODY {
        m.cell(who, req(Method::GET, "/v1/leases/aisle-alice"), 401)
            .await;
        m.cell(who, req(Method::GET, "/v1/leases/dock-carol"), 401)
            .await;
    }

    // List: filtered to what the caller may read.
    let all = m.cell(Alice, req(Method::GET, "/v1/leases"), 200).await;
    assert_eq!(names(&all), ["aisle-alice", "aisle-carol", "dock-carol"]);
    let aisles = m.cell(Bob, req(Method::GET, "/v1/leases"), 200).await;
    assert_eq!(names(&aisles), ["aisle-alice", "aisle-carol"], "bob's list");
    let docks = m
        .cell(Bob, req(Method::GET, "/v1/leases?prefix=dock-"), 200)
        .await;
    assert!(names(&docks).is_empty(), "bob sees no dock: {docks}");
    m.cell(Carol, req(Method::GET, "/v1/leases"), 403).await;
    for who in NOBODY {
        m.cell(who, req(Method::GET, "/v1/leases"), 401).await;
    }

    // Renew: one's own grant only, whatever secret is shown.
    let renew = |r: &str| req(Method::POST, format!("/v1/leases/{r}/renew"));
    m.cell(Alice, renew("aisle-alice").secret(&alice_secret), 200)
        .await;
    m.other_principal(Alice, renew("aisle-carol").secret(&carol_aisle_secret))
        .await;
    m.cell(Alice, renew("dock-carol").secret(&carol_dock_secret), 403)
        .await;
    m.cell(Bob, renew("aisle-alice").secret(&alice_secret), 403)
        .await;
    m.cell(Carol, renew("aisle-carol").secret(&carol_aisle_secret), 200)
        .await;
    m.cell(Carol, renew("dock-carol").secret(&carol_dock_secret), 200)
        .await;
    m.other_principal(Carol, renew("aisle-alice").secret(&alice_secret))
        .await;
    for who in NOBODY {
        m.cell(who, renew("aisle-alice").secret(&alice_secret), 401)
            .await;
    }

    // Forward: the forward permission and one's own grant.
    let forward = |r: &str| req(Method::POST, format!("/v1/leases/{r}/forward/items/1"));
    m.cell(Alice, forward("aisle-alice").secret(&alice_secret), 200)
        .await;
    m.other_principal(Alice, forward("aisle-carol").secret(&carol_aisle_secret))
        .await;
    m.cell(Alice, forward("dock-carol").secret(&carol_dock_secret), 403)
        .await;
    m.cell(Bob, forward("aisle-alice").secret(&alice_secret), 403)
        .await;
    m.cell(
        Carol,
        forward("aisle-carol").secret(&carol_aisle_secret),
        403,
    )
    .await;
    for who in NOBODY {
        m.cell(who, forward("aisle-alice").secret(&alice_secret), 401)
            .await;
    }
    assert_eq!(
        forwarded
            .all()
            .iter()
            .map(|w| w.header("authorization"))
            .collect::<Vec<_>>(),
        [None],
        "one write forwarded, without the client's bearer token"
    );

    // Idempotent retry: the key and holder are not enough, the principal must be the same.
    let keyed = || acquire_req("aisle-idem").key("retry-1");
    let first = m.cell(Carol, keyed(), 201).await;
    m.other_principal(Alice, keyed()).await;
    m.cell(Bob, keyed(), 403).await;
    m.cell(Anonymous, keyed(), 401).await;
    let again = m.cell(Carol, keyed(), 201).await;
    assert_eq!(first["secret"], again["secret"], "carol's retry replays");

    // /v3: v3:* only, refused in etcd's shape.
    for path in ["/v3/kv/range", "/v3/lease/grant"] {
        let body = if path.ends_with("range") {
            json!({"key": "YQ=="})
        } else {
            json!({"TTL": "5"})
        };
        for (who, want) in [(Carol, 200), (Alice, 403), (Bob, 403)] {
            m.cell(who, req(Method::POST, path).body(body.clone()), want)
                .await;
        }
        for who in NOBODY {
            m.cell(who, req(Method::POST, path).body(body.clone()), 401)
                .await;
        }
    }

    // /v3 across tenants: carol and erin write the same key, each sees only their own — by
    // key, and in a range over everything; erin cannot see, inspect or revoke carol's lease.
    let kv = |op: &str, body: Value| req(Method::POST, format!("/v3/kv/{op}")).body(body);
    let shared = "c2hhcmVk"; // "shared"
    for (who, value) in [(Carol, "Y2Fyb2w="), (Erin, "ZXJpbg==")] {
        m.cell(who, kv("put", json!({"key": shared, "value": value})), 200)
            .await;
    }
    for (who, value) in [(Carol, "Y2Fyb2w="), (Erin, "ZXJpbg==")] {
        let one = m.cell(who, kv("range", json!({"key": shared})), 200).await;
        let all = m
            .cell(
                who,
                kv("range", json!({"key": "AA==", "range_end": "AA=="})),
                200,
            )
            .await;
        for (what, body) in [("the key", one), ("everything", all)] {
            let seen: Vec<(Value, Value)> = body["kvs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|kv| (kv["key"].clone(), kv["value"].clone()))
                .collect();
            if seen != [(json!(shared), json!(value))] {
                m.wrong
                    .push(format!("{who:?} ranging {what} sees {seen:?}"));
            }
        }
    }
    let lease = m
        .cell(
            Carol,
            req(Method::POST, "/v3/lease/grant").body(json!({"TTL": "30"})),
            200,
        )
        .await;
    let id = lease["ID"].clone();
    let ttl_of = |body: &Value| body["TTL"].as_str().unwrap_or_default().to_owned();
    let mine = m
        .cell(
            Carol,
            req(Method::POST, "/v3/lease/timetolive").body(json!({"ID": id})),
            200,
        )
        .await;
    let theirs = m
        .cell(
            Erin,
            req(Method::POST, "/v3/lease/timetolive").body(json!({"ID": id})),
            200,
        )
        .await;
    if ttl_of(&mine) == "-1" || ttl_of(&theirs) != "-1" {
        m.wrong.push(format!(
            "lease time-to-live: carol's own {mine}, erin's view of it {theirs}"
        ));
    }
    m.cell(
        Erin,
        req(Method::POST, "/v3/lease/revoke").body(json!({"ID": id})),
        404,
    )
    .await;
    let listed = m
        .cell(
            Erin,
            req(Method::POST, "/v3/lease/leases").body(json!({})),
            200,
        )
        .await;
    if listed["leases"]
        .as_array()
        .is_some_and(|l| l.iter().any(|x| x["ID"] == id))
    {
        m.wrong.push(format!("erin lists carol's lease: {listed}"));
    }
    let deleted = m
        .cell(
            Erin,
            kv("deleterange", json!({"key": "AA==", "range_end": "AA=="})),
            200,
        )
        .await;
    if deleted["deleted"] != "1" {
        m.wrong
            .push(format!("erin deleted more than her own key: {deleted}"));
    }
    let kept = m
        .cell(Carol, kv("range", json!({"key": shared})), 200)
        .await;
    if kept["kvs"][0]["value"] != "Y2Fyb2w=" {
        m.wrong
            .push(format!("carol's key after erin's delete: {kept}"));
    }

    // Operations stay open.
    for who in EVERYONE {
        m.cell(who, req(Method::GET, "/livez"), 200).await;
    }
    m.cell(Anonymous, req(Method::GET, "/readyz"), 200).await;
    m.cell(Anonymous, req(Method::GET, "/version"), 200).await;

    // Release: another principal's grant stays held, whatever secret is shown.
    let release = |r: &str| req(Method::DELETE, format!("/v1/leases/{r}"));
    m.other_principal(Alice, release("aisle-carol").secret(&carol_aisle_secret))
        .await;
    m.other_principal(Carol, release("aisle-alice").secret(&alice_secret))
        .await;
    m.cell(Bob, release("aisle-alice").secret(&alice_secret), 403)
        .await;
    for who in NOBODY {
        m.cell(who, release("aisle-alice").secret(&alice_secret), 401)
            .await;
    }
    m.cell(Alice, req(Method::GET, "/v1/leases/aisle-carol"), 200)
        .await;
    m.cell(Alice, req(Method::GET, "/v1/leases/aisle-alice"), 200)
        .await;
    m.cell(Alice, release("aisle-alice").secret(&alice_secret), 204)
        .await;
    m.cell(
        Carol,
        release("aisle-carol").secret(&carol_aisle_secret),
        204,
    )
    .await;
    m.cell(Alice, req(Method::GET, "/v1/leases/aisle-alice"), 404)
        .await;
    m.cell(Alice, req(Method::GET, "/v1/leases/aisle-carol"), 404)
        .await;

    let metrics = metrics_text(&proxy.url).await;
    // Acquire, renew and release are all the acquire operation: 6 + 3 + 1 + 3 anonymous cells.
    assert_eq!(auth_count(&metrics, "unauthenticated", "acquire"), 13.0);
    assert_eq!(auth_count(&metrics, "forbidden", "v3"), 4.0);
    assert_eq!(auth_count(&metrics, "authenticated", "v3"), 15.0);
    assert_eq!(auth_count(&metrics, "forbidden", "forward"), 3.0);

    assert!(
        m.wrong.is_empty(),
        "{} cells wrong:\n{}",
        m.wrong.len(),
        m.wrong.join("\n")
    );
    assert!(m.cells >= 60, "only {} cells", m.cells);
    eprintln!("{} cells", m.cells);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_has_a_line_per_grant_release_and_refusal() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let log = dir.path().join("audit.jsonl");
    std::fs::write(&tokens, token_file()).unwrap();
    let proxy = Proxy::on(&etcd, |c| {
        c.auth_tokens = Some(tokens.clone());
        c.audit_log = Some(log.clone());
    })
    .await;
    let url = &proxy.url;
    let as_ = |who: &str, b: reqwest::RequestBuilder| {
        b.header("authorization", format!("Bearer {who}"))
            .header("x-request-id", "req-under-audit")
    };
    let body = json!({"holder": "w", "ttl_seconds": 30});
    let (s, grant) = send(as_(
        ALICE,
        http().post(format!("{url}/v1/leases/aisle-9")).json(&body),
    ))
    .await;
    assert_eq!(s, 201);
    let secret = str_field(&grant, "secret");
    let (s, _) = send(as_(
        BOB,
        http().post(format!("{url}/v1/leases/aisle-9")).json(&body),
    ))
    .await;
    assert_eq!(s, 403);
    let (s, _) = send(http().post(format!("{url}/v1/leases/aisle-9")).json(&body)).await;
    assert_eq!(s, 401);
    let renew = format!("{url}/v1/leases/aisle-9/renew");
    let (s, _) = send(as_(
        CAROL,
        http().post(&renew).header("lease-secret", &secret),
    ))
    .await;
    assert_eq!(s, 403);
    let (s, _) = send(as_(
        ALICE,
        http()
            .delete(format!("{url}/v1/leases/aisle-9"))
            .header("lease-secret", &secret),
    ))
    .await;
    assert_eq!(s, 204);
    // An expiry, without waiting for a TTL: the lease is revoked behind the proxy's back.
    let (s, doomed) = send(as_(
        CAROL,
        http().post(format!("{url}/v1/leases/dock-9")).json(&body),
    ))
    .await;
    assert_eq!(s, 201);
    let mut client = etcd.client().await;
    client.lease_revoke(lease_id(&doomed)).await.unwrap();
    until(Duration::from_secs(10), "the expiry audited", || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("\"expire\"")
    })
    .await;
    // Stopping drains the writer.
    proxy.stop().await;

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let find = |event: &str, outcome: &str| {
        lines
            .iter()
            .find(|l| l["event"] == event && l["outcome"] == outcome)
            .unwrap_or_else(|| panic!("no {event}/{outcome} line in\n{text}"))
            .clone()
    };
    let token = str_field(&grant, "token");
    let g = find("grant", "ok");
    assert_eq!(
        (
            &g["principal"],
            &g["resource"],
            &g["token"],
            &g["request_id"]
        ),
        (
            &json!("alice"),
            &json!("aisle-9"),
            &json!(token),
            &json!("req-under-audit")
        )
    );
    assert!(g["time"].as_str().unwrap().ends_with('Z'), "{g}");
    let f = find("authz", "forbidden");
    assert_eq!(
        (&f["principal"], &f["op"]),
        (&json!("bob"), &json!("acquire"))
    );
    let u = find("authz", "unauthenticated");
    assert!(u.get("principal").is_none(), "{u}");
    let r = find("renew", "other-principal");
    assert_eq!(r["principal"], "carol");
    let rel = find("release", "ok");
    assert_eq!(
        (&rel["principal"], &rel["token"]),
        (&json!("alice"), &json!(token))
    );
    assert!(!text.contains(&secret), "no secret in the audit log");
    assert!(!text.contains(ALICE), "no bearer token in the audit log");
    let e = find("expire", "ok");
    assert_eq!(
        (&e["principal"], &e["resource"], &e["token"]),
        (&json!("carol"), &json!("dock-9"), &doomed["token"])
    );
    assert!(e.get("request_id").is_none(), "{e}");
    assert_eq!(lines.len(), 7, "{text}");
}

/// Runs the binary with `args` and nothing real to talk to (no etcd, a port of its own); its
/// exit status and standard error. A binary that starts serving instead of exiting is killed
/// after 20 s and reported as `None`.
fn exit_of(args: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    let port = lease_proxy_testkit::free_port();
    let mut child = Command::new(BIN)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd-endpoints", "http://127.0.0.1:1"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if exit_within(&mut child, Duration::from_secs(20)).is_none() {
        let _ = child.kill();
        let _ = child.wait();
        return (None, "still running after 20 s".into());
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_bad_token_file_stops_the_binary_with_64() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let first = token_file().lines().next().unwrap().to_owned();
    std::fs::write(
        &tokens,
        format!("{first}\nmallory {} write:*\n", sha256_hex("m")),
    )
    .unwrap();
    let missing = dir.path().join("missing");
    // A principal name is a key segment of its /v3 namespace: no `/`, nothing but [A-Za-z0-9._-].
    let slash = dir.path().join("slash");
    std::fs::write(
        &slash,
        format!(
            "{first}
team/a {} read:*
",
            sha256_hex("s")
        ),
    )
    .unwrap();
    for (file, says) in [
        (&tokens, "line 2"),
        (&missing, "cannot read the token file"),
        (&slash, "line 2: the principal name"),
    ] {
        let (code, stderr) = exit_of(&[
            "--auth-tokens".as_ref(),
            file.as_os_str(),
            "--data-dir".as_ref(),
            dir.path().as_os_str(),
        ]);
        assert_eq!(code, Some(64), "{file:?}: {stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET {path}` on an open connection, as `who`; the status. The connection stays open.
async fn raw_get(s: &mut tokio::net::TcpStream, path: &str, token: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request =
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).await.unwrap();
        assert_eq!(n, 1, "connection closed: {}", String::from_utf8_lossy(&buf));
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0; len];
    s.read_exact(&mut body).await.unwrap();
    head[9..12].parse().unwrap()
}

/// Writes `text` over `path` in place (same inode) keeping its length and modification time,
/// so only SIGHUP can tell the proxy it changed (a rename would: a new inode).
fn rewrite_unnoticed(path: &Path, text: &str) {
    use std::io::Write;
    let before = std::fs::metadata(path).unwrap();
    let len = usize::try_from(before.len()).unwrap();
    assert!(text.len() < len, "the new file must fit");
    let padded = format!("{text}#{}\n", "-".repeat(len - text.len() - 2));
    assert_eq!(padded.len(), len);
    let mut file = std::fs::File::options().write(true).open(path).unwrap();
    file.write_all(padded.as_bytes()).unwrap();
    file.set_modified(before.modified().unwrap()).unwrap();
}

/// Polls `GET path` on the connection as `token` until it answers `want` (within 10 s).
async fn until_on(s: &mut tokio::net::TcpStream, path: &str, token: &str, want: u16) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = raw_get(s, path, token).await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} as {token}: still {got}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_and_file_changes_reload_the_tokens_without_dropping_connections() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let line = |name: &str, token: &str| format!("{name} {} read:*\n", sha256_hex(token));
    // Room for the rewrites below to keep the same length.
    std::fs::write(
        &tokens,
        format!("{}#{}\n", line("alice", ALICE), "-".repeat(200)),
    )
    .unwrap();
    let port = lease_proxy_testkit::free_port();
    let child = Running(
        Command::new(BIN)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--etcd-endpoints", &etcd.endpoint(0)])
            .args(["--etcd-prefix", &lease_proxy_testkit::prefix("auth")])
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--auth-tokens")
            .arg(&tokens)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(&format!("http://127.0.0.1:{port}")).await;
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let path = "/v1/leases/aisle-1";
    assert_eq!(raw_get(&mut conn, path, ALICE).await, 404, "alice reads");
    assert_eq!(raw_get(&mut conn, path, DAVE).await, 401, "dave is unknown");

    // Dave in, alice out, unnoticeable by polling: only SIGHUP reloads.
    rewrite_unnoticed(&tokens, &line("dave", DAVE));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(raw_get(&mut conn, path, ALICE).await, 404, "no reload yet");
    lease_proxy_testkit::signal_pid(child.0.id(), "HUP");
    until_on(&mut conn, path, DAVE, 404).await;
    assert_eq!(raw_get(&mut conn, path, ALICE).await, 401, "alice removed");

    // A file that does not parse keeps the table in force.
    rewrite_unnoticed(&tokens, "dave not-a-hash read:*\n");
    lease_proxy_testkit::signal_pid(child.0.id(), "HUP");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(raw_get(&mut conn, path, DAVE).await, 404, "old table kept");

    // A change of the file is noticed without a signal.
    std::fs::write(&tokens, line("alice", ALICE)).unwrap();
    until_on(&mut conn, path, ALICE, 404).await;
    assert_eq!(raw_get(&mut conn, path, DAVE).await, 401, "dave removed");
    // Every answer above came on the one connection opened before the first reload.
    assert!(child.0.id() > 0);
}
