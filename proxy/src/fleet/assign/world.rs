//! A small simulated fleet for the decision's tests: plans are applied as the reconciler
//! applies them (revocations, then grants of what is free), members release what they are told
//! to (or not, when they hang), and time moves to the next deadline when nothing else can
//! happen.

use std::collections::{BTreeMap, BTreeSet};

use super::*;

pub(super) fn resources(n: usize) -> BTreeSet<String> {
    (0..n).map(|i| format!("r{i:05}")).collect()
}

pub(super) fn spec(n: usize, max_moves: usize) -> Spec {
    Spec {
        resources: resources(n),
        drain_ms: 1_000,
        max_moves,
    }
}

pub(super) fn member(name: &str) -> Member {
    Member {
        name: name.to_owned(),
        weight: 1,
        state: State::Active,
        entitled: true,
    }
}

pub(super) fn members(n: usize) -> Vec<Member> {
    (0..n).map(|i| member(&format!("m{i:03}"))).collect()
}

/// A fleet's state as etcd would hold it, and what happened to it.
#[derive(Debug, Clone)]
pub(super) struct World {
    pub(super) spec: Spec,
    pub(super) members: Vec<Member>,
    pub(super) assignment: Assignment,
    pub(super) holdings: BTreeMap<String, Held>,
    pub(super) now: u64,
    pub(super) revision: i64,
    /// Members that never release (their grants end at the deadline).
    pub(super) hung: BTreeSet<String>,
    /// Per resource, the members granted it, in order.
    pub(super) granted: BTreeMap<String, Vec<String>>,
    /// The most hand-offs seen in flight at once.
    pub(super) most_in_flight: usize,
}

impl World {
    pub(super) fn new(spec: Spec, members: Vec<Member>) -> Self {
        Self {
            spec,
            members,
            assignment: Assignment::default(),
            holdings: BTreeMap::new(),
            now: 1_000_000,
            revision: 1,
            hung: BTreeSet::new(),
            granted: BTreeMap::new(),
            most_in_flight: 0,
        }
    }

    pub(super) fn decide(&self) -> Plan {
        next(&Input {
            spec: &self.spec,
            members: &self.members,
            current: &self.assignment,
            holdings: &self.holdings,
            now_ms: self.now,
        })
    }

    /// Applies one plan; whether it did anything (or time had to move).
    pub(super) fn step(&mut self) -> bool {
        let plan = self.decide();
        for grant in &plan.grants {
            assert!(
                !self.holdings.contains_key(&grant.resource),
                "granted {grant:?} while held: {:?}",
                self.holdings.get(&grant.resource)
            );
            let m = self.members.iter().find(|m| m.name == grant.member);
            assert!(
                m.is_some_and(|m| m.state == State::Active && m.entitled),
                "granted to a member that may not take it: {grant:?}"
            );
        }
        let idle = plan.is_idle(&self.assignment);
        self.assignment = plan.assignment.clone();
        for revoke in &plan.revokes {
            if self
                .holdings
                .get(&revoke.resource)
                .is_some_and(|h| h.revision == revoke.revision)
            {
                self.holdings.remove(&revoke.resource);
            }
        }
        for grant in &plan.grants {
            self.revision += 1;
            self.holdings.insert(
                grant.resource.clone(),
                Held {
                    holder: Holder::Member(grant.member.clone()),
                    revision: self.revision,
                },
            );
            self.granted
                .entry(grant.resource.clone())
                .or_default()
                .push(grant.member.clone());
        }
        self.most_in_flight = self.most_in_flight.max(self.in_flight());
        // Members release what moved away from them, unless they hang.
        let mut released = false;
        for r in self.assignment.deadlines.keys() {
            let holder = match self.holdings.get(r).map(|h| &h.holder) {
                Some(Holder::Member(m)) => m.clone(),
                _ => continue,
            };
            if !self.hung.contains(&holder) {
                self.holdings.remove(r);
                released = true;
            }
        }
        if idle && !released {
            if let Some(at) = plan.next_deadline {
                self.now = at;
                return true;
            }
            return false;
        }
        true
    }

    /// Steps until nothing changes; how many steps it took.
    pub(super) fn settle(&mut self) -> usize {
        for steps in 0..10_000 {
            if !self.step() {
                return steps;
            }
        }
        panic!("no rest after 10,000 steps: {:?}", self.assignment);
    }

    pub(super) fn in_flight(&self) -> usize {
        self.holdings
            .iter()
            .filter(|(r, h)| match &h.holder {
                Holder::Member(m) => self
                    .assignment
                    .targets
                    .get(*r)
                    .is_some_and(|t| t != m && self.live(m) != Some(State::Evicted)),
                _ => false,
            })
            .count()
    }

    pub(super) fn live(&self, name: &str) -> Option<State> {
        self.members
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.state)
    }

    /// Resources held, per member.
    pub(super) fn counts(&self) -> BTreeMap<String, usize> {
        let mut counts: BTreeMap<String, usize> =
            self.members.iter().map(|m| (m.name.clone(), 0)).collect();
        for held in self.holdings.values() {
            if let Holder::Member(m) = &held.holder {
                *counts.entry(m.clone()).or_default() += 1;
            }
        }
        counts
    }

    /// A member's session ends: its grants end with it.
    pub(super) fn dies(&mut self, name: &str) {
        self.members.retain(|m| m.name != name);
        self.holdings
            .retain(|_, h| h.holder != Holder::Member(name.to_owned()));
    }

    pub(super) fn set_state(&mut self, name: &str, state: State) {
        for m in self.members.iter_mut().filter(|m| m.name == name) {
            m.state = state;
        }
    }

    /// Forgets who was granted what (to count the moves of what comes next).
    pub(super) fn reset_history(&mut self) {
        self.granted.clear();
        self.most_in_flight = 0;
    }

    /// Resources granted to another member than before (the moves since the last reset),
    /// and whether any resource was granted more than once.
    pub(super) fn moves(&self, before: &BTreeMap<String, Held>) -> (usize, usize) {
        let moved = self
            .granted
            .iter()
            .filter(|(r, to)| match before.get(*r).map(|h| &h.holder) {
                Some(Holder::Member(m)) => to.last() != Some(m),
                _ => true,
            })
            .count();
        let twice = self.granted.values().filter(|to| to.len() > 1).count();
        (moved, twice)
    }

    /// Every resource of the spec held by exactly one live member, and the assignment saying
    /// so.
    pub(super) fn assert_covered(&self) {
        for r in &self.spec.resources {
            match self.holdings.get(r).map(|h| &h.holder) {
                Some(Holder::Member(m)) => {
                    assert!(self.live(m).is_some(), "{r} held by a dead member {m}");
                    assert_eq!(self.assignment.targets.get(r), Some(m), "{r}");
                }
                other => panic!("{r} not held by a member at rest: {other:?}"),
            }
        }
        assert!(self.assignment.deadlines.is_empty(), "{self:?}");
    }
}

pub(super) fn assert_balanced(world: &World) {
    let counts: Vec<usize> = world
        .members
        .iter()
        .filter(|m| m.eligible())
        .map(|m| world.counts()[&m.name])
        .collect();
    if let (Some(lo), Some(hi)) = (counts.iter().min(), counts.iter().max()) {
        assert!(hi - lo <= 1, "unbalanced: {counts:?}");
    }
}
