//! `campaign`: runs the fault campaign and writes its report.
//!
//! `campaign --runs 50 --duration 30s --seed 1000 --report campaign/data/c` runs fifty
//! 30-second runs with seeds 1000…1049 and writes `campaign/data/c.md` and `c.json` (each run
//! with its seed and plan). `--seed S --runs 1` replays run S's fault schedule. Exit status 1
//! when the real deployment shows a violation, or when a negative control is caught in fewer
//! than 90 % of its runs.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use lease_proxy_campaign::cluster::{Control, Faults, Marks};
use lease_proxy_campaign::report;
use lease_proxy_campaign::run::{run_once, Settings};

#[derive(Parser)]
#[command(
    about = "Fault campaign against etcd + lease-proxy + fence-gateway, judged by a history checker"
)]
struct Args {
    /// Number of runs.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Length of each run.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Fault-free phase at the end of each run.
    #[arg(long, default_value = "6s", value_parser = humantime::parse_duration)]
    final_phase: Duration,
    /// Competing clients.
    #[arg(long, default_value_t = 40)]
    clients: usize,
    /// Resources they compete for.
    #[arg(long, default_value_t = 20)]
    resources: usize,
    /// Run a negative control instead of the real deployment (test-only deployments).
    #[arg(long, value_enum, default_value = "none")]
    control: Control,
    /// Where the gateways keep their marks: two gateways sharing a private PostgreSQL (with
    /// session kills and restarts), or one gateway on SQLite.
    #[arg(long, value_enum, default_value = "postgres")]
    marks: Marks,
    /// Which faults the runs draw from: every kind, or only gateways paused mid-admission (on
    /// gateways sharing PostgreSQL whose registrations last 4 s).
    #[arg(long, value_enum, default_value = "all")]
    faults: Faults,
    /// Seed of the first run (run i has seed + i); drawn at random and printed when absent.
    #[arg(long)]
    seed: Option<u64>,
    /// The storage's shortest processing time per write.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    processing_min: Duration,
    /// The storage's longest processing time per write (must stay below the gateway's write
    /// grace, 2 s).
    #[arg(long, default_value = "60ms", value_parser = humantime::parse_duration)]
    processing_max: Duration,
    /// Members of a fleet beside the clients, as MEMBERSxRESOURCES (`6x12`: six members at the
    /// start, sharing twelve resources of their own); none when absent.
    #[arg(long, value_parser = parse_fleet)]
    fleet: Option<lease_proxy_campaign::fleet::Shape>,
    /// Write each run's history and the storage's applied log to `DIR/history-SEED.txt`.
    #[arg(long)]
    history_dir: Option<PathBuf>,
    /// Write `PATH.md` and `PATH.json`.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Run nothing: print the markdown report of committed data (`PATH.json`, as written by
    /// `--report`) and exit.
    #[arg(long, conflicts_with = "report")]
    render: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    let args = Args::parse();
    if let Some(path) = &args.render {
        let runs: Vec<lease_proxy_campaign::run::Report> =
            serde_json::from_str(&std::fs::read_to_string(path)?)?;
        print!("{}", report::markdown(&runs));
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let first_seed = args.seed.unwrap_or_else(rand::random);
    println!(
        "seeds {first_seed}…{}",
        first_seed.wrapping_add(args.runs.saturating_sub(1) as u64)
    );
    let mut runs = Vec::new();
    let mut broken = 0;
    for i in 0..args.runs {
        let settings = Settings {
            duration: args.duration,
            final_phase: args.final_phase,
            clients: args.clients,
            resources: args.resources,
            control: args.control,
            seed: first_seed.wrapping_add(i as u64),
            processing: (args.processing_min, args.processing_max),
            marks: args.marks,
            faults: args.faults,
            history_file: args
                .history_dir
                .as_ref()
                .map(|d| d.join(format!("history-{}.txt", first_seed.wrapping_add(i as u64)))),
            fleet: args.fleet,
        };
        // A run the harness itself could not complete (e.g. etcd never elected a leader after
        // a fault) judges nothing: it is counted and reported, not silently dropped.
        let r = match run_once(&settings).await {
            Ok(r) => r,
            Err(e) => {
                broken += 1;
                eprintln!(
                    "run {}/{} (seed {}): the harness failed: {e:#}",
                    i + 1,
                    args.runs,
                    settings.seed
                );
                continue;
            }
        };
        println!(
            "run {}/{} (seed {}): {} writes acknowledged, {} applied, {} stale refused, {} faults, {} violations{}",
            i + 1,
            args.runs,
            r.seed,
            r.writes_acknowledged,
            r.writes_applied,
            r.stale_rejected_by_enforcer + r.stale_rejected_by_proxy,
            r.fault_log.len(),
            r.violations.len(),
            r.violations
                .first()
                .map(|v| format!(" (first: {v})"))
                .unwrap_or_default()
        );
        runs.push(r);
    }
    let mut md = report::markdown(&runs);
    if broken > 0 {
        md.push_str(&format!(
            "\n{broken} further run(s) could not be completed by the harness and are not counted.\n"
        ));
    }
    println!("\n{md}");
    if let Some(path) = &args.report {
        std::fs::write(path.with_extension("md"), &md)?;
        std::fs::write(
            path.with_extension("json"),
            serde_json::to_string_pretty(&runs)?,
        )?;
    }
    let caught = runs.iter().filter(|r| !r.violations.is_empty()).count();
    let ok = broken == 0
        && match args.control {
            Control::None => caught == 0,
            _ => caught * 10 >= runs.len() * 9,
        };
    Ok(if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

/// `MEMBERSxRESOURCES`.
fn parse_fleet(s: &str) -> Result<lease_proxy_campaign::fleet::Shape, String> {
    let (members, resources) = s
        .split_once('x')
        .ok_or_else(|| format!("`{s}`: expected MEMBERSxRESOURCES, e.g. 6x12"))?;
    let number = |n: &str| n.parse::<usize>().map_err(|e| format!("`{n}`: {e}"));
    Ok(lease_proxy_campaign::fleet::Shape {
        members: number(members)?,
        resources: number(resources)?,
    })
}
