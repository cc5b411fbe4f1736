//! Telemetry of the two binaries, end to end: a client's W3C trace id joins the spans of
//! lease-proxy, fence-gateway and the storage, exported over OTLP to a receiver in the test; and
//! `/metrics` of both parses as Prometheus text with the right types and moves with operations.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use common::*;
use lease_proxy_testkit::poll::until;
use lease_proxy_testkit::process::exited;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prometheus_parse::{Scrape, Value as Sample};
use prost::Message;
use tokio::time::Instant;

const PROXY: &str = env!("CARGO_BIN_EXE_lease-proxy");

/// One exported span, as the receiver saw it.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    /// Every attribute and event, printed.
    details: String,
}

type Spans = Arc<Mutex<Vec<Span>>>;

/// An OTLP/HTTP (protobuf) trace receiver on a free port.
async fn otlp_receiver() -> (String, Spans) {
    async fn traces(State(spans): State<Spans>, body: Bytes) -> &'static str {
        let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref()?.value.as_ref())
                .map(|v| match v {
                    AnyValue::StringValue(s) => s.clone(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    spans.lock().unwrap().push(Span {
                        service: service.clone(),
                        name: span.name,
                        trace_id: hex::encode(span.trace_id),
                        span_id: hex::encode(span.span_id),
                        parent_span_id: hex::encode(span.parent_span_id),
                        details: format!("{:?} {:?}", span.attributes, span.events),
                    });
                }
            }
        }
        ""
    }
    let spans = Spans::default();
    let app = Router::new()
        .route("/v1/traces", post(traces))
        .with_state(spans.clone());
    (serve(app).await, spans)
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// A child process killed when dropped, unless it has exited.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    /// SIGTERM, then the exit code (within 20 s).
    async fn terminate(mut self) -> Option<i32> {
        lease_proxy_testkit::signal_pid(self.0.id(), "TERM");
        let within = Duration::from_secs(20);
        exited(&mut self.0, within, "an exit after SIGTERM")
            .await
            .code()
    }
}

/// fence-gateway on `port` in front of `upstream`, marks in `store`.
fn gateway_command(port: u16, upstream: &str, store: &str, key_file: &std::path::Path) -> Command {
    let mut cmd = Command::new(lease_proxy_testkit::workspace_binary("fence-gateway"));
    cmd.args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--upstream", upstream, "--store", store])
        .arg("--key-file")
        .arg(key_file);
    cmd
}

/// lease-proxy on `port` over `etcd`, forwarding to `upstream`.
fn proxy_command(port: u16, etcd: &Etcd, key_file: &std::path::Path, upstream: &str) -> Command {
    let mut cmd = Command::new(PROXY);
    cmd.args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd-endpoints", &etcd.endpoint(0)])
        .args(["--etcd-prefix", &lease_proxy_testkit::prefix("telemetry")])
        .arg("--key-file")
        .arg(key_file)
        .args(["--upstream", upstream]);
    cmd
}

/// Starts `cmd` exporting to `otlp`, logging JSON at debug level to `log`.
fn spawn(mut cmd: Command, otlp: &str, log: &std::path::Path) -> Running {
    Running(
        cmd.args(["--log-format", "json"])
            .env("RUST_LOG", "debug")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
            // Far beyond the test: spans reach the receiver only through the flush at shutdown.
            .env("OTEL_BSP_SCHEDULE_DELAY", "600000")
            .env_remove("OTEL_SERVICE_NAME")
            .env_remove("OTEL_SDK_DISABLED")
            .env_remove("OTEL_TRACES_EXPORTER")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

async fn scrape(url: &str) -> Scrape {
    let resp = http().get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let text = resp.text().await.unwrap();
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text")
}

/// The sum of every sample of counter `name` (with labels `with`), asserting it is a counter.
fn counter(scrape: &Scrape, name: &str, with: &[(&str, &str)]) -> f64 {
    let mut total = None;
    for s in scrape.samples.iter().filter(|s| s.metric == name) {
        let Sample::Counter(v) = s.value else {
            panic!("{name} is not a counter: {:?}", s.value)
        };
        if with.iter().all(|(k, v)| s.labels.get(k) == Some(*v)) {
            *total.get_or_insert(0.0) += v;
        }
    }
    total.unwrap_or_else(|| panic!("no {name} {with:?} in the scrape"))
}

fn gauge(scrape: &Scrape, name: &str) -> f64 {
    let s = scrape
        .samples
        .iter()
        .find(|s| s.metric == name)
        .unwrap_or_else(|| panic!("no {name} in the scrape"));
    match s.value {
        Sample::Gauge(v) => v,
        ref other => panic!("{name} is not a gauge: {other:?}"),
    }
}

/// The number of observations of histogram `name` with labels `with`.
fn histogram_count(scrape: &Scrape, name: &str, with: &[(&str, &str)]) -> u64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && with.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            Sample::Histogram(buckets) => buckets.last().map_or(0, |b| b.count as u64),
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_join_up_and_metrics_count_operations() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("fencing.key");
    fencing::Keyring::create_file(&key_file, &fencing::KeyId::parse("t1").unwrap()).unwrap();
    let (otlp, spans) = otlp_receiver().await;
    let Storage {
        url: store_url,
        log: traceparents,
    } = Storage::start().await;

    let gw_port = lease_proxy_testkit::free_port();
    let gw_url = format!("http://127.0.0.1:{gw_port}");
    let store = format!("sqlite:{}", dir.path().join("marks.db").display());
    let gateway_log = dir.path().join("gateway.log");
    let gateway = spawn(
        gateway_command(gw_port, &store_url, &store, &key_file),
        &otlp,
        &gateway_log,
    );
    let proxy_port = lease_proxy_testkit::free_port();
    let url = format!("http://127.0.0.1:{proxy_port}");
    let proxy_log = dir.path().join("proxy.log");
    let proxy = spawn(
        proxy_command(proxy_port, &etcd, &key_file, &gw_url),
        &otlp,
        &proxy_log,
    );
    wait_ready(&gw_url).await;
    wait_ready(&url).await;
    let before = scrape(&url).await;
    let gw_before = scrape(&gw_url).await;

    // An acquire and a forwarded write, each in a trace the client started.
    let acquire_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let write_trace = "0af7651916cd43dd8448eb211c80319c";
    let (status, grant) = send(
        http()
            .post(format!("{url}/v1/leases/aisle-7"))
            .header(
                "traceparent",
                format!("00-{acquire_trace}-00f067aa0ba902b7-01"),
            )
            .json(&serde_json::json!({"holder": "robot-1", "ttl_seconds": 2})),
    )
    .await;
    assert_eq!(status, 201, "{grant}");
    let secret = str_field(&grant, "secret");
    let (status, body) = send(
        http()
            .put(format!("{url}/v1/leases/aisle-7/forward/inventory/aisle-7"))
            .header(
                "traceparent",
                format!("00-{write_trace}-b7ad6b7169203331-01"),
            )
            .header("lease-secret", &secret)
            .body("count=12"),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // The enforcer's mark moves past the grant (a direct write with a higher token): the holder's
    // next forwarded write is refused as stale, and the proxy counts it.
    let keys = fencing::Keyring::load(&key_file).unwrap();
    let granted: u64 = str_field(&grant, "token").parse().unwrap();
    let direct = |token: u64| {
        http()
            .put(format!("{gw_url}/inventory/aisle-7"))
            .header(
                "fencing-token",
                keys.mint("aisle-7", fencing::Token::new(0, token)),
            )
            .header("fencing-resource", "aisle-7")
            .send()
    };
    assert_eq!(direct(granted + 1000).await.unwrap().status(), 200);
    let (status, body) = send(
        http()
            .put(format!("{url}/v1/leases/aisle-7/forward/inventory/aisle-7"))
            .header("lease-secret", &secret)
            .body("count=13"),
    )
    .await;
    assert_eq!(status, 409, "{body}");

    // More operations for the metrics: a conflict, a renewal, a renewal with a lost grant, a
    // release, and a grant left to expire.
    assert_eq!(
        send(
            http()
                .post(format!("{url}/v1/leases/aisle-7"))
                .json(&serde_json::json!({"holder": "robot-2", "ttl_seconds": 2}))
        )
        .await
        .0,
        409
    );
    assert_eq!(
        send(
            http()
                .post(format!("{url}/v1/leases/aisle-7/renew"))
                .header("lease-secret", &secret)
        )
        .await
        .0,
        200
    );
    let (status, other) = send(
        http()
            .post(format!("{url}/v1/leases/aisle-8"))
            .json(&serde_json::json!({"holder": "robot-2", "ttl_seconds": 2})),
    )
    .await;
    assert_eq!(status, 201, "{other}");
    let (status, _) = send(
        http()
            .delete(format!("{url}/v1/leases/aisle-8"))
            .header("lease-secret", str_field(&other, "secret")),
    )
    .await;
    assert!(status == 200 || status == 204, "release: {status}");
    let mid = scrape(&url).await;
    assert_eq!(gauge(&mid, "lease_proxy_leases_held"), 1.0);
    assert!(gauge(&mid, "lease_proxy_keepalive_streams") >= 1.0);
    // aisle-7 expires (TTL 2 s, no more renewals): the replica sees its key go, and its holder
    // then finds it lost.
    until(Duration::from_secs(15), "aisle-7 expired", || async {
        let text = scrape(&url).await;
        gauge(&text, "lease_proxy_leases_held") == 0.0
            && counter(&text, "lease_proxy_expirations_total", &[]) >= 1.0
    })
    .await;
    let (status, body) = send(
        http()
            .post(format!("{url}/v1/leases/aisle-7/renew"))
            .header("lease-secret", &secret),
    )
    .await;
    assert_eq!(status, 410, "a renewal after the expiry: {body}");

    let after = scrape(&url).await;
    let delta = |name: &str, with: &[(&str, &str)]| {
        counter(&after, name, with) - counter(&before, name, with).max(0.0)
    };
    assert_eq!(counter(&before, "lease_proxy_grants_total", &[]), 0.0);
    // Every quota's refusals are a series from the start, at 0.
    for quota in ["held", "rate", "watch-streams", "fleets"] {
        let refusals = counter(
            &before,
            "lease_proxy_quota_refusals_total",
            &[("quota", quota)],
        );
        assert_eq!(refusals, 0.0, "{quota}");
    }
    assert_eq!(delta("lease_proxy_grants_total", &[]), 2.0);
    assert_eq!(delta("lease_proxy_conflicts_total", &[]), 1.0);
    assert_eq!(delta("lease_proxy_releases_total", &[]), 1.0);
    assert_eq!(delta("lease_proxy_expirations_total", &[]), 1.0);
    assert!(
        counter(
            &after,
            "lease_proxy_renewals_total",
            &[("outcome", "renewed")]
        ) >= 1.0
    );
    assert!(counter(&after, "lease_proxy_renewals_total", &[("outcome", "lost")]) >= 1.0);
    assert!(
        counter(
            &after,
            "lease_proxy_stale_rejections_total",
            &[("reason", "lease_lost")]
        ) >= 1.0
    );
    assert_eq!(
        counter(&after, "lease_proxy_forwards_total", &[("outcome", "2xx")]),
        1.0
    );
    assert_eq!(
        counter(&after, "lease_proxy_forwards_total", &[("outcome", "4xx")]),
        1.0
    );
    assert_eq!(
        counter(
            &after,
            "lease_proxy_stale_rejections_total",
            &[("reason", "enforcer")]
        ),
        1.0
    );
    assert!(
        histogram_count(
            &after,
            "lease_proxy_etcd_request_duration_seconds",
            &[("op", "txn_create")]
        ) >= 2
    );
    assert!(
        histogram_count(
            &after,
            "lease_proxy_etcd_request_duration_seconds",
            &[("op", "keepalive")]
        ) >= 1
    );
    assert_eq!(gauge(&after, "lease_proxy_leases_held"), 0.0);
    assert!(gauge(&after, "process_resident_memory_bytes") > 1e6);
    assert!(gauge(&after, "process_open_fds") > 3.0);
    assert!(counter(&after, "process_cpu_seconds_total", &[]) > 0.0);
    for sample in &after.samples {
        for value in sample.labels.values() {
            assert!(
                !value.contains("aisle"),
                "a resource name as a label value: {sample:?}"
            );
        }
    }

    // The gateway counted its decisions and timed its store; a stale token sent straight to it is
    // refused and counted too.
    assert_eq!(direct(1).await.unwrap().status(), 409);
    let gw_after = scrape(&gw_url).await;
    // Admitted: the forwarded write and the direct one; stale: the forwarded and the direct one.
    for (outcome, change) in [("admitted", 2.0), ("stale", 2.0)] {
        let with = [("outcome", outcome)];
        assert_eq!(
            counter(&gw_after, "fence_requests_total", &with)
                - counter(&gw_before, "fence_requests_total", &with),
            change,
            "{outcome}"
        );
    }
    assert!(
        histogram_count(
            &gw_after,
            "fence_mark_store_duration_seconds",
            &[("op", "raise")]
        ) >= 1
    );

    // SIGTERM: both exit 0, flushing their spans (none was exported before).
    assert!(
        spans.lock().unwrap().is_empty(),
        "exported before the flush"
    );
    assert_eq!(proxy.terminate().await, Some(0));
    assert_eq!(gateway.terminate().await, Some(0));

    let spans = spans.lock().unwrap().clone();
    let in_trace = |trace: &str| -> Vec<Span> {
        spans
            .iter()
            .filter(|s| s.trace_id == trace)
            .cloned()
            .collect()
    };
    let names = |trace: &str| -> Vec<String> {
        in_trace(trace)
            .iter()
            .map(|s| format!("{}: {}", s.service, s.name))
            .collect()
    };
    let acquire = in_trace(acquire_trace);
    let has = |spans: &[Span], service: &str, name: &str| {
        spans
            .iter()
            .find(|s| s.service == service && s.name.starts_with(name))
            .cloned()
    };
    let root = has(&acquire, "lease-proxy", "POST /v1/leases/{resource}")
        .unwrap_or_else(|| panic!("no acquire span: {:?}", names(acquire_trace)));
    assert_eq!(
        root.parent_span_id, "00f067aa0ba902b7",
        "child of the client's span"
    );
    assert!(
        has(&acquire, "lease-proxy", "etcd txn_create").is_some(),
        "no etcd span: {:?}",
        names(acquire_trace)
    );

    let write = in_trace(write_trace);
    let forward = has(&write, "lease-proxy", "forward")
        .unwrap_or_else(|| panic!("no forward span: {:?}", names(write_trace)));
    let at_gateway = has(&write, "fence-gateway", "PUT")
        .unwrap_or_else(|| panic!("no gateway span: {:?}", names(write_trace)));
    assert_eq!(
        at_gateway.parent_span_id, forward.span_id,
        "the gateway continues the forward"
    );
    assert!(
        has(&write, "fence-gateway", "raise").is_some(),
        "no mark-store span: {:?}",
        names(write_trace)
    );
    let upstream = has(&write, "fence-gateway", "upstream PUT")
        .unwrap_or_else(|| panic!("no upstream span: {:?}", names(write_trace)));
    let at_storage: Vec<String> = traceparents
        .all()
        .iter()
        .filter_map(|w| w.header("traceparent"))
        .filter(|t| t.contains(write_trace))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        at_storage,
        vec![format!("00-{write_trace}-{}-01", upstream.span_id)],
        "the storage sees the trace, as a child of the gateway's upstream call"
    );
    // Never a secret or a signed token in a log line or a span; every log line is JSON.
    let credentials = [
        secret.clone(),
        str_field(&grant, "fencing_token"),
        str_field(&other, "secret"),
    ];
    for log in [&proxy_log, &gateway_log] {
        let text = std::fs::read_to_string(log).unwrap();
        assert!(text.lines().count() > 5, "{}: too few lines", log.display());
        for line in text.lines() {
            let parsed: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
            assert!(parsed["level"].is_string(), "{line}");
            for credential in &credentials {
                assert!(
                    !line.contains(credential.as_str()),
                    "a credential logged: {line}"
                );
            }
        }
    }
    for span in &spans {
        for credential in &credentials {
            assert!(
                !span.details.contains(credential.as_str()),
                "a credential in {span:?}"
            );
        }
    }
    let mut by_trace: HashMap<&str, usize> = HashMap::new();
    for s in &spans {
        *by_trace.entry(s.trace_id.as_str()).or_default() += 1;
    }
    assert!(
        by_trace[acquire_trace] >= 2 && by_trace[write_trace] >= 5,
        "{by_trace:?}"
    );
}

/// Without an OTLP endpoint nothing is exported, and a client's `traceparent` reaches the
/// storage unchanged through both binaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_the_client_trace_passes_through() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("fencing.key");
    fencing::Keyring::create_file(&key_file, &fencing::KeyId::parse("t1").unwrap()).unwrap();
    let Storage {
        url: store_url,
        log: traceparents,
    } = Storage::start().await;
    let gw_port = lease_proxy_testkit::free_port();
    let gw_url = format!("http://127.0.0.1:{gw_port}");
    let quiet = |mut cmd: Command| {
        Running(
            cmd.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
                .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let _gateway = quiet(gateway_command(gw_port, &store_url, "memory", &key_file));
    let proxy_port = lease_proxy_testkit::free_port();
    let url = format!("http://127.0.0.1:{proxy_port}");
    let _proxy = quiet(proxy_command(proxy_port, &etcd, &key_file, &gw_url));
    wait_ready(&gw_url).await;
    wait_ready(&url).await;
    let (status, grant) = send(
        http()
            .post(format!("{url}/v1/leases/bin-3"))
            .json(&serde_json::json!({"holder": "robot-1", "ttl_seconds": 10})),
    )
    .await;
    assert_eq!(status, 201, "{grant}");
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let (status, body) = send(
        http()
            .put(format!("{url}/v1/leases/bin-3/forward/inventory/bin-3"))
            .header("traceparent", traceparent)
            .header("lease-secret", str_field(&grant, "secret"))
            .body("count=1"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let at_storage: Vec<String> = traceparents
        .all()
        .iter()
        .filter_map(|w| w.header("traceparent").map(str::to_owned))
        .collect();
    assert_eq!(at_storage, vec![traceparent.to_owned()]);
}

/// A collector that accepts connections and never answers must not hold up the exit: SIGTERM
/// still ends the proxy, with status 0, within the drain and the flush deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresponsive_collector_does_not_hold_up_the_exit() {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", silent.local_addr().unwrap());
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = silent.accept().await {
            keep.lock().unwrap().push(conn);
        }
    });
    let port = lease_proxy_testkit::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut cmd = Command::new(PROXY);
    cmd.args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd-endpoints", &etcd.endpoint(0)])
        .args(["--etcd-prefix", &lease_proxy_testkit::prefix("telemetry")])
        .arg("--data-dir")
        .arg(dir.path());
    let proxy = spawn(cmd, &otlp, &dir.path().join("proxy.log"));
    wait_ready(&url).await;
    let (status, grant) = acquire_at(&url, "silent-1").await;
    assert_eq!(status, 201, "{grant}");
    let signalled = Instant::now();
    assert_eq!(proxy.terminate().await, Some(0));
    let took = signalled.elapsed();
    assert!(
        took < runtime::telemetry::FLUSH_DEADLINE + Duration::from_secs(3),
        "exit took {took:?}"
    );
    assert!(!held.lock().unwrap().is_empty(), "the exporter never tried");
}

async fn acquire_at(url: &str, resource: &str) -> (u16, serde_json::Value) {
    send(
        http()
            .post(format!("{url}/v1/leases/{resource}"))
            .json(&serde_json::json!({"holder": "robot-1", "ttl_seconds": 10})),
    )
    .await
}
