//! A hostile client against the etcd-compatible `/v3` API (docs/DESIGN.md §7.6): thousands of
//! request variants for every endpoint — data after the JSON value, line breaks and spaces inside
//! base64, both spellings of a field, duplicate keys, unicode escapes in field names and values,
//! signs, spaces and leading zeros in ids, nested transactions, range ends at and past the
//! namespace's end, empty and `\0` keys, other leases' ids — and then etcd itself, read directly,
//! must show that nothing outside the namespace was created, changed or deleted, that the proxy's
//! own leases (a live `/v1` grant, a spare) were neither revoked nor renewed nor given keys, and no
//! answer carried a byte of what lies outside.
//!
//! The requests come from a seeded generator; the seed is printed, and `V3_HOSTILE_SEED=<seed>`
//! replays a run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use lease_proxy_testkit::v3_hostile::{
    find_needle, hidden, needle_pair, needles, planted, Gen, Leases, HOLDER_KEY, MARKERS,
    NAMESPACE as NS,
};
use tokio::time::Instant;

const REQUESTS: usize = 2400;
const CONCURRENCY: usize = 8;

/// Every key outside the namespace (except `/v3` lease markers, which `/v3` grants create):
/// key → (create revision, mod revision, value, lease).
async fn outside(etcd: &Etcd) -> BTreeMap<Vec<u8>, (i64, i64, Vec<u8>, i64)> {
    snapshot(etcd)
        .await
        .kvs
        .into_iter()
        .filter(|kv| !kv.0.starts_with(NS) && !kv.0.starts_with(MARKERS))
        .map(|(k, c, m, v, l)| (k, (c, m, v, l)))
        .collect()
}

/// A lease's remaining TTL as etcd reports it (-1: gone).
async fn remaining(etcd: &Etcd, id: i64) -> i64 {
    etcd.client()
        .await
        .lease_time_to_live(id, None)
        .await
        .unwrap()
        .ttl()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_client_cannot_reach_outside_the_namespace() {
    let seed: u64 = std::env::var("V3_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("v3_hostile seed: {seed} (replay with V3_HOSTILE_SEED={seed})");

    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let mut client = etcd.client().await;
    for (key, value) in planted().into_iter().chain(hidden()) {
        client.put(key, value, None).await.unwrap();
    }
    // A live /v1 grant, and a spare lease (a refused acquire's, kept by the proxy for reuse).
    let (status, grant) = acquire(&proxy, "aisle-1", "robot-1", 60).await;
    assert_eq!(status, 201, "{grant}");
    let native = lease_id(&grant);
    let (status, refused) = acquire(&proxy, "aisle-1", "robot-2", 60).await;
    assert_eq!(status, 409, "{refused}");
    // Spares: the refused acquire's lease, or one granted ahead of demand — leases the proxy
    // keeps that carry no key. Let the refill settle first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spares: Vec<i64> = snapshot(&etcd)
        .await
        .leases
        .into_iter()
        .filter(|l| *l != native)
        .collect();
    assert!(!spares.is_empty(), "the proxy keeps spare leases");
    let spare = spares[0];
    // The client's own /v3 lease.
    let own: serde_json::Value = http()
        .post(format!("{}/v3/lease/grant", proxy.url))
        .body(r#"{"TTL":600}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let own: i64 = own["ID"].as_str().unwrap().parse().unwrap();

    let before = outside(&etcd).await;
    let holder_value = before[HOLDER_KEY].2.clone();
    let ttl_before = [
        (native, remaining(&etcd, native).await),
        (spare, remaining(&etcd, spare).await),
    ];
    let started = Instant::now();

    // Everything outside must stay invisible: keys and values, raw and in base64.
    let mut needles = needles();
    needles.extend(needle_pair(&holder_value));

    let mut gen = Gen::new(seed, Leases { native, spare, own });
    let requests: Vec<(String, String)> = (0..REQUESTS)
        .map(|_| {
            let r = gen.request();
            (r.path, r.body)
        })
        .collect();
    let client = http();
    let answers: Vec<(String, String, u16, String)> = futures::stream::iter(requests)
        .map(|(path, body)| {
            let req = client
                .post(format!("{}{path}", proxy.url))
                .timeout(Duration::from_secs(10))
                .body(body.clone());
            async move {
                let resp = req
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{path} {body}: {e}"));
                let status = resp.status().as_u16();
                (path, body, status, resp.text().await.unwrap())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;

    let mut by_status: BTreeMap<(String, u16), usize> = BTreeMap::new();
    for (path, body, status, text) in &answers {
        *by_status.entry((path.clone(), *status)).or_default() += 1;
        let context = format!("{path} {body:?} → {status} {text}");
        assert!(
            matches!(status, 200 | 400 | 404 | 500),
            "unexpected status: {context}"
        );
        if *status == 500 {
            assert!(
                text.contains("requested lease not found") || text.contains("key is not provided"),
                "{context}"
            );
        }
        if let Some(needle) = find_needle(text.as_bytes(), &needles) {
            panic!(
                "an answer carried {:?} from outside the namespace: {context}",
                String::from_utf8_lossy(needle)
            );
        }
    }
    println!(
        "{} requests in {:?}; by endpoint and status: {by_status:?}",
        answers.len(),
        started.elapsed()
    );
    let refused = answers.iter().filter(|a| a.2 == 400).count();
    let served = answers.iter().filter(|a| a.2 == 200).count();
    assert!(
        refused > 200 && served > 200,
        "{refused} refused, {served} served"
    );

    // Nothing outside the namespace was created, changed or deleted.
    let after = outside(&etcd).await;
    for (key, state) in &before {
        assert_eq!(
            after.get(key),
            Some(state),
            "{:?} changed or vanished",
            String::from_utf8_lossy(key)
        );
    }
    for key in after.keys() {
        assert!(
            before.contains_key(key),
            "{:?} was created outside the namespace",
            String::from_utf8_lossy(key)
        );
    }
    // Lease markers exist only for leases granted through /v3, each attached to its own lease.
    for (key, _, _, _, lease) in snapshot(&etcd).await.kvs {
        if let Some(id) = key.strip_prefix(MARKERS) {
            let id: i64 = String::from_utf8(id.to_vec()).unwrap().parse().unwrap();
            assert_eq!(id, lease, "marker {key:?}");
            assert!(
                id != native && id != spare,
                "a proxy lease was marked as /v3's"
            );
        }
        // No key anywhere was attached to the proxy's own leases, beyond the holder's record.
        if lease == native || lease == spare {
            assert_eq!(key, HOLDER_KEY, "{key:?} attached to a proxy lease");
        }
    }
    // The proxy's leases were neither revoked nor renewed: their TTL only ran down.
    let elapsed = started.elapsed().as_secs() as i64;
    for (id, ttl) in ttl_before {
        let now = remaining(&etcd, id).await;
        assert!(now > 0, "lease {id} was revoked");
        assert!(
            now <= ttl - elapsed + 1,
            "lease {id} was renewed: {ttl} s left before, {now} s after {elapsed} s"
        );
    }
    // And the /v1 holder still holds, with its token.
    let (status, held) = send(http().get(format!("{}/v1/leases/aisle-1", proxy.url))).await;
    assert_eq!(status, 200, "{held}");
    assert_eq!(token(&held), token(&grant));
}
