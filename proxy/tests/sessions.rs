//! Sessions against a real etcd: many grants on one heartbeat, ending together when the session
//! is closed or lapses, each with its own token and secret.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::time::Instant;

/// A holder key of the proxy's default prefix.
fn holder_key(resource: &str) -> Vec<u8> {
    format!("/lease-proxy/holders/{resource}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_holds_many_resources_on_one_lease_and_close_releases_all() {
    let etcd = Etcd::single().await;
    // No spare leases: their refill (granted in the background when the session opens) would
    // be counted among the acquires' proposals.
    let proxy = Proxy::start(etcd.endpoints(), |c| c.lease_spares = 0).await;
    let s = session(&proxy, "robot-1", 10).await;
    let before = etcd_proposals(&etcd).await;
    let mut grants = Vec::new();
    for i in 0..5 {
        let (status, grant) = acquire_in(&proxy, &format!("aisle-{i}"), "robot-1", &s).await;
        assert_eq!(status, 201, "{grant}");
        assert_eq!(grant["session"], s.0.as_str());
        assert_eq!(grant["ttl_seconds"], 10);
        assert_eq!(
            str_field(&grant, "lease_id"),
            s.0,
            "the grant lives on the session's lease"
        );
        // Counted from the session's last renewal (this acquire's, or one under a second ago).
        let expires = grant["expires_in_ms"].as_u64().unwrap();
        assert!((9_000..=10_100).contains(&expires), "{expires}");
        grants.push(grant);
    }
    // One transaction each and no lease grant: 5 proposals (the keepalive of each acquire is
    // none).
    let used = etcd_proposals(&etcd).await - before;
    assert_eq!(used, 5, "{used} proposals for 5 session acquires");
    // Each grant its own secret and token; the session's lease carries them all and the session
    // key.
    let secrets: std::collections::HashSet<_> =
        grants.iter().map(|g| str_field(g, "secret")).collect();
    assert_eq!(secrets.len(), 5);
    assert!(
        !secrets.contains(&s.1),
        "a grant's secret is not the session's"
    );
    let per_lease = keys_per_lease(&etcd).await;
    assert_eq!(
        per_lease.get(&s.0.parse::<i64>().unwrap()),
        Some(&6),
        "{per_lease:?}"
    );
    // Inspect: its resources, no secrets.
    let (status, view) = get_session(&proxy, &s.0).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        view["resources"],
        json!(["aisle-0", "aisle-1", "aisle-2", "aisle-3", "aisle-4"])
    );
    assert!(!view.to_string().contains(&s.1));
    // A resource held under a session refuses others like any grant.
    let (status, conflict) = acquire(&proxy, "aisle-2", "robot-2", 10).await;
    assert_eq!(
        (status, conflict["holder"].as_str()),
        (409, Some("robot-1"))
    );
    // Renewing a grant renews its session.
    let (status, renewed) = renew(&proxy, "aisle-3", &str_field(&grants[3], "secret")).await;
    assert_eq!(status, 200, "{renewed}");
    assert_eq!(renewed["token"], grants[3]["token"]);
    // Close: every grant ends at once, the session's lease is gone.
    assert_eq!(close_session(&proxy, &s).await.0, 204);
    for (i, grant) in grants.iter().enumerate() {
        let resource = format!("aisle-{i}");
        let (status, _) = send(http().get(format!("{}/v1/leases/{resource}", proxy.url))).await;
        assert_eq!(status, 404, "{resource} still held after close");
        let (status, body) = renew(&proxy, &resource, &str_field(grant, "secret")).await;
        assert_eq!(status, 410, "{resource}: {body}");
    }
    assert!(!snapshot(&etcd)
        .await
        .leases
        .contains(&s.0.parse::<i64>().unwrap()));
    // Closing again is a no-op; using the session is 410.
    assert_eq!(close_session(&proxy, &s).await.0, 204);
    let (status, body) = session_keepalive(&proxy, &s).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (410, Some("https://lease-proxy.dev/problems/session-lost"))
    );
    let (status, body) = acquire_in(&proxy, "aisle-9", "robot-1", &s).await;
    assert_eq!(status, 410, "{body}");
    let (status, body) = get_session(&proxy, &s.0).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (404, Some("https://lease-proxy.dev/problems/no-session"))
    );
    assert!(snapshot(&etcd)
        .await
        .kvs
        .iter()
        .all(|kv| !kv.0.starts_with(b"/lease-proxy/holders/")));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_session_releases_everything_and_its_grants_are_lost_everywhere() {
    let etcd = Etcd::shared().await;
    let Storage {
        url: storage,
        log: received,
    } = Storage::start().await;
    let proxy = Proxy::on(&etcd, |c| c.upstream = Some(storage.clone())).await;
    let other = proxy
        .replica(etcd.endpoints(), |c| c.upstream = Some(storage.clone()))
        .await;
    let s = session(&proxy, "robot-1", 2).await;
    let (status, a) = acquire_in(&proxy, "shelf-a", "robot-1", &s).await;
    assert_eq!(status, 201, "{a}");
    let (status, b) = acquire_in(&other, "shelf-b", "robot-1", &s).await;
    assert_eq!(status, 201, "{b}");
    // The heartbeat keeps both past several TTLs.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let (status, beat) = session_keepalive(&other, &s).await;
        assert_eq!(status, 200, "{beat}");
        assert_eq!(beat["ttl_seconds"], 2);
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    for resource in ["shelf-a", "shelf-b"] {
        let (status, _) = send(http().get(format!("{}/v1/leases/{resource}", proxy.url))).await;
        assert_eq!(status, 200, "{resource} lost under a live session");
    }
    // A forward while it lives carries the grant's own token.
    let (status, _) = send(
        http()
            .put(format!("{}/v1/leases/shelf-a/forward/items/1", proxy.url))
            .header("lease-secret", str_field(&a, "secret"))
            .body("x"),
    )
    .await;
    assert_eq!(status, 200);
    // Stop the heartbeat: both grants end together when the session lapses.
    let waiter = {
        let url = other.url.clone();
        tokio::spawn(async move { acquire_waiting(&url, "shelf-b", "robot-2", 10, 10_000).await })
    };
    let stopped = Instant::now();
    let (status, taken) = waiter.await.unwrap();
    assert_eq!(status, 201, "{taken}");
    assert!(
        stopped.elapsed() < Duration::from_secs(6),
        "the waiter got shelf-b {:?} after the heartbeat stopped",
        stopped.elapsed()
    );
    assert!(token(&taken) > token(&b), "tokens rise per resource");
    for (proxy, resource, grant) in [(&proxy, "shelf-a", &a), (&other, "shelf-b", &b)] {
        let secret = str_field(grant, "secret");
        let (status, body) = renew(proxy, resource, &secret).await;
        assert_eq!(status, 410, "{resource}: {body}");
        let (status, body) = send(
            http()
                .put(format!(
                    "{}/v1/leases/{resource}/forward/items/1",
                    proxy.url
                ))
                .header("lease-secret", &secret)
                .body("late"),
        )
        .await;
        assert_eq!(
            status, 410,
            "{resource} forwarded after its session lapsed: {body}"
        );
    }
    assert_eq!(received.len(), 1, "only the live grant's write arrived");
    assert_eq!(session_keepalive(&proxy, &s).await.0, 410);
    other.stop().await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_one_grant_of_a_session_keeps_the_others_and_is_never_renewed_after() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let other = proxy.replica(etcd.endpoints(), |_| {}).await;
    let s = session(&proxy, "robot-1", 30).await;
    // Released on one replica, renewed at once on the other: the other's watch-fed view may not
    // have seen the release yet, and the session's lease is alive — only the key says the grant
    // ended. Every renewal must be 410.
    for i in 0..30 {
        let resource = format!("bin-{i}");
        let (status, grant) = acquire_in(&proxy, &resource, "robot-1", &s).await;
        assert_eq!(status, 201, "{grant}");
        let secret = str_field(&grant, "secret");
        // Let the other replica's view see the grant.
        let (status, _) = renew(&other, &resource, &secret).await;
        assert_eq!(status, 200);
        assert_eq!(release(&proxy, &resource, &secret).await.0, 204);
        let (status, body) = renew(&other, &resource, &secret).await;
        assert_eq!(status, 410, "{resource} renewed after its release: {body}");
        // Idempotent.
        assert_eq!(release(&other, &resource, &secret).await.0, 204);
        // Taken again under the same session: a new grant, a higher token, a new secret; the
        // old secret is an ended grant's.
        let (status, again) = acquire_in(&proxy, &resource, "robot-1", &s).await;
        assert_eq!(status, 201, "{again}");
        assert!(token(&again) > token(&grant));
        assert_eq!(renew(&other, &resource, &secret).await.0, 410);
        assert_eq!(
            renew(&other, &resource, &str_field(&again, "secret"))
                .await
                .0,
            200
        );
    }
    let (_, view) = get_session(&other, &s.0).await;
    assert_eq!(view["resources"].as_array().unwrap().len(), 30);
    // The session lives on.
    assert_eq!(session_keepalive(&other, &s).await.0, 200);
    other.stop().await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_refuse_strangers_and_bad_input_changing_nothing() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let s = session(&proxy, "robot-1", 10).await;
    let (_, grant) = acquire_in(&proxy, "dock-1", "robot-1", &s).await;
    let grant_secret = str_field(&grant, "secret");
    let before = snapshot(&etcd).await;
    let post = |body: serde_json::Value, secret: Option<&str>| {
        let mut req = http()
            .post(format!("{}/v1/leases/dock-2", proxy.url))
            .json(&body);
        if let Some(secret) = secret {
            req = req.header("lease-secret", secret);
        }
        send(req)
    };
    let problem = |v: &serde_json::Value| {
        v["type"]
            .as_str()
            .unwrap_or_default()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    let other = session(&proxy, "robot-2", 10).await;
    let cases = [
        // No secret; another session's secret, a grant's secret (same lease id, other domain):
        // a secret that does not prove the session is answered as if there were none.
        (
            json!({"holder": "h", "session": s.0}),
            None,
            401,
            "missing-secret",
        ),
        (
            json!({"holder": "h", "session": s.0}),
            Some(other.1.as_str()),
            410,
            "session-lost",
        ),
        (
            json!({"holder": "h", "session": s.0}),
            Some(grant_secret.as_str()),
            410,
            "session-lost",
        ),
        // Not a session id; an id no session has.
        (
            json!({"holder": "h", "session": "abc"}),
            Some(s.1.as_str()),
            400,
            "invalid-field",
        ),
        (
            json!({"holder": "h", "session": "007"}),
            Some(s.1.as_str()),
            400,
            "invalid-field",
        ),
        (
            json!({"holder": "h", "session": 7}),
            Some(s.1.as_str()),
            400,
            "invalid-request",
        ),
        (
            json!({"holder": "h", "session": "12345"}),
            Some(s.1.as_str()),
            410,
            "session-lost",
        ),
        // A TTL that is not the session's; no TTL without a session.
        (
            json!({"holder": "h", "session": s.0, "ttl_seconds": 20}),
            Some(s.1.as_str()),
            400,
            "invalid-ttl",
        ),
        (json!({"holder": "h"}), None, 400, "invalid-request"),
    ];
    for (body, secret, status, kind) in cases {
        let (got, answer) = post(body.clone(), secret).await;
        assert_eq!(
            (got, problem(&answer)),
            (status, kind.to_owned()),
            "{body}: {answer}"
        );
    }
    // Keepalive and close with the wrong secret: as for an ended session (close is a no-op
    // 204, checked below: nothing changed); bad ids.
    let wrong = (s.0.clone(), other.1.clone());
    assert_eq!(session_keepalive(&proxy, &wrong).await.0, 410);
    assert_eq!(close_session(&proxy, &wrong).await.0, 204);
    let grant_as_session = (s.0.clone(), grant_secret.clone());
    assert_eq!(close_session(&proxy, &grant_as_session).await.0, 204);
    for id in ["x", "-1", "0", "1.5"] {
        let bad = (id.to_owned(), s.1.clone());
        assert_eq!(session_keepalive(&proxy, &bad).await.0, 400, "{id}");
        assert_eq!(get_session(&proxy, id).await.0, 400, "{id}");
    }
    for body in [
        json!({"holder": "h"}),
        json!({"holder": "h", "ttl_seconds": 1}),
        json!({"holder": "", "ttl_seconds": 10}),
        json!({"holder": "h", "ttl_seconds": 10, "extra": 1}),
    ] {
        let (status, answer) = send(
            http()
                .post(format!("{}/v1/sessions", proxy.url))
                .json(&body),
        )
        .await;
        assert_eq!(status, 400, "{body}: {answer}");
    }
    // None of it changed anything but the second session's key.
    let after = snapshot(&etcd).await;
    let without = |snap: &Snapshot, lease: i64| {
        snap.kvs
            .iter()
            .filter(|kv| kv.4 != lease)
            .cloned()
            .collect::<Vec<_>>()
    };
    let other_lease = other.0.parse::<i64>().unwrap();
    assert_eq!(without(&before, other_lease), without(&after, other_lease));
    // The session and its grant are intact.
    assert_eq!(renew(&proxy, "dock-1", &grant_secret).await.0, 200);
    assert_eq!(session_keepalive(&proxy, &s).await.0, 200);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_acquires_batch_into_few_proposals_each_with_its_own_outcome() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let s = session(&proxy, "robot-1", 30).await;
    // Held by someone else beforehand: its acquires under the session must be refused.
    let (_, held) = acquire(&proxy, "zone-held", "robot-9", 30).await;
    let before = etcd_proposals(&etcd).await;
    let resources: Vec<String> = (0..100)
        .map(|i| format!("zone-{i}"))
        .chain((0..20).map(|_| "zone-held".to_owned()))
        .chain((0..20).map(|_| "zone-hot".to_owned()))
        .collect();
    let results = futures::future::join_all(resources.iter().map(|r| {
        let (proxy, s) = (&proxy, &s);
        async move { (r.clone(), acquire_in(proxy, r, "robot-1", s).await) }
    }))
    .await;
    let used = etcd_proposals(&etcd).await - before;
    let mut hot_winners = 0;
    for (resource, (status, body)) in &results {
        match resource.as_str() {
            "zone-held" => {
                assert_eq!(status, &409, "{body}");
                assert_eq!(body["token"], held["token"]);
            }
            "zone-hot" => match status {
                201 => hot_winners += 1,
                409 => assert_eq!(body["holder"], "robot-1"),
                _ => panic!("zone-hot: {status} {body}"),
            },
            _ => assert_eq!(status, &201, "{resource}: {body}"),
        }
    }
    assert_eq!(
        hot_winners, 1,
        "one grant per resource, whatever shares a batch"
    );
    assert!(
        used < 140,
        "{used} proposals for 140 concurrent acquires: nothing was batched"
    );
    let keys = snapshot(&etcd).await.kvs;
    let mine = keys
        .iter()
        .filter(|kv| {
            kv.0.starts_with(b"/lease-proxy/holders/zone-") && kv.4 == s.0.parse::<i64>().unwrap()
        })
        .count();
    assert_eq!(mine, 101);
    assert!(keys.iter().any(|kv| kv.0 == holder_key("zone-held")));
    proxy.stop().await;
}

/// Pre-fence, idempotency and authorisation take the same paths under a session: a withdrawn
/// grant ends alone (the session and its other grants live on), a keyed retry gets its grant
/// back only under its own session, and only the opening principal may use a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefence_idempotency_and_principals_work_under_sessions() {
    let etcd = Etcd::single().await;
    // An enforcer nobody listens on: every pre-fence fails.
    let dead = format!("http://127.0.0.1:{}", lease_proxy_testkit::free_port());
    let plain = Proxy::start(etcd.endpoints(), |_| {}).await;
    let fencing = plain
        .replica(etcd.endpoints(), |c| c.prefence_url = Some(dead.clone()))
        .await;
    let s = session(&plain, "robot-1", 20).await;
    let (status, kept) = acquire_in(&plain, "kept", "robot-1", &s).await;
    assert_eq!(status, 201, "{kept}");
    let (status, body) = acquire_in(&fencing, "withdrawn", "robot-1", &s).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["type"],
        format!("{}prefence-failed", lease_proxy::PROBLEM_BASE)
    );
    let (_, view) = get_session(&plain, &s.0).await;
    assert_eq!(view["resources"], json!(["kept"]), "{view}");
    assert_eq!(
        renew(&plain, "kept", &str_field(&kept, "secret")).await.0,
        200
    );
    assert_eq!(session_keepalive(&plain, &s).await.0, 200);

    // Idempotency-Key: the same grant again under the same session, never under another.
    let keyed = |s: &(String, String)| {
        http()
            .post(format!("{}/v1/leases/keyed", plain.url))
            .header("lease-secret", &s.1)
            .header("idempotency-key", "retry-me-7f3a9c")
            .json(&json!({"holder": "robot-1", "session": s.0}))
    };
    let (status, first) = send(keyed(&s)).await;
    assert_eq!(status, 201, "{first}");
    let (status, again) = send(keyed(&s)).await;
    assert_eq!(status, 201, "{again}");
    assert_eq!(
        (again["secret"].clone(), again["token"].clone()),
        (first["secret"].clone(), first["token"].clone())
    );
    let other = session(&plain, "robot-1", 20).await;
    let (status, body) = send(keyed(&other)).await;
    assert_eq!(status, 409, "another session replayed the grant: {body}");
    fencing.stop().await;
    plain.stop().await;

    // Principals: only the opener uses a session; each grant still needs `acquire` on its
    // resource.
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let line = |name: &str, token: &str, perms: &str| {
        format!(
            "{name} {} {perms}\n",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()))
        )
    };
    std::fs::write(
        &tokens,
        line("alice", "alice-token-1", "acquire:aisle-,read:*")
            + &line("carol", "carol-token-1", "acquire:*,read:*"),
    )
    .unwrap();
    let authed = Proxy::start(etcd.endpoints(), |c| c.auth_tokens = Some(tokens.clone())).await;
    let as_ = |token: &str, req: reqwest::RequestBuilder| req.bearer_auth(token.to_owned());
    let (status, opened) = send(as_(
        "alice-token-1",
        http()
            .post(format!("{}/v1/sessions", authed.url))
            .json(&json!({"holder": "alice-bot", "ttl_seconds": 20})),
    ))
    .await;
    assert_eq!(status, 201, "{opened}");
    let (id, secret) = (
        str_field(&opened, "session_id"),
        str_field(&opened, "secret"),
    );
    let under = |token: &str, resource: &str| {
        as_(
            token,
            http()
                .post(format!("{}/v1/leases/{resource}", authed.url))
                .header("lease-secret", &secret)
                .json(&json!({"holder": "alice-bot", "session": id})),
        )
    };
    assert_eq!(send(under("alice-token-1", "aisle-1")).await.0, 201);
    let (status, body) = send(under("alice-token-1", "dock-1")).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (403, Some("https://lease-proxy.dev/problems/forbidden"))
    );
    // To another principal, even with the secret, the session is as good as ended.
    let (status, body) = send(under("carol-token-1", "aisle-2")).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (410, Some("https://lease-proxy.dev/problems/session-lost")),
        "carol used alice's session"
    );
    let keepalive = |token: &str| {
        as_(
            token,
            http()
                .post(format!("{}/v1/sessions/{id}/keepalive", authed.url))
                .header("lease-secret", &secret),
        )
    };
    assert_eq!(send(keepalive("carol-token-1")).await.0, 410);
    assert_eq!(send(keepalive("alice-token-1")).await.0, 200);
    let close = |token: &str| {
        as_(
            token,
            http()
                .delete(format!("{}/v1/sessions/{id}", authed.url))
                .header("lease-secret", &secret),
        )
    };
    assert_eq!(send(close("carol-token-1")).await.0, 204);
    assert_eq!(
        send(keepalive("alice-token-1")).await.0,
        200,
        "carol closed it"
    );
    assert_eq!(
        send(
            http()
                .delete(format!("{}/v1/sessions/{id}", authed.url))
                .header("lease-secret", &secret)
        )
        .await
        .0,
        401
    );
    assert_eq!(send(close("alice-token-1")).await.0, 204);
    authed.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_answers_the_current_holders_ttl_when_the_view_names_an_earlier_holders_live_lease() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let other = proxy.replica(etcd.endpoints(), |_| {}).await;
    // Two sessions whose leases both stay alive. The resource passes from the long session to
    // the short one through `other`, so `proxy`'s watch-fed view names the long session's lease
    // until its watch delivers the change. A GET on `proxy` asks the guessed lease's TTL at the
    // same time as the record: while readers GET without pause, some read the record of the
    // short grant with the view still on the long one — each must answer the short grant's TTL
    // (its own lease's), never the long session's.
    let long = session(&proxy, "robot-long", 60).await;
    let short = session(&other, "robot-short", 3).await;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The short session is kept alive every second, however long the rounds take on a loaded
    // machine: its TTL stays 3 s, distinct from the long session's 60.
    let keeper = {
        let (url, (id, secret), done) = (other.url.clone(), short.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let (status, body) = send(
                    http()
                        .post(format!("{url}/v1/sessions/{id}/keepalive"))
                        .header("lease-secret", &secret),
                )
                .await;
                assert_eq!(status, 200, "the short session's keepalive: {body}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (url, done) = (proxy.url.clone(), done.clone());
            tokio::spawn(async move {
                let mut short_seen = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    for i in 0..30 {
                        let (status, now) =
                            send(http().get(format!("{url}/v1/leases/shelf-{i}"))).await;
                        if status != 200 || now["holder"] != "robot-short" {
                            continue;
                        }
                        short_seen += 1;
                        let expires = now["expires_in_ms"].as_u64().unwrap();
                        assert!(
                            expires <= 3_000,
                            "the short grant answered with {expires} ms (an earlier holder's \
                             lease): {now}"
                        );
                    }
                }
                short_seen
            })
        })
        .collect();
    for round in 0..3 {
        for i in 0..30 {
            let resource = format!("shelf-{i}");
            let (status, first) = acquire_in(&proxy, &resource, "robot-long", &long).await;
            assert_eq!(status, 201, "{round}: {first}");
            let secret = str_field(&first, "secret");
            assert_eq!(release(&other, &resource, &secret).await.0, 204);
            let (status, second) = acquire_in(&other, &resource, "robot-short", &short).await;
            assert_eq!(status, 201, "{second}");
            let (status, now) =
                send(http().get(format!("{}/v1/leases/{resource}", proxy.url))).await;
            assert_eq!((status, &now["token"]), (200, &second["token"]), "{now}");
            assert!(now["expires_in_ms"].as_u64().unwrap() <= 3_000, "{now}");
            assert_eq!(
                release(&other, &resource, &str_field(&second, "secret"))
                    .await
                    .0,
                204
            );
        }
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut short_seen = 0;
    for reader in readers {
        short_seen += reader.await.unwrap();
    }
    assert!(short_seen > 0, "no reader saw a short grant");
    keeper.await.unwrap();
    other.stop().await;
    proxy.stop().await;
}
