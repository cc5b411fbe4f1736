//! Lock over gRPC, and client-side lock recipes exchanging their key for a fencing token.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_over_grpc_excludes_and_carries_a_fencing_token() {
    let etcd = Etcd::shared().await;
    let namespace = lease_proxy_testkit::prefix("tenant-a");
    let proxy = Proxy::on(&etcd, |c| c.v3_namespace = Some(namespace.clone())).await;
    let mut c = client(&proxy.url).await;
    let first = c.lease_grant(30, None).await.unwrap().id();
    let second = c.lease_grant(30, None).await.unwrap().id();

    // The lock's answer: its key in the namespace, and a token in the lock's own domain.
    let (headers, answer) = unary(
        &proxy.url,
        "/v3lockpb.Lock/Lock",
        &LockRequest {
            name: b"L".to_vec(),
            lease: first,
        },
        None,
    )
    .await;
    let answer = PbLockResponse::decode(answer.as_slice()).unwrap();
    let key = answer.key.clone();
    assert!(key.starts_with(b"L/"), "{key:?}");
    assert_eq!(headers["fencing-resource"], "lock/4c");
    let token = headers["fencing-token"].to_str().unwrap().to_owned();
    assert!(!token.is_empty());
    let mut raw = etcd.client().await;
    let stored = raw
        .get([namespace.as_bytes(), &key].concat(), None)
        .await
        .unwrap();
    assert_eq!(stored.kvs().len(), 1);

    // A second locker waits until the first unlocks.
    let mut other = client(&proxy.url).await;
    let waiting = tokio::spawn(async move {
        other
            .lock("L", Some(LockOptions::new().with_lease(second)))
            .await
            .unwrap()
            .key()
            .to_vec()
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!waiting.is_finished(), "two lockers hold L at once");
    c.unlock(key).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter never got the lock")
        .unwrap();
    assert!(next.starts_with(b"L/"));
    // A lease the proxy did not grant locks nothing.
    let foreign = raw.lease_grant(30, None).await.unwrap().id();
    let refused = c
        .lock("M", Some(LockOptions::new().with_lease(foreign)))
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("requested lease not found"),
        "{refused}"
    );

    // Each call is in the per-method metrics, with its code; a method not served is `unknown`.
    let (_, _) = unary(
        &proxy.url,
        "/etcdserverpb.KV/Nothing",
        &request_none(),
        None,
    )
    .await;
    let text = metrics_text(&proxy.url).await;
    let count = |method: &str, code: &str| {
        text.lines().any(|l| {
            l.starts_with("lease_proxy_grpc_request_duration_seconds_count")
                && l.contains(&format!("method=\"{method}\""))
                && l.contains(&format!("code=\"{code}\""))
        })
    };
    assert!(count("v3lockpb.Lock/Lock", "OK"), "{text}");
    assert!(count("v3lockpb.Lock/Lock", "Unknown"), "{text}");
    assert!(count("v3lockpb.Lock/Unlock", "OK"), "{text}");
    assert!(count("etcdserverpb.Lease/LeaseGrant", "OK"), "{text}");
    assert!(count("unknown", "Unimplemented"), "{text}");
}

/// An empty message.
fn request_none() -> LockRequest {
    LockRequest::default()
}

/// `POST /v3/lock/token` for `key`: the status, and the token if one was given.
async fn lock_token(proxy: &Proxy, key: &[u8]) -> (u16, Option<String>) {
    use base64::Engine;
    let key = base64::engine::general_purpose::STANDARD.encode(key);
    let resp = http()
        .post(format!("{}/v3/lock/token", proxy.url))
        .json(&serde_json::json!({ "key": key }))
        .send()
        .await
        .unwrap();
    let token = resp
        .headers()
        .get("fencing-token")
        .map(|v| v.to_str().unwrap().to_owned());
    (resp.status().as_u16(), token)
}

/// The docs' `etcdctl lock` example, run as written (its `export` line aside): the command
/// inside the lock exchanges `ETCD_LOCK_KEY` for a token and writes through fence-gateway. And
/// the exchange gives a token only to the key that holds its lock: the same token a `Lock` of
/// that key got, none for a waiter's key or a key gone, and a later holder's token shuts the
/// earlier one out at the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_side_lock_holders_exchange_their_key_for_a_token() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let Storage {
        url: storage,
        log: received,
    } = Storage::start().await;
    let gateway = start_gateway(&storage, &proxy.key_file).await;

    let doc = lease_proxy_testkit::docs::read("docs/API.md");
    let section = lease_proxy_testkit::docs::section(
        &doc,
        "### Fencing etcd's client-side locks (`etcdctl lock`, Go's Mutex and Election)",
    );
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the section's sh block");
    let script: String = block
        .lines()
        .filter(|l| !l.starts_with("export "))
        .map(|l| format!("{l}\n"))
        .collect();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .env("PROXY", &proxy.url)
        .env("GATEWAY", &gateway)
        .output()
        .unwrap();
    assert!(out.status.success(), "the example failed: {}", output(out));
    let writes = received.all();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        writes[0].resource(),
        format!("lock/{}", hex::encode("robot-arm"))
    );
    assert!(!writes[0].token().is_empty());

    // The holder's key gets the token its Lock got; a waiter's key none.
    let mut c = client(&proxy.url).await;
    let first = c.lease_grant(30, None).await.unwrap().id();
    let second = c.lease_grant(30, None).await.unwrap().id();
    let request = LockRequest {
        name: b"L".to_vec(),
        lease: first,
    };
    let (headers, answer) = unary(&proxy.url, "/v3lockpb.Lock/Lock", &request, None).await;
    let held = PbLockResponse::decode(answer.as_slice()).unwrap().key;
    let locked = headers["fencing-token"].to_str().unwrap().to_owned();
    assert_eq!(lock_token(&proxy, &held).await, (200, Some(locked.clone())));
    let waiter = format!("L/{second:x}");
    let leased = etcd_client::PutOptions::new().with_lease(second);
    c.put(waiter.as_str(), "", Some(leased)).await.unwrap();
    assert_eq!(lock_token(&proxy, waiter.as_bytes()).await, (400, None));
    for not_a_lock in [b"L".as_slice(), b"/x", b"", b"nothing/here"] {
        assert_eq!(
            lock_token(&proxy, not_a_lock).await,
            (400, None),
            "{not_a_lock:?}"
        );
    }

    // The first holder unlocks: the waiter holds L, its token is higher, the old one is stale.
    c.unlock(held.clone()).await.unwrap();
    assert_eq!(lock_token(&proxy, &held).await, (400, None));
    let (status, next) = lock_token(&proxy, waiter.as_bytes()).await;
    assert_eq!(status, 200);
    let write = |token: String| {
        send(
            http()
                .put(format!("{gateway}/l"))
                .header("Fencing-Token", token)
                .header("Fencing-Resource", format!("lock/{}", hex::encode("L")))
                .body("x"),
        )
    };
    assert_eq!(write(next.unwrap()).await.0, 200);
    assert_eq!(
        write(locked).await.0,
        409,
        "the earlier holder's token was admitted"
    );
}
