//! The decision's promises as properties over generated fleets and changes.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::world::*;
use super::*;

/// A fleet of up to 60 resources and 8 members, at rest after a cold start.
fn rested() -> impl Strategy<Value = World> {
    (0usize..60, 1usize..8, 1usize..20, any::<bool>()).prop_map(|(n, m, max_moves, weighted)| {
        let mut ms = members(m);
        if weighted {
            for (i, m) in ms.iter_mut().enumerate() {
                m.weight = 1 + (i as u32 % 3);
            }
        }
        let mut world = World::new(spec(n, max_moves), ms);
        world.settle();
        world
    })
}

/// What can happen to a fleet at rest.
#[derive(Debug, Clone)]
enum Change {
    Join(u32),
    Die(usize),
    Drain(usize),
    Evict(usize),
    Hang(usize),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        (1u32..4).prop_map(Change::Join),
        (0usize..8).prop_map(Change::Die),
        (0usize..8).prop_map(Change::Drain),
        (0usize..8).prop_map(Change::Evict),
        (0usize..8).prop_map(Change::Hang),
    ]
}

impl World {
    fn apply(&mut self, change: &Change) {
        let pick = |world: &World, i: usize| {
            (!world.members.is_empty()).then(|| world.members[i % world.members.len()].name.clone())
        };
        match change {
            Change::Join(weight) => {
                let name = format!("j{:03}", self.members.len() + self.revision as usize);
                let mut m = member(&name);
                m.weight = *weight;
                self.members.push(m);
            }
            Change::Die(i) => {
                if let Some(name) = pick(self, *i) {
                    self.dies(&name);
                }
            }
            Change::Drain(i) => {
                if let Some(name) = pick(self, *i) {
                    self.set_state(&name, State::Draining);
                }
            }
            Change::Evict(i) => {
                if let Some(name) = pick(self, *i) {
                    self.set_state(&name, State::Evicted);
                }
            }
            Change::Hang(i) => {
                if let Some(name) = pick(self, *i) {
                    self.hung.insert(name);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// At rest every resource is held by exactly one member, its target; unweighted shares
    /// differ by at most one, weighted ones are the weight's share rounded.
    #[test]
    fn at_rest_every_resource_is_held_and_shares_are_fair(world in rested()) {
        world.assert_covered();
        let eligible: Vec<&Member> = world.members.iter().filter(|m| m.eligible()).collect();
        let total: u32 = eligible.iter().map(|m| m.weight).sum();
        let counts = world.counts();
        for m in &eligible {
            let exact = world.spec.resources.len() as f64 * f64::from(m.weight) / f64::from(total);
            let got = counts[&m.name] as f64;
            prop_assert!((got - exact).abs() < 1.0, "{} has {got}, exact share {exact}", m.name);
        }
        if eligible.iter().all(|m| m.weight == 1) {
            assert_balanced(&world);
        }
    }

    /// Deciding again at rest changes nothing: the rest is a fixpoint.
    #[test]
    fn rest_is_a_fixpoint(world in rested()) {
        let plan = world.decide();
        prop_assert!(plan.is_idle(&world.assignment), "{plan:?}");
    }

    /// Whatever happens to a fleet at rest, it comes to rest again, covered and fair, with no
    /// resource granted twice, never more hand-offs in flight than the budget allows, nothing
    /// granted to a member that may not take it (checked in `step`), and — for an unweighted
    /// join or a death — exactly the newcomer's share or the dead member's holdings moved.
    #[test]
    fn after_any_change_the_fleet_rests_again_moving_each_resource_at_most_once(
        mut world in rested(),
        change in change(),
    ) {
        let before = world.holdings.clone();
        let members_before = world.members.clone();
        world.reset_history();
        world.apply(&change);
        world.settle();
        world.assert_covered_unless_nobody_may_hold();
        let (moved, twice) = world.moves(&before);
        prop_assert_eq!(twice, 0, "a resource moved twice: {:?}", world.granted);
        prop_assert!(
            world.most_in_flight <= world.spec.max_moves,
            "{} hand-offs in flight, budget {}", world.most_in_flight, world.spec.max_moves
        );
        let unweighted = members_before.iter().all(|m| m.weight == 1);
        match change {
            Change::Join(1) if unweighted => {
                let n = world.spec.resources.len();
                let m = members_before.len() + 1;
                let share = world.counts().into_iter().filter(|(k, _)| k.starts_with('j')).map(|(_, c)| c).sum::<usize>();
                prop_assert!(share == n / m || share == n / m + 1, "{share} of {n} over {m}");
                prop_assert_eq!(moved, share);
            }
            Change::Die(_) if !members_before.is_empty() && unweighted => {
                let lost = before.len() - world.holdings.len().min(before.len());
                let dead: BTreeSet<&String> = members_before.iter().map(|m| &m.name)
                    .filter(|n| world.live(n).is_none()).collect();
                let held_by_dead = before.values().filter(|h| matches!(&h.holder, Holder::Member(m) if dead.contains(m))).count();
                let _ = lost;
                if world.members.iter().any(Member::eligible) {
                    prop_assert_eq!(moved, held_by_dead);
                }
            }
            _ => {}
        }
    }

    /// Replicas that read the same state write the same assignment, whatever order the members
    /// come in, and deciding again on it (nothing else changed) gives the same plan.
    #[test]
    fn the_decision_is_deterministic_and_idempotent(
        mut world in rested(),
        change in change(),
        steps in 0usize..4,
        rotate in 0usize..8,
    ) {
        world.apply(&change);
        for _ in 0..steps {
            world.step();
        }
        let plan = world.decide();
        let mut shuffled = world.clone();
        if !shuffled.members.is_empty() {
            let k = rotate % shuffled.members.len();
            shuffled.members.rotate_left(k);
            shuffled.members.reverse();
        }
        prop_assert_eq!(&shuffled.decide(), &plan);
        let mut again = world.clone();
        again.assignment = plan.assignment.clone();
        let second = again.decide();
        prop_assert_eq!(&second.assignment, &plan.assignment);
        prop_assert_eq!(&second.grants, &plan.grants);
        prop_assert_eq!(&second.revokes, &plan.revokes);
    }
}

impl World {
    /// [`World::assert_covered`] when some member may hold resources; else only that nothing
    /// is granted to anyone who may not hold it.
    fn assert_covered_unless_nobody_may_hold(&self) {
        if self.members.iter().any(Member::eligible) {
            self.assert_covered();
        }
    }
}
