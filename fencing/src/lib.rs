//! Fencing tokens: the number that lets protected storage refuse a write from a holder that has
//! lost its lease.
//!
//! A [`Token`] is the pair `(era, revision)`: `revision` is the etcd create revision of the
//! ownership key, so it rises with every new holder of a resource; `era` is bumped by operators
//! after an etcd restore, which can reuse revisions. Tokens compare lexicographically.
//!
//! On the wire a token is signed and bound to one resource ([`Keyring::mint`],
//! [`Keyring::verify`]), so storage can reject forged tokens and tokens minted for another
//! resource, whatever number they carry.
#![forbid(unsafe_code)]

pub mod admission;
pub mod cli;
mod error;
pub mod gate;
pub mod gateway;
mod keys;
pub mod layer;
pub mod serve;
pub mod store;
pub mod telemetry;
mod token;

pub use admission::{Admission, Permit};
pub use error::{Error, TokenError};
pub use gate::{Gate, GateError};
pub use keys::{KeyId, Keyring};
pub use layer::{Fence, FencingLayer, Rejection};
pub use store::{HighWaterMarks, MemoryStore, PostgresStore, SharedGate, SqliteStore, StoreError};
pub use token::Token;

/// The canonical header carrying a signed fencing token.
pub const TOKEN_HEADER: &str = "fencing-token";
/// The legacy spelling of [`TOKEN_HEADER`], also accepted by enforcers.
pub const TOKEN_HEADER_LEGACY: &str = "x-fencing-token";
/// The header on an enforcer's refusal naming its problem slug (`stale-fencing-token`, …), so
/// that intermediaries can tell an enforcer's refusal from the storage's own answers.
pub const REJECTION_HEADER: &str = "fencing-rejection";
/// The slug of a stale token's refusal, in [`REJECTION_HEADER`].
pub const STALE_REJECTION: &str = "stale-fencing-token";
/// The header naming the resource a token is presented for.
pub const RESOURCE_HEADER: &str = "fencing-resource";
