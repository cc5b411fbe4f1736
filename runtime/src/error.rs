use std::path::PathBuf;

/// Why telemetry could not be set up, or TLS files are unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The metrics or trace pipeline could not be set up or read.
    #[error("telemetry: {0}")]
    Telemetry(String),
    /// A TLS certificate, key or CA file that cannot be read or holds nothing usable.
    #[error("{path}: {message}")]
    TlsFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// TLS files that load but do not make a configuration (a key that does not match the
    /// certificate, a CA that is not one).
    #[error("TLS configuration: {0}")]
    Tls(String),
}
