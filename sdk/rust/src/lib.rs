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
//! - [`Member`] ([`Client::join_fleet`]): this process in a fleet — a session, and a stream of
//!   [`AssignmentChange`]s whose granted resources are [`Lease`]s, lost
//!   ([`LostReason::HandedOff`]) when the service moves them to another member; the operator's
//!   calls [`Client::put_fleet`], [`Client::get_fleet`], [`Client::delete_fleet`],
//!   [`Client::drain_member`], [`Client::evict_member`].
//! - [`Error`]: everything that can go wrong, with the proxy's problems as variants.
//!
//! ```no_run
//! use std::time::Duration;
//! use lease_proxy_client::{AcquireOptions, Client};
//!
//! # async fn run() -> lease_proxy_client::Result<()> {
//! let client = Client::builder("https://leases.example:7070")
//!     .ca_file("ca.pem")
//!     .bearer_token("robot-7-token")
//!     .build()?;
//! let opts = AcquireOptions::new("robot-7", Duration::from_secs(10)).wait(Duration::from_secs(5));
//! let lease = client.acquire("aisle-1", opts).await?;
//! let lost = lease.lost();
//! tokio::select! {
//!     _ = lost.cancelled() => eprintln!("lost: {:?}", lease.lost_reason().await),
//!     _ = async {
//!         // Protected work: send `lease.fencing_token()` with every write, and look at
//!         // `lease.is_lost()` before each step.
//!         tokio::time::sleep(Duration::from_secs(30)).await
//!     } => lease.release().await?,
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Guarantees of the guard
//!
//! - The deadline is the monotonic instant read just before sending the request that succeeded
//!   (acquire or renewal) plus the `expires_in_ms` it answered: the proxy's lease cannot end
//!   before it, so nobody else can hold the resource before it. Never more than the answer's
//!   `ttl_seconds` (plus the wait of a queued acquire), nor 2^31 s; an answer with
//!   `ttl_seconds` 0 means lost at once ([`LostReason::Expired`]).
//! - Renewals run at a third of the lifetime last granted (±10 %, at least 100 ms apart);
//!   failures other than 410 are retried with a short backoff until the deadline; a 410
//!   reports the lease lost at once ([`LostReason::Revoked`]).
//! - `lost` fires as soon as the client's event stream (one per client, over the resources its
//!   guards hold: [`ClientBuilder::loss_watch`]) tells that the grant ended
//!   ([`LostReason::Revoked`]); no later than the deadline (a timer on it); and
//!   [`Lease::is_lost`] reads the clock itself, so a process resumed past its deadline sees the
//!   loss before anything else.
//! - A lease under a [`Session`] is lost when the session is ([`LostReason::SessionLost`]).
//! - Dropping a [`Lease`] (or a [`Session`]) stops its renewals and releases (closes) it from a
//!   task on the current Tokio runtime; [`Lease::release`] does it and waits for the answer.
//!
//! See `examples/hold.rs` for a runnable program.

mod client;
mod error;
mod fleet;
mod lease;
mod liveness;
mod loss_watch;
mod losses;
mod model;
mod propagation;
mod renewal;
mod session;
mod sse;
mod test_mode;
mod upkeep;
mod watch;

pub use client::{Client, ClientBuilder};
pub use error::{Error, Result};
pub use fleet::{
    AssignmentChange, Assignments, FleetMember, FleetSpec, FleetView, FleetWritten, JoinOptions,
    Member, MemberState, Releasing,
};
pub use lease::Lease;
pub use liveness::LostReason;
pub use model::{AcquireOptions, Grant, Holding, Renewal, SessionAcquireOptions};
pub use propagation::{FENCING_RESOURCE, FENCING_TOKEN, X_FENCING_TOKEN};
pub use session::Session;
pub use test_mode::{Fault, TestMode};
pub use upkeep::stop_by;
pub use watch::{Event, EventKind, EventStream};
