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
//!
//! Cargo features: the library alone (the default; no features) is tokens, the [`Gate`], the
//! tower [`FencingLayer`] and the memory store; `sqlite` and `postgres` add those stores;
//! `metrics` adds the mark store's latency histogram (`store::Timed`) through the OpenTelemetry
//! API (a no-op until the application installs a meter provider; `postgres` brings it, for the
//! shared gate's timings); `server` adds fence-gateway itself (`gateway`, the in-database package's
//! `indb`, the key-file `command`s: `cargo build -p fencing --features server --bin
//! fence-gateway`). What the binaries serve with is the `lease-proxy-runtime` crate's.
#![forbid(unsafe_code)]

pub mod admission;
#[cfg(feature = "server")]
pub mod command;
#[cfg(not(feature = "model"))]
#[allow(unreachable_pub)]
// The shared gate's decisions have no caller without the PostgreSQL store.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
mod decide;
/// What the gates and the layer decide, as pure functions: exposed for the model checker
/// (`model/`) only.
#[cfg(feature = "model")]
#[doc(hidden)]
pub mod decide;
mod domain;
mod error;
pub mod gate;
#[cfg(feature = "server")]
pub mod gateway;
#[cfg(feature = "server")]
pub mod indb;
mod keys;
pub mod layer;
pub mod store;
mod token;

pub use admission::{Admission, Outcome, Permit, Release, DEFAULT_WRITE_GRACE};
pub use domain::{
    check_resource_name, lock_resource, ResourceNameError, LOCK_RESOURCE_PREFIX,
    MAX_LOCK_NAME_BYTES, MAX_RESOURCE_LEN,
};
pub use error::{Error, TokenError};
pub use gate::{Gate, GateError};
pub use keys::{KeyId, Keyring, Keys};
pub use layer::{ExchangeIncomplete, Fence, FencingLayer, Rejection};
#[cfg(feature = "sqlite")]
pub use store::SqliteStore;
pub use store::{HighWaterMarks, MemoryStore, StoreError};
#[cfg(feature = "postgres")]
pub use store::{PostgresStore, SharedGate};
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
