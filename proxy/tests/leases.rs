//! The lease lifecycle over HTTP against a real single-member etcd.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_contenders_one_winner() {
    // Without spare leases every refused acquire revokes its lease; with them (the default) the
    // refused leases carry no key and are reused, so etcd's lease count stops growing.
    for spares in [0, 256] {
        let etcd = Etcd::single().await;
        let proxy = Proxy::start(etcd.endpoints(), |c| c.lease_spares = spares).await;
        let attempts = (0..50).map(|i| {
            let proxy = &proxy;
            async move { acquire(proxy, "aisle-1", &format!("robot-{i}"), 10).await }
        });
        let results = futures::future::join_all(attempts).await;
        let winners: Vec<_> = results.iter().filter(|(s, _)| *s == 201).collect();
        let losers: Vec<_> = results.iter().filter(|(s, _)| *s == 409).collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        assert_eq!(losers.len(), 49, "{results:?}");
        let winner = &winners[0].1;
        for (_, conflict) in losers {
            assert_eq!(conflict["holder"], winner["holder"]);
            assert_eq!(conflict["token"], winner["token"]);
            assert!(conflict.get("secret").is_none() && conflict.get("fencing_token").is_none());
        }
        // Only the winner's lease carries a key.
        let with_keys = keys_per_lease(&etcd).await;
        assert_eq!(
            with_keys.keys().copied().collect::<Vec<_>>(),
            vec![lease_id(winner)]
        );
        // Spares granted ahead of demand (one refill, started by the first acquire) settle.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let leases = snapshot(&etcd).await.leases;
        if spares == 0 {
            assert_eq!(
                leases,
                vec![lease_id(winner)],
                "refused leases were not given back"
            );
            continue;
        }
        // 100 more refusals, one at a time, reuse the spares: no new lease is granted.
        for i in 0..100 {
            assert_eq!(
                acquire(&proxy, "aisle-1", &format!("late-{i}"), 10).await.0,
                409
            );
        }
        let after = snapshot(&etcd).await.leases;
        assert!(
            after.len() <= leases.len(),
            "{} leases, then {}",
            leases.len(),
            after.len()
        );
        assert_eq!(keys_per_lease(&etcd).await, with_keys);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_handovers_strictly_increasing_tokens() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let keys = proxy.keyring();
    let mut last = 0u64;
    for i in 0..100 {
        let (status, grant) = acquire(&proxy, "shard-7", &format!("owner-{i}"), 5).await;
        assert_eq!(status, 201, "{grant}");
        let t = token(&grant);
        assert!(t > last, "token {t} after {last}");
        last = t;
        let verified = keys
            .verify("shard-7", &str_field(&grant, "fencing_token"))
            .unwrap();
        assert_eq!(verified.revision, t);
        let (status, _) = release(&proxy, "shard-7", &str_field(&grant, "secret")).await;
        assert_eq!(status, 204);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_holder_is_replaced_by_a_waiter() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;

    // 1. A holder that stops renewing: its lease lapses after the TTL.
    let ttl = 3;
    let (_, a) = acquire(&proxy, "cron-nightly", "a", ttl).await;
    let started = Instant::now();
    let (status, b) = send(
        http()
            .post(format!("{}/v1/leases/cron-nightly", proxy.url))
            .json(&json!({"holder": "b", "ttl_seconds": 5, "wait_ms": 15000})),
    )
    .await;
    assert_eq!(status, 201, "{b}");
    assert!(token(&b) > token(&a));
    let waited = started.elapsed();
    assert!(
        waited <= Duration::from_secs(ttl + 1),
        "took over after {waited:?}"
    );
    // The lifetime is measured from the request's arrival, so it includes the time waited — but
    // never more than the client itself saw pass.
    let expires = b["expires_in_ms"].as_u64().unwrap();
    assert!(
        expires > 5000 + 1000,
        "expires_in_ms {expires} ignores the wait"
    );
    assert!(
        expires <= 5000 + waited.as_millis() as u64,
        "expires_in_ms {expires} overstates"
    );

    // 2. A holder whose lease is revoked behind its back: the waiter is woken by the watch.
    let mut client = etcd.client().await;
    let waiter = {
        let url = proxy.url.clone();
        tokio::spawn(async move {
            send(
                http()
                    .post(format!("{url}/v1/leases/cron-nightly"))
                    .json(&json!({"holder": "c", "ttl_seconds": 5, "wait_ms": 15000})),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let revoked_at = Instant::now();
    client.lease_revoke(lease_id(&b)).await.unwrap();
    let (status, c) = waiter.await.unwrap();
    assert_eq!(status, 201, "{c}");
    assert!(token(&c) > token(&b));
    assert!(
        revoked_at.elapsed() < Duration::from_secs(2),
        "woken late: {:?}",
        revoked_at.elapsed()
    );

    // 3. A waiter whose wait runs out gets the conflict, with Retry-After.
    let resp = http()
        .post(format!("{}/v1/leases/cron-nightly", proxy.url))
        .json(&json!({"holder": "d", "ttl_seconds": 5, "wait_ms": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=5).contains(&retry));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_the_lease_past_its_ttl() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let (_, grant) = acquire(&proxy, "singleton", "worker", 2).await;
    let secret = str_field(&grant, "secret");
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let (status, renewed) = renew(&proxy, "singleton", &secret).await;
        assert_eq!(status, 200, "{renewed}");
        assert_eq!(renewed["ttl_seconds"], 2);
        assert_eq!(renewed["expires_in_ms"], 2000);
        assert_eq!(renewed["token"], grant["token"]);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (status, held) = send(http().get(format!("{}/v1/leases/singleton", proxy.url))).await;
    assert_eq!(status, 200);
    assert_eq!(held["holder"], "worker");
    assert_eq!(held["token"], grant["token"]);
    assert!(held.get("secret").is_none() && held.get("fencing_token").is_none());
    assert_eq!(acquire(&proxy, "singleton", "other", 5).await.0, 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secrets_are_rejected_and_change_nothing() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let (_, a) = acquire(&proxy, "res-a", "alice", 30).await;
    let (_, b) = acquire(&proxy, "res-b", "bob", 30).await;
    let secret_a = str_field(&a, "secret");
    let secret_b = str_field(&b, "secret");
    // Same lease id, different secret bytes: a forgery of the current grant.
    let mut forged = secret_a.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });

    let before = snapshot(&etcd).await;
    let cases: Vec<(&str, reqwest::RequestBuilder, u16)> = vec![
        (
            "forged renew",
            http()
                .post(format!("{}/v1/leases/res-a/renew", proxy.url))
                .header("lease-secret", &forged),
            403,
        ),
        (
            "forged release",
            http()
                .delete(format!("{}/v1/leases/res-a", proxy.url))
                .header("lease-secret", &forged),
            403,
        ),
        (
            "garbage secret",
            http()
                .post(format!("{}/v1/leases/res-a/renew", proxy.url))
                .header("lease-secret", "nope"),
            403,
        ),
        (
            "missing secret renew",
            http().post(format!("{}/v1/leases/res-a/renew", proxy.url)),
            401,
        ),
        (
            "missing secret release",
            http().delete(format!("{}/v1/leases/res-a", proxy.url)),
            401,
        ),
        (
            "bob renews alice's lease",
            http()
                .post(format!("{}/v1/leases/res-a/renew", proxy.url))
                .header("lease-secret", &secret_b),
            410,
        ),
    ];
    for (name, req, want) in cases {
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), want, "{name}");
        assert_eq!(
            resp.headers()["content-type"],
            "application/problem+json",
            "{name}"
        );
    }
    assert_eq!(
        snapshot(&etcd).await,
        before,
        "a rejected request changed etcd"
    );

    // Bob releasing with his secret on alice's resource is a no-op: alice still holds it.
    assert_eq!(release(&proxy, "res-a", &secret_b).await.0, 204);
    assert_eq!(snapshot(&etcd).await, before);

    // Release is idempotent for the holder.
    assert_eq!(release(&proxy, "res-a", &secret_a).await.0, 204);
    assert_eq!(release(&proxy, "res-a", &secret_a).await.0, 204);
    // After release, renewing is "lost".
    let (status, body) = renew(&proxy, "res-a", &secret_a).await;
    assert_eq!(status, 410, "{body}");
    assert_eq!(
        body["type"],
        format!("{}lease-lost", lease_proxy::PROBLEM_BASE)
    );

    // Renew after expiry (lease revoked in etcd): 410, and a new holder is unaffected.
    let mut client = etcd.client().await;
    client.lease_revoke(lease_id(&b)).await.unwrap();
    assert_eq!(renew(&proxy, "res-b", &secret_b).await.0, 410);
    let (_, c) = acquire(&proxy, "res-b", "carol", 30).await;
    assert_eq!(renew(&proxy, "res-b", &secret_b).await.0, 410);
    assert_eq!(
        renew(&proxy, "res-b", &str_field(&c, "secret")).await.0,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_returns_the_same_grant() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let replica = proxy.replica(etcd.endpoints(), |_| {}).await;
    let req = |p: &Proxy, holder: &str, key: &str| {
        http()
            .post(format!("{}/v1/leases/job-1", p.url))
            .header("idempotency-key", key)
            .json(&json!({"holder": holder, "ttl_seconds": 20}))
    };
    let (s1, first) = send(req(&proxy, "w1", "attempt-42")).await;
    let (s2, again) = send(req(&proxy, "w1", "attempt-42")).await;
    let (s3, via_replica) = send(req(&replica, "w1", "attempt-42")).await;
    assert_eq!((s1, s2, s3), (201, 201, 201));
    for other in [&again, &via_replica] {
        for field in ["lease_id", "token", "secret", "fencing_token"] {
            assert_eq!(first[field], other[field], "{field}");
        }
    }
    // The retried grant's secret works.
    assert_eq!(
        renew(&proxy, "job-1", &str_field(&again, "secret")).await.0,
        200
    );
    // Another key, or another holder with the same key, is a conflict.
    assert_eq!(send(req(&proxy, "w1", "attempt-43")).await.0, 409);
    assert_eq!(send(req(&proxy, "w2", "attempt-42")).await.0, 409);
    // Concurrent retries of one acquire: all answered with the same grant.
    let concurrent = (0..10).map(|_| send(req(&proxy, "w9", "k-77")));
    let _ = release(&proxy, "job-1", &str_field(&first, "secret")).await;
    let results = futures::future::join_all(concurrent).await;
    let tokens: HashSet<String> = results
        .iter()
        .map(|(s, b)| {
            assert_eq!(*s, 201, "{b}");
            str_field(b, "token")
        })
        .collect();
    assert_eq!(tokens.len(), 1);
    // One grant, so one lease carrying one ownership key (spare leases carry none; the replay
    // window's keys live on a lease of their own).
    let holding: Vec<i64> = snapshot(&etcd)
        .await
        .kvs
        .into_iter()
        .filter(|kv| kv.0.starts_with(b"/lease-proxy/holders/"))
        .map(|kv| kv.4)
        .collect();
    assert_eq!(holding.len(), 1);
    assert_eq!(keys_per_lease(&etcd).await.get(&holding[0]), Some(&1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_paginates_in_name_order() {
    // Its own etcd: the test counts etcd's gRPC calls.
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    for i in 0..7 {
        assert_eq!(acquire(&proxy, &format!("aisle-{i}"), "r", 30).await.0, 201);
    }
    assert_eq!(acquire(&proxy, "dock-1", "r", 30).await.0, 201);
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{}/v1/leases?prefix=aisle-&limit=3", proxy.url);
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let (status, page) = send(http().get(url)).await;
        assert_eq!(status, 200, "{page}");
        for l in page["leases"].as_array().unwrap() {
            assert!(l.get("secret").is_none());
            assert!(l["expires_in_ms"].as_u64().unwrap() > 0);
            seen.push(str_field(l, "resource"));
        }
        match page.get("next_cursor").and_then(|c| c.as_str()) {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let want: Vec<String> = (0..7).map(|i| format!("aisle-{i}")).collect();
    assert_eq!(seen, want);
    // One page is one range read, whatever its size: no TTL look-up per lease.
    let calls = |method: &'static str| {
        let etcd = &etcd;
        async move { grpc_calls(etcd, method).await }
    };
    let (ranges, lookups) = (calls("Range").await, calls("LeaseTimeToLive").await);
    let (_, all) = send(http().get(format!("{}/v1/leases?limit=1000", proxy.url))).await;
    assert_eq!(all["leases"].as_array().unwrap().len(), 8);
    assert_eq!(
        (
            calls("Range").await - ranges,
            calls("LeaseTimeToLive").await - lookups
        ),
        (1, 0),
        "(range reads, TTL look-ups) for one page of 8 leases"
    );
    for l in all["leases"].as_array().unwrap() {
        // At most the grant's TTL is left.
        let expires = l["expires_in_ms"].as_u64().unwrap();
        assert!(expires > 0 && expires <= 30_000, "{l}");
    }
    assert_eq!(
        send(http().get(format!("{}/v1/leases/free-one", proxy.url)))
            .await
            .0,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_share_a_few_keepalive_streams() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.keepalive_streams = 2;
        c.keepalive_own_streams = 1;
    })
    .await;
    // Counted from before the acquires: spare leases (granted ahead of demand) are renewed
    // through the same streams when they are taken.
    let streams_before = keepalive_streams_started(&etcd).await;
    let mut secrets = Vec::new();
    for i in 0..100 {
        let (status, g) = acquire(&proxy, &format!("lease-{i}"), "w", 30).await;
        assert_eq!(status, 201);
        secrets.push((format!("lease-{i}"), str_field(&g, "secret")));
    }
    for _round in 0..3 {
        let renewals = secrets
            .iter()
            .map(|(r, s)| async { renew(&proxy, r, s).await.0 });
        let statuses = futures::future::join_all(renewals).await;
        assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    }
    let opened = keepalive_streams_started(&etcd).await - streams_before;
    assert!(
        (1..=2).contains(&opened),
        "100 acquires and 300 renewals opened {opened} keepalive streams"
    );

    // gRPC keepalive streams with several renewals under way renew on an etcd stream of their
    // own, as many as allowed at once (here 1); the others over the shared streams, open
    // already.
    let mut c = etcd_client::Client::connect([&proxy.url], None)
        .await
        .unwrap();
    let id = c.lease_grant(60, None).await.unwrap().id();
    let before = keepalive_streams_started(&etcd).await;
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(keepalive_burst(&proxy.url, id, 20, 60).await);
    }
    let opened = keepalive_streams_started(&etcd).await - before;
    assert_eq!(opened, 1, "3 gRPC streams opened {opened} etcd streams");
}

/// etcd's own count of unary calls of `method` it has handled.
async fn grpc_calls(etcd: &Etcd, method: &str) -> u64 {
    let labels = format!("grpc_method=\"{method}\"");
    etcd_metric_where(etcd, "grpc_server_handled_total", &labels).await as u64
}
