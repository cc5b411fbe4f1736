//! Group commit against real etcd: concurrent acquires share proposals, each keeps its own
//! outcome, and a batch cut by a leader kill never yields two holders or a grant nobody was
//! told of.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use common::*;
use lease_proxy_testkit::poll::{eventually, Probe};
use serde_json::Value;
use tokio::time::Instant;

/// 64 concurrent acquires of distinct resources: with group commit they share proposals, alone
/// each is one; the grants are the same either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_share_proposals() {
    let etcd = Etcd::single().await;
    let mut used = Vec::new();
    for batch_max in [1, 64] {
        let proxy = Proxy::start(etcd.endpoints(), |c| {
            c.batch_max = batch_max;
            c.batch_linger = Duration::from_millis(20);
            // No spares: every acquire is a grant plus its transaction.
            c.lease_spares = 0;
        })
        .await;
        let before = etcd_proposals(&etcd).await;
        let results = futures::future::join_all((0..64).map(|i| {
            let proxy = &proxy;
            async move { acquire(proxy, &format!("b{batch_max}-{i}"), "h", 30).await }
        }))
        .await;
        let after = etcd_proposals(&etcd).await;
        assert!(results.iter().all(|(s, _)| *s == 201), "{results:?}");
        used.push(after - before);
        let sizes = metrics_text(&proxy.url).await;
        let batches = sizes
            .lines()
            .find(|l| l.starts_with("lease_proxy_etcd_batch_size_count"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or_default();
        if batch_max == 1 {
            assert_eq!(batches, 64.0, "{sizes}");
        } else {
            assert!(batches < 32.0, "{batches} batches for 64 acquires");
        }
        proxy.stop().await;
    }
    // 64 grants + 64 transactions alone; 64 grants + a few batches together.
    assert!(used[0] >= 128, "{used:?}");
    assert!(used[1] < 96, "{used:?}");
}

/// Leader kills in the fault test.
const KILLS: usize = 5;

/// What one acquire came to.
#[derive(Debug, Clone)]
struct Outcome {
    resource: String,
    status: u16,
    body: Value,
}

/// Two contenders per resource, three in four of them under sessions, acquiring through
/// repeated leader kills in a three-member cluster. Afterwards: at most one grant per resource was reported, every key in
/// etcd is a reported grant (same lease, token = create revision), and every reported grant is
/// in etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_kill_mid_batch_never_makes_two_holders_or_a_hidden_grant() {
    let mut etcd = Etcd::cluster(3).await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.etcd_timeout = Duration::from_secs(2);
        c.batch_linger = Duration::from_millis(2);
    })
    .await;
    let sessions = [
        session(&proxy, "s-a", 30).await,
        session(&proxy, "s-b", 30).await,
    ];
    let started = Instant::now();
    let run_for = Duration::from_secs(12);
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let url = proxy.url.clone();
            let session = sessions[w % 2].clone();
            tokio::spawn(async move {
                let client = http();
                let mut log = Vec::new();
                let mut i = 0;
                while started.elapsed() < run_for {
                    // Workers w and w^1 contend for the same names.
                    let resource = format!("r-{}-{i}", w / 2);
                    i += 1;
                    let body = if w % 4 < 3 {
                        serde_json::json!({"holder": format!("w{w}"), "session": session.0})
                    } else {
                        serde_json::json!({"holder": format!("w{w}"), "ttl_seconds": 30})
                    };
                    let resp = client
                        .post(format!("{url}/v1/leases/{resource}"))
                        .header("lease-secret", &session.1)
                        .json(&body)
                        .timeout(Duration::from_secs(5))
                        .send()
                        .await;
                    let (status, body) = match resp {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            (status, r.json::<Value>().await.unwrap_or(Value::Null))
                        }
                        Err(_) => (0, Value::Null),
                    };
                    log.push(Outcome {
                        resource,
                        status,
                        body,
                    });
                }
                log
            })
        })
        .collect();
    // Leader kills, one after another, each member restarted once a new leader is elected.
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let leader = etcd.leader().await.expect("a leader");
        etcd.kill(leader);
        etcd.wait_leader(Duration::from_secs(10))
            .await
            .expect("a new leader");
        tokio::time::sleep(Duration::from_millis(300)).await;
        etcd.restart(leader).await;
    }
    let mut outcomes = Vec::new();
    for w in workers {
        outcomes.extend(w.await.unwrap());
    }
    etcd.wait_leader(Duration::from_secs(10))
        .await
        .expect("a new leader");
    let mut granted: HashMap<String, Vec<&Outcome>> = HashMap::new();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for o in &outcomes {
        *statuses.entry(o.status).or_default() += 1;
        if o.status == 201 {
            granted.entry(o.resource.clone()).or_default().push(o);
        }
    }
    assert!(
        statuses.get(&201).copied().unwrap_or(0) > 20,
        "too little happened: {statuses:?}"
    );
    assert!(
        outcomes
            .iter()
            .any(|o| o.status == 201 && o.body["session"].is_string()),
        "no session grant: {statuses:?}"
    );
    for (resource, grants) in &granted {
        assert_eq!(grants.len(), 1, "{resource} granted twice: {grants:?}");
    }
    // Acquires whose outcome was unknown clean up in the background: wait until no grant is
    // left in etcd that no client was told of.
    let what = format!("grants nobody was told of cleaned up ({statuses:?})");
    let (keys, _) = eventually(Duration::from_secs(15), &what, || async {
        let keys = snapshot(&etcd).await.kvs;
        let untold: Vec<String> = keys
            .iter()
            .filter_map(|(key, ..)| key.strip_prefix(b"/lease-proxy/holders/"))
            .map(|resource| String::from_utf8_lossy(resource).into_owned())
            .filter(|resource| !granted.contains_key(resource))
            .collect();
        if untold.is_empty() {
            Probe::Done(keys)
        } else {
            Probe::Not(format!("held in etcd, no client told: {untold:?}"))
        }
    })
    .await;
    let mut in_etcd = 0;
    for (key, create_revision, _, _, lease) in &keys {
        let Some(resource) = key.strip_prefix(b"/lease-proxy/holders/") else {
            continue;
        };
        in_etcd += 1;
        let resource = String::from_utf8(resource.to_vec()).unwrap();
        let reported = granted.get(&resource).unwrap_or_else(|| {
            panic!("{resource} is held in etcd but no client was told ({statuses:?})")
        });
        let grant = &reported[0].body;
        assert_eq!(lease_id(grant), *lease, "{resource}");
        assert_eq!(
            token(grant),
            u64::try_from(*create_revision).unwrap(),
            "{resource}"
        );
    }
    assert_eq!(
        in_etcd,
        granted.len(),
        "a reported grant is missing from etcd"
    );
    eprintln!("outcomes: {statuses:?}, {in_etcd} grants");
    proxy.stop().await;
}

/// `lease_proxy_etcd_batch_splits_total` of a proxy.
async fn batch_splits(proxy: &Proxy) -> f64 {
    let text = metrics_text(&proxy.url).await;
    text.lines()
        .find(|l| l.starts_with("lease_proxy_etcd_batch_splits_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no split counter in {text}"))
}

/// Closing sessions that have already lapsed (their leases gone from etcd, their records still
/// cached on this replica) among concurrent acquires: etcd refuses no batch (none is split and
/// re-sent alone), and every answer is what it would be alone — 204 for each close (nothing
/// written for it), 201 for each acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_lapsed_sessions_never_splits_a_batch() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.batch_linger = Duration::from_millis(20);
    })
    .await;
    let mut kv = etcd.client().await;
    for round in 0..3 {
        // Opened through this replica (so cached here), then lapsed behind its back.
        let mut sessions = Vec::new();
        for i in 0..8 {
            let s = session(&proxy, &format!("s{round}-{i}"), 30).await;
            assert_eq!(
                acquire_in(&proxy, &format!("in-{round}-{i}"), "h", &s)
                    .await
                    .0,
                201
            );
            kv.lease_revoke(s.0.parse::<i64>().unwrap()).await.unwrap();
            sessions.push(s);
        }
        let before = batch_splits(&proxy).await;
        let (closes, acquires) = tokio::join!(
            futures::future::join_all(sessions.iter().map(|s| close_session(&proxy, s))),
            futures::future::join_all((0..32).map(|i| {
                let proxy = &proxy;
                async move { acquire(proxy, &format!("mate-{round}-{i}"), "h", 30).await }
            })),
        );
        assert!(closes.iter().all(|(s, _)| *s == 204), "{closes:?}");
        assert!(acquires.iter().all(|(s, _)| *s == 201), "{acquires:?}");
        assert_eq!(
            batch_splits(&proxy).await,
            before,
            "round {round}: a batch was split"
        );
        for (i, (_, grant)) in acquires.iter().enumerate() {
            let key = format!("/lease-proxy/holders/mate-{round}-{i}");
            let got = kv.get(key.as_str(), None).await.unwrap();
            assert_eq!(
                got.kvs().first().map(|k| k.create_revision() as u64),
                Some(token(grant)),
                "{key}"
            );
        }
    }
    let closed = kv
        .get(
            "/lease-proxy/ended/closed/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert!(
        closed.kvs().is_empty(),
        "a close marker for a lapsed session"
    );
}
