//! `lease-proxy-controls`: the `lease-proxy` server built with the `negative-controls` feature,
//! for the fault campaign's negative controls only (`LEASE_PROXY_NEGATIVE_CONTROL` names the
//! one to switch on). The same configuration and server as `lease-proxy`, without its
//! generated-output options; never part of a release.

use std::process::ExitCode;

use lease_proxy::Config;
use runtime::cli;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let config = match Config::load() {
        Ok(config) => config,
        Err(e) => return cli::config_error_exit(&e),
    };
    if let Err(e) = config.check_key_file() {
        eprintln!("lease-proxy-controls: {e}");
        return ExitCode::from(cli::EXIT_CONFIG);
    }
    let threads = config.worker_threads;
    cli::run_server(
        "lease-proxy-controls",
        config.log_format,
        threads,
        || async {
            let listener = tokio::net::TcpListener::bind(config.listen).await?;
            lease_proxy::run(listener, config, runtime::serve::terminated()).await
        },
    )
}
