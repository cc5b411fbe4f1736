//! lease-proxy: exclusive, time-bounded ownership of named resources over HTTP, kept in etcd,
//! with a fencing token on every grant.
//!
//! The crate is the service behind the `lease-proxy` binary; embed it with [`run`], which serves
//! on a listener until a shutdown future resolves (tests bind port 0 and call it).
#![forbid(unsafe_code)]

mod api;
mod audit;
mod auth;
mod config;
mod error;
mod etcd;
mod etcdapi;
mod fleet;
mod forward;
mod grpc;
mod headers;
mod keys;
mod lease;
mod metrics;
#[cfg(feature = "negative-controls")]
mod negative_control;
mod prefence;
mod server;
mod upstream;
mod v3;

pub use auth::CertPrincipal;
pub use config::{Config, ConfigError, LogFormat};
pub use error::{Conflict, Error, Op, ProofFailure, QuotaKind, Result};
#[cfg(feature = "model")]
#[doc(hidden)]
pub use fleet::model as fleet_model;
#[cfg(feature = "model")]
#[doc(hidden)]
pub use lease::model;
pub use runtime::problem::PROBLEM_BASE;
pub use server::{load_keys, run, StartError};
