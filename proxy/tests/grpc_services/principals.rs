//! Principals and bounds: one principal reaches nothing of another's; long calls hold slots and end with the drain; an answer larger than the bound reaches its reader.

use super::*;

/// One answer larger than the per-stream bound — a delete of many large keys with `prev_kv`, in
/// one revision and unfragmented — reaches a client that reads, as etcd sends it (it used to end the stream, and every resume again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_answer_larger_than_the_bound_reaches_a_reading_client() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.v3_namespace = Some("/ns/".into())).await;
    let mut raw = etcd.client().await;
    for i in 0..10 {
        raw.put(format!("/ns/big/{i}"), vec![b'x'; 1 << 20], None)
            .await
            .unwrap();
    }
    let create: PbWatchRequest = WatchOptions::new()
        .with_key("big/")
        .with_prefix()
        .with_prev_key()
        .into();
    let mut stream = h2grpc::Stream::open(&proxy.url, WATCH, &create, None).await;
    let created: PbWatchResponse = stream.next().await.expect("created");
    assert!(created.created);
    let mut c = client(&proxy.url).await;
    let all = etcd_client::DeleteOptions::new().with_prefix();
    c.delete("big/", Some(all)).await.unwrap();
    // One answer with the ten deletes and their 1 MiB previous values.
    let deleted = tokio::time::timeout(Duration::from_secs(20), stream.next::<PbWatchResponse>())
        .await
        .expect("no answer came")
        .expect("the stream ended");
    assert_eq!(deleted.events.len(), 10);
    assert!(deleted
        .events
        .iter()
        .all(|e| e.prev_kv.as_ref().unwrap().value.len() == 1 << 20));
}

/// The replica's event-stream slots count what holds an etcd watch, and nothing else: a watch
/// stream with no watch holds none; a waiting lock holds one, and is refused (its key removed)
/// when there is none; and a waiting lock ends with the drain, not at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_calls_hold_slots_and_end_with_the_drain() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.v3_namespace = Some("/ns/".into());
        c.max_watch_streams = 2;
        c.drain_timeout = Duration::from_secs(30);
        c.shutdown_delay = Duration::ZERO;
    })
    .await;
    // Five idle watch streams (an empty request, no create): /v1/watch still has its slots.
    let mut idle = Vec::new();
    for _ in 0..5 {
        let nothing = PbWatchRequest::default();
        idle.push(h2grpc::Stream::open(&proxy.url, WATCH, &nothing, None).await);
    }
    let events = http()
        .get(format!("{}/v1/watch", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        events.status(),
        200,
        "idle gRPC watch streams took the slots"
    );
    drop(events);

    // L held; two waiters take the two slots; a third is refused and leaves no key.
    let mut c = client(&proxy.url).await;
    let mut leases = Vec::new();
    for _ in 0..4 {
        leases.push(c.lease_grant(30, None).await.unwrap().id());
    }
    c.lock("L", Some(LockOptions::new().with_lease(leases[0])))
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for &lease in &leases[1..3] {
        let mut w = c.clone();
        waiters.push(tokio::spawn(async move {
            w.lock("L", Some(LockOptions::new().with_lease(lease)))
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let refused = c
        .lock("L", Some(LockOptions::new().with_lease(leases[3])))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("maximum of 2"), "{refused}");
    let raw = etcd.client().await;
    let key = format!("/ns/L/{:x}", leases[3]);
    until(
        Duration::from_secs(5),
        "the refused waiter's key gone",
        || {
            let (mut raw, key) = (raw.clone(), key.clone());
            async move { raw.get(key, None).await.unwrap().kvs().is_empty() }
        },
    )
    .await;

    // The drain ends the waiters at once: the proxy stops well before its drain deadline.
    drop(idle);
    let started = tokio::time::Instant::now();
    proxy.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the drain waited {:?} for waiting locks",
        started.elapsed()
    );
    for waiter in waiters {
        assert!(
            waiter.await.unwrap().is_err(),
            "a waiter got the lock during the drain"
        );
    }
}

/// A gRPC client authenticated as `user` (etcd-client's own `Authenticate`, then its `token`
/// metadata on every call, as Go's clientv3 does).
async fn client_as(url: &str, user: &str, token: &str) -> Client {
    let options = etcd_client::ConnectOptions::new().with_user(user, token);
    Client::connect([url], Some(options))
        .await
        .expect("connect")
}

/// Two principals on one proxy over gRPC: whatever the rival names — every range, a txn
/// comparing the other's keys, a watch of everything from revision 1, the other's lease in
/// every lease call and in Put and Lock, the other's lock key in Unlock, its election in Leader,
/// Observe and Resign — it reads, changes and renews nothing of the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_principal_reaches_nothing_of_anothers_over_grpc() {
    use etcd_client::{
        Compare, CompareOp, DeleteOptions, GetOptions, LeaderKey, PutOptions, ResignOptions, Txn,
        TxnOp,
    };
    const ACME: &str = "acme-token-5b7c1d";
    const RIVAL: &str = "rival-token-9e0a2f";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let lines = token_line("acme", ACME, "v3:*") + &token_line("rival", RIVAL, "v3:*");
    std::fs::write(&tokens, lines).unwrap();
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.auth_tokens = Some(tokens.clone());
        c.v3_namespace = Some("/ns/".into());
    })
    .await;

    // acme's state: keys, a lease with a key, a lock and an election it leads.
    let mut acme = client_as(&proxy.url, "acme", ACME).await;
    acme.put("shared/k", "acme's", None).await.unwrap();
    let lease = acme.lease_grant(60, None).await.unwrap().id();
    acme.put(
        "leased",
        "acme's",
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    let lock_key = acme
        .lock("door", Some(LockOptions::new().with_lease(lease)))
        .await
        .unwrap()
        .key()
        .to_vec();
    let leader = acme
        .campaign("boss", "acme", lease)
        .await
        .unwrap()
        .leader()
        .cloned()
        .unwrap();
    let mut raw = etcd.client().await;
    let snapshot = |kvs: &[etcd_client::KeyValue]| {
        kvs.iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision()))
            .collect::<Vec<_>>()
    };
    let everything = Some(GetOptions::new().with_prefix());
    let before = snapshot(
        raw.get("/ns/acme/", everything.clone())
            .await
            .unwrap()
            .kvs(),
    );
    assert_eq!(before.len(), 4, "{before:?}");

    let mut rival = client_as(&proxy.url, "rival", RIVAL).await;
    // Its watch of everything, from the first revision, opened before anything else it does.
    let mut watched = rival
        .watch(
            "",
            Some(WatchOptions::new().with_prefix().with_start_revision(1)),
        )
        .await
        .unwrap();

    // Reads of everything a range can name.
    for (key, options) in [
        ("", GetOptions::new().with_all_keys()),
        ("", GetOptions::new().with_from_key()),
        ("../acme/", GetOptions::new().with_prefix()),
        ("\u{0}", GetOptions::new().with_range(vec![0xff, 0xff])),
    ] {
        let got = rival.get(key, Some(options)).await.unwrap();
        assert!(got.kvs().is_empty(), "{key:?}: {:?}", got.kvs());
    }
    // A txn comparing acme's key (absent here: the compare fails) whose branches write.
    let txn = Txn::new()
        .when([Compare::value("shared/k", CompareOp::Equal, "acme's")])
        .and_then([TxnOp::put("shared/k", "pwned", None)])
        .or_else([
            TxnOp::delete("", Some(DeleteOptions::new().with_all_keys())),
            TxnOp::txn(
                Txn::new().and_then([TxnOp::get("", Some(GetOptions::new().with_all_keys()))]),
            ),
        ]);
    let answer = rival.txn(txn).await.unwrap();
    assert!(!answer.succeeded());
    rival
        .delete("", Some(DeleteOptions::new().with_all_keys()))
        .await
        .unwrap();

    // acme's lease, wherever a lease can be named.
    let not_found = "requested lease not found";
    let e = rival
        .put("k", "v", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains(not_found), "{e}");
    let e = rival.lease_revoke(lease).await.unwrap_err();
    assert!(e.to_string().contains(not_found), "{e}");
    assert_eq!(
        rival.lease_time_to_live(lease, None).await.unwrap().ttl(),
        -1
    );
    assert!(rival.leases().await.unwrap().leases().is_empty());
    assert!(rival.lease_keep_alive(lease).await.is_err());
    let e = rival
        .lock("door", Some(LockOptions::new().with_lease(lease)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains(not_found), "{e}");
    let e = rival.campaign("boss", "rival", lease).await.unwrap_err();
    assert!(e.to_string().contains(not_found), "{e}");

    // acme's lock key and election: names in rival's own namespace, which hold nothing.
    rival.unlock(lock_key.clone()).await.unwrap();
    let e = rival.leader("boss").await.unwrap_err();
    assert!(e.to_string().contains("election: no leader"), "{e}");
    let foreign = LeaderKey::new()
        .with_name(leader.name())
        .with_key(leader.key())
        .with_rev(leader.rev())
        .with_lease(leader.lease());
    let _ = rival
        .resign(Some(ResignOptions::new().with_leader(foreign)))
        .await;
    let mut observed = rival.observe("boss").await.unwrap();
    let nothing = tokio::time::timeout(Duration::from_millis(300), observed.message()).await;
    assert!(
        nothing.is_err(),
        "rival observed acme's leader: {nothing:?}"
    );
    // Its own lock of the same name is granted at once, in a fencing domain of its own.
    let own = rival.lease_grant(60, None).await.unwrap().id();
    let (headers, _) = unary(
        &proxy.url,
        "/v3lockpb.Lock/Lock",
        &LockRequest {
            name: b"door".to_vec(),
            lease: own,
        },
        Some(RIVAL),
    )
    .await;
    assert_eq!(
        headers["fencing-resource"],
        fencing::lock_resource(b"rival/door")
    );

    // acme writes again: rival's watch saw none of acme's events, before or now.
    acme.put("shared/k", "acme's again", None).await.unwrap();
    rival.put("mine", "rival's", None).await.unwrap();
    let mut seen = Vec::new();
    while let Ok(Ok(Some(answer))) =
        tokio::time::timeout(Duration::from_millis(500), watched.message()).await
    {
        for e in answer.events() {
            seen.push(e.kv().map(|kv| kv.key().to_vec()).unwrap_or_default());
        }
    }
    assert!(
        seen.iter()
            .all(|k| k.starts_with(b"mine") || k.starts_with(b"door/")),
        "rival's watch saw {seen:?}"
    );
    assert!(seen.iter().any(|k| k == b"mine"), "{seen:?}");

    // acme's keys are as they were but for its own new write; its lease lives on.
    let after = snapshot(raw.get("/ns/acme/", everything).await.unwrap().kvs());
    let unchanged = |all: &[(Vec<u8>, Vec<u8>, i64)]| {
        all.iter()
            .filter(|(k, _, _)| k != b"/ns/acme/shared/k")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(unchanged(&after), unchanged(&before));
    assert!(after
        .iter()
        .any(|(k, v, _)| k == b"/ns/acme/shared/k" && v == b"acme's again"));
    assert!(raw.lease_time_to_live(lease, None).await.unwrap().ttl() > 0);
    let outside = raw
        .get("/ns/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    for kv in outside.kvs() {
        assert!(
            kv.key().starts_with(b"/ns/acme/") || kv.key().starts_with(b"/ns/rival/"),
            "{:?}",
            kv.key()
        );
    }
}
