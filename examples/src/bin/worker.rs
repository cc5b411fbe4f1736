//! A singleton worker on the Rust SDK (`lease-proxy-client`): waits for a resource, holds it
//! while it works — the SDK's guard renews it in the background — and releases it on
//! SIGTERM/SIGINT. Kill it with SIGKILL and another worker takes over once the lease lapses —
//! with a higher fencing token.

use std::pin::pin;
use std::time::Duration;

use clap::Parser;
use lease_proxy_client::{AcquireOptions, Client, Error};

#[derive(Parser)]
#[command(about = "Hold a lease through lease-proxy and keep it renewed")]
struct Args {
    /// The proxy's base URL.
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    proxy: String,
    /// Resource to hold.
    #[arg(long, default_value = "aisle-1")]
    resource: String,
    /// This worker's identity.
    #[arg(long)]
    name: String,
    /// Lease TTL in seconds.
    #[arg(long, default_value_t = 6)]
    ttl: u64,
}

/// Acquires, holds until the lease is lost, and starts over; on SIGTERM/SIGINT releases what it
/// holds and exits. Fails only on an error other than "held by someone else".
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let client = match Client::new(&args.proxy) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("[{}] {e}", args.name);
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut shutdown = pin!(runtime::serve::terminated());
    let options = AcquireOptions::new(&args.name, Duration::from_secs(args.ttl))
        .wait(Duration::from_secs(30));
    loop {
        let acquired = tokio::select! {
            acquired = client.acquire(&args.resource, options.clone()) => acquired,
            () = &mut shutdown => return std::process::ExitCode::SUCCESS,
        };
        let lease = match acquired {
            Ok(lease) => lease,
            Err(Error::Held { holder, token, .. }) => {
                println!(
                    "[{}] {} is held by {holder} (token {token}); waiting",
                    args.name, args.resource
                );
                continue;
            }
            Err(e) => {
                eprintln!("[{}] giving up: {e}", args.name);
                return std::process::ExitCode::FAILURE;
            }
        };
        println!(
            "[{}] ACQUIRED {} token={} ttl={}s",
            args.name,
            lease.resource(),
            lease.token(),
            lease.grant().ttl_seconds
        );
        let lost = tokio::select! {
            reason = lease.lost_reason() => Some(reason),
            () = &mut shutdown => None,
        };
        match lost {
            Some(reason) => println!("[{}] LOST {} ({reason:?})", args.name, args.resource),
            None => {
                // Graceful shutdown: hand the resource over at once instead of after the TTL.
                match lease.release().await {
                    Ok(()) => println!("[{}] released {} on shutdown", args.name, args.resource),
                    Err(e) => eprintln!("[{}] release failed: {e}", args.name),
                }
                return std::process::ExitCode::SUCCESS;
            }
        }
    }
}
