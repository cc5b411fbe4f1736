//! A scriptable lease holder, for fault tests and experiments: acquires a resource through the
//! proxy, prints its grant as one JSON line, then obeys commands read from stdin, one per line,
//! printing one result line each:
//!
//! - `forward PATH BODY` — `PUT` BODY to PATH through the proxy's forward route;
//! - `direct PATH BODY` — `PUT` BODY to PATH on the enforcer directly, with the grant's token;
//! - `renew` — renew the lease.
//!
//! It never renews on its own: stop it (SIGSTOP) past its TTL and it becomes the zombie holder
//! that fencing exists to stop.

use std::time::Duration;

use clap::Parser;
use lease_proxy_examples::LeaseClient;
use tokio::io::{AsyncBufReadExt, BufReader};

#[derive(Parser)]
struct Args {
    /// lease-proxy's base URL.
    #[arg(long)]
    proxy: String,
    /// The enforcer's base URL, for `direct` writes.
    #[arg(long)]
    gateway: String,
    /// Resource to hold.
    #[arg(long)]
    resource: String,
    /// Holder identity.
    #[arg(long, default_value = "holder")]
    name: String,
    /// Lease TTL in seconds.
    #[arg(long, default_value_t = 2)]
    ttl: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let client = LeaseClient::new(&args.proxy);
    let mut held = client
        .acquire(
            &args.resource,
            &args.name,
            Duration::from_secs(args.ttl),
            Duration::ZERO,
        )
        .await?;
    println!(
        "{}",
        serde_json::json!({
            "token": held.grant.token,
            "fencing_token": held.grant.fencing_token,
            "secret": held.grant.secret,
        })
    );
    let http = reqwest::Client::new();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let mut words = line.splitn(3, ' ');
        let (command, path, body) = (words.next(), words.next(), words.next());
        let status = match (command, path) {
            (Some("forward"), Some(path)) => http
                .put(format!(
                    "{}/v1/leases/{}/forward{path}",
                    args.proxy, args.resource
                ))
                .header("lease-secret", &held.grant.secret)
                .body(body.unwrap_or_default().to_owned())
                .send()
                .await
                .map(|r| r.status().as_u16().to_string())
                .unwrap_or_else(|e| format!("error {e}")),
            (Some("direct"), Some(path)) => http
                .put(format!("{}{path}", args.gateway))
                .header("fencing-resource", &args.resource)
                .header("fencing-token", &held.grant.fencing_token)
                .body(body.unwrap_or_default().to_owned())
                .send()
                .await
                .map(|r| r.status().as_u16().to_string())
                .unwrap_or_else(|e| format!("error {e}")),
            (Some("renew"), _) => match client.renew(&mut held).await {
                Ok(()) => "200".to_owned(),
                Err(e) => format!("error {e}"),
            },
            _ => "error unknown command".to_owned(),
        };
        println!("{status}");
    }
    Ok(())
}
