//! The fleet's schedule: its members' events, drawn from the run's seed like every other fault.
//!
//! From 3 s on (the fleet has settled), every 1.5–3 s a member joins, leaves, dies, is paused,
//! drained or evicted; every kind once first, in random order, then drawn at random. The
//! membership the events leave is tracked while planning and kept between [`MIN_MEMBERS`] and
//! [`MAX_MEMBERS`], so that every planned event has a member to act on.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;

use super::{stream, Plan, Step};
use crate::nemesis::Fault;

/// The member events, and their weights once each has been met.
pub const FLEET: [(Fault, u32); 6] = [
    (Fault::MemberJoin, 2),
    (Fault::MemberLeave, 1),
    (Fault::MemberDeath, 2),
    (Fault::MemberPause, 3),
    (Fault::MemberDrain, 2),
    (Fault::MemberEvict, 1),
];

/// Fewest members the schedule leaves.
pub const MIN_MEMBERS: usize = 3;

/// Most members the schedule lets join.
pub const MAX_MEMBERS: usize = 9;

impl Plan {
    /// This plan with the fleet's schedule over `chaos` for a fleet that starts with `members`.
    pub fn with_fleet(mut self, chaos: Duration, members: usize) -> Self {
        let until = u64::try_from(chaos.as_millis()).unwrap_or(u64::MAX);
        self.fleet = schedule(&mut stream(self.seed, "fleet", 0), until, members);
        self
    }
}

fn schedule(rng: &mut StdRng, until: u64, members: usize) -> Vec<Step> {
    let mut unmet: Vec<Fault> = FLEET.iter().map(|(f, _)| *f).collect();
    unmet.shuffle(rng);
    let mut count = members;
    let mut steps = Vec::new();
    let mut now = 3000;
    while now < until {
        let allowed = |f: Fault| match f {
            Fault::MemberJoin => count < MAX_MEMBERS,
            Fault::MemberLeave | Fault::MemberDeath => count > MIN_MEMBERS,
            _ => count > 0,
        };
        let fault = match unmet.iter().rposition(|f| allowed(*f)) {
            Some(i) => unmet.remove(i),
            None => {
                let kinds: Vec<(Fault, u32)> =
                    FLEET.iter().copied().filter(|(f, _)| allowed(*f)).collect();
                match kinds.choose_weighted(rng, |(_, w)| *w) {
                    Ok((f, _)) => *f,
                    Err(_) => Fault::MemberJoin,
                }
            }
        };
        let hold_ms = match fault {
            // Beyond the TTL: its session lapses while it is stopped.
            Fault::MemberPause => crate::client::TTL_SECONDS * 1000 + rng.random_range(1000..4000),
            // Half the deaths restart under the same name within the TTL (static membership),
            // half are for good.
            Fault::MemberDeath if rng.random_bool(0.5) => rng.random_range(500..2000),
            // A drained or evicted member restarts (a deploy) after this.
            Fault::MemberDrain | Fault::MemberEvict => rng.random_range(300..1500),
            _ => 0,
        };
        match fault {
            Fault::MemberJoin => count += 1,
            Fault::MemberLeave => count -= 1,
            Fault::MemberDeath if hold_ms == 0 => count -= 1,
            _ => {}
        }
        steps.push(Step {
            at_ms: now,
            fault,
            target: rng.random(),
            hold_ms,
            delay_ms: 0,
        });
        now += rng.random_range(1500..3000);
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Parts;

    #[test]
    fn a_fleet_schedule_meets_every_kind_and_keeps_its_members() {
        for seed in 0..300 {
            let chaos = Duration::from_secs(24);
            let plan = Plan::generate(seed, chaos, Parts::ALL).with_fleet(chaos, 6);
            assert_eq!(
                plan,
                Plan::generate(seed, chaos, Parts::ALL).with_fleet(chaos, 6)
            );
            for (f, _) in FLEET {
                assert!(
                    plan.fleet.iter().any(|s| s.fault == f),
                    "seed {seed}: {f:?} never planned"
                );
            }
            let mut count = 6;
            for s in &plan.fleet {
                match s.fault {
                    Fault::MemberJoin => count += 1,
                    Fault::MemberLeave => count -= 1,
                    Fault::MemberDeath if s.hold_ms == 0 => count -= 1,
                    _ => {}
                }
                assert!((MIN_MEMBERS..=MAX_MEMBERS).contains(&count), "seed {seed}");
            }
            // The rest of the plan is the one without a fleet.
            let without = Plan::generate(seed, chaos, Parts::ALL);
            assert_eq!(plan.infrastructure, without.infrastructure);
            assert_eq!(plan.clients, without.clients);
        }
    }
}
