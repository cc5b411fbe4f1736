//! Holds a resource until Ctrl-C or until the lease is lost, then releases it.
//!
//! ```sh
//! cargo run -p lease-proxy-client --example hold -- http://127.0.0.1:7070 aisle-1 10
//! ```
//! Arguments: the proxy's URL, the resource, the TTL in seconds (defaults as above). Exits 1 if
//! the lease is lost.

use std::time::Duration;

use lease_proxy_client::{AcquireOptions, Client};
use tokio::time::Instant;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:7070".into());
    let resource = args.next().unwrap_or_else(|| "aisle-1".into());
    let ttl: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(10);

    let client = Client::new(&url)?;
    let opts =
        AcquireOptions::new("hold-example", Duration::from_secs(ttl)).wait(Duration::from_secs(30));
    let lease = client.acquire(&resource, opts).await?;
    println!(
        "holding {} with token {} (Fencing-Token: {})",
        lease.resource(),
        lease.token(),
        lease.fencing_token()
    );

    let lost = lease.lost();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = lost.cancelled() => {
                eprintln!("lost {}: {:?}", lease.resource(), lease.lost_reason().await);
                std::process::exit(1);
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = tick.tick() => {
                // Look before every unit of protected work: the lease may have been lost while
                // this process was not running.
                if !lease.is_lost() {
                    let left = lease.deadline().saturating_duration_since(Instant::now());
                    println!("working under token {} (held for at least {left:?})", lease.token());
                }
            }
        }
    }
    lease.release().await?;
    println!("released {resource}");
    Ok(())
}
