//! One robot: lease an aisle, count it, send the counts, renew at TTL/4, release, repeat.
//!
//! It uses the SDK's one-shot calls, not its guard (whose `forward` refuses once the deadline
//! has passed), because it deliberately does not check its own deadline before writing — like a client paused by a GC
//! right after such a check — so when it is stopped past its TTL and continued, its next write is
//! a zombie write that fencing must refuse. It prints one `event …` line per outcome for the
//! orchestrator.

use std::time::Duration;

use lease_proxy_client::{AcquireOptions, Client, Error};
use rand::Rng;
use tokio::time::Instant;

use crate::inventory::Count;
use crate::Failure;

/// `warehouse robot` options.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// lease-proxy's base URL.
    #[arg(long)]
    proxy: String,
    /// fence-gateway's base URL (for `--direct`).
    #[arg(long)]
    gateway: String,
    /// Aisles to choose from, comma-separated.
    #[arg(long, value_delimiter = ',')]
    aisles: Vec<String>,
    /// Robot name.
    #[arg(long)]
    name: String,
    /// Lease TTL in seconds.
    #[arg(long, default_value_t = 3)]
    ttl: u64,
    /// Write straight to the gateway with the token instead of through the proxy.
    #[arg(long)]
    direct: bool,
    /// How to reach the proxy and the gateway over TLS and authenticate.
    #[command(flatten)]
    access: Access,
}

/// TLS and credentials towards the proxy, the gateway and the inventory (`scripts/run.sh
/// --secure`).
#[derive(clap::Args, Clone, Default)]
pub(crate) struct Access {
    /// CAs (PEM) that sign the services' certificates, for `https://` URLs.
    #[arg(long, env = "WAREHOUSE_CA")]
    pub(crate) ca: Option<std::path::PathBuf>,
    /// Bearer token for the proxy (with `--auth-tokens` on); from the environment, so that it
    /// is not on the command line.
    #[arg(long, env = "WAREHOUSE_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
}

impl Access {
    /// An HTTP client trusting `--ca`.
    pub(crate) fn http(&self) -> Result<reqwest::Client, Failure> {
        Ok(lease_proxy_examples::http_client(self.ca.as_deref())?)
    }

    /// A lease-proxy client for `url`, trusting `--ca` and presenting `--token`.
    pub(crate) fn lease_client(&self, url: &str) -> Result<Client, Failure> {
        let mut builder = Client::builder(url);
        if let Some(ca) = &self.ca {
            builder = builder.ca_file(ca);
        }
        if let Some(token) = &self.token {
            builder = builder.bearer_token(token);
        }
        Ok(builder.build()?)
    }
}

/// Works until killed.
pub(crate) async fn work(args: Args) -> Result<std::process::ExitCode, Failure> {
    let http = args.access.http()?;
    let client = args.access.lease_client(&args.proxy)?;
    let ttl = Duration::from_secs(args.ttl);
    let opts = AcquireOptions::new(&args.name, ttl).wait(Duration::from_secs(5));
    loop {
        let aisle = args.aisles[rand::rng().random_range(0..args.aisles.len())].clone();
        let grant = match client.grant(&aisle, &opts).await {
            Ok(grant) => grant,
            Err(Error::Held { .. }) => continue,
            Err(e) => {
                println!("event error acquire {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        println!("event acquired {aisle} {}", grant.token);
        let mut renewed = Instant::now();
        let updates = rand::rng().random_range(3..9);
        let mut lost = false;
        for _ in 0..updates {
            // Counting takes a while.
            let pause = rand::rng().random_range(100..400);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let count = Count {
                robot: args.name.clone(),
                count: rand::rng().random_range(0..500),
            };
            let path = format!("/aisles/{aisle}/count");
            let request = if args.direct {
                http.put(format!("{}{path}", args.gateway))
                    .header("fencing-resource", &aisle)
                    .header("fencing-token", &grant.fencing_token)
            } else {
                client.forward_request(&aisle, &grant.secret, reqwest::Method::PUT, &path)
            };
            let status = match request.json(&count).send().await {
                Ok(resp) => resp.status().as_u16(),
                Err(_) => 0,
            };
            match status {
                200 => println!("event write-ok {aisle}"),
                409 => {
                    println!("event stale-enforcer {aisle}");
                    lost = true;
                }
                403 | 410 => {
                    println!("event stale-proxy {aisle}");
                    lost = true;
                }
                other => println!("event write-error {other}"),
            }
            if lost {
                break;
            }
            if renewed.elapsed() >= ttl / 4 {
                match client.renew(&aisle, &grant.secret).await {
                    Ok(_) => renewed = Instant::now(),
                    Err(Error::Lost) => {
                        println!("event lost {aisle}");
                        lost = true;
                        break;
                    }
                    Err(e) => println!("event error renew {e}"),
                }
            }
        }
        if !lost {
            let _ = client.release(&aisle, &grant.secret).await;
            println!("event released {aisle}");
        }
    }
}
