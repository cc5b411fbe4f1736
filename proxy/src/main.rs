//! The `lease-proxy` binary: configuration, logging, signals.

use std::process::ExitCode;

use clap::CommandFactory;
use lease_proxy::Config;

/// EX_USAGE: the configuration is wrong.
const EXIT_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let config = match Config::load() {
        Ok(config) => config,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let mut stdout = std::io::stdout();
    match fencing::cli::write_generated(
        Config::command(),
        config.completions,
        config.man,
        &mut stdout,
    ) {
        Ok(true) => return ExitCode::SUCCESS,
        Ok(false) => {}
        Err(e) => {
            eprintln!("lease-proxy: {e}");
            return ExitCode::FAILURE;
        }
    }
    if config.print_config {
        return match config.redacted_toml() {
            Ok(toml) => {
                print!("{toml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("lease-proxy: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let telemetry = fencing::telemetry::init("lease-proxy", config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lease-proxy: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(serve(config));
    drop(runtime);
    telemetry.shutdown();
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "lease-proxy failed");
            eprintln!("lease-proxy: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(config: Config) -> Result<(), lease_proxy::StartError> {
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    lease_proxy::run(listener, config, fencing::serve::terminated()).await
}
