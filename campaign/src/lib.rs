//! The fault campaign (issues 7 and 17, docs/DESIGN.md §7): on one machine, loopback only, a
//! 3-member etcd, two lease-proxy replicas, fence-gateway on SQLite in front of a storage that
//! takes time to apply, and competing clients, under a seeded nemesis that kills, pauses,
//! partitions, delays and resets; a checker then judges the history against the storage's own
//! apply log.
//!
//! - [`cluster`]: the deployment and its fault relays; [`relay`]: the TCP fault relay;
//! - [`storage`]: the recording storage; [`client`]: the competing clients;
//! - [`plan`]: a run's fault schedule, drawn from its seed; [`nemesis`]: the faults;
//! - [`history`] and [`checker`]: what happened and whether it was safe;
//! - [`belief`]: how long holders believed they held at once, and what their writes met;
//! - [`fleet`]: members of a fleet the service assigns resources to, and its coverage;
//! - [`hostile`]: background hostile `/v3` traffic, and what it must not change;
//! - [`indb`]: the deployment fenced inside PostgreSQL, written by SQL clients;
//! - [`run`]: one run and its report; [`report`]: many runs as markdown.

pub mod belief;
pub mod checker;
pub mod client;
pub mod cluster;
pub mod fleet;
pub mod history;
pub mod hostile;
pub mod indb;
pub mod nemesis;
pub mod plan;
pub mod postgres;
pub mod relay;
pub mod report;
pub mod run;
pub mod storage;
