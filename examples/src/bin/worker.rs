//! A singleton worker: waits for a resource, holds it while it works (the SDK's guard renews it
//! at TTL/3), and releases it on SIGTERM/SIGINT. Kill it with SIGKILL and another worker takes
//! over once the lease lapses — with a higher fencing token.

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

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("[{}] giving up: {e}", args.name);
            std::process::ExitCode::FAILURE
        }
    }
}

/// Acquires, holds until the lease is lost, and starts over, until terminated (then releases
/// at once instead of after the TTL); returns an error only on a hard failure.
async fn run(args: &Args) -> Result<(), Error> {
    let client = Client::new(&args.proxy)?;
    let opts = AcquireOptions::new(&args.name, Duration::from_secs(args.ttl))
        .wait(Duration::from_secs(30));
    let mut shutdown = pin!(terminated());
    loop {
        let lease = tokio::select! {
            acquired = client.acquire(&args.resource, opts.clone()) => match acquired {
                Ok(lease) => lease,
                Err(Error::Held { holder, token, .. }) => {
                    println!(
                        "[{}] {} is held by {holder} (token {token}); waiting",
                        args.name, args.resource
                    );
                    continue;
                }
                Err(e) => return Err(e),
            },
            _ = &mut shutdown => return Ok(()),
        };
        println!(
            "[{}] ACQUIRED {} token={} ttl={}s",
            args.name,
            lease.resource(),
            lease.token(),
            lease.grant().ttl_seconds
        );
        let lost = lease.lost();
        tokio::select! {
            _ = lost.cancelled() => {
                println!("[{}] LOST {} ({:?})", args.name, args.resource, lease.lost_reason().await);
            }
            _ = &mut shutdown => {
                // Graceful shutdown: hand the resource over at once instead of after the TTL.
                let _ = lease.release().await;
                println!("[{}] released {} on shutdown", args.name, args.resource);
                return Ok(());
            }
        }
    }
}

async fn terminated() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}
