//! One robot: lease an aisle with the Rust SDK (`lease-proxy-client`), count it, send the counts,
//! release, repeat. The SDK's guard renews the lease in the background; the robot stops the
//! moment the guard's lost signal fires, and releases its aisle when it is done with it or is
//! told to stop (SIGTERM/SIGINT).
//!
//! Half the robots send their counts through the proxy's forward route ([`Lease::forward`]), the
//! other half (`--direct`) straight to fence-gateway with [`Lease::fencing_token`]. The signal is
//! checked before every write, not during it: a robot stopped (SIGSTOP) right after the check
//! sends its next write late, with a token that has been superseded — a zombie write that fencing
//! must refuse. It prints one `event …` line per outcome for the orchestrator.

use std::pin::pin;
use std::time::Duration;

use lease_proxy_client::{AcquireOptions, Client, Error, Lease};
use rand::Rng;

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
    /// Write straight to the gateway without looking at the lost signal first, as a client
    /// that trusts its own belief (a paused process does): only the enforcer stops its late
    /// writes. Implies `--direct`.
    #[arg(long)]
    careless: bool,
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
    /// A plain HTTP client trusting `--ca` (the system's roots otherwise), for the gateway and
    /// the inventory.
    pub(crate) fn http(&self) -> Result<reqwest::Client, Failure> {
        let mut builder = reqwest::Client::builder().use_rustls_tls();
        if let Some(ca) = &self.ca {
            let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)? {
                builder = builder.add_root_certificate(cert);
            }
        }
        Ok(builder.build()?)
    }

    /// A lease-proxy client for `proxy` trusting `--ca` and presenting the bearer token.
    fn lease_client(&self, proxy: &str) -> Result<Client, Failure> {
        let mut builder = Client::builder(proxy).user_agent("warehouse-robot");
        if let Some(ca) = &self.ca {
            builder = builder.ca_file(ca);
        }
        if let Some(token) = &self.token {
            builder = builder.bearer_token(token);
        }
        Ok(builder.build()?)
    }
}

/// How one aisle's counting ended.
enum Counted {
    /// All counts sent: the robot releases the aisle.
    Done,
    /// The lease was lost (the guard's signal, or a write refused as stale) — or a count could
    /// not even be encoded: the robot walks away without writing again.
    Lost,
}

/// Works until killed, or until SIGTERM/SIGINT (then it releases the aisle it holds).
pub(crate) async fn work(args: Args) -> Result<std::process::ExitCode, Failure> {
    let http = args.access.http()?;
    let client = args.access.lease_client(&args.proxy)?;
    let ttl = Duration::from_secs(args.ttl);
    let mut shutdown = pin!(fencing::serve::terminated());
    loop {
        let aisle = args.aisles[rand::rng().random_range(0..args.aisles.len())].clone();
        let options = AcquireOptions::new(&args.name, ttl).wait(Duration::from_secs(5));
        let acquired = tokio::select! {
            acquired = client.acquire(&aisle, options) => acquired,
            () = &mut shutdown => return Ok(std::process::ExitCode::SUCCESS),
        };
        let lease = match acquired {
            Ok(lease) => lease,
            Err(Error::Held { .. }) => continue,
            Err(e) => {
                println!("event error acquire {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        println!("event acquired {aisle} {}", lease.token());
        let counted = tokio::select! {
            counted = count(&args, &http, &lease) => Some(counted),
            () = &mut shutdown => None,
        };
        match counted {
            Some(Counted::Done) => {
                release(lease).await;
            }
            // Dropping the guard releases what may be left of the grant, in the background.
            Some(Counted::Lost) => {}
            None => {
                release(lease).await;
                return Ok(std::process::ExitCode::SUCCESS);
            }
        }
    }
}

/// Counts the aisle `lease` holds a few times and sends each count; stops the moment the lease
/// is lost.
async fn count(args: &Args, http: &reqwest::Client, lease: &Lease) -> Counted {
    let aisle = lease.resource();
    let lost = lease.lost();
    let updates = rand::rng().random_range(3..9);
    for _ in 0..updates {
        // Counting takes a while.
        let pause = Duration::from_millis(rand::rng().random_range(100..400));
        tokio::select! {
            () = lost.cancelled(), if !args.careless => {}
            () = tokio::time::sleep(pause) => {}
        }
        // The signal, or the clock already past the deadline: a robot resumed after a SIGSTOP
        // may get here before the guard's own timer has run.
        if !args.careless && lease.is_lost() {
            println!("event lost {aisle}");
            return Counted::Lost;
        }
        let count = Count {
            robot: args.name.clone(),
            count: rand::rng().random_range(0..500),
        };
        let Ok(body) = serde_json::to_vec(&count) else {
            println!("event error encode");
            return Counted::Lost;
        };
        let path = format!("/aisles/{aisle}/count");
        let sent = if args.direct || args.careless {
            http.put(format!("{}{path}", args.gateway))
                .header("fencing-resource", aisle)
                .header("fencing-token", lease.fencing_token())
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body)
                .send()
                .await
                .map_err(Error::from)
        } else {
            lease
                .forward(reqwest::Method::PUT, &path, Some(body.into()))
                .await
        };
        match sent.map(|resp| resp.status().as_u16()) {
            Ok(200) => println!("event write-ok {aisle}"),
            Ok(409) => {
                println!("event stale-enforcer {aisle}");
                return Counted::Lost;
            }
            Ok(403 | 410) => {
                println!("event stale-proxy {aisle}");
                return Counted::Lost;
            }
            // The guard refused to forward: the lease was lost since the check above.
            Err(Error::Lost) => {
                println!("event lost {aisle}");
                return Counted::Lost;
            }
            Ok(other) => println!("event write-error {other}"),
            Err(_) => println!("event write-error 0"),
        }
    }
    Counted::Done
}

/// Releases `lease` and says so.
async fn release(lease: Lease) {
    let aisle = lease.resource().to_owned();
    match lease.release().await {
        Ok(()) => println!("event released {aisle}"),
        Err(e) => println!("event error release {e}"),
    }
}
