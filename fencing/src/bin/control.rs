//! `fence-gateway-control`: fence-gateway with one defect put back on purpose, for the fault
//! campaign's negative controls only (built only with the `negative-controls` feature, which
//! only the campaign and fencing's own tests turn on; never shipped).
//!
//! `fence-gateway-control --negative-control <release-with-caller|local-gate|
//! deadline-from-admission> <fence-gateway's flags…>`: the control is taken out of the command
//! line, the rest is fence-gateway's.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::ValueEnum;
use fencing::gateway::NegativeControl;

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let Some(at) = args.iter().position(|a| a == "--negative-control") else {
        eprintln!("fence-gateway-control: --negative-control is required");
        return ExitCode::from(runtime::cli::EXIT_CONFIG);
    };
    let named = args
        .get(at + 1)
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let control = match NegativeControl::from_str(named, false) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fence-gateway-control: --negative-control {named}: {e}");
            return ExitCode::from(runtime::cli::EXIT_CONFIG);
        }
    };
    args.drain(at..(at + 2).min(args.len()));
    fencing::gateway::main(args, |config| config.negative_control = Some(control))
}
