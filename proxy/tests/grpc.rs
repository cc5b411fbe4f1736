//! etcd's gRPC API on the proxy's own listener, against real etcd: the same scripted requests,
//! sent with the `etcd-client` crate to the proxy and straight to etcd, give the same answers
//! once what legitimately differs is normalised; keys written through the proxy are inside its
//! namespace in etcd, and no range end leads out of it.
//!
//! Normalisation: response headers dropped (cluster, member, revision, raft term), every
//! create/mod revision zeroed, lease ids replaced by their order of first appearance, a remaining
//! TTL above 0 by 1 (a second may tick between the two sides), a lease's keys sorted.
//!
//! The streaming services are in grpc_services.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use prost::Message;

use common::h2grpc;
use common::*;
use etcd_client::proto::{
    PbKeyValue, PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse, PbLeaseTimeToLiveResponse,
    PbPutRequest, PbTxnOpResponse, PbTxnResponse,
};
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, LeaseTimeToLiveOptions, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp,
};
use lease_proxy_testkit::poll::until;

/// One side's lease ids, as symbols in order of first appearance.
#[derive(Default)]
struct Leases(HashMap<i64, i64>);

impl Leases {
    fn symbol(&mut self, id: i64) -> i64 {
        if id == 0 {
            return 0;
        }
        let next = self.0.len() as i64 + 1;
        *self.0.entry(id).or_insert(next)
    }

    fn kv(&mut self, kv: &mut PbKeyValue) {
        kv.create_revision = 0;
        kv.mod_revision = 0;
        kv.lease = self.symbol(kv.lease);
    }

    fn kvs(&mut self, kvs: &mut [PbKeyValue]) {
        kvs.iter_mut().for_each(|kv| self.kv(kv));
    }

    fn txn(&mut self, t: &mut PbTxnResponse) {
        t.header = None;
        for op in &mut t.responses {
            match &mut op.response {
                Some(PbTxnOpResponse::ResponseRange(r)) => {
                    r.header = None;
                    self.kvs(&mut r.kvs);
                }
                Some(PbTxnOpResponse::ResponsePut(p)) => {
                    p.header = None;
                    p.prev_kv.iter_mut().for_each(|kv| self.kv(kv));
                }
                Some(PbTxnOpResponse::ResponseDeleteRange(d)) => {
                    d.header = None;
                    self.kvs(&mut d.prev_kvs);
                }
                Some(PbTxnOpResponse::ResponseTxn(inner)) => self.txn(inner),
                None => {}
            }
        }
    }

    fn time_to_live(&mut self, mut t: PbLeaseTimeToLiveResponse) -> PbLeaseTimeToLiveResponse {
        t.header = None;
        t.id = self.symbol(t.id);
        t.ttl = t.ttl.min(1);
        t.keys.sort();
        t
    }

    fn keep_alive(&mut self, mut k: PbLeaseKeepAliveResponse) -> PbLeaseKeepAliveResponse {
        k.header = None;
        k.id = self.symbol(k.id);
        k
    }
}

/// An error as etcd clients see it: the gRPC code and the message.
fn error(e: etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => format!("{:?} {:?}", s.code(), s.message()),
        other => format!("not a gRPC status: {other}"),
    }
}

/// The script, on one side: every answer normalised, one line per request.
async fn script(c: &mut Client) -> Vec<String> {
    let mut n = Leases::default();
    let mut out = Vec::new();
    let mut log = |step: &str, answer: String| out.push(format!("{step}: {answer}"));

    let grant = c.lease_grant(60, None).await.unwrap();
    let lease = grant.id();
    log("grant", format!("{} ttl {}", n.symbol(lease), grant.ttl()));

    c.put("a", "1", None).await.unwrap();
    let mut put = c
        .put("a", "2", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap()
        .0;
    put.header = None;
    put.prev_kv.iter_mut().for_each(|kv| n.kv(kv));
    log("put prev_kv", format!("{put:?}"));
    let leased = PutOptions::new().with_lease(lease);
    c.put("b", "x", Some(leased)).await.unwrap();
    for (k, v) in [("c", "3"), ("d", "4"), ("e", "5"), ("e/1", "6")] {
        c.put(k, v, None).await.unwrap();
    }
    log(
        "put empty key",
        error(c.put("", "v", None).await.unwrap_err()),
    );

    let gets: Vec<(&str, &str, GetOptions)> = vec![
        ("get a", "a", GetOptions::new()),
        ("get missing", "zz", GetOptions::new()),
        ("get everything", "", GetOptions::new().with_all_keys()),
        ("get prefix e", "e", GetOptions::new().with_prefix()),
        (
            "get from b, limit 2",
            "b",
            GetOptions::new().with_from_key().with_limit(2),
        ),
        ("get [b, d)", "b", GetOptions::new().with_range("d")),
        (
            "get all, descending, keys only",
            "",
            GetOptions::new()
                .with_all_keys()
                .with_sort(SortTarget::Key, SortOrder::Descend)
                .with_keys_only(),
        ),
        (
            "get all, count only",
            "",
            GetOptions::new().with_all_keys().with_count_only(),
        ),
        (
            "get all, by value, limit 3",
            "",
            GetOptions::new()
                .with_all_keys()
                .with_sort(SortTarget::Value, SortOrder::Ascend)
                .with_limit(3),
        ),
    ];
    for (step, key, options) in gets {
        let mut r = c.get(key, Some(options)).await.unwrap().0;
        r.header = None;
        n.kvs(&mut r.kvs);
        log(step, format!("{r:?}"));
    }

    let mut del = c
        .delete("c", Some(DeleteOptions::new().with_prev_key()))
        .await
        .unwrap()
        .0;
    del.header = None;
    n.kvs(&mut del.prev_kvs);
    log("delete c prev_kv", format!("{del:?}"));
    let mut del = c
        .delete(
            "d",
            Some(DeleteOptions::new().with_range("e/").with_prev_key()),
        )
        .await
        .unwrap()
        .0;
    del.header = None;
    n.kvs(&mut del.prev_kvs);
    log("delete [d, e/) prev_kv", format!("{del:?}"));

    for (step, value) in [("txn success", "2"), ("txn failure", "9")] {
        let nested = Txn::new()
            .when([Compare::create_revision("g", CompareOp::Equal, 0)])
            .and_then([TxnOp::put("g", "7", None)])
            .or_else([TxnOp::get("g", None)]);
        let txn = Txn::new()
            .when([
                Compare::value("a", CompareOp::Equal, value),
                Compare::version("b", CompareOp::Greater, 0),
                Compare::lease("b", CompareOp::Equal, lease),
            ])
            .and_then([
                TxnOp::put("f", "6", Some(PutOptions::new().with_prev_key())),
                TxnOp::get("", Some(GetOptions::new().with_all_keys())),
                TxnOp::txn(nested),
                TxnOp::delete(
                    "e/",
                    Some(DeleteOptions::new().with_prefix().with_prev_key()),
                ),
            ])
            .or_else([TxnOp::get("a", None)]);
        let mut t = c.txn(txn).await.unwrap().0;
        n.txn(&mut t);
        log(step, format!("{t:?}"));
    }

    let (mut keeper, mut renewals) = c.lease_keep_alive(lease).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let renewed = renewals.message().await.unwrap().unwrap().0;
    log("keepalive", format!("{:?}", n.keep_alive(renewed)));
    let with_keys = Some(LeaseTimeToLiveOptions::new().with_keys());
    let ttl = c
        .lease_time_to_live(lease, with_keys.clone())
        .await
        .unwrap();
    log("timetolive keys", format!("{:?}", n.time_to_live(ttl.0)));
    let leases = c.leases().await.unwrap().0;
    let ids: Vec<i64> = leases.leases.iter().map(|l| n.symbol(l.id)).collect();
    log("leases", format!("{ids:?}"));
    let mut revoked = c.lease_revoke(lease).await.unwrap().0;
    revoked.header = None;
    log("revoke", format!("{revoked:?}"));
    let mut gone = c.get("b", None).await.unwrap().0;
    gone.header = None;
    log("get b after revoke", format!("{gone:?}"));
    let ttl = c.lease_time_to_live(lease, with_keys).await.unwrap();
    log("timetolive revoked", format!("{:?}", n.time_to_live(ttl.0)));
    keeper.keep_alive().await.unwrap();
    let renewed = renewals.message().await.unwrap().unwrap().0;
    log("keepalive revoked", format!("{:?}", n.keep_alive(renewed)));
    log(
        "revoke revoked",
        error(c.lease_revoke(lease).await.unwrap_err()),
    );
    out
}

async fn client(url: &str) -> Client {
    Client::connect([url], None).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_and_lease_answers_equal_etcds() {
    let raw_etcd = Etcd::single().await;
    let behind = Etcd::single().await;
    let proxy = Proxy::start(behind.endpoints(), |_| {}).await;
    let etcd_side = script(&mut client(&raw_etcd.endpoint(0)).await).await;
    let proxy_side = script(&mut client(&proxy.url).await).await;
    for (etcd, ours) in etcd_side.iter().zip(&proxy_side) {
        assert_eq!(ours, etcd, "the proxy's answer (left) differs from etcd's");
    }
    assert_eq!(proxy_side.len(), etcd_side.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_stay_inside_the_namespace() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.v3_namespace = Some("/tenant-a/".into());
    })
    .await;
    let mut raw = etcd.client().await;
    for outside in ["/tenant-b/k", "/tenant-a", "/tenant-a0", "\u{0}", "zzz"] {
        raw.put(outside, "outside", None).await.unwrap();
    }
    let mut c = client(&proxy.url).await;
    c.put("k", "inside", None).await.unwrap();
    let inside = raw.get("/tenant-a/k", None).await.unwrap();
    assert_eq!(inside.kvs()[0].value(), b"inside");

    // Every "to the end" and "everything" a client can name stays in the namespace.
    for (key, options) in [
        ("", GetOptions::new().with_all_keys()),
        ("", GetOptions::new().with_from_key()),
        ("", GetOptions::new().with_prefix()),
        ("\u{0}", GetOptions::new().with_range("\u{0}")),
        (
            "\u{0}",
            GetOptions::new().with_range(vec![0xff, 0xff, 0xff]),
        ),
        ("a", GetOptions::new().with_range("\u{0}")),
    ] {
        let got = c.get(key, Some(options)).await.unwrap();
        let keys: Vec<&[u8]> = got.kvs().iter().map(|kv| kv.key()).collect();
        assert_eq!(keys, [b"k".as_slice()]);
    }
    let txn = Txn::new().and_then([
        TxnOp::delete("\u{0}", Some(DeleteOptions::new().with_from_key())),
        TxnOp::txn(Txn::new().and_then([TxnOp::get("", Some(GetOptions::new().with_all_keys()))])),
    ]);
    c.txn(txn).await.unwrap();
    c.delete("", Some(DeleteOptions::new().with_all_keys()))
        .await
        .unwrap();
    for outside in ["/tenant-b/k", "/tenant-a", "/tenant-a0", "\u{0}", "zzz"] {
        let still = raw.get(outside, None).await.unwrap();
        assert_eq!(still.kvs().len(), 1, "{outside:?} was touched");
    }
    let left = raw.get("/tenant-a/", Some(GetOptions::new().with_prefix()));
    assert_eq!(left.await.unwrap().kvs().len(), 0);

    // Compact acts on the whole cluster: refused as etcd refuses a user without the right.
    let refused = c.compact(1, None).await.unwrap_err();
    assert_eq!(
        error(refused),
        r#"PermissionDenied "etcdserver: permission denied""#
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_list_names_the_proxy_and_status_answers() {
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let mut c = client(&proxy.url).await;
    let members = c.member_list().await.unwrap();
    let urls: Vec<&str> = members
        .members()
        .iter()
        .flat_map(|m| m.client_urls())
        .map(String::as_str)
        .collect();
    assert_eq!(urls, [proxy.url.as_str()]);
    let status = c.status().await.unwrap();
    assert!(!status.version().is_empty());
    // HTTP on the same port is still the HTTP API.
    let (code, _) = send(http().get(format!("{}/livez", proxy.url))).await;
    assert_eq!(code, 200);
}

/// etcdctl's outputs against the proxy and against etcd, in one run: put, get, del and a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_answers_as_against_etcd() {
    const ETCDCTL: &str = "/usr/bin/etcdctl";
    assert!(
        std::path::Path::new(ETCDCTL).exists(),
        "{ETCDCTL} missing: scripts/deps.sh installs Debian's etcd-client"
    );
    let raw_etcd = Etcd::single().await;
    let behind = Etcd::single().await;
    let proxy = Proxy::start(behind.endpoints(), |_| {}).await;
    let run = |endpoint: &str, args: &[&str]| {
        let endpoint = endpoint.trim_start_matches("http://").to_owned();
        let out = Command::new(ETCDCTL)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoint}"))
            .args(args)
            .output()
            .unwrap();
        format!(
            "{} | {} | {}",
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    };
    let script: &[&[&str]] = &[
        &["put", "k1", "v1"],
        &["put", "k2", "v2", "--prev-kv"],
        &["put", "k1", "v1b", "--prev-kv"],
        &["get", "k1"],
        &["get", "k", "--prefix"],
        &["get", "k", "--prefix", "--keys-only", "--limit=1"],
        &["get", "a", "--from-key", "--keys-only", "-w", "fields"],
        &["del", "k2", "--prev-kv"],
        &["del", "nothing"],
        &["lease", "list"],
    ];
    for args in script {
        let etcd = run(&raw_etcd.endpoint(0), args);
        let ours = run(&proxy.url, args);
        let etcd = normalise_fields(&etcd);
        assert_eq!(normalise_fields(&ours), etcd, "etcdctl {args:?}");
    }
    // A lease: its id differs, its shape does not.
    let granted = run(&proxy.url, &["lease", "grant", "30"]);
    let shape = |s: &str| {
        s.split_whitespace()
            .map(|w| {
                if w.chars().all(|c| c.is_ascii_hexdigit()) && w.len() > 8 {
                    "ID"
                } else {
                    w
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        shape(&granted),
        shape(&run(&raw_etcd.endpoint(0), &["lease", "grant", "30"]))
    );
}

/// `-w fields` output without the lines that give revisions, raft terms and cluster ids.
fn normalise_fields(s: &str) -> String {
    s.lines()
        .filter(|l| {
            [
                "\"ClusterID\"",
                "\"MemberID\"",
                "\"Revision\"",
                "\"RaftTerm\"",
                "\"CreateRevision\"",
                "\"ModRevision\"",
            ]
            .iter()
            .all(|f| !l.contains(f))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A unary `KV.Put` sent by hand over h2c with `metadata`, since etcd-client sets no metadata
/// of its own: the gRPC status code and message of the answer (0 and "" for a success).
async fn put_with(url: &str, metadata: &[(&str, &str)], key: &str) -> (String, String) {
    let message = PbPutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        ..Default::default()
    }
    .encode_to_vec();
    let mut body = vec![0];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(&message);
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let mut req = client
        .post(format!("{url}/etcdserverpb.KV/Put"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body);
    for (name, value) in metadata {
        req = req.header(*name, *value);
    }
    let resp = req.send().await.unwrap();
    // A refusal is a trailers-only answer (its status in the headers); a success has a message.
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let code = header("grpc-status").unwrap_or_else(|| "0".into());
    let message = header("grpc-message").unwrap_or_default();
    (code, message.replace("%20", " "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_are_judged_as_v3_json_judges_them() {
    const ACME: &str = "acme-token-6c1d0e";
    const READER: &str = "reader-token-1f2e3d";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let file = token_line("acme", ACME, "v3:*") + &token_line("reader", READER, "read:*");
    std::fs::write(&tokens, file).unwrap();
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.auth_tokens = Some(tokens.clone());
        c.v3_namespace = Some("/ns/".into());
    })
    .await;
    let bearer = format!("Bearer {ACME}");
    let denied = ("7".to_owned(), "etcdserver: permission denied".to_owned());
    let invalid = ("16".to_owned(), "etcdserver: invalid auth token".to_owned());
    let ok = ("0".to_owned(), String::new());
    // No credentials at all: etcd's answer to a request without a user.
    let no_user = ("3".to_owned(), "etcdserver: user name is empty".to_owned());
    assert_eq!(put_with(&proxy.url, &[], "k0").await, no_user);
    assert_eq!(
        put_with(&proxy.url, &[("token", "nope")], "k0").await,
        invalid
    );
    assert_eq!(
        put_with(&proxy.url, &[("token", READER)], "k0").await,
        denied
    );
    let by_header = [("authorization", bearer.as_str())];
    assert_eq!(put_with(&proxy.url, &by_header, "k1").await, ok);
    // etcd's own `token` metadata, as Go's clientv3 sends it.
    assert_eq!(put_with(&proxy.url, &[("token", ACME)], "k2").await, ok);
    // A credential given twice is refused, whichever comes first (the first `token` was once
    // chosen, and `token` ignored beside `authorization`).
    for twice in [
        [("token", ACME), ("token", READER)],
        [("token", READER), ("token", ACME)],
        [("token", ACME), ("token", ACME)],
        [("authorization", bearer.as_str()), ("token", "garbage")],
        [("token", ACME), ("authorization", bearer.as_str())],
    ] {
        assert_eq!(
            put_with(&proxy.url, &twice, "k3").await,
            invalid,
            "{twice:?}"
        );
    }
    let mut raw = etcd.client().await;
    let written = raw
        .get(
            "/ns/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    let keys: Vec<&[u8]> = written.kvs().iter().map(|kv| kv.key()).collect();
    assert_eq!(keys, [b"/ns/acme/k1".as_slice(), b"/ns/acme/k2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_is_served_over_tls_too() {
    let etcd = Etcd::shared().await;
    let pki = lease_proxy_testkit::pki::Pki::new("grpc");
    let server = pki.server("proxy");
    let ca = std::fs::read(pki.ca()).unwrap();
    let https = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    let proxy = Proxy::start_https(etcd.endpoints(), &https, |c| {
        c.etcd_prefix = lease_proxy_testkit::prefix("grpc-tls");
        c.tls_cert = Some(server.cert.clone());
        c.tls_key = Some(server.key.clone());
    })
    .await;
    let tls = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(ca));
    let options = etcd_client::ConnectOptions::new().with_tls(tls);
    let mut c = Client::connect([proxy.url.as_str()], Some(options))
        .await
        .unwrap();
    c.put("k", "over tls", None).await.unwrap();
    let got = c.get("k", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"over tls");
    let members = c.member_list().await.unwrap();
    assert_eq!(
        members.members()[0].client_urls(),
        std::slice::from_ref(&proxy.url)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_bounded_and_client_deadlines_kept() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.max_body_bytes = 16 * 1024).await;
    let mut c = client(&proxy.url).await;
    let huge = vec![b'x'; 32 * 1024];
    let refused = error(c.put("big", huge, None).await.unwrap_err());
    // tonic's refusal (grpc-go, so etcd, says ResourceExhausted): refused before decoding.
    assert!(refused.starts_with("OutOfRange"), "{refused}");
    assert!(c.get("big", None).await.unwrap().kvs().is_empty());

    // etcd stopped: the client's 200 ms deadline ends the call, well before --etcd-timeout.
    etcd.signal(0, "STOP");
    let started = tokio::time::Instant::now();
    let answer = put_with(&proxy.url, &[("grpc-timeout", "200m")], "late").await;
    etcd.signal(0, "CONT");
    assert_eq!(answer, ("4".into(), "context deadline exceeded".into()));
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_leases_are_unknown_and_a_half_close_is_answered() {
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |_| {}).await;
    let mut raw = etcd.client().await;
    let foreign = raw.lease_grant(60, None).await.unwrap().id();
    let mut c = client(&proxy.url).await;
    let not_found = r#"NotFound "etcdserver: requested lease not found""#;

    // A lease not granted through the proxy's etcd fronts is unknown to them, whatever the call.
    let leased = PutOptions::new().with_lease(foreign);
    assert_eq!(
        error(c.put("k", "v", Some(leased)).await.unwrap_err()),
        not_found
    );
    assert_eq!(error(c.lease_revoke(foreign).await.unwrap_err()), not_found);
    let ttl = c.lease_time_to_live(foreign, None).await.unwrap();
    assert_eq!(ttl.ttl(), -1);
    assert!(c.leases().await.unwrap().leases().is_empty());
    // etcd-client sends the first keepalive itself and reads TTL 0 (etcd's answer for an
    // unknown lease) as "lease not found".
    let kept = c.lease_keep_alive(foreign).await.map(drop).unwrap_err();
    assert!(
        matches!(&kept, etcd_client::Error::LeaseKeepAliveError(m) if m == "lease not found"),
        "{kept:?}"
    );
    assert!(raw.lease_time_to_live(foreign, None).await.unwrap().ttl() > 0);

    // Many renewals sent at once on one stream (as Go's client renews all its leases on one)
    // are answered in the order they were sent, a foreign lease's among them with TTL 0.
    let mine = c.lease_grant(30, None).await.unwrap().id();
    let ask = |id| PbLeaseKeepAliveRequest { id };
    let order: Vec<i64> = (0..40)
        .map(|i| if i % 5 == 3 { foreign } else { mine })
        .collect();
    let mut stream = h2grpc::Stream::open(
        &proxy.url,
        "/etcdserverpb.Lease/LeaseKeepAlive",
        &ask(order[0]),
        None,
    )
    .await;
    for &id in &order[1..] {
        stream.send(&ask(id)).await;
    }
    let mut answered = Vec::new();
    for _ in &order {
        let answer: PbLeaseKeepAliveResponse = stream.next().await.expect("an answer");
        assert_eq!(answer.ttl > 0, answer.id == mine, "{answer:?}");
        answered.push(answer.id);
    }
    assert_eq!(answered, order);

    // One keepalive, then the client half-closes (python-etcd3's refresh): the answer comes,
    // then the stream ends.
    let ours = c.lease_grant(30, None).await.unwrap().id();
    let (mut keeper, mut renewals) = c.lease_keep_alive(ours).await.unwrap();
    keeper.keep_alive().await.unwrap();
    drop(keeper);
    assert_eq!(renewals.message().await.unwrap().unwrap().ttl(), 30);
    assert!(renewals.message().await.unwrap().is_none());
}

/// A keepalive stream opened before its principal's line was removed renews nothing after the
/// removal: each renewal is judged against the token file in force,
/// and the first one refused ends the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepalive_stream_renews_nothing_once_its_principal_is_removed() {
    const ACME: &str = "acme-token-2b7e41";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let line = |name: &str, token: &str| token_line(name, token, "v3:*");
    std::fs::write(
        &tokens,
        line("acme", ACME) + &line("other", "other-token-9c"),
    )
    .unwrap();
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |c| c.auth_tokens = Some(tokens.clone())).await;
    let grant = |token: &'static str| {
        send(
            http()
                .post(format!("{}/v3/lease/grant", proxy.url))
                .bearer_auth(token)
                .json(&serde_json::json!({"TTL": 30})),
        )
    };
    let (status, granted) = grant(ACME).await;
    assert_eq!(status, 200, "{granted}");
    let id: i64 = str_field(&granted, "ID").parse().unwrap();

    let keepalive = PbLeaseKeepAliveRequest { id };
    let path = "/etcdserverpb.Lease/LeaseKeepAlive";
    let mut stream = h2grpc::Stream::open(&proxy.url, path, &keepalive, Some(ACME)).await;
    let first: PbLeaseKeepAliveResponse = stream.next().await.expect("renewed");
    assert_eq!((first.id, first.ttl), (id, 30));

    // acme's line goes (by rename); once a new call of acme's is refused, the file is in force.
    let replaced = dir.path().join("tokens.new");
    std::fs::write(&replaced, line("other", "other-token-9c")).unwrap();
    std::fs::rename(&replaced, &tokens).unwrap();
    until(Duration::from_secs(15), "the removal in force", || async {
        grant(ACME).await.0 == 401
    })
    .await;
    // The stream ends with the reload, whether or not it asks for another renewal.
    let after = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.next::<PbLeaseKeepAliveResponse>(),
    )
    .await
    .expect("the stream neither answered nor ended");
    assert!(
        after.is_none(),
        "a removed principal's lease was renewed: {after:?}"
    );
}

/// A replica remembers the leases whose marker it wrote or read (their ids are etcd's, never
/// given twice, and a marker never changes), so renewals of them read nothing; a lease revoked
/// through another replica is then renewed by none (TTL 0, as etcd answers an unknown lease)
/// and locks nothing, and another principal's stays unknown however often it was confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_a_confirmed_lease_read_no_marker_and_a_revoked_one_renews_nothing() {
    const ACME: &str = "acme-token-5d1f07";
    const OTHER: &str = "other-token-77c2e9";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        token_line("acme", ACME, "v3:*") + &token_line("other", OTHER, "v3:*"),
    )
    .unwrap();
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| c.auth_tokens = Some(tokens.clone())).await;
    let replica = proxy
        .replica(etcd.endpoints(), |c| c.auth_tokens = Some(tokens.clone()))
        .await;
    let ranges = || async {
        etcd_metric_where(&etcd, "grpc_server_handled_total", r#"grpc_method="Range""#).await
    };
    let (status, granted) = send(
        http()
            .post(format!("{}/v3/lease/grant", proxy.url))
            .bearer_auth(ACME)
            .json(&serde_json::json!({"TTL": 30})),
    )
    .await;
    assert_eq!(status, 200, "{granted}");
    let id: i64 = str_field(&granted, "ID").parse().unwrap();
    let ask = PbLeaseKeepAliveRequest { id };
    let path = "/etcdserverpb.Lease/LeaseKeepAlive";

    // Granted here: 20 renewals, no marker read.
    let before = ranges().await;
    let mut stream = h2grpc::Stream::open(&proxy.url, path, &ask, Some(ACME)).await;
    for i in 0..20 {
        if i > 0 {
            stream.send(&ask).await;
        }
        let renewed: PbLeaseKeepAliveResponse = stream.next().await.expect("renewed");
        assert_eq!((renewed.id, renewed.ttl), (id, 30));
    }
    let read = ranges().await - before;
    assert!(read < 5.0, "{read} etcd ranges for 20 renewals");

    // The other principal, on both replicas, before and after acme's renewals there: unknown.
    let mut foreign = h2grpc::Stream::open(&replica.url, path, &ask, Some(OTHER)).await;
    let refused: PbLeaseKeepAliveResponse = foreign.next().await.expect("answered");
    assert_eq!((refused.id, refused.ttl), (id, 0));
    let mut there = h2grpc::Stream::open(&replica.url, path, &ask, Some(ACME)).await;
    let renewed: PbLeaseKeepAliveResponse = there.next().await.expect("renewed");
    assert_eq!(renewed.ttl, 30);
    foreign.send(&ask).await;
    let refused: PbLeaseKeepAliveResponse = foreign.next().await.expect("answered");
    assert_eq!((refused.id, refused.ttl), (id, 0));
    let mut here = h2grpc::Stream::open(&proxy.url, path, &ask, Some(OTHER)).await;
    let refused: PbLeaseKeepAliveResponse = here.next().await.expect("answered");
    assert_eq!((refused.id, refused.ttl), (id, 0));

    // Revoked through the replica: the first replica, which remembers it, renews nothing.
    let (status, body) = send(
        http()
            .post(format!("{}/v3/lease/revoke", replica.url))
            .bearer_auth(ACME)
            .json(&serde_json::json!({"ID": id.to_string()})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for _ in 0..2 {
        stream.send(&ask).await;
        let gone: PbLeaseKeepAliveResponse = stream.next().await.expect("answered");
        assert_eq!((gone.id, gone.ttl), (id, 0));
    }
    // A lock under a lease the first replica remembers (it granted it) and the other revoked:
    // refused as under an unknown lease, also where its queue key is there already (put without
    // a lease: no put under the lease happens then).
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let v3 = |url: &str, path: &str, body: serde_json::Value| {
        send(
            http()
                .post(format!("{url}/v3/{path}"))
                .bearer_auth(ACME)
                .json(&body),
        )
    };
    let (_, granted) = v3(&proxy.url, "lease/grant", serde_json::json!({"TTL": 30})).await;
    let gone: i64 = str_field(&granted, "ID").parse().unwrap();
    let (status, body) = v3(
        &replica.url,
        "lease/revoke",
        serde_json::json!({"ID": gone.to_string()}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = v3(
        &proxy.url,
        "kv/put",
        serde_json::json!({"key": b64(&format!("pre/{gone:x}")), "value": b64("v")}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for url in [&proxy.url, &replica.url] {
        for name in ["x", "pre"] {
            let lock = serde_json::json!({"name": b64(name), "lease": gone.to_string()});
            let (status, body) = v3(url, "lock/lock", lock).await;
            assert_eq!(status, 500, "{name}: {body}");
            assert_eq!(body["message"], "etcdserver: requested lease not found");
        }
    }
    let mut raw = etcd.client().await;
    assert_eq!(raw.lease_time_to_live(id, None).await.unwrap().ttl(), -1);
    assert!(raw
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .all(|kv| kv.lease() != id));
}

/// A burst of renewals on one stream, each request its own DATA frame and none waiting for its
/// answer (Go's clientv3 renewing thousands of one client's leases at once), is read and
/// answered in full, as etcd answers it (with the requests left unread
/// while renewals ran, the h2 crate ended the whole connection with ENHANCE_YOUR_CALM once about
/// 2,000 small frames waited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_renewals_on_one_stream_is_answered_in_full() {
    const BURST: usize = 5000;
    let etcd = Etcd::shared().await;
    let proxy = Proxy::on(&etcd, |_| {}).await;
    let mut c = client(&proxy.url).await;
    let id = c.lease_grant(60, None).await.unwrap().id();
    let ask = PbLeaseKeepAliveRequest { id };
    let path = "/etcdserverpb.Lease/LeaseKeepAlive";
    let mut stream = h2grpc::Stream::open(&proxy.url, path, &ask, None).await;
    for _ in 1..BURST {
        stream.send(&ask).await;
    }
    for i in 0..BURST {
        let answer: PbLeaseKeepAliveResponse = stream
            .next()
            .await
            .unwrap_or_else(|| panic!("the stream ended after {i} answers"));
        assert_eq!((answer.id, answer.ttl), (id, 60));
    }
}

/// One HTTP/2 connection to `url` with one unary gRPC call (a Range) on it, sent with
/// `metadata`; how long the connection then lived, up to `watch`: `None` if still open then.
async fn connection_life_after_a_call(
    url: &str,
    metadata: &[(&str, &str)],
    watch: Duration,
) -> Option<Duration> {
    use http_body_util::{BodyExt, Full};
    let addr = url.trim_start_matches("http://");
    let socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(socket),
    )
    .await
    .unwrap();
    let connection = tokio::spawn(connection);
    let range = etcd_client::proto::PbRangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    };
    let mut call = hyper::Request::post(format!("{url}/etcdserverpb.KV/Range"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in metadata {
        call = call.header(*name, *value);
    }
    let body = Full::new(bytes::Bytes::from(h2grpc::frame(&range)));
    let answer = send.send_request(call.body(body).unwrap()).await.unwrap();
    answer.into_body().collect().await.unwrap();
    let answered = tokio::time::Instant::now();
    tokio::time::timeout(watch, connection)
        .await
        .ok()
        .map(|_| answered.elapsed())
}

/// A gRPC client keeps its connection for life and may leave it idle (python-etcd3 then fails
/// its next call if the server closed it), so a connection that carried a call of a caller
/// let in has no idle deadline; a refused caller's goes idle as any other (one
/// refused call pinned a connection slot for ever, at no cost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_let_in_callers_grpc_connection_outlives_the_idle_timeout() {
    const ACME: &str = "acme-token-9a8b7c";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, token_line("acme", ACME, "v3:*")).unwrap();
    let etcd = Etcd::single().await;
    let proxy = Proxy::start(etcd.endpoints(), |c| {
        c.auth_tokens = Some(tokens.clone());
        c.v3_namespace = Some("/ns/".into());
        c.idle_timeout = Duration::from_millis(500);
        c.header_read_timeout = Duration::from_millis(500);
    })
    .await;
    let watch = Duration::from_secs(3);
    let refused = connection_life_after_a_call(&proxy.url, &[], watch).await;
    assert!(
        refused.is_some(),
        "a refused caller's connection was still open {watch:?} after its call"
    );
    let bearer = format!("Bearer {ACME}");
    let let_in = [("authorization", bearer.as_str())];
    let kept = connection_life_after_a_call(&proxy.url, &let_in, watch).await;
    assert_eq!(kept, None, "a let-in caller's connection was closed");
}
