//! Background hostile `/v3` traffic: the seeded generator of the `/v3` issue
//! ([`lease_proxy_testkit::v3_hostile`]) aimed at the proxies while the nemesis works, and
//! whatever it does must change nothing outside its namespace.
//!
//! - [`plant`] puts the sentinel keys outside the namespace, straight into etcd, before the run;
//! - [`traffic`] sends hostile requests to the proxies at a modest rate, aiming them at the live
//!   `/v1` leases it reads from etcd every second, and checks every answer ([`check_answer`]);
//! - [`verify`] reads etcd after the run: every sentinel untouched, no key outside the namespace
//!   that the proxy does not write itself ([`foreign_key`]), no namespaced key on a lease that is
//!   not a `/v3` one.
//!
//! Faults are expected: a killed or paused proxy, an etcd without a leader, a blackholed relay
//! give errors, timeouts and 5xx answers, which are counted, never judged. Only a *successful*
//! answer can show that a hostile request did what it must not.

mod answers;
mod keys;
mod traffic;

pub use answers::{check_answer, Finding, Verdict};
pub use keys::{foreign_key, plant, verify, Sentinel, Sentinels};
pub use traffic::{traffic, Settings, Stats};

/// The proxies' `--etcd-prefix` in the campaign (the default): every key of their own lies
/// under it.
pub const PREFIX: &[u8] = b"/lease-proxy/";
/// Where the proxies keep `/v1` ownership keys: `{PREFIX}holders/{resource}`, each on its
/// grant's lease.
pub const HOLDERS: &[u8] = b"/lease-proxy/holders/";
