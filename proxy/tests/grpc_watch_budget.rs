//! One principal's stalled watch streams against another principal's ordinary stream on the
//! gRPC front, one etcd with its own authentication on behind proxies with `--auth-tokens`
//! ([`common::authed`]): the memory watch answers hold is counted until written and budgeted per
//! principal, and the stream that holds it is the one that ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::authed::*;
use common::*;
use etcd_client::{Client, ConnectOptions, WatchOptions};
use lease_proxy_testkit::poll::{eventually, Probe};

/// One principal's stalled watch streams, each with three watches over a 24 MiB history (one
/// answer each), against another principal's ordinary stream (two watches of one key, every put
/// two answers): the other's stream gets every event, and the replica never holds more than the
/// attacker's budget for it — the attacker's own streams are what end. Before, the first answer
/// into an empty queue always passed, answers handed to HTTP/2 were not counted, and a push past
/// the replica's shared 256 MiB ended whoever received it: the ordinary stream was cut off
/// "fell behind" (an attacker saw it 12 times of 12, the proxy past 900 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_history_watches_cut_off_their_own_principal_only() {
    const REVISIONS: usize = 24;
    const STALLED: usize = 12;
    // Three: HTTP/2 takes one answer and hyper holds the next while it waits to send, so the
    // third is what waited in the queue, where alone it was counted.
    const HISTORIES: usize = 3;
    const PUTS: usize = 60;
    let world = World::new().await;
    let mut root = world.root().await;
    let value = vec![b'h'; 1 << 20];
    for _ in 0..REVISIONS {
        root.put("/lease-proxy/v3/kv/acme/big", value.clone(), None)
            .await
            .unwrap();
    }
    let proxy = world.proxy(|_| {}).await;
    let connect = |name: &'static str, token: &'static str| {
        let url = proxy.url.clone();
        async move {
            let options = ConnectOptions::new().with_user(name, token);
            Client::connect([url], Some(options)).await.unwrap()
        }
    };

    // The ordinary stream: two watches of one key, read as the events come.
    let mut other = connect("other", OTHER).await;
    let mut ordinary = other.watch("k", None).await.unwrap();
    ordinary.watch("k", None).await.unwrap();
    for _ in 0..2 {
        let created = ordinary.message().await.unwrap().expect("created");
        assert!(created.created());
    }
    let reading = tokio::spawn(async move {
        let mut events = 0;
        while events < 2 * PUTS {
            let answer = tokio::time::timeout(Duration::from_secs(30), ordinary.message())
                .await
                .expect("the ordinary stream was held back");
            match answer {
                Ok(Some(answer)) => events += answer.events().len(),
                Ok(None) => panic!("the ordinary stream ended after {events} events"),
                Err(e) => panic!("the ordinary stream was cut off after {events} events: {e}"),
            }
        }
    });
    let writing = tokio::spawn({
        let mut root = root.clone();
        async move {
            for i in 0..PUTS {
                root.put("/lease-proxy/v3/kv/other/k", format!("v{i}"), None)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });

    // The attack, meanwhile: streams that read nothing after their first `created`, each
    // asking three times for the whole history, each on its own connection.
    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        let mut acme = connect("acme", ACME).await;
        let history = || Some(WatchOptions::new().with_start_revision(1));
        let mut stream = acme.watch("big", history()).await.unwrap();
        for _ in 1..HISTORIES {
            stream.watch("big", history()).await.unwrap();
        }
        let created = stream.message().await.unwrap().expect("created");
        assert!(created.created());
        stalled.push((acme, stream));
    }
    writing.await.unwrap();
    reading.await.unwrap();

    let text = metrics_text(&proxy.url).await;
    let peak = metric(&text, "lease_proxy_grpc_watch_held_peak_bytes", &[]);
    let cut = |budget: &str| {
        metric(
            &text,
            "lease_proxy_grpc_watch_cut_off_total",
            &[&format!("budget=\"{budget}\"")],
        )
    };
    eprintln!(
        "peak held {:.1} MiB; streams cut off: {} principal, {} replica, {} stream",
        peak / f64::from(1 << 20),
        cut("principal"),
        cut("replica"),
        cut("stream")
    );
    assert!(
        peak >= (REVISIONS << 20) as f64,
        "no history answer was ever counted (peak {peak})"
    );
    assert!(
        peak <= (64 << 20) as f64 + f64::from(1 << 20),
        "the replica held {peak} bytes of watch answers, past the attacker's 64 MiB budget"
    );
    assert!(
        cut("principal") >= 1.0,
        "the attacker's own streams were never ended: {text}"
    );
    assert_eq!(cut("replica"), 0.0);
    // Every stream gone, everything is given back.
    drop(stalled);
    eventually(
        Duration::from_secs(10),
        "every held byte given back",
        || async {
            let text = metrics_text(&proxy.url).await;
            assert!(
                text.contains("\nlease_proxy_grpc_watch_held_bytes "),
                "{text}"
            );
            let held = metric(&text, "lease_proxy_grpc_watch_held_bytes", &[]);
            if held == 0.0 {
                Probe::Done(())
            } else {
                Probe::Not(format!("{held} bytes held"))
            }
        },
    )
    .await;
}
