//! A Rust client for [lease-proxy](../../README.md): exclusive, time-bounded ownership of named
//! resources with fencing tokens, over the proxy's HTTP API (`/v1`).
//!
//! - [`Client`]: one-shot calls ([`Client::grant`], [`Client::renew`], [`Client::release`],
//!   [`Client::get`], [`Client::list`]).
//! - [`Error`]: everything that can go wrong, with the proxy's problems as variants.

mod client;
mod error;
mod model;

pub use client::{Client, ClientBuilder};
pub use error::{Error, Result};
pub use model::{AcquireOptions, Grant, Holding, Renewal, SessionAcquireOptions};
