//! Elections: the same scripted answers as etcd's.

use super::*;

/// One side's election script (jetcd's and etcd-client's election calls): answers as lines,
/// lease ids and the keys named after them replaced by their order of appearance.
async fn election_script(c: &mut Client) -> Vec<String> {
    use etcd_client::{LeaderKey, ProclaimOptions, ResignOptions};
    let first = c.lease_grant(30, None).await.unwrap().id();
    let second = c.lease_grant(30, None).await.unwrap().id();
    let names = |s: String| {
        s.replace(&format!("{first:x}"), "LEASE1")
            .replace(&format!("{second:x}"), "LEASE2")
    };
    let mut out = Vec::new();
    let leader_line = |r: Result<etcd_client::LeaderResponse, etcd_client::Error>| match r {
        Ok(r) => {
            let kv = r.kv().unwrap();
            format!(
                "leader {} = {}",
                kv.key_str().unwrap(),
                kv.value_str().unwrap()
            )
        }
        Err(etcd_client::Error::GRpcStatus(s)) => format!("error {:?} {}", s.code(), s.message()),
        Err(e) => format!("error {e}"),
    };
    out.push(leader_line(c.leader("E").await));
    let won = c.campaign("E", "v1", first).await.unwrap();
    let leader = won.leader().unwrap().clone();
    out.push(format!(
        "campaign {} rev>0:{}",
        leader.key_str().unwrap(),
        leader.rev() > 0
    ));
    let mut observe = c.observe("E").await.unwrap();
    let observed = |o: Option<etcd_client::LeaderResponse>| {
        let kv = o.unwrap();
        let kv = kv.kv().unwrap();
        format!(
            "observed {} = {}",
            kv.key_str().unwrap(),
            kv.value_str().unwrap()
        )
    };
    out.push(observed(observe.message().await.unwrap()));
    let proclaimed = ProclaimOptions::new().with_leader(leader.clone());
    c.proclaim("v2", Some(proclaimed)).await.unwrap();
    out.push(observed(observe.message().await.unwrap()));
    out.push(leader_line(c.leader("E").await));
    // A second candidate waits while the first leads.
    let mut other = c.clone();
    let waiting = tokio::spawn(async move { other.campaign("E", "w1", second).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(700)).await;
    out.push(format!("second waits: {}", !waiting.is_finished()));
    // A stale leader key proclaims nothing and resigns nothing.
    let stale = LeaderKey::new()
        .with_name("E")
        .with_key(leader.key().to_vec())
        .with_rev(leader.rev() + 1000)
        .with_lease(first);
    let refused = c
        .proclaim(
            "v3",
            Some(ProclaimOptions::new().with_leader(stale.clone())),
        )
        .await
        .unwrap_err();
    out.push(format!("stale proclaim: {refused}"));
    c.resign(Some(ResignOptions::new().with_leader(stale)))
        .await
        .unwrap();
    out.push(format!("still leads: {}", !waiting.is_finished()));
    c.resign(Some(ResignOptions::new().with_leader(leader)))
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the second candidate never led")
        .unwrap();
    out.push(format!(
        "second leads: {}",
        next.leader().unwrap().key_str().unwrap()
    ));
    out.push(observed(observe.message().await.unwrap()));
    out.into_iter().map(names).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_answers_equal_etcds() {
    let raw_etcd = Etcd::single().await;
    let behind = Etcd::single().await;
    let proxy = Proxy::start(behind.endpoints(), |c| c.v3_namespace = Some("/ns/".into())).await;
    let etcd_side = election_script(&mut client(&raw_etcd.endpoint(0)).await).await;
    let mut c = client(&proxy.url).await;
    let ours = election_script(&mut c).await;
    for (i, (etcd, ours)) in etcd_side.iter().zip(&ours).enumerate() {
        assert_eq!(
            ours, etcd,
            "step {i}: the proxy's (left) differs from etcd's"
        );
    }
    assert_eq!(ours.len(), etcd_side.len());
    // Every election key is inside the namespace.
    let mut raw = behind.client().await;
    let all = raw
        .get("E/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(
        all.kvs().is_empty(),
        "an election key outside the namespace"
    );
    // A campaign's answer carries the leader's fencing token.
    let lease = c.lease_grant(30, None).await.unwrap().id();
    let (headers, _) = unary(
        &proxy.url,
        "/v3electionpb.Election/Campaign",
        &CampaignRequest {
            name: b"F".to_vec(),
            lease,
            value: b"x".to_vec(),
        },
        None,
    )
    .await;
    assert_eq!(headers["fencing-resource"], "lock/46");
    assert!(headers.contains_key("fencing-token"));
}

/// `v3electionpb.CampaignRequest`, as the test sends it.
#[derive(Clone, PartialEq, Message)]
struct CampaignRequest {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(int64, tag = "2")]
    lease: i64,
    #[prost(bytes = "vec", tag = "3")]
    value: Vec<u8>,
}
