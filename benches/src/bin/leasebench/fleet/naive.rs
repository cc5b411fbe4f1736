//! The naive alternative on raw etcd, as KCL 2.x's lease taker does it: every member has a lease
//! (kept alive at a third of its TTL) and a presence key on it, and every [`PERIOD`] it counts
//! the members present, aims at its fair share (`ceil(resources / members)`), and
//!
//! - takes free resources, in random order, up to its share: a create-if-absent transaction of
//!   the ownership key on its lease each (two members racing for one: one wins);
//! - when none is free and it is still short, steals from the most loaded member by KCL's rule
//!   (that member has more than the share: the excess, or it has exactly the share and this one
//!   needs more than one: one; at most `maxLeasesToStealAtOneTime` = 1 a period): the ownership
//!   key overwritten on its lease with a compare on the revision it read. The loser learns of it
//!   at its next look — until then both believe they own the resource.
//!
//! It never gives anything up on its own. Leaving revokes its lease (KCL's graceful shutdown
//! drops its leases); dying stops it, and its lease lapses after the TTL.
//!
//! Every member reads the benchmark's own watch of etcd ([`super::view`]): a free, current view
//! of who owns what, which no real worker has (KCL scans its table every period) — the naive side
//! is given the best information it could have.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use rand::seq::IteratorRandom;
use rand::Rng;
use tokio::task::JoinHandle;

use super::view::{State, NAIVE_HOLDERS, NAIVE_MEMBERS};

/// How often a member looks (KCL's taker runs every two failover times, 20 s by default).
pub(crate) const PERIOD: Duration = Duration::from_millis(100);

/// Transactions sent by the naive members, and how many found their compare true.
#[derive(Debug, Default)]
pub(crate) struct Attempts {
    pub(crate) sent: AtomicU64,
    pub(crate) won: AtomicU64,
    pub(crate) steals: AtomicU64,
}

/// The naive members.
pub(crate) struct Naive {
    client: Client,
    view: Arc<Mutex<State>>,
    ttl: i64,
    members: BTreeMap<String, (i64, JoinHandle<()>)>,
    pub(crate) attempts: Arc<Attempts>,
}

impl Drop for Naive {
    fn drop(&mut self) {
        for (_, task) in self.members.values() {
            task.abort();
        }
    }
}

impl Naive {
    /// Members on `client` that read `view`, with leases of `ttl` seconds.
    pub(crate) fn new(client: Client, view: Arc<Mutex<State>>, ttl: u64) -> Self {
        Self {
            client,
            view,
            ttl: i64::try_from(ttl).unwrap_or(i64::MAX),
            members: BTreeMap::new(),
            attempts: Arc::default(),
        }
    }

    /// Starts `names` at once: each a lease, its presence, its keepalive and its loop.
    pub(crate) async fn join(&mut self, names: &[String]) -> anyhow::Result<()> {
        let joins = names.iter().map(|name| {
            let mut client = self.client.clone();
            let ttl = self.ttl;
            async move {
                let lease = client.lease_grant(ttl, None).await?.id();
                client
                    .put(
                        format!("{NAIVE_MEMBERS}{name}"),
                        "",
                        Some(PutOptions::new().with_lease(lease)),
                    )
                    .await?;
                Ok::<_, anyhow::Error>((name.clone(), lease))
            }
        });
        for joined in futures::future::join_all(joins).await {
            let (name, lease) = joined?;
            let member = Member {
                name: name.clone(),
                lease,
                client: self.client.clone(),
                view: self.view.clone(),
                attempts: self.attempts.clone(),
            };
            let period = Duration::from_secs(u64::try_from(self.ttl).unwrap_or(1)) / 3;
            let task = tokio::spawn(member.run(period));
            self.members.insert(name, (lease, task));
        }
        Ok(())
    }

    /// `name` leaves: its lease revoked, its keys with it.
    pub(crate) async fn leave(&mut self, name: &str) -> anyhow::Result<()> {
        if let Some((lease, task)) = self.members.remove(name) {
            task.abort();
            self.client.clone().lease_revoke(lease).await?;
        }
        Ok(())
    }

    /// `name` dies: it stops; its lease lapses after the TTL.
    pub(crate) fn die(&mut self, name: &str) {
        if let Some((_, task)) = self.members.remove(name) {
            task.abort();
        }
    }

    /// Stops every member and revokes their leases.
    pub(crate) async fn end(mut self) -> anyhow::Result<()> {
        let members = std::mem::take(&mut self.members);
        for (lease, task) in members.into_values() {
            task.abort();
            let _ = self.client.clone().lease_revoke(lease).await;
        }
        Ok(())
    }
}

/// One member.
struct Member {
    name: String,
    lease: i64,
    client: Client,
    view: Arc<Mutex<State>>,
    attempts: Arc<Attempts>,
}

/// What a member decides to do in one period.
enum Move {
    Take(Vec<String>),
    Steal(String, i64),
    Nothing,
}

impl Member {
    async fn run(self, keepalive: Duration) {
        let mut client = self.client.clone();
        let lease = self.lease;
        let beat = async move {
            let Ok((mut keeper, mut answers)) = client.lease_keep_alive(lease).await else {
                return;
            };
            loop {
                tokio::time::sleep(keepalive).await;
                if keeper.keep_alive().await.is_err() {
                    return;
                }
                let _ = answers.message().await;
            }
        };
        let take = async {
            loop {
                let pause = rand::rng().random_range(PERIOD * 4 / 5..=PERIOD * 6 / 5);
                tokio::time::sleep(pause).await;
                let planned = self.decide();
                self.act(planned).await;
            }
        };
        tokio::select! {
            () = beat => {}
            () = take => {}
        }
    }

    /// KCL's taker on the view: take free resources up to the share, else steal by its rule.
    fn decide(&self) -> Move {
        let Ok(s) = self.view.lock() else {
            return Move::Nothing;
        };
        let members = s.present.len().max(1);
        let target = s.resources.len().div_ceil(members);
        let mine = s.held.get(&self.name).map_or(0, |h| h.len());
        let needed = target.saturating_sub(mine);
        if needed == 0 {
            return Move::Nothing;
        }
        let mut rng = rand::rng();
        let free = s.free.iter().choose_multiple(&mut rng, needed);
        if !free.is_empty() {
            return Move::Take(free.into_iter().cloned().collect());
        }
        let most = s
            .held
            .iter()
            .filter(|(m, _)| **m != self.name && s.present.contains(*m))
            .max_by_key(|(_, h)| h.len());
        let Some((_, theirs)) = most else {
            return Move::Nothing;
        };
        let count = theirs.len();
        let mut steal = 0;
        if count >= target {
            steal = needed.min(count - target);
            if needed > 1 && steal == 0 {
                steal = 1;
            }
            steal = steal.min(1);
        }
        if steal == 0 {
            return Move::Nothing;
        }
        let Some(resource) = theirs.iter().choose(&mut rng) else {
            return Move::Nothing;
        };
        let revision = s.owners.get(resource).map_or(0, |(_, rev)| *rev);
        Move::Steal(resource.clone(), revision)
    }

    async fn act(&self, planned: Move) {
        let put = |r: &str| {
            TxnOp::put(
                format!("{NAIVE_HOLDERS}{r}"),
                self.name.as_str(),
                Some(PutOptions::new().with_lease(self.lease)),
            )
        };
        let txns: Vec<Txn> = match &planned {
            Move::Take(free) => free
                .iter()
                .map(|r| {
                    let key = format!("{NAIVE_HOLDERS}{r}");
                    Txn::new()
                        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                        .and_then([put(r)])
                })
                .collect(),
            Move::Steal(r, revision) => {
                let key = format!("{NAIVE_HOLDERS}{r}");
                vec![Txn::new()
                    .when([Compare::mod_revision(key, CompareOp::Equal, *revision)])
                    .and_then([put(r)])]
            }
            Move::Nothing => Vec::new(),
        };
        let steal = matches!(planned, Move::Steal(..));
        let sends = txns.into_iter().map(|txn| {
            let mut client = self.client.clone();
            async move { client.txn(txn).await.map(|r| r.succeeded()) }
        });
        for won in futures::future::join_all(sends).await {
            self.attempts.sent.fetch_add(1, Ordering::Relaxed);
            if won.unwrap_or(false) {
                self.attempts.won.fetch_add(1, Ordering::Relaxed);
                if steal {
                    self.attempts.steals.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
