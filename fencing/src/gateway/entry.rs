//! What the `fence-gateway` binary does, from its command line to its exit status, so that the
//! campaign's `fence-gateway-control` runs exactly the same gateway with one defect set.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::CommandFactory;

use super::GatewayConfig;
use runtime::cli;

/// Runs fence-gateway with the command line `args` (the program's name first): a subcommand
/// (`pg …`, `--completions`, `--man`, `--print-config`) or the gateway until SIGTERM, with the
/// configuration `adjust`ed after it was read and before it is validated. Bad configuration
/// exits 64.
pub fn main(args: Vec<OsString>, adjust: impl FnOnce(&mut GatewayConfig)) -> ExitCode {
    if let Some(exit) = crate::command::run_if_asked(&args) {
        return exit;
    }
    let mut config = match GatewayConfig::load_from(args) {
        Ok(c) => c,
        Err(e) => return cli::config_error_exit(&e),
    };
    if let Some(command) = config.command {
        return crate::indb::run(command);
    }
    // Completions and the man page need none of the required settings.
    if let Some(exit) = cli::print_generated(GatewayConfig::command(), &config.print) {
        return exit;
    }
    adjust(&mut config);
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
        super::run(listener, config, runtime::serve::terminated()).await
    })
}
