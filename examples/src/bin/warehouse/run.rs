//! The scenario: robots, chaos, live progress, audit.

use std::collections::HashMap;
use std::io::Write;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;
use tokio::time::Instant;

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
    /// Number of aisles.
    #[arg(long, default_value_t = 4)]
    aisles: usize,
    /// Lease TTL in seconds.
    #[arg(long, default_value_t = 3)]
    ttl: u64,
    /// How long the robots work.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// SIGKILL robots and SIGSTOP them beyond their TTL at random.
    #[arg(long)]
    chaos: bool,
    /// TLS and credentials (passed on to the robots).
    #[command(flatten)]
    access: crate::robot::Access,
}

#[derive(Default)]
struct Tally {
    writes: AtomicU64,
    stale_proxy: AtomicU64,
    stale_enforcer: AtomicU64,
    /// Robots that stopped on their lease's lost signal.
    losses: AtomicU64,
    grants: AtomicU64,
    kills: AtomicU64,
    stalls: AtomicU64,
}

/// How a robot sends its counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    /// Through the proxy's forward route.
    Forward,
    /// Straight to the gateway with its token, after checking the lease is not lost.
    Direct,
    /// Straight to the gateway without checking (`robot --careless`): fencing's case.
    Careless,
}

struct Robot {
    name: String,
    style: Style,
    child: Child,
}

fn spawn_robot(
    args: &Args,
    name: &str,
    style: Style,
    tally: &Arc<Tally>,
) -> Result<Robot, Failure> {
    let aisles: Vec<String> = (1..=args.aisles).map(|i| format!("aisle-{i}")).collect();
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("robot")
        .args(["--proxy", &args.proxy, "--gateway", &args.gateway])
        .args(["--aisles", &aisles.join(","), "--name", name])
        .args(["--ttl", &args.ttl.to_string()])
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

fn signal(child: &Child, sig: &str) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Runs the scenario and the audit; exit status 1 on any violation.
pub(crate) async fn run(args: Args) -> Result<std::process::ExitCode, Failure> {
    let tally = Arc::new(Tally::default());
    let mut robots = Vec::new();
    for i in 0..args.robots {
        // Every other robot writes straight to the gateway; one of those does not look at its
        // lost signal, so the demo shows the enforcer refusing a paused robot's late writes.
        let style = match i {
            1 => Style::Careless,
            i if i % 2 == 1 => Style::Direct,
            _ => Style::Forward,
        };
        robots.push(spawn_robot(&args, &format!("robot-{i}"), style, &tally)?);
    }
    let robots = Arc::new(Mutex::new(robots));
    let started = Instant::now();
    let deadline = started + args.duration;
    println!(
        "{} robots on {} aisles for {:?}, TTL {} s, chaos {}",
        args.robots,
        args.aisles,
        args.duration,
        args.ttl,
        if args.chaos { "on" } else { "off" }
    );
    let chaos = args.chaos.then(|| {
        let robots = robots.clone();
        let tally = tally.clone();
        let ttl = args.ttl;
        let respawn = args.clone();
        tokio::spawn(async move {
            while Instant::now() + Duration::from_secs(ttl + 4) < deadline {
                let wait = rand::rng().random_range(1500..3500);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                let mut robots = robots.lock().await;
                let kill = rand::rng().random_bool(0.5);
                // Half the stalls hit the careless robot: a paused holder that writes on waking
                // is what fencing is for.
                let careless = robots.iter().position(|r| r.style == Style::Careless);
                let i = match careless {
                    Some(c) if !kill && rand::rng().random_bool(0.5) => c,
                    _ => rand::rng().random_range(0..robots.len()),
                };
                if kill {
                    signal(&robots[i].child, "KILL");
                    tally.kills.fetch_add(1, Ordering::Relaxed);
                    let (name, style) = (robots[i].name.clone(), robots[i].style);
                    if let Ok(fresh) = spawn_robot(&respawn, &name, style, &tally) {
                        robots[i] = fresh;
                    }
                } else {
                    signal(&robots[i].child, "STOP");
                    tally.stalls.fetch_add(1, Ordering::Relaxed);
                    let stalled = robots[i].child.id();
                    // Beyond the TTL: the lease lapses while the robot sleeps.
                    let stall =
                        Duration::from_millis(ttl * 1000 + rand::rng().random_range(500..2500));
                    tokio::spawn(async move {
                        tokio::time::sleep(stall).await;
                        if let Some(pid) = stalled {
                            let _ = std::process::Command::new("kill")
                                .args(["-CONT", &pid.to_string()])
                                // The robot may have been killed while stalled.
                                .stderr(std::process::Stdio::null())
                                .status();
                        }
                    });
                }
            }
        })
    });
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        print!(
            "\r[{:>3}s] grants {:>4} | writes {:>5} | losses seen {:>3} | stale refused: at proxy {:>3}, at enforcer {:>3} | kills {:>2} | stalls {:>2} ",
            started.elapsed().as_secs(),
            tally.grants.load(Ordering::Relaxed),
            tally.writes.load(Ordering::Relaxed),
            tally.losses.load(Ordering::Relaxed),
            tally.stale_proxy.load(Ordering::Relaxed),
            tally.stale_enforcer.load(Ordering::Relaxed),
            tally.kills.load(Ordering::Relaxed),
            tally.stalls.load(Ordering::Relaxed),
        );
        let _ = std::io::stdout().flush();
    }
    println!();
    if let Some(chaos) = chaos {
        chaos.abort();
    }
    for robot in robots.lock().await.iter_mut() {
        signal(&robot.child, "CONT");
        let _ = robot.child.kill().await;
    }
    audit_and_report(&args, &tally).await
}

async fn audit_and_report(args: &Args, tally: &Tally) -> Result<std::process::ExitCode, Failure> {
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
        "chaos:                        {} robots killed, {} stalled beyond their TTL",
        tally.kills.load(Ordering::Relaxed),
        tally.stalls.load(Ordering::Relaxed)
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
    if report.violations() == 0 {
        println!("invariant violations:         0");
        Ok(std::process::ExitCode::SUCCESS)
    } else {
        println!("invariant violations:         {}", report.violations());
        Ok(std::process::ExitCode::from(1))
    }
}
