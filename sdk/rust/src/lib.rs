//! A Rust client for lease-proxy: exclusive, time-bounded ownership of named resources with
//! fencing tokens, over the proxy's HTTP API (`/v1`).
//!
//! - [`Client`]: one-shot calls ([`Client::grant`], [`Client::renew`], [`Client::release`],
//!   [`Client::get`], [`Client::list`]) and the guards below.
//! - [`Lease`] ([`Client::acquire`]): a held resource that renews itself, reports its loss no
//!   later than its conservative deadline, and is released when dropped.
//! - [`Session`] ([`Client::open_session`]): one heartbeat for many leases.
//! - [`EventStream`] ([`Client::watch`]): who acquires, releases and loses what, as a stream
//!   of [`Event`]s that reconnects and resumes.
//! - [`Error`]: everything that can go wrong, with the proxy's problems as variants.

mod client;
mod error;
mod lease;
mod liveness;
mod model;
mod renewal;
mod session;
mod sse;
mod watch;

pub use client::{Client, ClientBuilder};
pub use error::{Error, Result};
pub use lease::Lease;
pub use liveness::LostReason;
pub use model::{AcquireOptions, Grant, Holding, Renewal, SessionAcquireOptions};
pub use session::Session;
pub use watch::{Event, EventKind, EventStream};
