//! The operator of the run: chaos (in turn, a robot SIGSTOPped past its TTL and one SIGKILLed
//! and restarted at once) and a rolling deploy (each robot in turn drained with SIGTERM — it
//! hands its aisles off and leaves — then restarted). After each event it waits for the fleet to
//! settle (every aisle held by a robot, no hand-off in flight, shares even), so the ledger can
//! tell what each event moved and how long the fleet took to be whole again.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use lease_proxy_client::{Client, MemberState};
use rand::Rng;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::ledger::{self, Shared as Ledger};
use crate::run::{signal, spawn_robot, Args, Robot, Style, Tally};

/// What the operator needs.
pub(crate) struct Operator {
    pub(crate) args: Args,
    pub(crate) client: Client,
    pub(crate) robots: Arc<Mutex<Vec<Robot>>>,
    pub(crate) tally: Arc<Tally>,
    pub(crate) ledger: Ledger,
    pub(crate) deadline: Instant,
    /// How long each kind of event took to settle: (events settled, total time, not settled).
    pub(crate) settled: BTreeMap<&'static str, (u32, Duration, u32)>,
}

impl Operator {
    /// Acts until too little time is left for an event to settle.
    pub(crate) async fn run(mut self) -> Self {
        // The robots join one by one, each join moving aisles: those moves are no robot
        // event's, so the first event waits for the fleet to settle.
        self.wait_settled(false).await;
        let started = Instant::now();
        let deploy_at = started + (self.deadline - started) / 4;
        let mut deployed = !self.args.deploy;
        while self.time_left() {
            if !deployed && Instant::now() >= deploy_at {
                self.rolling_deploy().await;
                deployed = true;
                continue;
            }
            let mut wait = Duration::from_millis(rand::rng().random_range(1500..3500));
            if !deployed {
                wait = wait.min(deploy_at.saturating_duration_since(Instant::now()));
            }
            tokio::time::sleep(wait.min(self.deadline.saturating_duration_since(Instant::now())))
                .await;
            let deploy_due = !deployed && Instant::now() >= deploy_at;
            if !self.args.chaos || deploy_due || !self.time_left() {
                continue;
            }
            // In turn, a stall first: even a short run stalls a robot past its TTL, the case
            // that moves aisles and that fencing is for.
            let (stalls, kills) = (&self.tally.stalls, &self.tally.kills);
            if stalls.load(Ordering::Relaxed) > kills.load(Ordering::Relaxed) {
                self.kill().await;
            } else {
                self.stall().await;
            }
        }
        self
    }

    /// Whether an event now could settle before the deadline.
    fn time_left(&self) -> bool {
        Instant::now() + Duration::from_secs(self.args.ttl + 4) < self.deadline
    }

    fn event(&self, what: &'static str) {
        ledger::lock(&self.ledger).robot_event(what, Instant::now());
    }

    /// SIGKILLs a robot and starts it again at once: it joins under its name within its TTL, so
    /// the service gives it back what it held (static membership).
    async fn kill(&mut self) {
        let mut robots = self.robots.lock().await;
        let i = rand::rng().random_range(0..robots.len());
        self.event("kill");
        signal(&robots[i].child, "KILL");
        self.tally.kills.fetch_add(1, Ordering::Relaxed);
        let (name, style) = (robots[i].name.clone(), robots[i].style);
        if let Ok(fresh) = spawn_robot(&self.args, &name, style, &self.tally) {
            robots[i] = fresh;
        }
        drop(robots);
        self.settle("kill", Instant::now()).await;
    }

    /// SIGSTOPs a robot past its TTL (half the time the careless one: a paused holder that
    /// writes on waking is what fencing is for): its session expires, its aisles go to the
    /// others; resumed, it finds its leases lost, joins again and gets its share back.
    async fn stall(&mut self) {
        let robots = self.robots.lock().await;
        let careless = robots.iter().position(|r| r.style == Style::Careless);
        let i = match careless {
            Some(c) if rand::rng().random_bool(0.5) => c,
            _ => rand::rng().random_range(0..robots.len()),
        };
        self.event("stall");
        signal(&robots[i].child, "STOP");
        self.tally.stalls.fetch_add(1, Ordering::Relaxed);
        let stalled = robots[i].child.id();
        drop(robots);
        let started = Instant::now();
        let stall =
            Duration::from_millis(self.args.ttl * 1000 + rand::rng().random_range(500..2500));
        tokio::time::sleep(stall).await;
        if let Some(pid) = stalled {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
        self.settle("stall", started).await;
    }

    /// Drains and restarts every robot in turn, each once the fleet has settled again.
    async fn rolling_deploy(&mut self) {
        let count = self.robots.lock().await.len();
        for i in 0..count {
            if !self.time_left() {
                return;
            }
            let started = Instant::now();
            let mut robots = self.robots.lock().await;
            self.event("drain");
            signal(&robots[i].child, "TERM");
            let grace = self.args.drain_wait + Duration::from_secs(3);
            let exited = tokio::time::timeout(grace, robots[i].child.wait()).await;
            if !matches!(exited, Ok(Ok(status)) if status.success()) {
                let _ = robots[i].child.kill().await;
            }
            drop(robots);
            self.settle("drain", started).await;
            let started = Instant::now();
            let mut robots = self.robots.lock().await;
            self.event("restart");
            let (name, style) = (robots[i].name.clone(), robots[i].style);
            if let Ok(fresh) = spawn_robot(&self.args, &name, style, &self.tally) {
                robots[i] = fresh;
            }
            drop(robots);
            self.tally.deploys.fetch_add(1, Ordering::Relaxed);
            self.settle("restart", started).await;
        }
    }

    /// Waits until the fleet has settled, and counts how long that took since `since`.
    async fn settle(&mut self, what: &'static str, since: Instant) {
        let done = self.wait_settled(what == "drain").await;
        let entry = self.settled.entry(what).or_default();
        if done {
            entry.0 += 1;
            entry.1 += since.elapsed();
        } else {
            entry.2 += 1;
        }
    }

    /// Waits until the fleet has settled (`drained`: but for the robot just drained), at most
    /// until it should have (two TTLs, a drain and 2 s) or the run's end. Whether it did.
    async fn wait_settled(&self, drained: bool) -> bool {
        let names: Vec<String> = self
            .robots
            .lock()
            .await
            .iter()
            .map(|r| r.name.clone())
            .collect();
        let limit =
            Instant::now() + Duration::from_secs(self.args.ttl * 2 + 2) + self.args.drain_wait;
        while Instant::now() < limit.min(self.deadline) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if self.is_settled(&names, drained).await {
                return true;
            }
        }
        false
    }

    /// Every aisle held, none in a hand-off, every robot a member (all but the one drained out
    /// after a drain), each holding its even share.
    async fn is_settled(&self, robots: &[String], drained: bool) -> bool {
        let Ok(Some(fleet)) = self.client.get_fleet(&self.args.fleet).await else {
            return false;
        };
        let active: Vec<_> = fleet
            .members
            .iter()
            .filter(|m| m.state == MemberState::Active)
            .collect();
        let present = robots
            .iter()
            .filter(|r| active.iter().any(|m| &m.member == *r))
            .count();
        let shares = active.iter().map(|m| m.held.len());
        let (low, high) = (shares.clone().min(), shares.max());
        fleet.unassigned.is_empty()
            && fleet.members.iter().all(|m| m.releasing.is_empty())
            && present + usize::from(drained) >= robots.len()
            && high.zip(low).is_some_and(|(h, l)| h - l <= 1)
    }
}
