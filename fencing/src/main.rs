//! The `fence-gateway` binary: configuration, logging, signals.

use std::process::ExitCode;

use clap::CommandFactory;
use fencing::cli;
use fencing::gateway::{self, GatewayConfig};

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(exit) = fencing::command::run_if_asked(&args) {
        return exit;
    }
    let config = match GatewayConfig::load() {
        Ok(c) => c,
        Err(e) => return cli::config_error_exit(&e),
    };
    if let Some(command) = config.command {
        return fencing::indb::run(command);
    }
    // Completions and the man page need none of the required settings.
    if let Some(exit) = cli::print_generated(GatewayConfig::command(), &config.print) {
        return exit;
    }
    if let Err(e) = config.validate() {
        eprintln!("fence-gateway: {e}");
        return ExitCode::from(cli::EXIT_CONFIG);
    }
    if config.print.print_config {
        return cli::print_settings("fence-gateway", config.redacted_toml());
    }
    if let Err(e) = config.check_key_file() {
        eprintln!("fence-gateway: {e}");
        return ExitCode::from(cli::EXIT_CONFIG);
    }
    cli::run_server("fence-gateway", config.log_format, None, || async {
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        gateway::run(listener, config, fencing::serve::terminated()).await
    })
}
