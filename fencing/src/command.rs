//! `fence-gateway keys …`: making the fencing key file and rotating its keys. Parsed apart from
//! the gateway's configuration (whose subcommands are the in-database package's, `pg …`), so the
//! serving flags and `pg` stay as they are: `main` hands over when the first argument is `keys`.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;

use crate::keys::file;
use crate::{Error, KeyId, Keyring};
use runtime::cli::EXIT_CONFIG;

/// `fence-gateway keys …` as its own command line.
#[derive(Debug, Parser)]
#[command(name = "fence-gateway", bin_name = "fence-gateway", version)]
struct KeysCli {
    #[command(subcommand)]
    command: Top,
}

#[derive(Debug, clap::Subcommand)]
enum Top {
    /// The fencing key file shared by every lease-proxy and fence-gateway: make one, rotate its
    /// keys (docs/OPERATIONS.md, "The fencing key file").
    #[command(subcommand)]
    Keys(KeysCommand),
}

/// `fence-gateway keys …`.
#[derive(Debug, Clone, clap::Subcommand)]
enum KeysCommand {
    /// Writes a new key file holding one random 32-byte key: readable by its owner only (mode
    /// 0600), never over an existing file.
    Generate {
        /// Where to write it (its directory is made if missing).
        file: PathBuf,
        /// The key's id: 1-32 of [A-Za-z0-9_-].
        #[arg(long, default_value = "k1")]
        kid: String,
    },
    /// Rotation, step 1: appends a fresh key as a verifying line (the signing key unchanged)
    /// and prints its id. Give the file to every gateway (and `pg sync-keys`) before promoting.
    Add {
        /// The key file, replaced by rename (its mode and owner kept).
        file: PathBuf,
        /// The new key's id (default: `kN` after the highest such id in the file).
        #[arg(long)]
        kid: Option<String>,
    },
    /// Rotation, step 2: makes KID the signing key (moves its line first).
    Promote {
        /// The key file, replaced by rename (its mode and owner kept).
        file: PathBuf,
        /// The key to sign with from now on.
        kid: String,
    },
    /// Rotation, step 3: removes KID's line once no token it signed is in use (never the
    /// signing key).
    Remove {
        /// The key file, replaced by rename (its mode and owner kept).
        file: PathBuf,
        /// The key to retire.
        kid: String,
    },
}

/// Runs `fence-gateway keys …` when `args` (the whole command line) asks for it: prints its
/// outcome and returns its exit status (0 done; 64 unusable arguments, key id or key file; 1
/// refused — an existing file is not overwritten — or failed to write). `None` otherwise.
pub fn run_if_asked(args: &[OsString]) -> Option<ExitCode> {
    if args.get(1).is_none_or(|a| a != "keys") {
        return None;
    }
    let cli = match KeysCli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return Some(runtime::cli::config_error_exit(&e)),
    };
    let Top::Keys(command) = cli.command;
    Some(match keys(command) {
        Ok(said) => {
            println!("{said}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fence-gateway: {e}");
            match e {
                Error::Io { .. } => ExitCode::FAILURE,
                _ => ExitCode::from(EXIT_CONFIG),
            }
        }
    })
}

/// Does what `command` asks; what to tell the operator.
fn keys(command: KeysCommand) -> Result<String, Error> {
    match command {
        KeysCommand::Generate { file, kid } => {
            Keyring::create_file(&file, &key_id(&kid)?).map_err(|e| match e {
                Error::Io { path, source } if source.kind() == ErrorKind::AlreadyExists => {
                    Error::Io {
                        path,
                        source: std::io::Error::new(
                            ErrorKind::AlreadyExists,
                            "exists already, not overwritten (rotate its keys with `keys add`)",
                        ),
                    }
                }
                other => other,
            })?;
            Ok(format!(
                "wrote {}: one key, {kid}, readable by its owner only. Give this same file to \
                 every lease-proxy and fence-gateway (--key-file), and load it into PostgreSQL \
                 with `fence-gateway pg sync-keys` if you fence there.",
                file.display()
            ))
        }
        KeysCommand::Add { file, kid } => {
            let kid = kid.as_deref().map(key_id).transpose()?;
            let (text, kid) = file::add(&read(&file)?, kid)?;
            file::replace(&file, &text)?;
            Ok(kid.to_string())
        }
        KeysCommand::Promote { file, kid } => {
            let text = file::promote(&read(&file)?, &key_id(&kid)?)?;
            file::replace(&file, &text)?;
            Ok(format!("{kid} signs in {}", file.display()))
        }
        KeysCommand::Remove { file, kid } => {
            let text = file::remove(&read(&file)?, &key_id(&kid)?)?;
            file::replace(&file, &text)?;
            Ok(format!("{kid} removed from {}", file.display()))
        }
    }
}

fn key_id(kid: &str) -> Result<KeyId, Error> {
    KeyId::parse(kid)
        .ok_or_else(|| Error::KeyChange(format!("key id {kid:?}: must be 1-32 of [A-Za-z0-9_-]")))
}

fn read(path: &Path) -> Result<String, Error> {
    runtime::files::read_config_text(path, 1 << 20).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}
