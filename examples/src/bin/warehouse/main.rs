//! The warehouse: robots take exclusive inventory counts of aisles through lease-proxy, crash
//! and stall, and the inventory stays correct.
//!
//! - `warehouse inventory` — the inventory service (HTTP; SQLite, or PostgreSQL with `--db`),
//!   placed behind fence-gateway; it keeps its own write log for the audit.
//! - `warehouse robot` — one robot on the Rust SDK: lease an aisle, count, send updates while
//!   the lease guard renews in the background, stop the moment it is lost.
//! - `warehouse run` — starts robots, injects chaos (SIGKILL, SIGSTOP beyond the TTL), shows
//!   progress, then audits the inventory's write log and exits non-zero on any violation.
//!
//! `./scripts/run.sh` starts etcd, lease-proxy, fence-gateway and the inventory, then runs this.

mod audit;
mod inventory;
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
