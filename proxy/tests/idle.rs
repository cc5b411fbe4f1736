//! The proxy's connection to etcd survives idleness under etcd's default keepalive
//! enforcement: an idle minute re-opens neither the holder watch nor a
//! keepalive stream, as etcd's own `grpc_server_started_total` counts them.
//!
//! A minute because that is what was asked of it; with the old 2 s pings etcd dropped the
//! connection every ~8 s, so half of it would do, but a slower ping schedule that trips etcd's
//! limit only now and then needs the longer look.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;

/// etcd's count of streams it has started for `method`.
async fn streams_started(etcd: &Etcd, method: &str) -> u64 {
    let labels = format!("grpc_method=\"{method}\"");
    etcd_metric_where(etcd, "grpc_server_started_total", &labels).await as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_minute_reopens_no_stream() {
    let etcd = Etcd::single().await; // etcd's default --grpc-keepalive-* settings
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let (status, grant) = acquire(&proxy, "idle", "h", 300).await;
    assert_eq!(status, 201);
    let secret = str_field(&grant, "secret");
    assert_eq!(renew(&proxy, "idle", &secret).await.0, 200);
    let before = (
        streams_started(&etcd, "Watch").await,
        streams_started(&etcd, "LeaseKeepAlive").await,
    );
    assert!(before.0 >= 1 && before.1 >= 1, "{before:?}");
    tokio::time::sleep(Duration::from_secs(60)).await;
    // A keepalive stream lost while idle is re-opened by the next renewal: count after it.
    assert_eq!(renew(&proxy, "idle", &secret).await.0, 200);
    let after = (
        streams_started(&etcd, "Watch").await,
        streams_started(&etcd, "LeaseKeepAlive").await,
    );
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (0, 0),
        "watch and keepalive streams re-opened during an idle minute"
    );
    // A release right after the idle minute still wakes a waiter through the same watch.
    assert_eq!(release(&proxy, "idle", &secret).await.0, 204);
    assert_eq!(streams_started(&etcd, "Watch").await, after.0);
}
