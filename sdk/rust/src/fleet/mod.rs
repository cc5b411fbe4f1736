//! Fleets (`/v1/fleets`, docs/API.md "Fleets"): a named set of resources the service shares
//! among its members, balanced and sticky, handed over revoke-before-grant. A member is a
//! session; what it is assigned are ordinary grants under it, so each is a [`crate::Lease`]
//! here, lost when the service moves it away (`HandedOff`), takes it back (`Revoked`) or the
//! session ends (`SessionLost`).
//!
//! - `book.rs`: what each view of the assignment means for the guards handed out (pure);
//! - `member.rs`: the member — join, drain, leave, serve;
//! - `follow.rs`: its task — the long poll, each view acted on, a lost session;
//! - `change.rs`: what the assignment stream carries, and a fleet grant's grip;
//! - `admin.rs`: the operator's calls.

mod admin;
mod book;
mod change;
mod follow;
mod member;

pub use admin::{FleetMember, FleetSpec, FleetView, FleetWritten};
pub use book::MemberState;
pub(crate) use change::Grip;
pub use change::{AssignmentChange, Assignments, Releasing};
pub use member::{JoinOptions, Member};
