//! Who owns what, from one etcd watch of everything (the benchmark's etcd is its own): each
//! side's ownership keys give resource → member, every key change is counted, and an event's
//! goal — the members that are live after it — is judged as the changes arrive: when every
//! resource is first owned by a live member (coverage), and when, besides, the live members'
//! counts differ by at most one (balance).
//!
//! The naive side's members read the same view (free resources, each member's holdings, the
//! live members' presence keys): a free, always-current view of every key, better than any
//! real worker's scan.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use etcd_client::{Client, EventType, WatchOptions};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How a side names owners in its keys.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Layout {
    /// lease-proxy: `/lease-proxy/holders/{resource}`, a JSON record whose `holder` is the
    /// member.
    Proxy,
    /// The naive members: `/naive/r/{resource}` holds the member's name; `/naive/m/{member}`
    /// is its presence, on its lease.
    Naive,
}

/// Where a side keeps its ownership keys.
pub(crate) const PROXY_HOLDERS: &str = "/lease-proxy/holders/";
/// The naive side's ownership keys.
pub(crate) const NAIVE_HOLDERS: &str = "/naive/r/";
/// The naive side's presence keys.
pub(crate) const NAIVE_MEMBERS: &str = "/naive/m/";

/// What is being waited for after an event.
#[derive(Debug, Clone)]
struct Goal {
    live: BTreeSet<String>,
    /// A member that died with the event: when its keys first went.
    dead: Option<String>,
    expired: Option<Instant>,
    since: Instant,
    covered: Option<Instant>,
    balanced: Option<Instant>,
    /// Changes of owner per resource since the event.
    moves: HashMap<String, usize>,
    /// Changes of owner straight from a live member to another (no release or expiry between).
    taken_while_held: usize,
    /// Resource-milliseconds without a live owner since the event, until balanced.
    unowned_ms: f64,
    /// Resources without a live owner when last judged, and when.
    unowned: (usize, Instant),
    keys_written: usize,
}

/// The state the watch keeps.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// Resource → owner and the key's mod revision.
    pub(crate) owners: HashMap<String, (String, i64)>,
    /// Owner → its resources.
    pub(crate) held: HashMap<String, BTreeSet<String>>,
    /// Every resource of the fleet.
    pub(crate) resources: BTreeSet<String>,
    /// The resources nobody owns.
    pub(crate) free: BTreeSet<String>,
    /// Members present (naive side).
    pub(crate) present: BTreeSet<String>,
    goal: Option<Goal>,
    last_change: Option<Instant>,
}

impl State {
    fn set(&mut self, resource: &str, owner: Option<(String, i64)>) {
        let before = match owner {
            Some(o) => self.owners.insert(resource.to_owned(), o),
            None => self.owners.remove(resource),
        };
        if let Some((old, _)) = &before {
            if let Some(h) = self.held.get_mut(old) {
                h.remove(resource);
            }
        }
        let now = self.owners.get(resource).map(|(m, _)| m.clone());
        if now.is_some() {
            self.free.remove(resource);
        } else if self.resources.contains(resource) {
            self.free.insert(resource.to_owned());
        }
        if let Some(m) = &now {
            self.held
                .entry(m.clone())
                .or_default()
                .insert(resource.to_owned());
        }
        let before = before.map(|(m, _)| m);
        let Some(goal) = self.goal.as_mut() else {
            return;
        };
        if now.is_some() && before != now {
            *goal.moves.entry(resource.to_owned()).or_default() += 1;
            if before.as_ref().is_some_and(|b| goal.live.contains(b)) {
                goal.taken_while_held += 1;
            }
        }
        if now.is_none() && goal.expired.is_none() && before.is_some() && before == goal.dead {
            goal.expired = Some(Instant::now());
        }
    }

    /// How many resources lack a live owner, and whether the live owners' counts are within one
    /// of each other.
    fn judge(&self, live: &BTreeSet<String>) -> (usize, bool) {
        let unowned = self
            .resources
            .iter()
            .filter(|r| !self.owners.get(*r).is_some_and(|(m, _)| live.contains(m)))
            .count();
        let counts = live
            .iter()
            .map(|m| self.held.get(m).map_or(0, BTreeSet::len));
        let (lo, hi) = counts.fold((usize::MAX, 0), |(lo, hi), n| (lo.min(n), hi.max(n)));
        (unowned, hi.saturating_sub(lo) <= 1)
    }

    fn check(&mut self, now: Instant) {
        let Some(goal) = &self.goal else { return };
        if goal.balanced.is_some() {
            return;
        }
        let live = goal.live.clone();
        let (unowned, even) = self.judge(&live);
        if let Some(goal) = self.goal.as_mut() {
            let (before, at) = goal.unowned;
            goal.unowned_ms += before as f64 * now.duration_since(at).as_secs_f64() * 1e3;
            goal.unowned = (unowned, now);
            if unowned == 0 && goal.covered.is_none() {
                goal.covered = Some(now);
            }
            if unowned == 0 && even {
                goal.balanced = Some(now);
            }
        }
    }
}

/// An event's outcome, as the watch saw it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// From the event to every resource owned by a live member.
    pub(crate) covered_ms: Option<f64>,
    /// From the event to that, and the counts within one.
    pub(crate) balanced_ms: Option<f64>,
    /// Changes of owner (grants, takeovers).
    pub(crate) moves: usize,
    /// Resources whose owner changed more than once.
    pub(crate) moved_twice: usize,
    /// Changes of owner straight from a live member to another.
    pub(crate) taken_while_held: usize,
    /// Resource-milliseconds without a live owner, from the event to balance.
    pub(crate) unowned_ms: f64,
    /// From the dead member's keys' expiry (the first of them gone) to balance.
    pub(crate) balanced_after_expiry_ms: Option<f64>,
    /// Keys written (put or deleted) since the event.
    pub(crate) keys_written: usize,
}

/// The watch, running.
pub(crate) struct View {
    pub(crate) state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for View {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl View {
    /// Watches everything from the current revision on, for `layout`'s keys of `resources`.
    pub(crate) async fn start(
        client: &Client,
        layout: Layout,
        resources: &[String],
    ) -> anyhow::Result<Self> {
        let mut client = client.clone();
        let revision = client
            .get("/leasebench-view", None)
            .await?
            .header()
            .context("no header")?
            .revision();
        let state = Arc::new(Mutex::new(State {
            resources: resources.iter().cloned().collect(),
            free: resources.iter().cloned().collect(),
            ..State::default()
        }));
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let mut stream = client.watch("/", Some(options)).await?;
        let into = state.clone();
        let task = tokio::spawn(async move {
            while let Ok(Some(resp)) = stream.message().await {
                let now = Instant::now();
                let Ok(mut s) = into.lock() else { return };
                for e in resp.events() {
                    let Some(kv) = e.kv() else { continue };
                    let key = String::from_utf8_lossy(kv.key()).into_owned();
                    let put = e.event_type() == EventType::Put;
                    apply(
                        &mut s,
                        layout,
                        &key,
                        put.then(|| (kv.value(), kv.mod_revision())),
                    );
                    if let Some(goal) = s.goal.as_mut() {
                        goal.keys_written += 1;
                    }
                    s.last_change = Some(now);
                }
                s.check(now);
            }
        });
        Ok(Self { state, task })
    }

    /// Starts judging for an event at `since` after which `live` are the live members (and
    /// `dead` died with it).
    pub(crate) fn expect(&self, live: BTreeSet<String>, dead: Option<String>, since: Instant) {
        if let Ok(mut s) = self.state.lock() {
            let unowned = s.judge(&live).0;
            s.goal = Some(Goal {
                live,
                dead,
                expired: None,
                since,
                covered: None,
                balanced: None,
                moves: HashMap::new(),
                taken_while_held: 0,
                unowned_ms: 0.0,
                unowned: (unowned, since),
                keys_written: 0,
            });
            s.check(Instant::now());
        }
    }

    /// Waits until the goal is balanced and no key has changed for `quiet`, or `limit` has
    /// passed; what was seen.
    pub(crate) async fn settled(
        &self,
        quiet: std::time::Duration,
        limit: std::time::Duration,
    ) -> Seen {
        let deadline = Instant::now() + limit;
        loop {
            let done = self.state.lock().is_ok_and(|s| {
                let balanced = s.goal.as_ref().is_some_and(|g| g.balanced.is_some());
                let calm = s.last_change.is_none_or(|t| t.elapsed() >= quiet);
                balanced && calm
            });
            if done || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let s = self.state.lock().map(|s| s.goal.clone()).ok().flatten();
        let Some(g) = s else {
            return Seen {
                covered_ms: None,
                balanced_ms: None,
                moves: 0,
                moved_twice: 0,
                taken_while_held: 0,
                unowned_ms: 0.0,
                balanced_after_expiry_ms: None,
                keys_written: 0,
            };
        };
        let ms = |t: Option<Instant>| t.map(|t| t.duration_since(g.since).as_secs_f64() * 1e3);
        let after_expiry = g
            .expired
            .zip(g.balanced)
            .map(|(e, b)| b.saturating_duration_since(e).as_secs_f64() * 1e3);
        Seen {
            covered_ms: ms(g.covered),
            balanced_ms: ms(g.balanced),
            moves: g.moves.values().sum(),
            moved_twice: g.moves.values().filter(|&&n| n > 1).count(),
            taken_while_held: g.taken_while_held,
            unowned_ms: g.unowned_ms,
            balanced_after_expiry_ms: after_expiry,
            keys_written: g.keys_written,
        }
    }

    /// Each live member's count now.
    pub(crate) fn counts(&self) -> BTreeMap<String, usize> {
        self.state
            .lock()
            .map(|s| s.held.iter().map(|(m, r)| (m.clone(), r.len())).collect())
            .unwrap_or_default()
    }
}

/// Applies one key's change (`None`: deleted) to `s`.
fn apply(s: &mut State, layout: Layout, key: &str, put: Option<(&[u8], i64)>) {
    match layout {
        Layout::Proxy => {
            let Some(resource) = key.strip_prefix(PROXY_HOLDERS) else {
                return;
            };
            if !s.resources.contains(resource) {
                return;
            }
            let owner = put.and_then(|(value, rev)| {
                let record: serde_json::Value = serde_json::from_slice(value).ok()?;
                Some((record["holder"].as_str()?.to_owned(), rev))
            });
            s.set(resource, owner);
        }
        Layout::Naive => {
            if let Some(resource) = key.strip_prefix(NAIVE_HOLDERS) {
                let owner =
                    put.map(|(value, rev)| (String::from_utf8_lossy(value).into_owned(), rev));
                s.set(resource, owner);
            } else if let Some(member) = key.strip_prefix(NAIVE_MEMBERS) {
                if put.is_some() {
                    s.present.insert(member.to_owned());
                } else {
                    s.present.remove(member);
                }
            }
        }
    }
}
