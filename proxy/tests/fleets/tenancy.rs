//! Fleets shared by tenants, with authentication on: what another tenant's refusals tell it
//! (nothing of the fleet), the budgets a fleet counts against (the held quota, the acquire
//! rate), and the bounds that keep a fleet's records writable (members, names).

use std::time::Duration;

use serde_json::{json, Value};

use super::common::fleet::{make_fleet, names};
use super::common::*;
use super::{replicas, Replicas};
use lease_proxy_testkit::poll::{eventually, Probe};

const WITHIN: Duration = Duration::from_secs(15);

fn tokens(dir: &tempfile::TempDir, lines: &[(&str, &str, &str)]) -> std::path::PathBuf {
    let path = dir.path().join("tokens");
    let file: String = lines
        .iter()
        .map(|(name, token, perms)| token_line(name, token, perms))
        .collect();
    std::fs::write(&path, file).unwrap();
    path
}

fn slug(body: &Value) -> &str {
    body["type"]
        .as_str()
        .and_then(|t| t.rsplit('/').next())
        .unwrap_or_default()
}

/// `method url` as `token`, with `secret` in `Lease-Secret` if any.
async fn call(method: &str, url: &str, token: &str, secret: Option<&str>) -> (u16, Value) {
    let mut req = match method {
        "GET" => http().get(url),
        "POST" => http().post(url),
        "DELETE" => http().delete(url),
        other => panic!("{other}"),
    }
    .bearer_auth(token);
    if let Some(secret) = secret {
        req = req.header("lease-secret", secret);
    }
    send(req).await
}

/// `POST {url}/v1/fleets/{fleet}/members` as `token`.
async fn join_as(url: &str, fleet: &str, token: &str, member: &str, ttl: u64) -> (u16, Value) {
    let body = json!({"member": member, "ttl_seconds": ttl});
    send(
        http()
            .post(format!("{url}/v1/fleets/{fleet}/members"))
            .bearer_auth(token)
            .json(&body),
    )
    .await
}

/// `PUT {url}/v1/fleets/{fleet}` as `token`.
async fn put_as(url: &str, fleet: &str, token: &str, body: &Value) -> (u16, Value) {
    let req = http().put(format!("{url}/v1/fleets/{fleet}"));
    send(req.bearer_auth(token).json(body)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_learns_nothing_of_a_fleet_it_may_not_act_on() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens(
        &dir,
        &[
            ("alice", "alice-token", "acquire:tn-,read:tn-"),
            ("carol", "carol-token", "acquire:other-,read:other-"),
        ],
    );
    let Replicas {
        etcd: _etcd, r1, ..
    } = replicas("fleet-tenancy", |c| {
        c.auth_tokens = Some(tokens.clone());
    })
    .await;
    let url = &r1.url;
    let resources = names("tn-secret", 3);
    let (status, body) = put_as(url, "tn", "alice-token", &json!({"resources": resources})).await;
    assert_eq!(status, 200, "{body}");
    let (status, m1) = join_as(url, "tn", "alice-token", "m1", 30).await;
    assert_eq!(status, 201, "{m1}");
    let secret = str_field(&m1, "secret");

    // Every answer carol gets is the same refusal, whether the member exists or not, and none
    // names a resource of the fleet.
    let fleet = format!("{url}/v1/fleets/tn");
    let member = |name: &str| format!("{fleet}/members/{name}");
    let drain = |name: &str| format!("{fleet}/members/{name}/drain");
    let mut asked = vec![
        ("GET", fleet.clone(), None),
        ("DELETE", fleet.clone(), None),
        ("DELETE", member("m1"), None),
        ("DELETE", member("ghost"), None),
        ("POST", drain("m1"), None),
        ("POST", drain("ghost"), None),
        ("POST", drain("m1"), Some(secret.clone())),
        ("POST", drain("ghost"), Some(secret.clone())),
        ("GET", member("m1"), Some(secret.clone())),
        ("GET", member("ghost"), Some(secret.clone())),
    ];
    let mut answers = Vec::new();
    for (method, target, shown) in asked.drain(..) {
        let (status, body) = call(method, &target, "carol-token", shown.as_deref()).await;
        let detail = body["detail"].as_str().unwrap_or_default().to_owned();
        assert_eq!(
            (status, slug(&body)),
            (403, "forbidden"),
            "{method} {target}: {body}"
        );
        assert!(
            !detail.contains("tn-"),
            "{method} {target} names a resource: {detail}"
        );
        answers.push((method, target, detail));
    }
    let (_, _, first) = &answers[1];
    for (method, target, detail) in &answers[1..] {
        assert_eq!(detail, first, "{method} {target} tells the member apart");
    }
    let (status, body) = join_as(url, "tn", "carol-token", "m9", 30).await;
    assert_eq!((status, slug(&body)), (403, "forbidden"), "{body}");
    assert!(!body["detail"].as_str().unwrap().contains("tn-"), "{body}");
    // The member is untouched.
    let (status, view) = call("GET", &member("m1"), "alice-token", Some(&secret)).await;
    assert_eq!(
        (status, view["state"].as_str()),
        (200, Some("active")),
        "{view}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_whose_assignment_could_outgrow_one_etcd_request_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens(&dir, &[("alice", "alice-token", "acquire:tn-,read:tn-")]);
    let Replicas {
        etcd: _etcd, r1, ..
    } = replicas("fleet-fat", |c| {
        c.auth_tokens = Some(tokens.clone());
    })
    .await;
    let url = &r1.url;
    // A spec whose assignment could outgrow one etcd request (every name listed twice while
    // it is handed off) is refused before anything is written.
    let fat: Vec<String> = (0..10_000)
        .map(|i| format!("tn-{i:05}-{}", "x".repeat(52)))
        .collect();
    let (status, body) = put_as(url, "tn-fat", "alice-token", &json!({"resources": fat})).await;
    assert_eq!(
        (status, slug(&body)),
        (400, "invalid-field"),
        "{}",
        body["detail"]
    );
    let (status, _) = call(
        "GET",
        &format!("{url}/v1/fleets/tn-fat"),
        "alice-token",
        None,
    )
    .await;
    assert_eq!(status, 404);
}

/// The held-quota index keys of `principal` under `prefix`.
async fn index_keys(etcd: &Etcd, prefix: &str, principal: &str) -> usize {
    keys_under(etcd, &format!("{prefix}principals/{principal}/")).await
}

/// How many keys lie under `prefix`.
async fn keys_under(etcd: &Etcd, prefix: &str) -> usize {
    let mut client = etcd.client().await;
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_keys_only();
    client.get(prefix, Some(options)).await.unwrap().kvs().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_is_no_way_around_the_held_quota() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens(&dir, &[("alice", "alice-token", "acquire:qa-,read:qa-")]);
    let Replicas {
        etcd,
        r1,
        r2,
        prefix,
    } = replicas("fleet-quota", |c| {
        c.auth_tokens = Some(tokens.clone());
        c.quota_held = Some(3);
    })
    .await;
    let url = &r1.url;
    let acquire = |resource: &'static str| {
        let url = url.clone();
        async move {
            let body = json!({"holder": "h", "ttl_seconds": 30});
            let req = http().post(format!("{url}/v1/leases/{resource}"));
            send(req.bearer_auth("alice-token").json(&body)).await
        }
    };
    let (status, plain) = acquire("qa-plain").await;
    assert_eq!(status, 201, "{plain}");
    let resources = names("qa-fleet", 5);
    let (status, body) = put_as(url, "qa", "alice-token", &json!({"resources": resources})).await;
    assert_eq!(status, 200, "{body}");
    let (status, m) = join_as(&r2.url, "qa", "alice-token", "m", 30).await;
    assert_eq!(status, 201, "{m}");
    let secret = str_field(&m, "secret");
    let member = format!("{url}/v1/fleets/qa/members/m");
    let holding = |want: usize| {
        let (member, secret) = (member.clone(), secret.clone());
        async move {
            eventually(WITHIN, &format!("the member holds {want}"), || async {
                let (status, view) = call("GET", &member, "alice-token", Some(&secret)).await;
                let held = view["held"].as_array().map_or(0, Vec::len);
                if status == 200 && held == want {
                    Probe::Done(())
                } else {
                    Probe::Not(format!("{status}: holds {held}: {view}"))
                }
            })
            .await;
        }
    };
    // One held by hand, two by the fleet: the quota of 3 is full, whichever way it was taken.
    holding(2).await;
    let (status, body) = acquire("qa-more").await;
    assert_eq!((status, slug(&body)), (429, "quota-exceeded"), "{body}");
    assert_eq!(index_keys(&etcd, &prefix, "alice").await, 3);
    // The hand-made grant released: the fleet takes the room.
    let lease_secret = str_field(&plain, "secret");
    let release = http().delete(format!("{url}/v1/leases/qa-plain"));
    let (status, _) = send(
        release
            .bearer_auth("alice-token")
            .header("lease-secret", lease_secret),
    )
    .await;
    assert_eq!(status, 204);
    holding(3).await;
    // The fleet ended: its grants go, and their index keys with them.
    let (status, _) = call(
        "DELETE",
        &format!("{url}/v1/fleets/qa"),
        "alice-token",
        None,
    )
    .await;
    assert_eq!(status, 204);
    eventually(WITHIN, "no index key left", || async {
        match index_keys(&etcd, &prefix, "alice").await {
            0 => Probe::Done(()),
            n => Probe::Not(format!("{n} left")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_written_again_costs_the_rate_and_unchanged_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens(&dir, &[("alice", "alice-token", "acquire:sp-,read:sp-")]);
    let Replicas {
        etcd, r1, prefix, ..
    } = replicas("fleet-spec-rate", |c| {
        c.auth_tokens = Some(tokens.clone());
        c.quota_acquire_rate = Some(2.0);
    })
    .await;
    let url = &r1.url;
    let spec = json!({"resources": names("sp", 4), "drain_ms": 1000});
    let spec_key = format!("{prefix}fleets/sp/spec");
    let mod_revision = || async {
        let mut client = etcd.client().await;
        let got = client.get(spec_key.as_str(), None).await.unwrap();
        got.kvs()
            .first()
            .map_or(0, etcd_client::KeyValue::mod_revision)
    };
    let (status, first) = put_as(url, "sp", "alice-token", &spec).await;
    assert_eq!(status, 200, "{first}");
    let written = mod_revision().await;
    // The same spec again: the same answer, nothing written.
    let (status, again) = eventually(WITHIN, "a second PUT within the rate", || async {
        match put_as(url, "sp", "alice-token", &spec).await {
            (429, _) => Probe::Not("limited".into()),
            answer => Probe::Done(answer),
        }
    })
    .await
    .0;
    assert_eq!((status, &again), (200, &first));
    assert_eq!(
        mod_revision().await,
        written,
        "an unchanged spec was written again"
    );
    // Written in a tight loop, specs are held back by the acquire rate (2/s).
    let mut limited = 0;
    for i in 0..12 {
        let spec = json!({"resources": names("sp", 4), "drain_ms": 2000 + i});
        match put_as(url, "sp", "alice-token", &spec).await {
            (200, _) => {}
            (429, body) => {
                assert_eq!(slug(&body), "quota-exceeded", "{body}");
                limited += 1;
            }
            (status, body) => panic!("{status}: {body}"),
        }
    }
    assert!(limited >= 6, "only {limited} of 12 PUTs limited at 2/s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_joins_never_take_a_fleet_past_its_member_bound() {
    const BOUND: usize = 1_000;
    const BEFORE: usize = BOUND - 20;
    let Replicas {
        etcd: _etcd,
        r1,
        r2,
        ..
    } = replicas("fleet-bound", |_| {}).await;
    make_fleet(&r1.url, "fb", &names("fb", 10), json!({})).await;
    let join = |i: usize| {
        let url = if i.is_multiple_of(2) {
            r1.url.clone()
        } else {
            r2.url.clone()
        };
        async move {
            let body = json!({"member": format!("m{i:04}"), "ttl_seconds": 120});
            let req = http().post(format!("{url}/v1/fleets/fb/members"));
            send(req.json(&body)).await
        }
    };
    use futures::StreamExt as _;
    let joined: Vec<(u16, Value)> = futures::stream::iter(0..BEFORE)
        .map(join)
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(
        joined.iter().all(|(s, _)| *s == 201),
        "a join before the bound failed"
    );
    // Sixty at once for the last twenty places.
    let last = futures::future::join_all((BEFORE..BEFORE + 60).map(join)).await;
    let admitted = last.iter().filter(|(s, _)| *s == 201).count();
    for (status, body) in last.iter().filter(|(s, _)| *s != 201) {
        assert_eq!((*status, slug(body)), (409, "fleet-full"), "{body}");
    }
    let (status, view) = send(http().get(format!("{}/v1/fleets/fb", r1.url))).await;
    assert_eq!(status, 200);
    let members = view["members"].as_array().map_or(0, Vec::len);
    assert!(
        members <= BOUND,
        "{members} members, {admitted} of 60 admitted"
    );
    assert_eq!(members, BEFORE + admitted, "a refused join stayed a member");
}

/// A replica's count of etcd requests of kind `op`.
async fn etcd_requests(url: &str, op: &str) -> u64 {
    let op = format!("op=\"{op}\"");
    metric(
        &metrics_text(url).await,
        "lease_proxy_etcd_request_duration_seconds_count",
        &[&op],
    ) as u64
}

/// The replica's open event streams and long polls.
async fn streams(url: &str) -> u64 {
    metric(&metrics_text(url).await, "lease_proxy_watch_streams", &[]) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_long_polls_of_one_fleet_share_each_reading_of_it() {
    const WAITERS: usize = 30;
    let Replicas {
        etcd: _etcd,
        r1,
        r2,
        ..
    } = replicas("fleet-waiters", |_| {}).await;
    // One resource each: a woken waiter has a grant to read (a newcomer then gets none, as the
    // fleet is balanced already, and moves none).
    make_fleet(&r1.url, "fw", &names("fw", WAITERS), json!({"drain_ms": 0})).await;
    let mut members = Vec::new();
    for i in 0..WAITERS {
        let name = format!("m{i:02}");
        members.push(super::common::fleet::joined(&r1.url, "fw", &name, 60).await);
    }
    // At rest with one each: a view read before the last join's rebalance would change.
    let names: Vec<String> = (0..WAITERS).map(|i| format!("m{i:02}")).collect();
    let one_each: Vec<(&str, usize)> = names.iter().map(|n| (n.as_str(), 1)).collect();
    super::common::fleet::rested(&r2.url, "fw", &one_each, WITHIN).await;
    let mut waiting = Vec::new();
    for m in members {
        let (status, view) = m.view().await;
        assert_eq!(status, 200, "{view}");
        let after = str_field(&view, "revision");
        // Each waits for its view to change: the join below changes none of them.
        waiting.push(tokio::spawn(
            async move { m.view_after(&after, 20_000).await },
        ));
    }
    eventually(WITHIN, "every member waits", || async {
        match streams(&r1.url).await {
            n if n >= WAITERS as u64 => Probe::Done(()),
            n => Probe::Not(format!("{n} waiting")),
        }
    })
    .await;
    // What a woken waiter reads: the fleet's keys (`range`), its grants (`txn_read`) and its
    // session (`get`, proving the secret).
    let reads = || async {
        let mut n = 0;
        for op in ["range", "txn_read", "get"] {
            n += etcd_requests(&r1.url, op).await;
        }
        n
    };
    let before = reads().await;
    // A newcomer, through the other replica: every waiter on r1 is woken and looks again.
    let (status, body) = super::common::fleet::join(&r2.url, "fw", "newcomer", 60).await;
    assert_eq!(status, 201, "{body}");
    let mut most = 0;
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < until {
        most = most.max(reads().await - before);
        assert!(
            most < WAITERS as u64 / 2,
            "{most} reads of the fleet on one replica for one change, {WAITERS} waiting"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for w in waiting {
        w.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_makes_at_most_its_quota_of_fleets() {
    let dir = tempfile::tempdir().unwrap();
    let perms = "acquire:fq-,read:fq-";
    let tokens = tokens(
        &dir,
        &[("alice", "alice-token", perms), ("bob", "bob-token", perms)],
    );
    let Replicas {
        etcd,
        r1,
        r2,
        prefix,
    } = replicas("fleet-fquota", |c| {
        c.auth_tokens = Some(tokens.clone());
        c.quota_fleets = Some(3);
    })
    .await;
    let spec = json!({"resources": ["fq-1", "fq-2"]});
    let alices = format!("{prefix}fleet-owners/alice/");
    let owned = || keys_under(&etcd, &alices);
    // Eight made at once through both replicas: never more than three.
    let puts = (0..8).map(|i| {
        let (url, spec) = ([&r1.url, &r2.url][i % 2].clone(), spec.clone());
        async move { put_as(&url, &format!("fq-a{i}"), "alice-token", &spec).await }
    });
    let answers = futures::future::join_all(puts).await;
    let made = answers.iter().filter(|(s, _)| *s == 200).count();
    assert!(
        answers
            .iter()
            .all(|(s, b)| *s == 200 || (*s == 429 && b["quota"] == "fleets") || *s == 409),
        "{answers:?}"
    );
    assert!((1..=3).contains(&made), "{made} made: {answers:?}");
    assert_eq!(owned().await, made);
    // One at a time, up to the quota, and no further.
    for i in made..3 {
        let (status, body) = put_as(&r1.url, &format!("fq-b{i}"), "alice-token", &spec).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = put_as(&r2.url, "fq-over", "alice-token", &spec).await;
    assert_eq!(
        (status, slug(&body), &body["quota"]),
        (429, "quota-exceeded", &json!("fleets")),
        "{body}"
    );
    let (status, _) = call(
        "GET",
        &format!("{}/v1/fleets/fq-over", r1.url),
        "alice-token",
        None,
    )
    .await;
    assert_eq!(status, 404, "a refused fleet is not made");
    assert_eq!(owned().await, 3);
    let mut refusals = 0.0;
    for url in [&r1.url, &r2.url] {
        let text = metrics_text(url).await;
        refusals += metric(
            &text,
            "lease_proxy_quota_refusals_total",
            &["quota=\"fleets\""],
        );
    }
    assert!(refusals >= 1.0, "{refusals} refusals counted");
    // A fleet it made may still change; another principal has a quota of its own.
    let made_one = answers
        .iter()
        .enumerate()
        .find(|(_, (s, _))| *s == 200)
        .map(|(i, _)| format!("fq-a{i}"))
        .unwrap();
    let changed = json!({"resources": ["fq-1", "fq-2", "fq-3"]});
    let (status, body) = put_as(&r1.url, &made_one, "alice-token", &changed).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = put_as(&r1.url, "fq-bob", "bob-token", &spec).await;
    assert_eq!(status, 200, "{body}");
    // Ending one makes room for one.
    let (status, _) = call(
        "DELETE",
        &format!("{}/v1/fleets/{made_one}", r2.url),
        "alice-token",
        None,
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(owned().await, 2);
    let (status, body) = put_as(&r2.url, "fq-over", "alice-token", &spec).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(owned().await, 3);
    // A replica without authentication on the same prefix changes a fleet of alice's: the
    // fleet stays hers, so she still ends it, and its key goes with it.
    let open = r1
        .replica(etcd.endpoints(), |c| {
            c.etcd_prefix = prefix.clone();
        })
        .await;
    let (status, body) = send(
        http()
            .put(format!("{}/v1/fleets/fq-over", open.url))
            .json(&changed),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = call(
        "DELETE",
        &format!("{}/v1/fleets/fq-over", r1.url),
        "alice-token",
        None,
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(owned().await, 2);
}
