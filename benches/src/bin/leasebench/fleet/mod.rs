//! `--fleet`: many members sharing many resources, through a lease-proxy fleet against the naive
//! alternative on raw etcd ([`naive`]: KCL 2.x's lease taker), on the same etcd in the same run,
//! the side that goes first alternating by round.
//!
//! Each side lives through the same events, timed from the moment the benchmark causes them:
//! the members start together (`start`), one more joins (`join`), one leaves (`leave`: closes
//! its session, revokes its lease), one dies (`death`: stops everything; its session or lease
//! lapses after the TTL). After each, [`view`] — one watch of etcd — times full coverage (every
//! resource owned by a live member) and balance (that, and the live members' counts within one),
//! and counts the moves (changes of owner), the resources moved twice, the keys written, etcd's
//! write transactions (revisions) and its raft proposals (`etcd_server_proposals_committed_total`:
//! failed compares and lease grants and revokes included), until nothing has changed for a
//! second.

mod naive;
mod proxy;
mod view;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context;
use etcd_client::Client;
use serde_json::{json, Value};
use tokio::time::Instant;

use naive::Naive;
use proxy::ProxyFleet;
use view::{Layout, Seen, View};

/// What to run.
pub(crate) struct Plan {
    /// Fleets, as (resources, members).
    pub(crate) sizes: Vec<(usize, usize)>,
    /// The members' TTL, seconds.
    pub(crate) ttl: u64,
    /// Rounds: each runs both sides.
    pub(crate) rounds: usize,
}

/// How long an event may take to settle beyond the TTL.
const LIMIT: Duration = Duration::from_secs(180);

/// How long nothing must change for an event to have settled.
const QUIET: Duration = Duration::from_secs(1);

/// One side's members.
enum Members {
    Proxy(ProxyFleet),
    Naive(Box<Naive>),
}

impl Members {
    async fn join(&mut self, names: &[String]) -> anyhow::Result<()> {
        match self {
            Members::Proxy(p) => p.join(names).await,
            Members::Naive(n) => n.join(names).await,
        }
    }

    async fn leave(&mut self, name: &str) -> anyhow::Result<()> {
        match self {
            Members::Proxy(p) => p.leave(name).await,
            Members::Naive(n) => n.leave(name).await,
        }
    }

    fn die(&mut self, name: &str) {
        match self {
            Members::Proxy(p) => p.die(name),
            Members::Naive(n) => n.die(name),
        }
    }

    async fn end(self) -> anyhow::Result<()> {
        match self {
            Members::Proxy(p) => p.end().await,
            Members::Naive(n) => (*n).end().await,
        }
    }
}

/// Where the sides run.
pub(crate) struct Target<'a> {
    /// etcd's client URL (also where its `/metrics` are).
    pub(crate) etcd: &'a str,
    /// The proxy's base URL.
    pub(crate) proxy: &'a str,
}

/// Runs `plan`, printing a markdown line per event; every event as JSON.
pub(crate) async fn run(plan: &Plan, target: &Target<'_>) -> anyhow::Result<Value> {
    let client = Client::connect([target.etcd], None).await?;
    println!(
        "\n| resources / members | event | side | covered ms | balanced ms | moves (at least) | moved twice | taken from a live owner | unowned resource-s | keys written | etcd txns | etcd proposals |"
    );
    println!("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    let mut runs = Vec::new();
    let mut run_id = 0;
    for (i, &(resources, members)) in plan.sizes.iter().enumerate() {
        for round in 0..plan.rounds.max(1) {
            let proxy_first = (i + round) % 2 == 0;
            for proxy_turn in [proxy_first, !proxy_first] {
                run_id += 1;
                let size = Size {
                    resources,
                    members,
                    ttl: plan.ttl,
                    id: run_id,
                };
                let events = side(&client, target, &size, proxy_turn).await?;
                runs.push(json!({
                    "resources": resources,
                    "members": members,
                    "ttl_seconds": plan.ttl,
                    "round": round,
                    "side": if proxy_turn { "proxy" } else { "naive" },
                    "naive_period_ms": naive::PERIOD.as_millis(),
                    "events": events,
                }));
            }
        }
    }
    Ok(json!(runs))
}

/// One side's fleet.
struct Size {
    resources: usize,
    members: usize,
    ttl: u64,
    /// Distinct per side and round: their resources never collide.
    id: usize,
}

/// Lives one side through the events; each event as JSON.
async fn side(
    client: &Client,
    target: &Target<'_>,
    size: &Size,
    proxy_side: bool,
) -> anyhow::Result<Vec<Value>> {
    let resources: Vec<String> = (0..size.resources)
        .map(|i| format!("lbf{}-{i:05}", size.id))
        .collect();
    let names: Vec<String> = (0..=size.members).map(|i| format!("m{i:03}")).collect();
    let (first, newcomer) = names.split_at(size.members);
    let layout = if proxy_side {
        Layout::Proxy
    } else {
        Layout::Naive
    };
    let view = View::start(client, layout, &resources).await?;
    let name = if proxy_side { "proxy" } else { "naive" };
    let mut meter = Meter::new(client, target.etcd, size, name)?;
    let mut live: BTreeSet<String> = first.iter().cloned().collect();

    meter.before().await?;
    let since = Instant::now();
    view.expect(live.clone(), None, since);
    let mut members = if proxy_side {
        let fleet = format!("lbf{}", size.id);
        let p = ProxyFleet::create(target.proxy, &fleet, &resources, size.ttl).await?;
        Members::Proxy(p)
    } else {
        Members::Naive(Box::new(Naive::new(
            client.clone(),
            view.state.clone(),
            size.ttl,
        )))
    };
    members.join(first).await?;
    let mut events = vec![meter.after("start", &view, size.resources).await?];

    meter.before().await?;
    live.extend(newcomer.iter().cloned());
    view.expect(live.clone(), None, Instant::now());
    members.join(newcomer).await?;
    let least = size.resources / live.len();
    events.push(meter.after("join", &view, least).await?);

    let leaver = first.first().context("no members")?.clone();
    let held = view.counts().get(&leaver).copied().unwrap_or(0);
    meter.before().await?;
    live.remove(&leaver);
    view.expect(live.clone(), None, Instant::now());
    members.leave(&leaver).await?;
    events.push(meter.after("leave", &view, held).await?);

    let dead = first.get(1).context("fewer than two members")?.clone();
    let held = view.counts().get(&dead).copied().unwrap_or(0);
    meter.before().await?;
    live.remove(&dead);
    view.expect(live.clone(), Some(dead.clone()), Instant::now());
    members.die(&dead);
    events.push(meter.after("death", &view, held).await?);

    if let Members::Naive(n) = &members {
        let a = &n.attempts;
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        events.push(json!({
            "event": "attempts",
            "transactions": load(&a.sent),
            "won": load(&a.won),
            "steals": load(&a.steals),
        }));
    }
    members.end().await?;
    Ok(events)
}

/// etcd's revision and proposals before an event, and the event's figures after it.
struct Meter {
    client: Client,
    http: reqwest::Client,
    metrics: String,
    label: String,
    side: &'static str,
    ttl: u64,
    revision: i64,
    proposals: f64,
}

impl Meter {
    fn new(client: &Client, etcd: &str, size: &Size, side: &'static str) -> anyhow::Result<Self> {
        Ok(Self {
            client: client.clone(),
            http: reqwest::Client::new(),
            metrics: format!("{}/metrics", etcd.trim_end_matches('/')),
            label: format!("{} / {}", size.resources, size.members),
            side,
            ttl: size.ttl,
            revision: 0,
            proposals: 0.0,
        })
    }

    async fn read(&mut self) -> anyhow::Result<(i64, f64)> {
        let revision = self
            .client
            .get("/leasebench-view", None)
            .await?
            .header()
            .context("no header")?
            .revision();
        let text = self.http.get(&self.metrics).send().await?.text().await?;
        let proposals = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("etcd_server_proposals_committed_total ")?
                    .parse::<f64>()
                    .ok()
            })
            .context("no etcd_server_proposals_committed_total in etcd's metrics")?;
        Ok((revision, proposals))
    }

    async fn before(&mut self) -> anyhow::Result<()> {
        (self.revision, self.proposals) = self.read().await?;
        Ok(())
    }

    /// Waits for the event to settle; prints its line and gives it as JSON.
    async fn after(&mut self, event: &str, view: &View, least: usize) -> anyhow::Result<Value> {
        let seen: Seen = view
            .settled(QUIET, LIMIT + Duration::from_secs(self.ttl))
            .await;
        let (revision, proposals) = self.read().await?;
        let txns = revision - self.revision;
        let proposals = proposals - self.proposals;
        let shown = |ms: Option<f64>| ms.map_or("never".to_owned(), |ms| format!("{ms:.0}"));
        let balanced = match seen.balanced_after_expiry_ms {
            Some(after) => format!("{} ({after:.0} after expiry)", shown(seen.balanced_ms)),
            None => shown(seen.balanced_ms),
        };
        println!(
            "| {} | {event} | {} | {} | {balanced} | {} ({least}) | {} | {} | {:.1} | {} | {txns} | {proposals:.0} |",
            self.label,
            self.side,
            shown(seen.covered_ms),
            seen.moves,
            seen.moved_twice,
            seen.taken_while_held,
            seen.unowned_ms / 1e3,
            seen.keys_written,
        );
        Ok(json!({
            "event": event,
            "covered_ms": seen.covered_ms,
            "balanced_ms": seen.balanced_ms,
            "moves": seen.moves,
            "least_moves": least,
            "moved_twice": seen.moved_twice,
            "taken_while_held": seen.taken_while_held,
            "unowned_resource_ms": seen.unowned_ms,
            "balanced_after_expiry_ms": seen.balanced_after_expiry_ms,
            "keys_written": seen.keys_written,
            "etcd_txns": txns,
            "etcd_proposals": proposals,
        }))
    }
}
