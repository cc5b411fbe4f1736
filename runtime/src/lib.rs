//! What lease-proxy and fence-gateway serve with.
//!
//! The crate alone (no features) is what the fencing library itself uses as well:
//! [`problem`] (RFC 9457 bodies), [`backoff`], bounded reads of operators' files ([`files`]) and
//! the buckets of every duration histogram ([`DURATION_BUCKETS`]). Feature `server` adds the
//! binaries' plumbing: [`serve`] (serving and draining), [`tls`], [`reload`] (files reloaded on
//! SIGHUP or a settled change), [`cli`] (layered command lines), [`telemetry`] (logs, traces,
//! metrics) and [`openapi`] (completing the OpenAPI document).
#![forbid(unsafe_code)]

pub mod backoff;
#[cfg(feature = "server")]
pub mod cli;
#[cfg(feature = "server")]
mod error;
pub mod files;
#[cfg(feature = "server")]
pub mod openapi;
pub mod problem;
#[cfg(feature = "server")]
pub mod reload;
#[cfg(feature = "server")]
pub mod serve;
#[cfg(feature = "server")]
pub mod telemetry;
#[cfg(feature = "server")]
pub mod tls;

#[cfg(feature = "server")]
pub use error::Error;

/// Bucket bounds, in seconds, of every duration histogram: 100 µs to 10 s.
pub const DURATION_BUCKETS: [f64; 15] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0,
];
