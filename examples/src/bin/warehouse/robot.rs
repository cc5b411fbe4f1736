//! One robot: a member of the fleet `aisles` on the Rust SDK (`lease-proxy-client`). The
//! service decides which aisles it counts; the robot counts each aisle it is granted, in a task
//! of its own, and sends the counts until the aisle's guard is lost — handed off to another
//! robot (then it releases the aisle at once, so the hand-off is quick), its session lost (a
//! stall past its TTL: the SDK joins again under the same name), or revoked. On SIGTERM (a
//! deploy) it drains: the service hands its aisles to the others, it releases each as it
//! finishes, and it leaves once it holds nothing (or `--drain-wait` has passed).
//!
//! Half the robots send their counts through the proxy's forward route ([`Lease::forward`]), the
//! other half (`--direct`) straight to fence-gateway with [`Lease::fencing_token`]. The signal is
//! checked before every write, not during it: a robot stopped (SIGSTOP) right after the check
//! sends its next write late, with a token that has been superseded — a zombie write that fencing
//! must refuse. It prints one `event …` line per outcome for the orchestrator.

use std::pin::pin;
use std::time::Duration;

use futures::StreamExt;
use lease_proxy_client::{AssignmentChange, Client, Error, JoinOptions, Lease, LostReason, Member};
use rand::Rng;
use tokio::task::JoinSet;
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
    /// The fleet to join (its resources are the aisles).
    #[arg(long, default_value = "aisles")]
    fleet: String,
    /// Robot name: the member's name.
    #[arg(long)]
    name: String,
    /// Session TTL in seconds.
    #[arg(long, default_value_t = 3)]
    ttl: u64,
    /// On SIGTERM, how long to wait for the hand-offs before leaving anyway.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    drain_wait: Duration,
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
    pub(crate) fn lease_client(&self, proxy: &str, agent: &str) -> Result<Client, Failure> {
        let mut builder = Client::builder(proxy).user_agent(agent);
        if let Some(ca) = &self.ca {
            builder = builder.ca_file(ca);
        }
        if let Some(token) = &self.token {
            builder = builder.bearer_token(token);
        }
        Ok(builder.build()?)
    }
}

/// Works until killed, or until SIGTERM/SIGINT (then it drains and leaves).
pub(crate) async fn work(args: Args) -> Result<std::process::ExitCode, Failure> {
    let http = args.access.http()?;
    let client = args.access.lease_client(&args.proxy, "warehouse-robot")?;
    let mut shutdown = pin!(runtime::serve::terminated());
    loop {
        let member = tokio::select! {
            joined = join(&client, &args) => joined,
            () = &mut shutdown => return Ok(std::process::ExitCode::SUCCESS),
        };
        println!("event joined {}", args.fleet);
        let mut counting = JoinSet::new();
        let ended = tokio::select! {
            ended = follow(&args, &http, &member, &mut counting) => ended,
            () = &mut shutdown => {
                drain(&args, &member, &mut counting).await;
                let _ = member.leave().await;
                println!("event left {}", args.fleet);
                return Ok(std::process::ExitCode::SUCCESS);
            }
        };
        // Ended without a rejoin (evicted, the fleet gone, the name taken): join again.
        println!("event error member {ended}");
        counting.shutdown().await;
        drop(member);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Joins the fleet, trying again until it works.
async fn join(client: &Client, args: &Args) -> Member {
    let opts = JoinOptions::new(&args.name, Duration::from_secs(args.ttl))
        .rejoin(true)
        .poll(Duration::from_secs(10));
    loop {
        match client.join_fleet(&args.fleet, opts.clone()).await {
            Ok(member) => return member,
            Err(e) => {
                println!("event error join {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Follows the member's assignment: a counting task per aisle granted. Returns why it ended.
async fn follow(
    args: &Args,
    http: &reqwest::Client,
    member: &Member,
    counting: &mut JoinSet<()>,
) -> String {
    let mut changes = member.assignments();
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(Ok(change)) => take(args, http, change, counting),
                Some(Err(e)) => return e.to_string(),
                None => return "the assignment stream ended".to_owned(),
            },
            Some(_) = counting.join_next(), if !counting.is_empty() => {}
        }
    }
}

/// Acts on one change: counts what was granted; what moved away or was taken back stops on its
/// guard's lost signal.
fn take(args: &Args, http: &reqwest::Client, change: AssignmentChange, counting: &mut JoinSet<()>) {
    if change.rejoined {
        println!("event rejoined {}", args.fleet);
    }
    for aisle in &change.removed {
        println!("event revoked {aisle}");
    }
    for lease in change.added {
        println!("event acquired {} {}", lease.resource(), lease.token());
        let (style, name, gateway, http) = (
            Style::of(args),
            args.name.clone(),
            args.gateway.clone(),
            http.clone(),
        );
        counting.spawn(async move { count(style, &name, &gateway, &http, lease).await });
    }
}

/// On SIGTERM: asks the service to hand everything off, keeps following the assignment while
/// the counting tasks finish and give their aisles back, then returns (at the latest after
/// `--drain-wait`).
async fn drain(args: &Args, member: &Member, counting: &mut JoinSet<()>) {
    match member.drain().await {
        Ok(_) => println!("event draining {}", args.fleet),
        Err(e) => println!("event error drain {e}"),
    }
    let http = match args.access.http() {
        Ok(http) => http,
        Err(_) => return,
    };
    let until = Instant::now() + args.drain_wait;
    let mut changes = member.assignments();
    while Instant::now() < until && !(member.held().is_empty() && counting.is_empty()) {
        tokio::select! {
            Some(Ok(change)) = changes.next() => take(args, &http, change, counting),
            Some(_) = counting.join_next(), if !counting.is_empty() => {}
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    counting.shutdown().await;
}

/// How a robot sends its counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    /// Through the proxy's forward route.
    Forward,
    /// Straight to the gateway with its token, after checking the lease is not lost.
    Direct,
    /// Straight to the gateway without checking: fencing's case.
    Careless,
}

impl Style {
    fn of(args: &Args) -> Self {
        match (args.careless, args.direct) {
            (true, _) => Style::Careless,
            (false, true) => Style::Direct,
            (false, false) => Style::Forward,
        }
    }
}

/// How one write went.
enum Sent {
    Ok,
    /// Refused as stale (the guard had not told yet, or was not asked): stop counting.
    Stale,
    /// The guard refused to send it: the lease was lost.
    Lost,
    Failed,
}

/// Counts the aisle `lease` holds and sends each count until the lease is lost, then gives the
/// aisle back (a hand-off) or walks away (anything else: nothing of it is left to give back).
async fn count(style: Style, robot: &str, gateway: &str, http: &reqwest::Client, lease: Lease) {
    let aisle = lease.resource().to_owned();
    let lost = lease.lost();
    loop {
        // Counting takes a while.
        let pause = Duration::from_millis(rand::rng().random_range(100..400));
        tokio::select! {
            () = lost.cancelled(), if style != Style::Careless => {}
            () = tokio::time::sleep(pause) => {}
        }
        // The signal, or the clock already past the deadline: a robot resumed after a SIGSTOP
        // may get here before the guard's own timer has run.
        if style != Style::Careless && lease.is_lost() {
            break;
        }
        let count = Count {
            robot: robot.to_owned(),
            count: rand::rng().random_range(0..500),
        };
        match send(style, gateway, http, &lease, &count).await {
            Sent::Ok => println!("event write-ok {aisle}"),
            Sent::Stale | Sent::Lost => break,
            Sent::Failed => {}
        }
    }
    // A guard already lost answers at once; one refused as stale learns of it within moments.
    let reason = tokio::time::timeout(Duration::from_secs(5), lease.lost_reason()).await;
    if reason == Ok(LostReason::HandedOff) {
        match lease.release().await {
            Ok(()) => println!("event handed-off {aisle}"),
            Err(e) => println!("event error release {e}"),
        }
    } else {
        let why = reason.map_or_else(|_| "Stale".to_owned(), |r| format!("{r:?}"));
        println!("event lost {aisle} {why}");
    }
}

async fn send(
    style: Style,
    gateway: &str,
    http: &reqwest::Client,
    lease: &Lease,
    count: &Count,
) -> Sent {
    let aisle = lease.resource();
    let Ok(body) = serde_json::to_vec(count) else {
        println!("event error encode");
        return Sent::Failed;
    };
    let path = format!("/aisles/{aisle}/count");
    let sent = if style == Style::Forward {
        lease
            .forward(reqwest::Method::PUT, &path, Some(body.into()))
            .await
    } else {
        http.put(format!("{gateway}{path}"))
            .header("fencing-resource", aisle)
            .header("fencing-token", lease.fencing_token())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(Error::from)
    };
    match sent.map(|resp| resp.status().as_u16()) {
        Ok(200) => Sent::Ok,
        Ok(409) => {
            println!("event stale-enforcer {aisle}");
            Sent::Stale
        }
        Ok(403 | 410) => {
            println!("event stale-proxy {aisle}");
            Sent::Stale
        }
        // The guard refused to forward: the lease was lost since the check.
        Err(Error::Lost) => Sent::Lost,
        Ok(other) => {
            println!("event write-error {other}");
            Sent::Failed
        }
        Err(_) => {
            println!("event write-error 0");
            Sent::Failed
        }
    }
}
