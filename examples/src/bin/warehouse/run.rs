//! The scenario: the fleet, its robots, chaos and a rolling deploy (`chaos.rs`), live
//! progress, the ledger of who held what (`ledger.rs`), audit.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lease_proxy_client::FleetSpec;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::chaos::Operator;
use crate::ledger::{self, Ledger};
use crate::{audit, inventory::Applied, Failure};

/// `warehouse run` options.
#[derive(clap::Args, Clone)]
pub(crate) struct Args {
    /// lease-proxy's base URL.
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    proxy: String,
    /// fence-gateway's base URL.
    #[arg(long, default_value = "http://127.0.0.1:7071")]
    gateway: String,
    /// The inventory's own URL (for the audit's read of its write log).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    inventory: String,
    /// Number of robots (every other one writes directly to the gateway with its token, and
    /// robot-1 does so without looking at its lost signal).
    #[arg(long, default_value_t = 6)]
    robots: usize,
    /// Number of aisles: the fleet's resources, `aisle-1` … `aisle-N`.
    #[arg(long, default_value_t = 12)]
    aisles: usize,
    /// The fleet the robots join (made, or changed, to hold the aisles).
    #[arg(long, default_value = "aisles")]
    pub(crate) fleet: String,
    /// How long a robot has to give up an aisle moved away from it before the service
    /// revokes it.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    drain: Duration,
    /// Session TTL in seconds.
    #[arg(long, default_value_t = 3)]
    pub(crate) ttl: u64,
    /// How long the robots work.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Every few seconds, SIGSTOP a robot beyond its TTL or SIGKILL one (restarted at once), in
    /// turn, a stall first; which robot is random.
    #[arg(long)]
    pub(crate) chaos: bool,
    /// A rolling deploy a quarter of the way in: each robot in turn drained (SIGTERM: it hands
    /// its aisles off and leaves) and restarted, as long as the time allows.
    #[arg(long)]
    pub(crate) deploy: bool,
    /// How long a drained robot waits for its hand-offs before leaving anyway.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub(crate) drain_wait: Duration,
    /// TLS and credentials (passed on to the robots).
    #[command(flatten)]
    access: crate::robot::Access,
}

#[derive(Default)]
pub(crate) struct Tally {
    writes: AtomicU64,
    stale_proxy: AtomicU64,
    stale_enforcer: AtomicU64,
    /// Aisles a robot stopped counting on its lease's lost signal, other than a hand-off.
    losses: AtomicU64,
    /// Aisles a robot gave up when the fleet moved them to another.
    handed_off: AtomicU64,
    grants: AtomicU64,
    pub(crate) kills: AtomicU64,
    pub(crate) stalls: AtomicU64,
    /// Robots drained and restarted by the rolling deploy.
    pub(crate) deploys: AtomicU64,
}

/// How a robot sends its counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// Through the proxy's forward route.
    Forward,
    /// Straight to the gateway with its token, after checking the lease is not lost.
    Direct,
    /// Straight to the gateway without checking (`robot --careless`): fencing's case.
    Careless,
}

pub(crate) struct Robot {
    pub(crate) name: String,
    pub(crate) style: Style,
    pub(crate) child: Child,
}

pub(crate) fn spawn_robot(
    args: &Args,
    name: &str,
    style: Style,
    tally: &Arc<Tally>,
) -> Result<Robot, Failure> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("robot")
        .args(["--proxy", &args.proxy, "--gateway", &args.gateway])
        .args(["--fleet", &args.fleet, "--name", name])
        .args(["--ttl", &args.ttl.to_string()])
        .arg("--drain-wait")
        .arg(humantime::format_duration(args.drain_wait).to_string())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    if let Some(ca) = &args.access.ca {
        cmd.arg("--ca").arg(ca);
    }
    if let Some(token) = &args.access.token {
        cmd.env("WAREHOUSE_TOKEN", token);
    }
    match style {
        Style::Forward => {}
        Style::Direct => {
            cmd.arg("--direct");
        }
        Style::Careless => {
            cmd.arg("--careless");
        }
    }
    let mut child = cmd.spawn()?;
    if let Some(stdout) = child.stdout.take() {
        let tally = tally.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let counter = match line.split_whitespace().nth(1) {
                    Some("write-ok") => &tally.writes,
                    Some("stale-proxy") => &tally.stale_proxy,
                    Some("lost") => &tally.losses,
                    Some("handed-off") => &tally.handed_off,
                    Some("stale-enforcer") => &tally.stale_enforcer,
                    Some("acquired") => &tally.grants,
                    _ => continue,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    Ok(Robot {
        name: name.to_owned(),
        style,
        child,
    })
}

pub(crate) fn signal(child: &Child, sig: &str) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Starts `--robots` robots. Every other one writes straight to the gateway; one of those does
/// not look at its lost signal, so the demo shows the enforcer refusing a paused robot's late
/// writes.
fn start_robots(args: &Args, tally: &Arc<Tally>) -> Result<Vec<Robot>, Failure> {
    (0..args.robots)
        .map(|i| {
            let style = match i {
                1 => Style::Careless,
                i if i % 2 == 1 => Style::Direct,
                _ => Style::Forward,
            };
            spawn_robot(args, &format!("robot-{i}"), style, tally)
        })
        .collect()
}

/// Runs the scenario and the audit; exit status 1 on any violation.
pub(crate) async fn run(args: Args) -> Result<std::process::ExitCode, Failure> {
    let client = args.access.lease_client(&args.proxy, "warehouse-run")?;
    let aisles: Vec<String> = (1..=args.aisles).map(|i| format!("aisle-{i}")).collect();
    client
        .put_fleet(
            &args.fleet,
            &FleetSpec::new(aisles.clone()).drain(args.drain),
        )
        .await?;
    let ledger: ledger::Shared = Arc::new(std::sync::Mutex::new(Ledger::new(&aisles)));
    let (ready, listening) = tokio::sync::oneshot::channel();
    let following = tokio::spawn(ledger::follow(
        client.clone(),
        "aisle-".to_owned(),
        ledger.clone(),
        ready,
    ));
    // The ledger must see the first grants: the robots start once its stream is open.
    let _ = tokio::time::timeout(Duration::from_secs(5), listening).await;
    let tally = Arc::new(Tally::default());
    let robots = Arc::new(Mutex::new(start_robots(&args, &tally)?));
    let started = Instant::now();
    let deadline = started + args.duration;
    println!(
        "{} robots in fleet {} over {} aisles for {:?}, TTL {} s, chaos {}, rolling deploy {}",
        args.robots,
        args.fleet,
        args.aisles,
        args.duration,
        args.ttl,
        if args.chaos { "on" } else { "off" },
        if args.deploy { "on" } else { "off" },
    );
    let operator = tokio::spawn(
        Operator {
            args: args.clone(),
            client: client.clone(),
            robots: robots.clone(),
            tally: tally.clone(),
            ledger: ledger.clone(),
            deadline,
            settled: BTreeMap::new(),
        }
        .run(),
    );
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        progress(started, &tally, &ledger);
    }
    println!();
    ledger::lock(&ledger).close(Instant::now());
    following.abort();
    // An event under way when the time is up (a drained robot's exit) ends within seconds.
    let settled = match tokio::time::timeout(Duration::from_secs(10), operator).await {
        Ok(Ok(operator)) => operator.settled,
        _ => BTreeMap::new(),
    };
    for robot in robots.lock().await.iter_mut() {
        signal(&robot.child, "CONT");
        let _ = robot.child.kill().await;
    }
    let ledger = std::mem::take(&mut *ledger::lock(&ledger));
    audit_and_report(&args, &tally, &ledger, &settled).await
}

fn progress(started: Instant, tally: &Tally, ledger: &ledger::Shared) {
    let moves = ledger::lock(ledger).moves();
    print!(
        "\r[{:>3}s] grants {:>4} | writes {:>5} | moves {:>3}, handed off {:>3} | losses {:>3} | stale refused: proxy {:>3}, enforcer {:>3} | killed {:>2}, stalled {:>2}, deployed {:>2} ",
        started.elapsed().as_secs(),
        tally.grants.load(Ordering::Relaxed),
        tally.writes.load(Ordering::Relaxed),
        moves,
        tally.handed_off.load(Ordering::Relaxed),
        tally.losses.load(Ordering::Relaxed),
        tally.stale_proxy.load(Ordering::Relaxed),
        tally.stale_enforcer.load(Ordering::Relaxed),
        tally.kills.load(Ordering::Relaxed),
        tally.stalls.load(Ordering::Relaxed),
        tally.deploys.load(Ordering::Relaxed),
    );
    let _ = std::io::stdout().flush();
}

/// How long each kind of robot event took to settle: (settled, total time, never settled).
type Settled = BTreeMap<&'static str, (u32, Duration, u32)>;

async fn audit_and_report(
    args: &Args,
    tally: &Tally,
    ledger: &Ledger,
    settled: &Settled,
) -> Result<std::process::ExitCode, Failure> {
    let http = args.access.http()?;
    let log: Vec<Applied> = http
        .get(format!("{}/log", args.inventory))
        .send()
        .await?
        .json()
        .await?;
    let metrics = http
        .get(format!("{}/metrics", args.gateway))
        .send()
        .await?
        .text()
        .await?;
    let gateway_counts: HashMap<&str, &str> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("fence_requests_total{outcome=\""))
        .filter_map(|l| l.split_once("\"} "))
        .collect();
    let report = audit::check(&log);
    println!("== audit of the inventory's write log");
    println!("writes applied:               {}", report.applied);
    println!(
        "writes the robots saw accepted: {}",
        tally.writes.load(Ordering::Relaxed)
    );
    println!(
        "losses the robots saw:        {} (each stopped counting at its lease's lost signal)",
        tally.losses.load(Ordering::Relaxed)
    );
    println!(
        "stale writes refused:         at the proxy {}, at the enforcer {} (gateway counted {} stale)",
        tally.stale_proxy.load(Ordering::Relaxed),
        tally.stale_enforcer.load(Ordering::Relaxed),
        gateway_counts.get("stale").copied().unwrap_or("?"),
    );
    println!(
        "chaos:                        {} killed (restarted at once), {} stalled beyond their TTL, {} drained and restarted (rolling deploy)",
        tally.kills.load(Ordering::Relaxed),
        tally.stalls.load(Ordering::Relaxed),
        tally.deploys.load(Ordering::Relaxed),
    );
    println!(
        "aisles handed off:            {} (each released by its robot when moved to another)",
        tally.handed_off.load(Ordering::Relaxed)
    );
    for (aisle, (writes, tokens, top)) in &report.aisles {
        println!("  {aisle}: {writes} writes under {tokens} tokens, highest {top}, token order ok");
    }
    for w in &report.out_of_order {
        println!("VIOLATION out of order: {w:?}");
    }
    for (aisle, rev, a, b) in &report.double_counts {
        println!("VIOLATION double count on {aisle}: token {rev} used by {a} and {b}");
    }
    report_fleet(ledger, settled);
    let violations = report.violations() + ledger.overlaps.len();
    println!("invariant violations:         {violations}");
    Ok(if violations == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    })
}

/// The fleet's part of the audit, from the ledger the proxy's event stream kept.
fn report_fleet(ledger: &Ledger, settled: &Settled) {
    println!("== the fleet, from the proxy's event stream");
    match ledger.coverage() {
        Some(c) => println!(
            "aisle-seconds unowned:        {:.2} of {:.0} ({:.2} %) since every aisle was first held; longest gap {:.2} s ({})",
            c.unowned_seconds,
            c.aisle_seconds,
            100.0 * c.unowned_seconds / c.aisle_seconds.max(f64::EPSILON),
            c.longest_gap.0,
            c.longest_gap.1,
        ),
        None => println!("aisle-seconds unowned:        not measured: the aisles were never all held at once"),
    }
    println!("moves (to another robot):     {}", ledger.moves());
    let per: Vec<String> = ledger
        .moves_per_event()
        .into_iter()
        .map(|(what, (events, moves))| {
            let (n, took, never) = settled.get(what).copied().unwrap_or_default();
            let mean = if n == 0 {
                0.0
            } else {
                took.as_secs_f64() / f64::from(n)
            };
            let unsettled = if never > 0 {
                format!(", {never} not settled")
            } else {
                String::new()
            };
            #[allow(clippy::cast_precision_loss)]
            let avg = moves as f64 / events.max(1) as f64;
            format!("{what} {avg:.1} ({events}×, settled in {mean:.1} s{unsettled})")
        })
        .collect();
    println!(
        "moves per robot event:        {}",
        if per.is_empty() {
            "no robot event".to_owned()
        } else {
            per.join("; ")
        }
    );
    for overlap in &ledger.overlaps {
        println!("VIOLATION two holders at once: {overlap}");
    }
}
