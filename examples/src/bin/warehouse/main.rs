//! The warehouse: a fleet of robots shares the aisles through lease-proxy — the service decides
//! who counts which — while robots crash, stall and are redeployed, and the inventory stays
//! correct.
//!
//! - `warehouse inventory` — the inventory service (HTTP; SQLite, or PostgreSQL with `--db`),
//!   placed behind fence-gateway; it keeps its own write log for the audit.
//! - `warehouse robot` — one robot on the Rust SDK: a member of the fleet `aisles`, counting
//!   each aisle it is granted until the aisle's guard is lost (handed off: then it releases it),
//!   draining on SIGTERM.
//! - `warehouse run` — makes the fleet, starts robots, injects chaos (SIGKILL, SIGSTOP beyond
//!   the TTL) and a rolling deploy, shows progress, then audits the inventory's write log and
//!   the fleet's coverage, and exits non-zero on any violation.
//!
//! `./scripts/run.sh` starts etcd, lease-proxy, fence-gateway and the inventory, then runs this.

mod audit;
mod chaos;
mod inventory;
mod ledger;
mod robot;
mod run;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Robots counting aisles under leases, with fencing")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the inventory.
    Inventory(inventory::Args),
    /// Be one robot.
    Robot(robot::Args),
    /// Run the scenario and audit it.
    Run(run::Args),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let result = match Cli::parse().command {
        Command::Inventory(args) => inventory::serve(args).await,
        Command::Robot(args) => robot::work(args).await,
        Command::Run(args) => run::run(args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("warehouse: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Errors of this example, boxed: it reports them and exits.
type Failure = Box<dyn std::error::Error + Send + Sync>;
