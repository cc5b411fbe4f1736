//! A run's fleet: made, its members started and its coverage sampled ([`Running`]), then
//! stopped and judged ([`Stopped`]) into a [`FleetReport`].

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::coverage::{self, Sampler};
use super::{Env, Members, Shape, DRAIN_MS, FLEET};
use crate::history::{Event, Kind, Outcome};

/// Makes the fleet (`PUT /v1/fleets/{FLEET}`) over `resources`, through the proxies, retrying
/// for up to 20 s.
pub async fn create(proxies: &[String], resources: &[String]) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    while Instant::now() < deadline {
        for proxy in proxies {
            let answer = http
                .put(format!("{proxy}/v1/fleets/{FLEET}"))
                .json(&serde_json::json!({"resources": resources, "drain_ms": DRAIN_MS}))
                .send()
                .await;
            match answer {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => last = format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
                Err(e) => last = e.to_string(),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("cannot make the fleet: {last}")
}

/// What a run's fleet did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetReport {
    /// Its shape: members at the start, resources.
    pub shape: Shape,
    /// How well its resources stayed owned.
    pub coverage: coverage::Coverage,
    /// Grants its members saw appear in their assignments.
    pub grants: usize,
    /// Its members' writes acknowledged.
    pub writes_acknowledged: usize,
    /// Its members' writes refused (4xx).
    pub writes_refused: usize,
    /// Late writes: a member's first write after a pause with the token it had, an evicted
    /// member's parting writes.
    pub late_writes: LateWrites,
    /// Writes with an older token applied after a member saw the newer grant in its view
    /// ([`crate::checker::announced_early`]): the view shows a grant before its pre-fence may
    /// have completed. Not violations — storage order holds — but not the pre-fenced
    /// announcement an acquire gives.
    #[serde(default)]
    pub announced_early: Vec<String>,
    /// Resources a member's view listed both in `held` and in `releasing` (the member, following
    /// the protocol, released them), summed over every view its members read.
    #[serde(default)]
    pub held_and_releasing: u64,
}

/// Late writes' outcomes. Accepted ones came before the resource's next grant (the enforcer
/// refuses them after it): the checker judges each against the grants.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct LateWrites {
    /// Answered 2xx.
    pub accepted: u64,
    /// Refused (4xx).
    pub refused: u64,
    /// Without an answer.
    pub unknown: u64,
}

/// A fleet running in a run: its members and the sampler of its coverage.
pub struct Running {
    shape: Shape,
    members: Arc<Members>,
    sampler: Sampler,
}

impl Running {
    /// Makes the fleet through `env`'s proxies, starts its members and samples its ownership
    /// through `etcd`.
    pub async fn start(shape: Shape, env: Env, etcd: etcd_client::Client) -> anyhow::Result<Self> {
        create(&env.proxies, &shape.resource_names()).await?;
        let members = Arc::new(Members::start(env, shape.members));
        let sampler = Sampler::start(etcd, "fleet-", members.clone());
        Ok(Self {
            shape,
            members,
            sampler,
        })
    }

    /// The members, for the nemesis.
    pub fn members(&self) -> Arc<Members> {
        self.members.clone()
    }

    /// Stops the members and, at the same moment, the sampler.
    pub fn stop(self) -> Stopped {
        self.members.stop();
        Stopped {
            shape: self.shape,
            samples: self.sampler.stop(),
            late_writes: self.members.late_writes(),
            held_and_releasing: self.members.contradictions(),
        }
    }
}

/// A fleet whose members have stopped: what is left to judge.
pub struct Stopped {
    shape: Shape,
    samples: Vec<coverage::Sample>,
    late_writes: LateWrites,
    held_and_releasing: u64,
}

impl Stopped {
    /// The report, and the hand-overs found (violations), judged with the run's `events`
    /// (which started at `started`) and the storage's `applied` log.
    pub fn judge(
        &self,
        events: &[Event],
        applied: &[crate::storage::Applied],
        started: Instant,
    ) -> (FleetReport, Vec<String>) {
        let fleet_write = |e: &&Event| e.kind.is_write() && e.resource.starts_with("fleet-");
        let report = FleetReport {
            shape: self.shape,
            coverage: coverage::coverage(&self.samples, &self.shape.resource_names(), started),
            grants: events.iter().filter(|e| e.kind == Kind::Assigned).count(),
            writes_acknowledged: events
                .iter()
                .filter(fleet_write)
                .filter(|e| e.outcome == Outcome::Ok)
                .count(),
            writes_refused: events
                .iter()
                .filter(fleet_write)
                .filter(|e| matches!(e.outcome, Outcome::Fail(_)))
                .count(),
            late_writes: self.late_writes,
            announced_early: crate::checker::announced_early(events, applied),
            held_and_releasing: self.held_and_releasing,
        };
        (report, coverage::handovers(&self.samples))
    }
}
