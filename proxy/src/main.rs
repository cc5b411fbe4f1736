//! The `lease-proxy` binary: configuration, logging, signals.

use std::process::ExitCode;

use clap::CommandFactory;
use lease_proxy::Config;
use runtime::cli;

/// mimalloc, not glibc malloc: allocation was ~14 % of the proxy's CPU under load (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let config = match Config::load() {
        Ok(config) => config,
        Err(e) => return cli::config_error_exit(&e),
    };
    if let Some(exit) = cli::print_generated(Config::command(), &config.print) {
        return exit;
    }
    if config.print.print_config {
        return cli::print_settings("lease-proxy", config.redacted_toml());
    }
    if let Err(e) = config.check_key_file() {
        eprintln!("lease-proxy: {e}");
        return ExitCode::from(cli::EXIT_CONFIG);
    }
    let threads = config.worker_threads;
    cli::run_server("lease-proxy", config.log_format, threads, || async {
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        lease_proxy::run(listener, config, runtime::serve::terminated()).await
    })
}
