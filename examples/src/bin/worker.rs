//! A singleton worker: waits for a resource, holds it while it works, renews every TTL/3, and
//! releases it on SIGTERM/SIGINT. Kill it with SIGKILL and another worker takes over once the
//! lease lapses — with a higher fencing token.

use std::time::Duration;

use clap::Parser;
use lease_proxy_examples::{Error, Held, LeaseClient};
use tokio::sync::Mutex;
use tokio::time::Instant;

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
    let client = LeaseClient::new(&args.proxy);
    let current: Mutex<Option<Held>> = Mutex::new(None);
    tokio::select! {
        e = run(&client, &args, &current) => {
            eprintln!("[{}] giving up: {e}", args.name);
            std::process::ExitCode::FAILURE
        }
        _ = terminated() => {
            // Graceful shutdown: hand the resource over at once instead of after the TTL.
            let held = current.lock().await.take();
            if let Some(held) = held {
                let _ = client.release(&held).await;
                println!("[{}] released {} on shutdown", args.name, args.resource);
            }
            std::process::ExitCode::SUCCESS
        }
    }
}

/// Acquires, holds until the lease is lost, and starts over; returns only on a hard error.
async fn run(client: &LeaseClient, args: &Args, current: &Mutex<Option<Held>>) -> Error {
    let ttl = Duration::from_secs(args.ttl);
    loop {
        let mut held = match client
            .acquire(&args.resource, &args.name, ttl, Duration::from_secs(30))
            .await
        {
            Ok(held) => held,
            Err(Error::Held { holder, token, .. }) => {
                println!(
                    "[{}] {} is held by {holder} (token {token}); waiting",
                    args.name, args.resource
                );
                continue;
            }
            Err(e) => return e,
        };
        println!(
            "[{}] ACQUIRED {} token={} ttl={}s",
            args.name, held.grant.resource, held.grant.token, held.grant.ttl_seconds
        );
        *current.lock().await = Some(held.clone());
        loop {
            tokio::time::sleep(ttl / 3).await;
            if Instant::now() >= held.deadline {
                println!(
                    "[{}] deadline passed before a renewal: no longer the holder",
                    args.name
                );
                break;
            }
            match client.renew(&mut held).await {
                Ok(()) => println!(
                    "[{}] renewed {} token={}",
                    args.name, args.resource, held.grant.token
                ),
                Err(Error::Lost) => {
                    println!("[{}] LOST {}", args.name, args.resource);
                    break;
                }
                Err(e) => eprintln!("[{}] renewal failed, will retry: {e}", args.name),
            }
        }
        *current.lock().await = None;
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
