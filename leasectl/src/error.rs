//! The one error type of leasectl, and the exit status each error gives.

use std::io;

use lease_proxy_client::Error as ClientError;
use nix::sys::signal::Signal;

use crate::cli::{
    EXIT_CANNOT_EXECUTE, EXIT_HELD, EXIT_INTERNAL, EXIT_LOST, EXIT_NOT_FOUND, EXIT_UNAVAILABLE,
    EXIT_USAGE,
};

/// What can go wrong in leasectl.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The API call failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The command line cannot be acted on.
    #[error("{0}")]
    Usage(String),
    /// The command of `exec` could not be started.
    #[error("cannot start {command}: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// Why.
        source: io::Error,
    },
    /// Waiting for the command failed.
    #[error("cannot wait for the command: {0}")]
    Wait(io::Error),
    /// A signal could not be sent to the command.
    #[error("cannot send {0} to the command: {1}")]
    Signal(Signal, nix::Error),
    /// The signal handlers could not be installed.
    #[error("cannot catch signals: {0}")]
    Handler(io::Error),
    /// The async runtime could not be started.
    #[error("cannot start the runtime: {0}")]
    Runtime(io::Error),
    /// Standard output could not be written.
    #[error("cannot write the output: {0}")]
    Output(io::Error),
}

impl Error {
    /// The exit status leasectl ends with after this error.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Error::Client(ClientError::Held { .. }) => EXIT_HELD,
            Error::Client(ClientError::Lost | ClientError::SessionLost) => EXIT_LOST,
            Error::Client(ClientError::Config(_)) | Error::Usage(_) => EXIT_USAGE,
            // A broken answer is the proxy's fault, not the command line's.
            Error::Client(ClientError::Protocol(_)) => EXIT_UNAVAILABLE,
            Error::Client(_) => EXIT_UNAVAILABLE,
            Error::Spawn { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                EXIT_NOT_FOUND
            }
            Error::Spawn { .. } => EXIT_CANNOT_EXECUTE,
            Error::Wait(_)
            | Error::Signal(..)
            | Error::Handler(_)
            | Error::Runtime(_)
            | Error::Output(_) => EXIT_INTERNAL,
        }
    }
}
