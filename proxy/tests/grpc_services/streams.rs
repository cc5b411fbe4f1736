//! Watch streams' resources: one etcd watch shared by the watches of one range, a failed shared watch, dead streams held open, the etcd API's own maximum duration.

use super::*;

/// etcd's own count of its watchers.
async fn etcd_watchers(etcd: &Etcd) -> i64 {
    etcd_metric(etcd, "etcd_debugging_mvcc_watcher_total").await as i64
}

/// Waits up to 10 s for etcd's watcher count to be `want` (the count moves as etcd processes
/// creates and cancels); the last count seen.
async fn watchers_become(etcd: &Etcd, want: i64) -> i64 {
    let mut seen = etcd_watchers(etcd).await;
    for _ in 0..100 {
        if seen == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen = etcd_watchers(etcd).await;
    }
    seen
}

/// Watches "from now" of one range, from many streams and clients, are one etcd watch; each
/// stream gets every event after its created revision under its own watch id and filters; a
/// cancel or a stream gone leaves the others watching; the etcd watch goes with the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_of_one_range_share_one_etcd_watch() {
    const STREAMS: usize = 60;
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.v3_namespace = Some("/ns/".into())).await;
    // The proxy's own watches (its holder view), once they are all open.
    let mut before = etcd_watchers(&etcd).await;
    loop {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let now = etcd_watchers(&etcd).await;
        if now == before {
            break;
        }
        before = now;
    }
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(&proxy.url).await);
    }
    let mut streams = Vec::new();
    for i in 0..STREAMS {
        let c = &mut clients[i % 3];
        let mut options = WatchOptions::new().with_prefix();
        if i == 1 {
            options = options.with_filters([WatchFilterType::NoPut]);
        }
        let mut s = c.watch("room/", Some(options)).await.unwrap();
        let created = tokio::time::timeout(Duration::from_secs(10), s.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(created.created() && !created.canceled());
        streams.push((created.header().unwrap().revision(), s));
    }
    assert_eq!(
        watchers_become(&etcd, before + 1).await,
        before + 1,
        "{STREAMS} watches of one range are not one etcd watch"
    );
    // Another range, or the same one with prev_kv, is a watch of its own.
    let mut other = clients[0]
        .watch(
            "room/",
            Some(WatchOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    take(&mut other, 1).await;
    assert_eq!(watchers_become(&etcd, before + 2).await, before + 2);

    let mut raw = etcd.client().await;
    let put = raw.put("/ns/room/x", "1", None).await.unwrap();
    let put_revision = put.header().unwrap().revision();
    raw.delete("/ns/room/x", None).await.unwrap();
    raw.put("/ns/elsewhere", "1", None).await.unwrap();
    for (i, (created_at, s)) in streams.iter_mut().enumerate() {
        let want: &[&str] = if i == 1 {
            &["event watch=0 type=1 key=\"room/x\" value=\"\" version=0 prev=None"]
        } else {
            &[
                "event watch=0 type=0 key=\"room/x\" value=\"1\" version=1 prev=None",
                "event watch=0 type=1 key=\"room/x\" value=\"\" version=0 prev=None",
            ]
        };
        assert_eq!(take(s, want.len()).await, want, "stream {i}");
        assert!(
            *created_at < put_revision,
            "stream {i}: created at {created_at}"
        );
    }
    assert_eq!(
        take(&mut other, 2).await[1],
        "event watch=0 type=1 key=\"room/x\" value=\"\" version=0 prev=Some(\"room/x=1\")"
    );

    // A cancel answers that stream alone; the others go on.
    let (_, first) = &mut streams[0];
    first.cancel(0).await.unwrap();
    assert_eq!(
        take(first, 1).await,
        ["answer watch=0 created=false canceled=true reason=\"\" compacted=false"]
    );
    drop(streams.swap_remove(0));
    drop(streams.swap_remove(1));
    raw.put("/ns/room/y", "2", None).await.unwrap();
    for (_, s) in streams.iter_mut() {
        assert_eq!(
            take(s, 1).await,
            ["event watch=0 type=0 key=\"room/y\" value=\"2\" version=1 prev=None"]
        );
    }
    // A progress request on a stream with a shared watch: answered after what came before.
    let (_, s) = &mut streams[0];
    s.request_progress().await.unwrap();
    assert_eq!(
        take(s, 1).await,
        ["answer watch=-1 created=false canceled=false reason=\"\" compacted=false"]
    );
    // Creates answered in the order they came, shared or not (Go's client pairs its creates
    // with the created answers in order): one with history, one shared, one with progress
    // notifications, sent back to back.
    let history = WatchOptions::new()
        .with_prefix()
        .with_start_revision(put_revision);
    let mut mixed = clients[1]
        .watch("room/", Some(history.clone()))
        .await
        .unwrap();
    let notified = WatchOptions::new().with_prefix().with_progress_notify();
    for round in 0..4 {
        if round > 0 {
            mixed.watch("room/", Some(history.clone())).await.unwrap();
        }
        let shared = WatchOptions::new().with_prefix();
        mixed.watch("room/", Some(shared)).await.unwrap();
        mixed.watch("room/", Some(notified.clone())).await.unwrap();
    }
    let mut created = Vec::new();
    while created.len() < 12 {
        let answer = tokio::time::timeout(Duration::from_secs(10), mixed.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if answer.created() {
            created.push(answer.watch_id());
        }
    }
    assert_eq!(created, (0..12).collect::<Vec<i64>>());
    drop(mixed);

    // A member joining an idle shared watch is answered created at etcd's revision now, not the
    // shared watch's last event's (which a compaction may have removed: a client resuming from
    // it after a reconnect would be refused); a cancel frees its id at once.
    let mut idle = clients[2]
        .watch("quiet/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    take(&mut idle, 1).await;
    let mut now = 0;
    for i in 0..5 {
        let put = raw.put(format!("/ns/busy/{i}"), "x", None).await.unwrap();
        now = put.header().unwrap().revision();
    }
    let (_, joined) = &mut streams[0];
    let quiet = WatchOptions::new().with_prefix().with_watch_id(7);
    joined.watch("quiet/", Some(quiet.clone())).await.unwrap();
    let created = tokio::time::timeout(Duration::from_secs(10), joined.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(created.created() && created.watch_id() == 7);
    assert!(
        created.header().unwrap().revision() >= now,
        "created at {} after a put at {now}",
        created.header().unwrap().revision()
    );
    joined.cancel(7).await.unwrap();
    joined.watch("quiet/", Some(quiet)).await.unwrap();
    assert_eq!(
        take(joined, 2).await,
        [
            "answer watch=7 created=false canceled=true reason=\"\" compacted=false",
            "answer watch=7 created=true canceled=false reason=\"\" compacted=false"
        ]
    );

    // After a half-close the stream's watches go on, as etcd's do.
    let create: PbWatchRequest = WatchOptions::new().with_key("room/").with_prefix().into();
    let mut half = h2grpc::Stream::open(&proxy.url, WATCH, &create, None).await;
    let created: PbWatchResponse = half.next().await.expect("created");
    assert!(created.created);
    half.close();
    raw.put("/ns/room/z", "3", None).await.unwrap();
    let event: PbWatchResponse = tokio::time::timeout(Duration::from_secs(10), half.next())
        .await
        .expect("no event after the half-close")
        .expect("the stream ended at the half-close");
    assert_eq!(event.events.len(), 1);
    drop(half);
    drop(idle);
    drop(streams);
    drop(other);
    assert_eq!(
        watchers_become(&etcd, before).await,
        before,
        "the shared etcd watch outlived its last member"
    );
}

/// When etcd fails a shared watch, every member's stream ends Unavailable, as a stream whose
/// own etcd watch fails does (a member gone is a transport error, once answered Unknown): the
/// client resumes elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_shared_watch_ends_every_members_stream() {
    let mut etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.v3_namespace = Some("/ns/".into())).await;
    let mut c = client(&proxy.url).await;
    let mut members = Vec::new();
    // Two members of one shared watch, and a watch on its stream's own etcd watch (progress
    // notifications are per watch), which ends the same way.
    for i in 0..3 {
        let mut options = WatchOptions::new().with_prefix();
        if i == 2 {
            options = options.with_progress_notify();
        }
        let mut s = c.watch("room/", Some(options)).await.unwrap();
        take(&mut s, 1).await;
        members.push(s);
    }
    etcd.kill(0);
    for mut s in members {
        let end = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                match s.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return "ended OK".to_owned(),
                    Err(etcd_client::Error::GRpcStatus(status)) => {
                        return format!("{:?}", status.code())
                    }
                    Err(e) => return format!("{e}"),
                }
            }
        })
        .await
        .expect("a member's stream outlived its failed shared watch");
        assert_eq!(end, "Unavailable");
    }
}

/// Streams cut off for not reading give back what waited for them at once, even while their
/// clients hold them open unread: a tenant that stalls many members of one shared watch and
/// floods it cannot use up the replica's bound on waiting answers and so get another client's
/// stream — one reading, only a little behind — cut off (it could, before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_streams_held_open_hold_no_memory() {
    const STALLED: usize = 60;
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.v3_namespace = Some("/ns/".into());
        c.max_watch_streams = 300;
    })
    .await;
    let create: PbWatchRequest = WatchOptions::new().with_key("flood/").with_prefix().into();
    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        let mut s = h2grpc::Stream::open(&proxy.url, WATCH, &create, None).await;
        let created: PbWatchResponse = s.next().await.expect("created");
        assert!(created.created);
        stalled.push(s);
    }
    // 24 MiB to every stalled member: each one passes its 8 MiB bound (and what its connection
    // takes in) and is cut off; together they would hold more than the replica's 256 MiB if
    // what waited for them stayed.
    let mut raw = etcd.client().await;
    for i in 0..24 {
        raw.put(format!("/ns/flood/{i}"), vec![b'x'; 1 << 20], None)
            .await
            .unwrap();
    }
    // Another client, reading a little behind: it gets every event (5 MiB in all, more than
    // its connection takes in while it is behind, less than its own 8 MiB bound).
    let mut reader = client(&proxy.url).await;
    let mut watching = reader
        .watch("v/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    take(&mut watching, 1).await;
    let puts = tokio::spawn(async move {
        for round in 0..20 {
            let batch = (0..32).map(|i| {
                let mut raw = raw.clone();
                async move {
                    raw.put(format!("/ns/v/{round}-{i}"), vec![b'y'; 8 << 10], None)
                        .await
                        .unwrap();
                }
            });
            futures::future::join_all(batch).await;
        }
    });
    let mut events = 0;
    while events < 640 {
        let answer = tokio::time::timeout(Duration::from_secs(20), watching.message())
            .await
            .expect("the reader was held back")
            .unwrap_or_else(|e| panic!("the reader was cut off after {events} events: {e}"))
            .expect("its stream ended");
        events += answer.0.events.len();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    puts.await.unwrap();
    drop(stalled);
}

/// etcd's watch streams and observers last as long as their client, and not every client
/// resumes one the server ends (python-etcd3's watch fails): through the proxy they outlive
/// `--watch-max-duration` (the /v1 streams' bound) and end only at `--v3-watch-max-duration`
/// when it is set, Unavailable, so that a client resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_api_streams_end_only_at_their_own_max_duration() {
    let etcd = Etcd::single().await;
    for bound in [None, Some(Duration::from_secs(1))] {
        let proxy = Proxy::start(etcd.endpoints(), |c| {
            c.v3_namespace = Some("/ns/".into());
            c.watch_max_duration = Duration::from_secs(1);
            c.v3_watch_max_duration = bound;
        })
        .await;
        let mut c = client(&proxy.url).await;
        let mut stream = c.watch("long", None).await.unwrap();
        assert!(stream.message().await.unwrap().unwrap().created());
        let mut observed = c.observe("vote").await.unwrap();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        c.put("long", "later", None).await.unwrap();
        let watched = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
        let observer = tokio::time::timeout(Duration::from_millis(500), observed.message()).await;
        match bound {
            None => {
                let events = watched.expect("no answer").expect("the stream ended");
                assert_eq!(events.expect("ended").events().len(), 1);
                assert!(observer.is_err(), "the observer ended: {observer:?}");
            }
            Some(_) => {
                let ended = watched.expect("the stream went on").unwrap_err();
                assert!(
                    ended.to_string().contains("--v3-watch-max-duration"),
                    "{ended}"
                );
                let ended = observer.expect("the observer went on").unwrap_err();
                assert!(
                    ended.to_string().contains("--v3-watch-max-duration"),
                    "{ended}"
                );
            }
        }
        proxy.stop().await;
    }
}
