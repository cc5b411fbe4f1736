//! `GET /v1/watch` on the replica's one shared etcd watch, against real etcd: any number of
//! streams are one etcd watcher and each gets every event; a reader that stops holds back no
//! one and, overtaken by the shared ring, catches up on a watch of its own without losing or
//! repeating an event; a principal sees only what it may read; the shared watch's own
//! reconnect (etcd restarted under it) loses nothing for the streams on it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::sse::{Message, Sse};
use common::*;

const WAIT: Duration = Duration::from_secs(10);

/// etcd's watchers, once the count has settled at `want` (up to 10 s); the last count seen.
async fn watchers_become(etcd: &Etcd, want: f64) -> f64 {
    let mut seen = 0.0;
    for _ in 0..100 {
        seen = etcd_metric(etcd, "etcd_debugging_mvcc_watcher_total").await;
        if seen == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

/// etcd's watchers once the count holds still for half a second (the proxy's own watches are
/// opened as it starts).
async fn settled_watchers(etcd: &Etcd) -> f64 {
    let mut seen = etcd_metric(etcd, "etcd_debugging_mvcc_watcher_total").await;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = etcd_metric(etcd, "etcd_debugging_mvcc_watcher_total").await;
        if now == seen {
            return now;
        }
        seen = now;
    }
}

/// The proxy's `lease_proxy_watch_own_total` for `reason`.
async fn own_watches(proxy: &Proxy, reason: &str) -> f64 {
    let label = format!("reason=\"{reason}\"");
    metrics_text(&proxy.url)
        .await
        .lines()
        .filter(|l| l.starts_with("lease_proxy_watch_own_total") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// (type, resource, id) of every event message of `messages`.
fn events(messages: &[Message]) -> Vec<(String, String, String)> {
    messages
        .iter()
        .filter_map(|m| {
            let d = m.data.as_ref()?;
            Some((
                d["type"].as_str()?.to_owned(),
                d["resource"].as_str()?.to_owned(),
                m.id.clone()?,
            ))
        })
        .collect()
}

/// The next `n` events of `sse`.
async fn take(sse: &mut Sse, n: usize) -> Vec<(String, String, String)> {
    let mut got = Vec::with_capacity(n);
    for _ in 0..n {
        got.push(sse.event(WAIT).await);
    }
    events(&got)
}

/// `n` grants made and ended straight in etcd, 100 to a transaction (so 100 events a revision),
/// each with a holder name of `holder_len` bytes.
async fn flood(etcd: &Etcd, n: usize, holder_len: usize) {
    let mut kv = etcd.client().await;
    let value = serde_json::json!({
        "holder": "h".repeat(holder_len), "lease_id": "0", "secret_hash": "x",
        "acquired_at": 0, "ttl_seconds": 30
    })
    .to_string();
    let name = |i: usize| format!("/lease-proxy/holders/flood-{i:06}");
    for base in (0..n).step_by(100) {
        let end = (base + 100).min(n);
        let puts: Vec<_> = (base..end)
            .map(|i| etcd_client::TxnOp::put(name(i), value.as_str(), None))
            .collect();
        kv.txn(etcd_client::Txn::new().and_then(puts))
            .await
            .unwrap();
        let deletes: Vec<_> = (base..end)
            .map(|i| etcd_client::TxnOp::delete(name(i), None))
            .collect();
        kv.txn(etcd_client::Txn::new().and_then(deletes))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn many_streams_are_one_etcd_watch_and_each_gets_every_event() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let before = settled_watchers(&etcd).await;
    let mut streams = Vec::new();
    for i in 0..200 {
        let prefix = if i % 2 == 0 { "" } else { "sh-" };
        let mut sse = Sse::open(&format!("{}/v1/watch?prefix={prefix}", proxy.url), None).await;
        sse.next(WAIT).await.unwrap();
        streams.push(sse);
    }
    assert_eq!(
        watchers_become(&etcd, before + 1.0).await,
        before + 1.0,
        "200 streams are one etcd watcher ({before} before)"
    );
    let mut expected = Vec::new();
    for r in ["sh-a", "sh-b", "sh-c"] {
        let (s, grant) = acquire(&proxy, r, "alice", 30).await;
        assert_eq!(s, 201, "{grant}");
        release(&proxy, r, &str_field(&grant, "secret")).await;
        expected.push(("acquired".to_owned(), r.to_owned()));
        expected.push(("released".to_owned(), r.to_owned()));
    }
    let mut first = None;
    for sse in &mut streams {
        let got = take(sse, 6).await;
        let kinds: Vec<_> = got.iter().map(|(t, r, _)| (t.clone(), r.clone())).collect();
        assert_eq!(kinds, expected);
        // Every stream names the events by the same ids.
        assert_eq!(first.get_or_insert_with(|| got.clone()), &got);
    }
    assert_eq!(own_watches(&proxy, "overtaken").await, 0.0);
    assert_eq!(own_watches(&proxy, "unreached").await, 0.0);
}

#[tokio::test]
async fn a_reader_that_stops_holds_back_no_one_and_catches_up_without_loss() {
    let etcd = Etcd::single().await;
    // The stopped reader takes nothing for a while on purpose and must then get everything.
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.client_write_timeout = Duration::from_secs(120);
    })
    .await;
    let url = format!("{}/v1/watch", proxy.url);
    let before = settled_watchers(&etcd).await;
    let mut fast = Sse::open(&url, None).await;
    let mut stopped = Sse::open(&url, None).await;
    fast.next(WAIT).await.unwrap();
    stopped.next(WAIT).await.unwrap();

    // 10,000 events (5,000 grants made and ended) of 1 KiB holders: far more than the shared ring keeps, and more than the
    // sockets between the proxy and the stopped reader hold. The fast reader reads them as
    // they come, while the other reads nothing.
    let total = 10_000;
    let (fast_got, ()) = tokio::join!(take(&mut fast, total), flood(&etcd, total / 2, 1024));
    // Then it reads: the same events, the same ids, in the same order.
    let stopped_got = take(&mut stopped, total).await;
    assert_eq!(stopped_got.len(), fast_got.len());
    assert!(
        stopped_got == fast_got,
        "the stopped reader lost, repeated or reordered events"
    );
    assert!(
        own_watches(&proxy, "overtaken").await >= 1.0,
        "the ring overtook the stopped reader (found when it reads on), or the test proves nothing"
    );
    let extra = stopped.next(Duration::from_millis(500)).await;
    assert!(
        extra.as_ref().is_none_or(|m| m.data.is_none()),
        "an event repeated: {extra:?} after {:?}",
        stopped_got.last()
    );
    // Caught up, it is back on the shared watch: its own etcd watch is gone.
    let (s, grant) = acquire(&proxy, "after", "alice", 30).await;
    assert_eq!(s, 201, "{grant}");
    assert_eq!(take(&mut stopped, 1).await[0].1, "after");
    assert_eq!(take(&mut fast, 1).await[0].1, "after");
    assert_eq!(
        watchers_become(&etcd, before + 1.0).await,
        before + 1.0,
        "the caught-up reader still reads its own etcd watch"
    );
}

#[tokio::test]
async fn a_principal_on_the_shared_watch_sees_only_what_it_may_read() {
    let etcd = Etcd::single().await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        [
            token_line("writer", "w-token-0123456789", "acquire:*"),
            token_line("aisles", "a-token-0123456789", "read:aisle-"),
            token_line("docks", "d-token-0123456789", "read:dock-"),
        ]
        .concat(),
    )
    .unwrap();
    let proxy = Proxy::start(etcd.endpoints(), |c| c.auth_tokens = Some(tokens.clone())).await;
    let url = format!("{}/v1/watch", proxy.url);
    let mut aisles = Sse::open_as(&url, None, Some("a-token-0123456789")).await;
    let mut docks = Sse::open_as(&url, None, Some("d-token-0123456789")).await;
    aisles.next(WAIT).await.unwrap();
    docks.next(WAIT).await.unwrap();
    let writer = http();
    for r in ["dock-1", "aisle-1", "dock-2", "aisle-2"] {
        let (s, v) = send(
            writer
                .post(format!("{}/v1/leases/{r}", proxy.url))
                .bearer_auth("w-token-0123456789")
                .json(&serde_json::json!({"holder": "robot", "ttl_seconds": 30})),
        )
        .await;
        assert_eq!(s, 201, "{v}");
    }
    let seen = |got: Vec<(String, String, String)>| -> Vec<String> {
        got.into_iter().map(|(_, r, _)| r).collect()
    };
    assert_eq!(seen(take(&mut aisles, 2).await), ["aisle-1", "aisle-2"]);
    assert_eq!(seen(take(&mut docks, 2).await), ["dock-1", "dock-2"]);
    for (sse, who) in [(&mut aisles, "aisles"), (&mut docks, "docks")] {
        while let Some(m) = sse.next(Duration::from_millis(1500)).await {
            assert!(m.data.is_none(), "{who} was shown {m:?}");
        }
    }
}

#[tokio::test]
async fn streams_lose_nothing_across_the_shared_watchs_reconnect() {
    let mut etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let url = format!("{}/v1/watch", proxy.url);
    let mut fresh = Sse::open(&url, None).await;
    let start = fresh.next(WAIT).await.unwrap().id.unwrap();
    let (s, grant) = acquire(&proxy, "before", "alice", 30).await;
    assert_eq!(s, 201, "{grant}");
    let first = take(&mut fresh, 1).await;
    // A stream resumed from before the first event, on the shared watch too.
    let mut resumed = Sse::open(&url, Some(&start)).await;
    resumed.next(WAIT).await.unwrap();
    assert_eq!(take(&mut resumed, 1).await, first);

    // etcd restarts under the shared watch; grants are made straight in etcd the moment it is
    // back, before the proxy has watched again.
    etcd.restart(0).await;
    flood(&etcd, 300, 16).await;
    let both = [take(&mut fresh, 600).await, take(&mut resumed, 600).await];
    for got in &both {
        let names: Vec<_> = got.iter().map(|(t, r, _)| format!("{t} {r}")).collect();
        let want: Vec<_> = (0..3)
            .flat_map(|b| {
                let acquired = (b * 100..b * 100 + 100).map(|i| format!("acquired flood-{i:06}"));
                let expired = (b * 100..b * 100 + 100).map(|i| format!("expired flood-{i:06}"));
                acquired.chain(expired).collect::<Vec<_>>()
            })
            .collect();
        assert!(
            names == want,
            "events lost or repeated across the reconnect"
        );
    }
    assert_eq!(both[0], both[1]);
    assert!(
        !fresh.ended && !resumed.ended,
        "the streams lived through it"
    );
    assert_eq!(own_watches(&proxy, "overtaken").await, 0.0);
}

/// etcd compacting at revision C drops C's deletions from what a watch from C sends (it accepts
/// the watch): a resume point just before C is gone — 410 on the replica whose ring holds C
/// and on a fresh one alike — and C itself resumes.
#[tokio::test]
async fn a_resume_point_before_a_compacted_revisions_deletions_is_gone_on_every_replica() {
    let etcd = Etcd::single().await;
    let warm = Proxy::start(etcd.endpoints(), |_| {}).await;
    let mut sse = Sse::open(&format!("{}/v1/watch", warm.url), None).await;
    sse.next(WAIT).await.unwrap();
    // Five grants made in one revision, ended in the next.
    flood(&etcd, 5, 16).await;
    let got = take(&mut sse, 10).await;
    let revision = |id: &str| id.split('.').next().unwrap().parse::<i64>().unwrap();
    let (made, ended) = (revision(&got[0].2), revision(&got[5].2));
    assert_eq!((got[5].0.as_str(), ended), ("expired", made + 1), "{got:?}");
    etcd.client().await.compact(ended, None).await.unwrap();
    let fresh = warm.replica(etcd.endpoints(), |_| {}).await;
    let client = http();
    for proxy in [&warm, &fresh] {
        let resume = |id: String| {
            client
                .get(format!("{}/v1/watch", proxy.url))
                .header("last-event-id", id)
                .send()
        };
        let before = resume(made.to_string()).await.unwrap();
        assert_eq!(before.status(), 410, "{}: bare {made}", proxy.url);
        let at = resume(ended.to_string()).await.unwrap();
        assert_eq!(at.status(), 200, "{}: bare {ended}", proxy.url);
    }
}
