//! The `fence-gateway` binary: configuration, logging, signals.

use std::process::ExitCode;

use clap::CommandFactory;
use fencing::gateway::{self, GatewayConfig};

/// EX_USAGE: the configuration is wrong.
const EXIT_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let config = match GatewayConfig::load() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // Completions and the man page need none of the required settings.
    let mut stdout = std::io::stdout();
    match fencing::cli::write_generated(
        GatewayConfig::command(),
        config.completions,
        config.man,
        &mut stdout,
    ) {
        Ok(true) => return ExitCode::SUCCESS,
        Ok(false) => {}
        Err(e) => {
            eprintln!("fence-gateway: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Err(e) = config.validate() {
        eprintln!("fence-gateway: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    if config.print_config {
        return match config.redacted_toml() {
            Ok(toml) => {
                print!("{toml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("fence-gateway: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let telemetry = fencing::telemetry::init("fence-gateway", config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fence-gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        gateway::run(listener, config, fencing::serve::terminated()).await
    });
    drop(runtime);
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fence-gateway: {e}");
            ExitCode::FAILURE
        }
    }
}
