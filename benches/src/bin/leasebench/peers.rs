//! The peers a user would pick instead of lease-proxy, and the limit for any proxy, started here
//! beside it on the same etcd (`--peers`):
//!
//! - etcd's `grpc-proxy` (`etcd grpc-proxy start`, Debian's etcd-server package), with a key
//!   namespace of its own, for the gRPC operations;
//! - etcd's JSON gateway (`/v3/…` on etcd's own client port, see `gateway`) for the HTTP ones;
//! - a bare pass-through: leasebench itself (`leasebench pass-through`), serving on the project's
//!   own listener stack (`runtime::serve`, as lease-proxy does) and forwarding every request as
//!   it came, HTTP/2 to etcd, with no checks — what any proxy in front of etcd costs at least.
//!
//! What grpc-proxy does with keepalives: its `LeaseKeepAlive` answers a client's request only
//! when its own clientv3 lessor gets an answer from etcd, and that lessor renews each lease
//! once every TTL/3 (polling every 500 ms): the first request on a lease is answered within
//! 500 ms, every later one when the lessor next renews — 20 s for a 60 s lease. A loop of
//! back-to-back renewals through it runs at one renewal per lease per TTL/3; the per-round
//! deadline (`--round-deadline`) cuts it and the row says so.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use axum::body::Body;
use axum::Router;
use http::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lease_proxy_benches::stack::{free_port, Spawned, Stack};

/// The key namespace grpc-proxy is started with (its clients' keys are relative to it).
pub(crate) const GRPC_PROXY_NAMESPACE: &str = "/leasebench-grpc-proxy/";

/// Where the keys of the pass-through side live (it forwards keys as they are).
pub(crate) const PASS_THROUGH_PREFIX: &str = "/leasebench-grpc-pass/";

/// Starts `etcd grpc-proxy` (the `etcd` binary at `etcd`) in front of `etcd_url`, namespaced;
/// returns its endpoint once it answers a gRPC call.
pub(crate) async fn grpc_proxy(
    stack: &mut Stack,
    etcd: &Path,
    etcd_url: &str,
) -> anyhow::Result<(String, Spawned)> {
    let port = free_port();
    let endpoint = format!("127.0.0.1:{port}");
    let mut cmd = Command::new(etcd);
    cmd.args(["grpc-proxy", "start", "--endpoints", etcd_url])
        .args(["--listen-addr", &endpoint])
        .args(["--namespace", GRPC_PROXY_NAMESPACE])
        .arg("--data-dir")
        .arg(stack.dir().join("grpc-proxy"));
    let spawned = stack.spawn(cmd)?;
    let url = format!("http://{endpoint}");
    ready(&url).await?;
    Ok((url, spawned))
}

/// Starts the pass-through (this binary, `pass-through`) to `etcd_url`; its URL once it
/// forwards a gRPC call.
pub(crate) async fn pass_through(
    stack: &mut Stack,
    etcd_url: &str,
) -> anyhow::Result<(String, Spawned)> {
    let port = free_port();
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["pass-through", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--upstream", etcd_url]);
    let spawned = stack.spawn(cmd)?;
    let url = format!("http://127.0.0.1:{port}");
    ready(&url).await?;
    Ok((url, spawned))
}

/// Waits (up to 15 s) until a gRPC `Status` call through `url` succeeds.
async fn ready(url: &str) -> anyhow::Result<()> {
    let mut last = None;
    for _ in 0..150 {
        let answered = async {
            let mut client = etcd_client::Client::connect([url], None).await?;
            client.status().await
        };
        match tokio::time::timeout(Duration::from_secs(1), answered).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => last = Some(e.to_string()),
            Err(_) => last = Some("no answer in 1 s".to_owned()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{url} did not answer gRPC: {}", last.unwrap_or_default())
}

/// Serves the pass-through on `listen` until killed: every request forwarded to `upstream` over
/// HTTP/2 with prior knowledge (gRPC: etcd's client port), its answer streamed back, trailers
/// and all.
pub(crate) async fn serve_pass_through(listen: SocketAddr, upstream: &str) -> anyhow::Result<()> {
    let upstream: Uri = upstream.parse().context("--upstream")?;
    let authority = upstream
        .authority()
        .context("--upstream has no host")?
        .clone();
    // No Nagle delay on the way to etcd, as tonic's channels (lease-proxy's) set none.
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(connector);
    let app = Router::new().fallback_service(tower::service_fn(move |req: Request<Body>| {
        let (client, authority) = (client.clone(), authority.clone());
        async move { Ok::<_, Infallible>(forward(&client, &authority, req).await) }
    }));
    lease_proxy_benches::stack::serve_forever(listen, app).await
}

/// One request to the upstream at `authority`, as it came; 502 when the upstream fails it.
async fn forward(
    client: &Client<HttpConnector, Body>,
    authority: &http::uri::Authority,
    mut req: Request<Body>,
) -> Response<Body> {
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let target = Uri::builder()
        .scheme("http")
        .authority(authority.clone())
        .path_and_query(path)
        .build();
    let Ok(target) = target else {
        return status(StatusCode::BAD_REQUEST);
    };
    *req.uri_mut() = target;
    *req.version_mut() = http::Version::HTTP_2;
    req.headers_mut().remove(http::header::HOST);
    match client.request(req).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            // A gRPC call's connection is a client's for its whole life, as lease-proxy marks
            // its gRPC calls: no idle deadline.
            parts.extensions.insert(runtime::serve::LongLived::always());
            Response::from_parts(parts, Body::new(body))
        }
        Err(_) => status(StatusCode::BAD_GATEWAY),
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = code;
    resp
}
