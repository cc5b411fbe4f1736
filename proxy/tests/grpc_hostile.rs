//! etcd's gRPC front against what a hostile tenant tried, and against what a newcomer's etcdctl
//! met: one etcd with its own authentication on (the proxies call it as `root`), proxies with
//! `--auth-tokens` ([`common::authed`]). Each case runs in turn on the one etcd:
//! - etcdctl refused by the proxy as by etcd: no credentials, a principal without `v3:*`, a
//!   wrong token — the same answer, one call, no retries (etcdctl retries "invalid auth token"
//!   up to 100 times), and a refused `Authenticate` audited and counted;
//! - renewals of guessed lease ids cost etcd one read, not two a guess;
//! - a 30 MB Range answers through the proxy as it does against etcd;
//! - a removed principal's silent connections give their slots back once the file is reloaded.
//!
//! One principal's stalled watch streams against another's are in `grpc_watch_budget.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::authed::*;
use common::*;
use etcd_client::{Client, ConnectOptions, GetOptions};

const ETCDCTL: &str = "/usr/bin/etcdctl";

/// Lines of the audit log at `path` with `outcome`, once the count has held still for 300 ms
/// (the writer appends in the background).
async fn audited(path: &Path, outcome: &str) -> usize {
    let count = || {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&format!("\"outcome\":\"{outcome}\"")))
            .count()
    };
    let mut seen = count();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = count();
        if now == seen {
            return now;
        }
        seen = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_front_holds_against_a_hostile_tenant() {
    assert!(
        Path::new(ETCDCTL).exists(),
        "{ETCDCTL} missing: scripts/deps.sh installs Debian's etcd-client"
    );
    let world = World::new().await;
    etcdctl_is_refused_as_etcd_refuses_it(&world).await;
    guessed_renewals_cost_etcd_one_read_at_most(&world).await;
    a_30_mb_range_answers_as_against_etcd(&world).await;
    a_removed_principals_silent_connections_give_their_slots_back(&world).await;
}

/// What one etcdctl run did: its exit code and last line of standard error (the answer), and
/// how long it took.
struct Run {
    answer: String,
    took: Duration,
}

fn etcdctl(endpoint: &str, args: &[&str]) -> Run {
    let started = tokio::time::Instant::now();
    let out = Command::new(ETCDCTL)
        .env("ETCDCTL_API", "3")
        .arg(format!(
            "--endpoints={}",
            endpoint.trim_start_matches("http://")
        ))
        .args(args)
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    Run {
        answer: format!("{} | {last}", out.status.code().unwrap_or(-1)),
        took,
    }
}

/// A unary `KV.Range` sent by hand with etcd's `token` metadata set to `token`: the gRPC code
/// and message of the answer.
async fn range_with_token(url: &str, token: &str) -> (String, String) {
    let range = etcd_client::proto::PbRangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    };
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let resp = client
        .post(format!("{url}/etcdserverpb.KV/Range"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("token", token)
        .body(h2grpc::frame(&range))
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    (
        header("grpc-status"),
        header("grpc-message").replace("%20", " "),
    )
}

/// etcdctl against etcd with authentication on, then against the proxy (started only then, so
/// that etcd's count of calls is etcdctl's alone): each refusal the same answer, after one
/// call, in well under a second. A newcomer's etcdctl without credentials made 100 calls in
/// 2.7 s, each an audit line, against the proxy's "invalid auth token", which etcdctl takes
/// for an expired token to fetch again; a principal without `v3:*` read as a wrong token.
async fn etcdctl_is_refused_as_etcd_refuses_it(world: &World) {
    let etcd_url = world.etcd.endpoint(0);
    let cases: [(&str, Vec<String>, Vec<String>); 3] = [
        ("no credentials", vec![], vec![]),
        (
            "a user without the etcd API's permission",
            vec!["--user".into(), format!("norole:{NOROLE_PASSWORD}")],
            vec!["--user".into(), format!("reader:{READER}")],
        ),
        (
            "a wrong password (token)",
            vec!["--user".into(), "root:wrong".into()],
            vec!["--user".into(), "acme:wrong".into()],
        ),
    ];
    let range_calls = |text: &str| {
        metric(
            text,
            "grpc_server_started_total",
            &["grpc_method=\"Range\""],
        )
    };
    let mut against_etcd = Vec::new();
    for (_, etcd_args, _) in &cases {
        let before = range_calls(&metrics_text(&etcd_url).await);
        let mut args: Vec<&str> = etcd_args.iter().map(String::as_str).collect();
        args.extend(["get", "k"]);
        let run = etcdctl(&etcd_url, &args);
        let calls = range_calls(&metrics_text(&etcd_url).await) - before;
        against_etcd.push((run, calls));
    }
    let etcd_bad_token = range_with_token(&etcd_url, "nope").await;

    let proxy = world.proxy(|_| {}).await;
    let log = world.audit_log();
    let proxy_calls = |text: &str| {
        metric(
            text,
            "lease_proxy_grpc_request_duration_seconds_count",
            &["method=\"etcdserverpb.KV/Range\""],
        )
    };
    let refused_auth = |text: &str| {
        metric(
            text,
            "lease_proxy_auth_requests_total",
            &["outcome=\"unauthenticated\"", "route=\"v3\""],
        )
    };
    for ((what, _, proxy_args), (etcd_run, etcd_calls)) in cases.iter().zip(&against_etcd) {
        let text = metrics_text(&proxy.url).await;
        let (calls_before, refused_before) = (proxy_calls(&text), refused_auth(&text));
        let audited_before = audited(&log, "unauthenticated").await;
        let mut args: Vec<&str> = proxy_args.iter().map(String::as_str).collect();
        args.extend(["get", "k"]);
        let run = etcdctl(&proxy.url, &args);
        let text = metrics_text(&proxy.url).await;
        let calls = proxy_calls(&text) - calls_before;
        let refused = refused_auth(&text) - refused_before;
        let audit_lines = audited(&log, "unauthenticated").await - audited_before;
        eprintln!(
            "{what}: etcd {:?} in {:?} ({etcd_calls} Range calls); proxy {:?} in {:?} ({calls} \
             Range calls, {audit_lines} audit lines)",
            etcd_run.answer, etcd_run.took, run.answer, run.took
        );
        assert_eq!(run.answer, etcd_run.answer, "{what}: the answer");
        assert!(
            calls <= *etcd_calls && calls <= 1.0,
            "{what}: etcdctl called the proxy's Range {calls} times, etcd's {etcd_calls}"
        );
        assert!(
            run.took < Duration::from_secs(1),
            "{what}: etcdctl took {:?} against the proxy",
            run.took
        );
        // Every refused credential is one audit line and one count: the Range refused before
        // any service ran, or the `Authenticate` refused (none was audited).
        let unauthenticated = if *what == "a user without the etcd API's permission" {
            0
        } else {
            1
        };
        assert_eq!(audit_lines, unauthenticated, "{what}: audit lines");
        assert_eq!(refused, unauthenticated as f64, "{what}: counted refusals");
    }
    let bad_token = range_with_token(&proxy.url, "nope").await;
    assert_eq!(bad_token, etcd_bad_token, "a token nobody has");
    // A principal without the permission is let in by Authenticate, as etcd lets in a user
    // without roles, and refused at its call, counted as forbidden.
    let text = metrics_text(&proxy.url).await;
    assert!(
        metric(
            &text,
            "lease_proxy_auth_requests_total",
            &["outcome=\"forbidden\"", "route=\"v3\""]
        ) >= 1.0,
        "{text}"
    );
}

/// Renewals of lease ids a principal guessed: the first renewal of an id reads its marker (and
/// answers with that read's header), repeats within a short while read nothing — where each
/// cost etcd two reads (the marker, then a header) — and another principal's guesses of a
/// real lease hide nothing from its owner.
async fn guessed_renewals_cost_etcd_one_read_at_most(world: &World) {
    use etcd_client::proto::{PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse};
    const GUESSES: usize = 100;
    const PATH: &str = "/etcdserverpb.Lease/LeaseKeepAlive";
    let proxy = world.proxy(|_| {}).await;
    let options = ConnectOptions::new().with_user("acme", ACME);
    let mut acme = Client::connect([proxy.url.clone()], Some(options))
        .await
        .unwrap();
    let real = acme.lease_grant(60, None).await.unwrap().id();
    let reads = || async {
        metric(
            &metrics_text(&proxy.url).await,
            "lease_proxy_etcd_request_duration_seconds_count",
            &["op=\"get\""],
        )
    };
    // Guessed ids: one that does not exist, and acme's real one (another principal's to
    // `other`).
    for (token, guessed) in [(ACME, real + 7), (OTHER, real)] {
        let ask = PbLeaseKeepAliveRequest { id: guessed };
        let before = reads().await;
        let mut stream = h2grpc::Stream::open(&proxy.url, PATH, &ask, Some(token)).await;
        for i in 0..GUESSES {
            if i > 0 {
                stream.send(&ask).await;
            }
            let answer: PbLeaseKeepAliveResponse = stream.next().await.expect("an answer");
            assert_eq!((answer.id, answer.ttl), (guessed, 0));
            assert!(answer.header.is_some(), "an answer without a header");
        }
        let cost = reads().await - before;
        eprintln!("{GUESSES} renewals of guessed lease {guessed}: {cost} etcd reads");
        assert!(
            cost <= 3.0,
            "{GUESSES} renewals of a guessed id cost etcd {cost} reads"
        );
    }
    let ask = PbLeaseKeepAliveRequest { id: real };
    let mut stream = h2grpc::Stream::open(&proxy.url, PATH, &ask, Some(ACME)).await;
    let renewed: PbLeaseKeepAliveResponse = stream.next().await.expect("an answer");
    assert_eq!(
        (renewed.id, renewed.ttl),
        (real, 60),
        "the owner's renewal after another principal's guesses"
    );
}

/// A Range whose answer is 30 MB (thirty 1 MiB values: etcd takes at most 1.5 MiB a request)
/// answers through the proxy as it does against etcd; the proxy's etcd client read at most
/// 4 MiB (tonic's default).
async fn a_30_mb_range_answers_as_against_etcd(world: &World) {
    const KEYS: usize = 30;
    let mut root = world.root().await;
    let value = vec![b'v'; 1 << 20];
    for i in 0..KEYS {
        let key = format!("/lease-proxy/v3/kv/acme/big/{i:02}");
        root.put(key, value.clone(), None).await.unwrap();
    }
    let proxy = world.proxy(|_| {}).await;
    let options = ConnectOptions::new().with_user("acme", ACME);
    let acme = Client::connect([proxy.url.clone()], Some(options))
        .await
        .unwrap();
    let mut kv = acme.kv_client().max_decoding_message_size(64 << 20);
    let through = kv
        .get("big/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap_or_else(|e| panic!("a 30 MB Range through the proxy: {e}"));
    let direct = root
        .kv_client()
        .max_decoding_message_size(64 << 20)
        .get(
            "/lease-proxy/v3/kv/acme/big/",
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(through.kvs().len(), KEYS);
    assert_eq!(direct.kvs().len(), KEYS);
    for (ours, etcds) in through.kvs().iter().zip(direct.kvs()) {
        assert_eq!(
            [b"/lease-proxy/v3/kv/acme/".as_slice(), ours.key()].concat(),
            etcds.key()
        );
        assert_eq!(ours.value(), etcds.value());
    }
}

/// A client's connection left silent after a call: its task ends when the connection does
/// (the client keeps its side open, as a gRPC client between calls does).
struct Silent {
    connection: tokio::task::JoinHandle<()>,
    _client: hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>,
}

/// One HTTP/2 connection to `url` with one unary Range call on it as `token`, once the call is
/// answered (`None` if not within `within`).
async fn connection_with_a_call(url: &str, token: &str, within: Duration) -> Option<Silent> {
    use http_body_util::{BodyExt, Full};
    let addr = url.trim_start_matches("http://").to_owned();
    let url = url.to_owned();
    let token = token.to_owned();
    let call = async move {
        let socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut send, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(socket),
        )
        .await
        .unwrap();
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        let range = etcd_client::proto::PbRangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        };
        let call = hyper::Request::post(format!("{url}/etcdserverpb.KV/Range"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("authorization", format!("Bearer {token}"))
            .body(Full::new(bytes::Bytes::from(h2grpc::frame(&range))))
            .unwrap();
        let answer = send.send_request(call).await.unwrap();
        let grpc_status = answer
            .headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().to_owned());
        let trailers = answer.into_body().collect().await.unwrap();
        let status = grpc_status.or_else(|| {
            trailers
                .trailers()
                .and_then(|t| t.get("grpc-status"))
                .map(|v| v.to_str().unwrap().to_owned())
        });
        assert_eq!(status.as_deref(), Some("0"), "the call failed");
        Silent {
            connection,
            _client: send,
        }
    };
    tokio::time::timeout(within, call).await.ok()
}

/// A let-in caller's connection has no idle deadline, but only while its principal would be
/// let in: once its line is gone from the token file, its silent connections go idle as any
/// other — a keepalive stream left open ends — and give back their slots of
/// `--max-client-connections` (32 silent connections of a removed principal held every slot,
/// and other principals got DEADLINE_EXCEEDED).
async fn a_removed_principals_silent_connections_give_their_slots_back(world: &World) {
    use etcd_client::proto::{PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse};
    const SLOTS: usize = 4;
    let proxy = world
        .proxy(|c| {
            c.max_client_connections = SLOTS;
            c.idle_timeout = Duration::from_millis(500);
            c.header_read_timeout = Duration::from_millis(500);
        })
        .await;
    // Silent connections after a call, and one with a keepalive stream open and quiet.
    let mut silent = Vec::new();
    for _ in 1..SLOTS {
        let connection = connection_with_a_call(&proxy.url, DOOMED, Duration::from_secs(5))
            .await
            .expect("a slot for doomed");
        silent.push(connection);
    }
    let path = "/etcdserverpb.Lease/LeaseKeepAlive";
    let ask = PbLeaseKeepAliveRequest { id: 1 };
    let mut renewing = h2grpc::Stream::open(&proxy.url, path, &ask, Some(DOOMED)).await;
    let _: PbLeaseKeepAliveResponse = renewing.next().await.expect("a renewal answered");
    // Every slot is taken, for good while doomed may call.
    let waited = connection_with_a_call(&proxy.url, ACME, Duration::from_secs(2)).await;
    assert!(waited.is_none(), "a slot was free beyond the limit");

    let replaced = world.dir.path().join("tokens.new");
    std::fs::write(&replaced, World::token_file(false)).unwrap();
    std::fs::rename(&replaced, &world.tokens).unwrap();
    lease_proxy_testkit::signal_pid(std::process::id(), "HUP");
    let ended = tokio::time::timeout(
        Duration::from_secs(10),
        renewing.next::<PbLeaseKeepAliveResponse>(),
    )
    .await;
    assert!(
        matches!(ended, Ok(None)),
        "a removed principal's quiet keepalive stream did not end: {ended:?}"
    );
    // Every slot comes back: as many connections of another principal are served.
    let mut served = Vec::new();
    for i in 0..SLOTS {
        let connection = connection_with_a_call(&proxy.url, ACME, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("{i} slots of {SLOTS} came back after the reload"));
        served.push(connection);
    }
    for connection in silent {
        assert!(
            tokio::time::timeout(Duration::from_secs(5), connection.connection)
                .await
                .is_ok(),
            "a removed principal's connection is still open"
        );
    }
    std::fs::write(&world.tokens, World::token_file(true)).unwrap();
    lease_proxy_testkit::signal_pid(std::process::id(), "HUP");
}
