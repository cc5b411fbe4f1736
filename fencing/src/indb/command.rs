//! `fence-gateway pg install | uninstall | sync-keys`: the in-database package's command line.
//! A subcommand of fence-gateway's, so the gateway's own flags (docs/DESIGN.md §5.1) are
//! unchanged: without a subcommand the binary serves, as before.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::{InstallOptions, PackageError};

/// fence-gateway's subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum GatewayCommand {
    /// Fencing inside PostgreSQL: install, upgrade or remove the SQL package, load its keys
    /// (docs/POSTGRES.md).
    #[command(subcommand)]
    Pg(PgCommand),
}

/// Where the package lives.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// The database: `postgres://user:password@host:port/db`.
    #[arg(long, env = "FENCE_GATEWAY_DATABASE_URL")]
    pub database_url: String,

    /// The package's schema.
    #[arg(long, default_value = "fencing")]
    pub schema: String,

    /// How long to wait for the package's lock, and for each lock after it, before failing with
    /// the sessions that hold them (pid, user, application_name).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub lock_timeout: Duration,
}

/// `fence-gateway pg …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum PgCommand {
    /// Installs the package, or upgrades it in place (idempotent); moves fence-gateway's
    /// tables into its schema if a gateway created them elsewhere.
    Install {
        /// The database and schema.
        #[command(flatten)]
        target: Target,
        /// The role owning marks, keys and functions (default: the connecting role, which must
        /// be a member of it). Never give it to applications.
        #[arg(long)]
        owner: Option<String>,
        /// A role allowed to admit (call `admit`, write to protected tables); repeatable.
        #[arg(long = "writer", value_name = "ROLE")]
        writers: Vec<String>,
        /// A role fence-gateway connects as: granted the store's tables, its search_path set to
        /// the package schema in this database; repeatable.
        #[arg(long = "gateway-role", value_name = "ROLE")]
        gateway_roles: Vec<String>,
    },
    /// Removes the package's functions, keys and settings; the marks stay (gateways may share
    /// them, and a mark never goes down).
    Uninstall {
        /// The database and schema.
        #[command(flatten)]
        target: Target,
        /// Also when tables are protected: their fencing triggers are dropped.
        #[arg(long)]
        force: bool,
    },
    /// Replaces the verification keys with the key file's (the proxy's and the gateway's), whole
    /// and at once; a file that does not load changes nothing.
    SyncKeys {
        /// The database and schema.
        #[command(flatten)]
        target: Target,
        /// The fencing key file (`KID SECRET` per line).
        #[arg(long)]
        key_file: PathBuf,
    },
}

/// Runs a subcommand; its outcome is printed, its exit status returned (0 done, 64 unusable
/// arguments or key file, 1 refused or failed at the database — nothing changed).
pub fn run(command: GatewayCommand) -> ExitCode {
    let GatewayCommand::Pg(command) = command;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fence-gateway pg: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(command)) {
        Ok(done) => {
            println!("{done}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fence-gateway pg: {e}");
            match e {
                PackageError::Usage(_) | PackageError::Keys(_) => {
                    ExitCode::from(runtime::cli::EXIT_CONFIG)
                }
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// What `pg install` says it did.
fn installed(done: &super::Installed, schema: &str) -> String {
    let mut adopted = done
        .adopted_from
        .as_ref()
        .map(|s| format!("; fence-gateway's tables moved from schema {s}"))
        .unwrap_or_default();
    if !done.protect_again.is_empty() {
        adopted.push_str(&format!(
            "; run fencing.protect again (as each table's owner) on {}: its triggers are an \
             older version's, or a table added under it lacks them",
            done.protect_again.join(", ")
        ));
    }
    adopted.push_str(if done.event_trigger {
        "; tables created or attached under protected ones are protected at once (event trigger)"
    } else {
        "; no event trigger (only a superuser's install makes it): run fencing.protect \
         again after adding a partition or child to a protected table"
    });
    if done.from == done.to {
        format!(
            "fencing package version {} in schema {schema} (functions and grants renewed){adopted}",
            done.to
        )
    } else {
        format!(
            "fencing package installed in schema {schema}: version {} -> {}{adopted}",
            done.from, done.to
        )
    }
}

async fn execute(command: PgCommand) -> Result<String, PackageError> {
    match command {
        PgCommand::Install {
            target,
            owner,
            writers,
            gateway_roles,
        } => {
            let options = InstallOptions {
                schema: target.schema.clone(),
                owner,
                writers,
                gateway_roles,
                lock_timeout: target.lock_timeout,
            };
            let done = super::install(&target.database_url, &options).await?;
            Ok(installed(&done, &target.schema))
        }
        PgCommand::Uninstall { target, force } => {
            let done = super::uninstall(
                &target.database_url,
                &target.schema,
                force,
                target.lock_timeout,
            )
            .await?;
            Ok(format!(
                "fencing package removed from schema {} (marks kept){}",
                target.schema,
                if done.unprotected.is_empty() {
                    String::new()
                } else {
                    format!("; no longer protected: {}", done.unprotected.join(", "))
                }
            ))
        }
        PgCommand::SyncKeys { target, key_file } => {
            let ids = super::sync_keys(
                &target.database_url,
                &target.schema,
                &key_file,
                target.lock_timeout,
            )
            .await?;
            Ok(format!(
                "verification keys in schema {}: {} (signing key first)",
                target.schema,
                ids.join(", ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::gateway::GatewayConfig;

    #[test]
    fn the_subcommand_leaves_the_serving_command_line_as_it_was() {
        let serve = GatewayConfig::try_parse_from([
            "fence-gateway",
            "--listen",
            "127.0.0.1:7071",
            "--upstream",
            "http://127.0.0.1:8080",
            "--store",
            "postgres://u:p@h/db",
            "--key-file",
            "keys",
        ])
        .unwrap();
        assert!(serve.command.is_none());
        assert_eq!(serve.store, "postgres://u:p@h/db");
        let sync = GatewayConfig::try_parse_from([
            "fence-gateway",
            "pg",
            "sync-keys",
            "--database-url",
            "postgres://u:p@h/db",
            "--key-file",
            "keys",
        ])
        .unwrap();
        let Some(GatewayCommand::Pg(PgCommand::SyncKeys { target, key_file })) = sync.command
        else {
            panic!("{:?}", sync.command);
        };
        assert_eq!(
            (target.schema.as_str(), key_file.to_str()),
            ("fencing", Some("keys"))
        );
        let install = GatewayConfig::try_parse_from([
            "fence-gateway",
            "pg",
            "install",
            "--database-url",
            "postgres://u:p@h/db",
            "--schema",
            "fence",
            "--writer",
            "a",
            "--writer",
            "b",
        ])
        .unwrap();
        let Some(GatewayCommand::Pg(PgCommand::Install {
            target, writers, ..
        })) = install.command
        else {
            panic!("{:?}", install.command);
        };
        assert_eq!((target.schema.as_str(), writers.len()), ("fence", 2));
        assert!(GatewayConfig::try_parse_from(["fence-gateway", "pg", "install"]).is_err());
    }

    #[test]
    fn schema_names_are_plain_and_new() {
        for ok in ["fencing", "fence_2", "_x"] {
            super::super::check_schema(ok).unwrap();
        }
        for bad in ["public", "pg_fence", "Fencing", "a-b", "a;drop", "", "1x"] {
            assert!(super::super::check_schema(bad).is_err(), "{bad}");
        }
    }
}
