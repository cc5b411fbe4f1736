use std::path::PathBuf;

use crate::Token;

/// Why a key file could not be loaded or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key file could not be read or written.
    #[error("key file {path}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A line of the key file is not `KID SECRET` with a valid id and a long enough secret.
    #[error("key file line {line}: {reason}")]
    KeyLine {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The key file holds no key at all.
    #[error("key file holds no key")]
    NoKeys,
    /// A change of the key file that would break it or that names a key it does not hold.
    #[error("key file change refused: {0}")]
    KeyChange(String),
}

/// Why a presented token is refused. Each variant maps to one HTTP status at the enforcer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Not a token of a format this version understands (syntax, length, encoding).
    #[error("malformed fencing token")]
    Malformed,
    /// Signed with a key id that is not in the keyring (retired or never issued).
    #[error("fencing token signed with an unknown key")]
    UnknownKey,
    /// The signature does not match: forged or altered.
    #[error("fencing token signature is invalid")]
    BadSignature,
    /// Genuine, but minted for another resource.
    #[error("fencing token was issued for another resource")]
    WrongResource,
}

/// Why a high-water-mark store could not answer. The enforcer fails closed on it: nothing is
/// forwarded.
#[derive(Debug, thiserror::Error)]
#[error("high-water-mark store: {0}")]
pub struct StoreError(pub String);

/// Why a write was not admitted, by either gate.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The token is below the resource's mark (or a higher token is being admitted).
    #[error("fencing token {token} is below the high-water mark {mark}")]
    Stale {
        /// The refused token.
        token: Token,
        /// The mark it is below.
        mark: Token,
    },
    /// The store failed; nothing was admitted.
    #[error(transparent)]
    Store(#[from] StoreError),
}
