//! Leader failover on a real three-member etcd cluster: holders that keep renewing never lose
//! their leases because of it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use etcd_client::proto::{PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse};
use tokio::time::Instant;

const HOLDERS: usize = 20;
const TTL: u64 = 6;
/// etcd's default election timeout.
const ELECTION_TIMEOUT: Duration = Duration::from_millis(1000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_loses_no_lease() {
    let mut etcd = Etcd::cluster(3).await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.etcd_timeout = Duration::from_secs(2);
    })
    .await;
    let mut holders = Vec::new();
    for i in 0..HOLDERS {
        let (status, grant) =
            acquire(&proxy, &format!("shard-{i}"), &format!("owner-{i}"), TTL).await;
        assert_eq!(status, 201, "{grant}");
        holders.push((
            format!("shard-{i}"),
            str_field(&grant, "secret"),
            token(&grant),
        ));
    }

    // Every holder renews every TTL/3 and records the outcome of each attempt.
    let started = Instant::now();
    let run_for = Duration::from_secs(14);
    let tasks: Vec<_> = holders
        .iter()
        .cloned()
        .map(|(resource, secret, _)| {
            let url = proxy.url.clone();
            tokio::spawn(async move {
                let client = http();
                let mut log = Vec::new();
                let mut next = Instant::now();
                while started.elapsed() < run_for {
                    let at = Instant::now();
                    let status = match client
                        .post(format!("{url}/v1/leases/{resource}/renew"))
                        .header("lease-secret", &secret)
                        .timeout(Duration::from_secs(3))
                        .send()
                        .await
                    {
                        Ok(r) => r.status().as_u16(),
                        Err(_) => 0,
                    };
                    log.push((at, status));
                    // Retry quickly after a failure, otherwise keep the TTL/3 cadence.
                    next += Duration::from_secs(TTL) / 3;
                    let wait = if status == 200 {
                        next.saturating_duration_since(Instant::now())
                    } else {
                        next = Instant::now();
                        Duration::from_millis(200)
                    };
                    tokio::time::sleep(wait).await;
                }
                log
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_secs(3)).await;
    let leader = etcd.leader().await.expect("a leader before the kill");
    let killed_at = Instant::now();
    etcd.kill(leader);
    let new_leader = etcd
        .wait_leader(Duration::from_secs(10))
        .await
        .expect("a new leader");
    let elected_after = killed_at.elapsed();
    assert_ne!(new_leader, leader);

    let resume_deadline = ELECTION_TIMEOUT + Duration::from_secs(2);
    for (task, (resource, _, _)) in tasks.into_iter().zip(&holders) {
        let log = task.await.unwrap();
        assert!(
            log.iter().all(|(_, s)| *s != 410),
            "{resource} lost its lease: {log:?}"
        );
        let resumed = log
            .iter()
            .find(|(at, s)| *at > killed_at && *s == 200)
            .map(|(at, _)| *at - killed_at)
            .unwrap_or_else(|| panic!("{resource} never renewed after the kill: {log:?}"));
        // A renewal that was due just after the kill must succeed within the bound; holders whose
        // next renewal was scheduled later resume at their own cadence.
        let first_try_after_kill = log
            .iter()
            .find(|(at, _)| *at > killed_at)
            .map(|(at, _)| *at - killed_at)
            .unwrap();
        assert!(
            resumed <= first_try_after_kill.max(Duration::ZERO) + resume_deadline,
            "{resource}: renewals resumed {resumed:?} after the kill (first try at \
             {first_try_after_kill:?}, leader elected after {elected_after:?})"
        );
    }
    // Every holder still holds its resource with its original token.
    for (resource, secret, original) in &holders {
        let (status, renewed) = renew(&proxy, resource, secret).await;
        assert_eq!(status, 200, "{resource}: {renewed}");
        assert_eq!(token(&renewed), *original);
    }
}

/// A gRPC keepalive stream with several renewals under way renews on an etcd stream of its own
/// (two such client streams: two etcd streams, beside the shared one that renews while they
/// open). When the member under it stops answering (paused), the renewals on it, and those
/// after, are answered through another member on the same client stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepalive_stream_renews_through_a_paused_member() {
    let etcd = Etcd::cluster(3).await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.etcd_timeout = Duration::from_secs(3);
    })
    .await;
    let mut c = etcd_client::Client::connect([&proxy.url], None)
        .await
        .unwrap();
    let id = c.lease_grant(60, None).await.unwrap().id();
    let before = keepalive_streams_started(&etcd).await;
    let mut streams = Vec::new();
    for _ in 0..2 {
        streams.push(keepalive_burst(&proxy.url, id, 20, 60).await);
    }
    // The proxy's etcd streams are on the first member until it fails.
    assert_eq!(keepalive_streams_started(&etcd).await - before, 3);

    let ask = PbLeaseKeepAliveRequest { id };
    etcd.signal(0, "STOP");
    let mut ttls = Vec::new();
    for _ in 0..3 {
        streams[0].send(&ask).await;
        let answer = tokio::time::timeout(Duration::from_secs(10), streams[0].next()).await;
        ttls.push(answer.map(|a: Option<PbLeaseKeepAliveResponse>| a.unwrap().ttl));
    }
    etcd.signal(0, "CONT");
    for ttl in ttls {
        assert_eq!(ttl.expect("answered with the first member paused"), 60);
    }
}
