//! Watches: answers equal etcd's, nothing outside the namespace, streams ended by their principal's removal, a stalled reader cut off alone.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_answers_equal_etcds() {
    let raw_etcd = Etcd::single().await;
    let behind = Etcd::single().await;
    let proxy = Proxy::start(behind.endpoints(), |_| {}).await;
    let mut raw = client(&raw_etcd.endpoint(0)).await;
    let etcd_side = script(&mut raw.clone(), &mut raw).await;
    let mut proxy_client = client(&proxy.url).await;
    let ours = script(&mut proxy_client, &mut behind.client().await).await;
    for (i, (etcd, ours)) in etcd_side.iter().zip(&ours).enumerate() {
        assert_eq!(
            ours, etcd,
            "answer line {i}: the proxy's (left) differs from etcd's"
        );
    }
    assert_eq!(ours.len(), etcd_side.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_see_nothing_outside_the_namespace() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.v3_namespace = Some("/tenant-a/".into());
    })
    .await;
    let mut raw = etcd.client().await;
    let outside = [
        "/tenant-b/k",
        "/tenant-a",
        "/tenant-a0",
        "\u{0}",
        "zzz",
        "/tenant-a.",
    ];
    for key in outside {
        raw.put(key, "before", None).await.unwrap();
    }
    let mut c = client(&proxy.url).await;
    // Every "everything" a client can name, live and from the first revision.
    let everything = [
        ("", WatchOptions::new().with_all_keys()),
        ("", WatchOptions::new().with_prefix()),
        ("", WatchOptions::new().with_from_key()),
        ("\u{0}", WatchOptions::new().with_range("\u{0}")),
        (
            "\u{0}",
            WatchOptions::new().with_range(vec![0xff, 0xff, 0xff]),
        ),
        (
            "",
            WatchOptions::new().with_all_keys().with_start_revision(1),
        ),
    ];
    let mut s = c
        .watch(
            "",
            Some(WatchOptions::new().with_all_keys().with_prev_key()),
        )
        .await
        .unwrap();
    for (key, options) in everything {
        s.watch(key, Some(options.with_prev_key())).await.unwrap();
    }
    // Created answers: the first watch and the six more.
    let created = take(&mut s, 7).await;
    assert!(
        created
            .iter()
            .all(|l| l.contains("created=true canceled=false")),
        "{created:?}"
    );
    for key in outside {
        raw.put(key, "during", None).await.unwrap();
        raw.delete(key, None).await.unwrap();
    }
    c.put("k", "inside", None).await.unwrap();
    c.put("k", "again", None).await.unwrap();
    // Each of the seven watches sees the two puts of `k`, and nothing else.
    let mut seen = Vec::new();
    while let Ok(Some(answer)) = tokio::time::timeout(Duration::from_secs(2), s.message())
        .await
        .map(|m| m.unwrap())
    {
        seen.extend(lines(&answer.0));
    }
    assert_eq!(seen.len(), 14, "{seen:#?}");
    for line in &seen {
        assert!(line.contains(r#"key="k""#), "{line}");
        assert!(
            line.contains("prev=None") || line.contains(r#"prev=Some("k=inside")"#),
            "{line}"
        );
    }
}

/// A watch stream opened by a principal whose line is then removed ends, as its keepalives do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_stream_ends_once_its_principal_is_removed() {
    const ACME: &str = "acme-token-77d1c0";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let line = |name: &str, token: &str| token_line(name, token, "v3:*");
    std::fs::write(
        &tokens,
        line("acme", ACME) + &line("other", "other-token-31"),
    )
    .unwrap();
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |c| c.auth_tokens = Some(tokens.clone())).await;

    // etcd-client sends `authorization` only after an Authenticate; metadata by hand instead.
    let create: PbWatchRequest = WatchOptions::new().with_key("k").with_prefix().into();
    let mut stream = h2grpc::Stream::open(&proxy.url, WATCH, &create, Some(ACME)).await;
    let created: PbWatchResponse = stream.next().await.expect("created");
    assert!(created.created && !created.canceled);

    let put = |token: &'static str, key: &'static str| {
        send(
            http()
                .post(format!("{}/v3/kv/put", proxy.url))
                .bearer_auth(token)
                .json(&serde_json::json!({"key": base64_of(key), "value": base64_of("v")})),
        )
    };
    assert_eq!(put(ACME, "k1").await.0, 200);
    let event: PbWatchResponse = stream.next().await.expect("an event");
    assert_eq!(event.events.len(), 1);

    // acme's line goes; once a new call of acme's is refused, the file is in force.
    let replaced = dir.path().join("tokens.new");
    std::fs::write(&replaced, line("other", "other-token-31")).unwrap();
    std::fs::rename(&replaced, &tokens).unwrap();
    until(Duration::from_secs(15), "the removal in force", || async {
        put(ACME, "k2").await.0 == 401
    })
    .await;
    // The stream ends (Unauthenticated in its trailers): what comes before the end can only
    // be the events of puts made before the removal took effect.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(answer) = stream.next::<PbWatchResponse>().await {
            assert!(answer
                .events
                .iter()
                .all(|e| e.kv.as_ref().unwrap().key == b"k2"));
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stream went on after its principal was removed"
    );
}

fn base64_of(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A client that opens a watch and stops reading holds at most the proxy's bound of answers:
/// its stream then ends (Unavailable, so it would resume from its last revision), and another
/// client's watch of the same keys, on the same proxy and etcd connection, gets every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watch_reader_is_cut_off_and_holds_back_no_one() {
    const VALUES: usize = 16;
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.v3_namespace = Some("/ns/".into())).await;
    let create: PbWatchRequest = WatchOptions::new().with_key("big/").with_prefix().into();
    let mut stalled = h2grpc::Stream::open(&proxy.url, WATCH, &create, None).await;
    let created: PbWatchResponse = stalled.next().await.expect("created");
    assert!(created.created);

    let mut reader = client(&proxy.url).await;
    let mut watching = reader
        .watch("big/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    take(&mut watching, 1).await;
    // The reader that reads, reading as the events come, gets every one.
    let reading = tokio::spawn(async move {
        let mut events = 0;
        while events < VALUES {
            let answer = tokio::time::timeout(Duration::from_secs(20), watching.message())
                .await
                .expect("the reading client was held back")
                .unwrap()
                .expect("its stream ended");
            events += answer.0.events.len();
        }
    });
    let mut raw = etcd.client().await;
    for i in 0..VALUES {
        raw.put(format!("/ns/big/{i}"), vec![b'x'; 1 << 20], None)
            .await
            .unwrap();
    }
    reading.await.unwrap();
    // The stalled one, read at last: part of the events, then the end.
    let mut got = 0;
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(answer) = stalled.next::<PbWatchResponse>().await {
            got += answer.events.len();
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stalled stream was never cut off (got {got} events)"
    );
    assert!(
        got < VALUES,
        "the stalled stream got all {got} events: nothing was bounded"
    );
}
