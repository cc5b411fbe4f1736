//! The `fence-gateway` binary: configuration, logging, signals (`fencing::gateway::main`).

use std::process::ExitCode;

fn main() -> ExitCode {
    fencing::gateway::main(std::env::args_os().collect(), |_| {})
}
