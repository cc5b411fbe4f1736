//! Protected storage for tests (feature `proxy`): fence-gateway in this process, in front of a
//! storage such as [`crate::recording::Storage`], so a test can write through the proxy's forward
//! or straight to the gateway and see what got through.

use std::path::Path;
use std::time::Duration;

/// How long a starting gateway has to answer `/readyz` with 200.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// fence-gateway in this process, in header mode (a write's resource is its `Fencing-Resource`
/// header), its marks in memory, verifying tokens with `key_file` (the proxy's), in front of
/// `upstream`. Its base URL, once it is ready.
pub async fn start_gateway(upstream: &str, key_file: &Path) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("the bound port"));
    let config = fencing::gateway::GatewayConfig::new(upstream, "memory", key_file.to_owned());
    tokio::spawn(fencing::gateway::run(
        listener,
        config,
        std::future::pending(),
    ));
    let readyz = format!("{url}/readyz");
    crate::poll::answers(&reqwest::Client::new(), &readyz, 200, READY_WITHIN).await;
    url
}
