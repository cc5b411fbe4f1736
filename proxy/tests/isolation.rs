//! Tenants of one proxy (`--auth-tokens`) neither see nor block each other through `/v1`: a
//! list and its cursors stay inside the caller's read prefixes, a session is seen and proven
//! only by its principal (another principal cannot even tell that it exists), and one principal
//! cannot take every event-stream slot of a replica.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use common::*;
use lease_proxy_testkit::poll::{eventually, Probe};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const WRITER: &str = "writer-token-4be1c0";
const ALPHA: &str = "alpha-token-0d97aa";
const MULTI: &str = "multi-token-71c3e2";
const ALL: &str = "all-token-c5a0b4";
const ACME: &str = "acme-token-b21f67";
const GLOBEX: &str = "globex-token-e803d9";

/// writer acquires anything; alpha reads `a-`; multi reads `b-` and `d-`; all reads
/// everything; acme and globex each acquire and read their own prefix.
fn token_file(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("tokens");
    let line = |name: &str, token: &str, perms: &str| {
        format!(
            "{name} {} {perms}\n",
            hex::encode(Sha256::digest(token.as_bytes()))
        )
    };
    let text = [
        line("writer", WRITER, "acquire:*"),
        line("alpha", ALPHA, "read:a-"),
        line("multi", MULTI, "read:d-,read:b-"),
        line("all", ALL, "read:*"),
        line("acme", ACME, "acquire:acme-,read:acme-"),
        line("globex", GLOBEX, "acquire:globex-,read:globex-"),
    ]
    .concat();
    std::fs::write(&path, text).unwrap();
    path
}

/// One request as `token` (with a `Lease-Secret` and a JSON body if given): status, body.
async fn call(
    method: Method,
    url: String,
    token: &str,
    secret: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = http().request(method, url).bearer_auth(token);
    if let Some(secret) = secret {
        req = req.header("lease-secret", secret);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    send(req).await
}

/// Every page of `GET /v1/leases?prefix=…&limit=…` as `token`, starting at `cursor`: the names
/// of each page, and the resource each `next_cursor` names.
async fn pages(
    proxy: &Proxy,
    token: &str,
    prefix: &str,
    limit: usize,
    mut cursor: Option<String>,
) -> (Vec<Vec<String>>, Vec<String>) {
    let (mut pages, mut cursors) = (Vec::new(), Vec::new());
    loop {
        let mut url = format!("{}/v1/leases?prefix={prefix}&limit={limit}", proxy.url);
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let (status, page) = call(Method::GET, url, token, None, None).await;
        assert_eq!(status, 200, "{page}");
        let names: Vec<String> = page["leases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| str_field(h, "resource"))
            .collect();
        pages.push(names);
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        let Some(c) = &cursor else {
            return (pages, cursors);
        };
        let named = String::from_utf8(URL_SAFE_NO_PAD.decode(c).unwrap()).unwrap();
        cursors.push(named);
        assert!(pages.len() < 100, "the pages never end: {pages:?}");
    }
}

fn flat(pages: &[Vec<String>]) -> Vec<String> {
    pages.concat()
}

/// D1: with `read:a-` a principal pages through `a-…` only; every `next_cursor` names a
/// resource it was shown (never another tenant's), several prefixes are listed in key order,
/// and a hand-made cursor shows nothing outside the caller's prefixes either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_and_its_cursors_stay_inside_the_callers_read_prefixes() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(&dir);
    let proxy = Proxy::on(&etcd, |c| c.auth_tokens = Some(tokens.clone())).await;
    let held = [
        "a-1", "a-2", "a-3", "ab-1", "b-1", "c-1", "c-2", "d-1", "d-2", "e-1",
    ];
    for r in held {
        let (s, body) = call(
            Method::POST,
            format!("{}/v1/leases/{r}", proxy.url),
            WRITER,
            None,
            Some(json!({"holder": "w", "ttl_seconds": 30})),
        )
        .await;
        assert_eq!(s, 201, "{body}");
    }
    let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();

    // One entry a page: exactly alpha's resources, no empty page, every cursor one of them.
    let (alpha, cursors) = pages(&proxy, ALPHA, "", 1, None).await;
    assert_eq!(cursors, names(&["a-1", "a-2"]), "alpha's cursors");
    assert_eq!(flat(&alpha), names(&["a-1", "a-2", "a-3"]));
    assert!(alpha.iter().all(|p| p.len() == 1), "{alpha:?}");
    // Asked prefixes are intersected with the caller's.
    for (prefix, want) in [
        ("a-2", &["a-2"][..]),
        ("a", &["a-1", "a-2", "a-3"]),
        ("ab-", &[]),
        ("b-", &[]),
    ] {
        let (got, cursors) = pages(&proxy, ALPHA, prefix, 1, None).await;
        assert_eq!(flat(&got), names(want), "alpha, prefix {prefix:?}");
        assert!(
            cursors.iter().all(|c| want.contains(&c.as_str())),
            "{cursors:?}"
        );
    }

    // Two prefixes, in key order whatever the token file's order, paged across both.
    for limit in [1, 2, 3, 100] {
        let (multi, cursors) = pages(&proxy, MULTI, "", limit, None).await;
        assert_eq!(flat(&multi), names(&["b-1", "d-1", "d-2"]), "limit {limit}");
        let shown = flat(&multi);
        assert!(cursors.iter().all(|c| shown.contains(c)), "{cursors:?}");
    }
    let (multi, _) = pages(&proxy, MULTI, "d", 100, None).await;
    assert_eq!(flat(&multi), names(&["d-1", "d-2"]));

    // A hand-made cursor is a position, not a permission: after another tenant's name, or
    // before everything, the caller still sees only its own.
    let cursor = |r: &str| Some(URL_SAFE_NO_PAD.encode(r));
    for (after, want) in [
        ("0", &["a-1", "a-2", "a-3"][..]),
        ("a-1", &["a-2", "a-3"]),
        ("ab-1", &[]),
        ("c-1", &[]),
    ] {
        let (got, cursors) = pages(&proxy, ALPHA, "", 1, cursor(after)).await;
        assert_eq!(flat(&got), names(want), "alpha after {after}");
        assert!(
            cursors.iter().all(|c| want.contains(&c.as_str())),
            "{cursors:?}"
        );
    }
    let (got, _) = pages(&proxy, MULTI, "", 1, cursor("c-2")).await;
    assert_eq!(flat(&got), names(&["d-1", "d-2"]));

    // `read:*` pages through everything, as without authentication.
    let (every, cursors) = pages(&proxy, ALL, "", 4, None).await;
    assert_eq!(flat(&every), names(&held));
    assert_eq!(cursors, names(&["ab-1", "d-1"]));
    proxy.stop().await;
}

/// D4: acme's session is invisible to globex — `GET` answers as for a session that does not
/// exist, and keepalive, close and acquire under it answer exactly as for an absent session,
/// whatever secret globex shows — while `read:*` sees it and acme uses it. A forged secret on
/// one's own session answers as an absent session too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_seen_and_proven_only_by_its_principal() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(&dir);
    let log = dir.path().join("audit.jsonl");
    let proxy = Proxy::on(&etcd, |c| {
        c.auth_tokens = Some(tokens.clone());
        c.audit_log = Some(log.clone());
    })
    .await;
    let url = &proxy.url;
    let (s, opened) = call(
        Method::POST,
        format!("{url}/v1/sessions"),
        ACME,
        None,
        Some(json!({"holder": "acme-robot", "ttl_seconds": 30})),
    )
    .await;
    assert_eq!(s, 201, "{opened}");
    let id = str_field(&opened, "session_id");
    let secret = str_field(&opened, "secret");
    let (s, grant) = call(
        Method::POST,
        format!("{url}/v1/leases/acme-1"),
        ACME,
        Some(&secret),
        Some(json!({"holder": "acme-robot", "session": id})),
    )
    .await;
    assert_eq!(s, 201, "{grant}");
    // A session id nobody has: the next ids etcd hands out are its neighbours.
    let (s, other) = call(
        Method::POST,
        format!("{url}/v1/sessions"),
        GLOBEX,
        None,
        Some(json!({"holder": "g", "ttl_seconds": 30})),
    )
    .await;
    assert_eq!(s, 201);
    let other_secret = str_field(&other, "secret");
    let absent = (str_field(&other, "session_id").parse::<i64>().unwrap() + 1000).to_string();
    let forged = {
        // The shape of a secret, sealed by nobody.
        let mut bytes = URL_SAFE_NO_PAD.decode(&secret).unwrap();
        bytes[30] ^= 1;
        URL_SAFE_NO_PAD.encode(bytes)
    };

    // GET: globex sees what it sees of an absent session; `read:*` and acme see it.
    let get = |token: &'static str, id: String| {
        call(
            Method::GET,
            format!("{url}/v1/sessions/{id}"),
            token,
            None,
            None,
        )
    };
    let nothing = get(GLOBEX, absent.clone()).await;
    assert_eq!(nothing.0, 404, "{}", nothing.1);
    assert_eq!(get(GLOBEX, id.clone()).await, nothing, "globex's view");
    for token in [ALL, ACME] {
        let (s, view) = get(token, id.clone()).await;
        assert_eq!(s, 200, "{view}");
        assert_eq!(view["holder"], "acme-robot");
    }
    assert_eq!(
        get(ACME, id.clone()).await.1["resources"],
        json!(["acme-1"])
    );

    // Keepalive, close and acquire under it: globex's answers, with any secret, are those
    // of an absent session (same status, same body); so are acme's with a forged secret.
    let keepalive = |token: &'static str, id: String, secret: String| async move {
        call(
            Method::POST,
            format!("{url}/v1/sessions/{id}/keepalive"),
            token,
            Some(&secret),
            None,
        )
        .await
    };
    let close = |token: &'static str, id: String, secret: String| async move {
        call(
            Method::DELETE,
            format!("{url}/v1/sessions/{id}"),
            token,
            Some(&secret),
            None,
        )
        .await
    };
    let acquire = |token: &'static str, id: String, secret: String| async move {
        let resource = if token == ACME { "acme-2" } else { "globex-2" };
        call(
            Method::POST,
            format!("{url}/v1/leases/{resource}"),
            token,
            Some(&secret),
            Some(json!({"holder": "x", "session": id})),
        )
        .await
    };
    let gone = keepalive(GLOBEX, absent.clone(), forged.clone()).await;
    assert_eq!(gone.0, 410, "{}", gone.1);
    let closed = close(GLOBEX, absent.clone(), forged.clone()).await;
    assert_eq!(closed.0, 204, "{}", closed.1);
    let lost = acquire(GLOBEX, absent.clone(), forged.clone()).await;
    assert_eq!(lost.0, 410, "{}", lost.1);
    let mut wrong = Vec::new();
    for (who, token, shown) in [
        ("globex, forged", GLOBEX, forged.clone()),
        ("globex, its own session's", GLOBEX, other_secret.clone()),
        (
            "globex, acme's grant's",
            GLOBEX,
            str_field(&grant, "secret"),
        ),
        ("globex, the session's own", GLOBEX, secret.clone()),
        ("acme, forged", ACME, forged.clone()),
    ] {
        let got = keepalive(token, id.clone(), shown.clone()).await;
        if got != gone {
            wrong.push(format!("{who}: keepalive {got:?}, absent {gone:?}"));
        }
        let got = acquire(token, id.clone(), shown.clone()).await;
        if got != lost {
            wrong.push(format!("{who}: acquire {got:?}, absent {lost:?}"));
        }
        let got = close(token, id.clone(), shown.clone()).await;
        if got != closed {
            wrong.push(format!("{who}: close {got:?}, absent {closed:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // None of it touched the session: acme keeps it alive and still holds its grant.
    let (s, beat) = keepalive(ACME, id.clone(), secret.clone()).await;
    assert_eq!(s, 200, "{beat}");
    assert_eq!(
        get(ACME, id.clone()).await.1["resources"],
        json!(["acme-1"])
    );
    assert_eq!(close(ACME, id.clone(), secret.clone()).await.0, 204);
    assert_eq!(get(ACME, id.clone()).await, nothing);
    proxy.stop().await;
    // The audit log tells the truth the answers hide.
    let text = std::fs::read_to_string(&log).unwrap();
    let refused = |principal: &str, why: &str| {
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|l| {
                l["event"] == "session"
                    && l["outcome"] == why
                    && l["principal"] == principal
                    && l["session"] == id.as_str()
            })
            .count()
    };
    // Keepalive and acquire, for each of globex's four secrets and acme's forged one.
    assert_eq!(refused("globex", "other-principal"), 8, "{text}");
    assert_eq!(refused("acme", "wrong-secret"), 2, "{text}");
}

/// Opens `GET /v1/watch` as `token`: the response (kept open while held).
async fn watch(proxy: &Proxy, token: &str) -> reqwest::Response {
    reqwest::Client::new()
        .get(format!("{}/v1/watch", proxy.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

/// How many streams `token` opens before it is refused, and the refusal.
async fn streams_until_refused(
    proxy: &Proxy,
    token: &str,
) -> (Vec<reqwest::Response>, u16, Value, Option<String>) {
    let mut open = Vec::new();
    loop {
        let r = watch(proxy, token).await;
        if r.status() == 200 {
            open.push(r);
            assert!(open.len() <= 64, "never refused");
            continue;
        }
        let status = r.status().as_u16();
        let retry_after = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let body: Value = r.json().await.unwrap();
        return (open, status, body, retry_after);
    }
}

/// D5: at `--max-watch-streams 8` one principal gets its share (a quarter by default) and is
/// then refused 429 `quota-exceeded` with `Retry-After`; other principals still get streams, and
/// once the replica is full, 503 `too-many-watches` with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_principal_cannot_take_every_event_stream_slot() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(&dir);
    let proxy = Proxy::on(&etcd, |c| {
        c.auth_tokens = Some(tokens.clone());
        c.max_watch_streams = 8;
    })
    .await;
    let (mut hog, status, problem, retry_after) = streams_until_refused(&proxy, ALPHA).await;
    assert_eq!(
        (hog.len(), status),
        (2, 429),
        "alpha's streams, then: {problem}"
    );
    assert!(
        str_field(&problem, "type").ends_with("/quota-exceeded"),
        "{problem}"
    );
    assert_eq!(problem["quota"], "watch-streams");
    assert!(retry_after.is_some_and(|s| s.parse::<u64>().unwrap() >= 1));
    // Others still get theirs, until the replica is full.
    let mut others = Vec::new();
    for token in [MULTI, ALL, ACME] {
        let (open, status, _, _) = streams_until_refused(&proxy, token).await;
        assert_eq!((open.len(), status), (2, 429), "{token}");
        others.extend(open);
    }
    let (none, status, problem, retry_after) = streams_until_refused(&proxy, GLOBEX).await;
    assert_eq!((none.len(), status), (0, 503), "{problem}");
    assert!(str_field(&problem, "type").ends_with("/too-many-watches"));
    assert!(retry_after.is_some(), "503 without Retry-After");
    // A stream alpha closes is a slot alpha may take again.
    drop(hog.pop());
    let (again, _) = eventually(Duration::from_secs(10), "alpha's slot back", || async {
        match watch(&proxy, ALPHA).await {
            r if r.status() == 200 => Probe::Done(r),
            r => Probe::Not(r.status().to_string()),
        }
    })
    .await;
    hog.push(again);
    let metrics = metrics_text(&proxy.url).await;
    assert!(
        metrics.contains("lease_proxy_quota_refusals_total{quota=\"watch-streams\""),
        "{metrics}"
    );
    drop((hog, others));
    proxy.stop().await;
}
