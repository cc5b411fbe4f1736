//! `leasectl`: the command-line client of lease-proxy — one-shot lease calls, a watch of lease
//! events, `exec`, which runs a command while holding a lease (like `etcdctl lock` or
//! `consul lock`) and stops it the moment the lease is lost, and `fleet`: fleets made, shown,
//! joined, drained and evicted.

mod cli;
mod error;
mod exec;
mod fleet;
mod oneshot;
mod signals;
mod supervise;
mod watch;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use lease_proxy_client::Client;

use crate::cli::{Cli, Command, Connection, EXIT_USAGE};
use crate::error::Error;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli::write_generated(&cli.print, &mut std::io::stdout()) {
        Ok(true) => return ExitCode::SUCCESS,
        Ok(false) => {}
        Err(e) => return fail(&Error::Output(e)),
    }
    let Some(command) = cli.command else {
        let _ = Cli::command().print_help();
        return ExitCode::from(EXIT_USAGE);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&Error::Runtime(e)),
    };
    match runtime.block_on(run(&cli.connection, command)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => fail(&e),
    }
}

/// Prints `e` with its causes and returns its exit status.
fn fail(e: &Error) -> ExitCode {
    let mut message = e.to_string();
    let mut cause = match e {
        // The SDK keeps the transport error without naming it as the source.
        Error::Client(lease_proxy_client::Error::Http(http)) => std::error::Error::source(http),
        _ => std::error::Error::source(e),
    };
    while let Some(c) = cause {
        let text = c.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
        cause = c.source();
    }
    eprintln!("leasectl: {message}");
    ExitCode::from(e.exit_code())
}

/// Runs `command` against the proxy `connection` names.
async fn run(connection: &Connection, command: Command) -> Result<u8, Error> {
    let client = connect(connection)?;
    match command {
        Command::Acquire {
            resource,
            ttl,
            holder,
            wait,
            idempotency_key,
        } => oneshot::acquire(&client, &resource, ttl, holder, wait, idempotency_key).await,
        Command::Renew { resource, secret } => oneshot::renew(&client, &resource, &secret).await,
        Command::Release { resource, secret } => {
            oneshot::release(&client, &resource, &secret).await
        }
        Command::Get { resource } => oneshot::get(&client, &resource).await,
        Command::List { prefix } => oneshot::list(&client, &prefix).await,
        Command::Watch {
            prefix,
            last_event_id,
        } => watch::run(&client, &prefix, last_event_id).await,
        Command::Exec(exec) => exec::run(&client, exec).await,
        Command::Fleet(command) => fleet::run(&client, command).await,
    }
}

/// The SDK client for `connection`.
fn connect(connection: &Connection) -> Result<Client, Error> {
    let mut builder = Client::builder(&connection.url)
        .timeout(connection.timeout)
        .user_agent(concat!("leasectl/", env!("CARGO_PKG_VERSION")));
    if let Some(token) = &connection.token {
        builder = builder.bearer_token(token.clone());
    }
    if let Some(ca) = &connection.ca_file {
        builder = builder.ca_file(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&connection.cert, &connection.key) {
        builder = builder.identity_files(cert.clone(), key.clone());
    }
    Ok(builder.build()?)
}
