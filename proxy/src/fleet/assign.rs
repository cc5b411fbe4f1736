//! The decision of a fleet, and nothing else: given what etcd holds — the spec, the members, the
//! assignment last written and who holds each resource — [`next`] answers the assignment to
//! write and the grants and revocations to make. It reads no clock (the time comes in as
//! `now_ms`) and does no I/O, so every replica that reads the same state decides the same thing,
//! and a model checker can call it as the proxy does.
//!
//! What it promises (each an example in `assign/tests.rs` and a property in
//! `assign/properties.rs`, both driven through the simulated fleet of `assign/world.rs`):
//! - **Balanced**: at rest, every eligible member's share is its weight's, rounded: unweighted
//!   counts differ by at most one.
//! - **Sticky**: a resource stays where the last assignment put it unless its member is gone or
//!   over its share; a join moves only what the newcomer gets (about N/(M+1)), a leave or a
//!   death only what the leaver held.
//! - **Revoke before grant**: a resource is granted only when nobody holds it; one held by a
//!   member it is no longer assigned to is that member's to release by its deadline, then
//!   revoked.
//! - **Churn budget**: at most `max_moves` hand-offs (resources held by a live member and
//!   assigned to another) are in flight; what exceeds it waits, kept by its holder.
//! - **Draining and evicted members get nothing new**; an evicted member's grants end at once.
//! - **Deterministic and idempotent**: the same state gives the same plan, whatever order the
//!   members come in, and deciding again on the plan's own assignment (nothing else changed)
//!   gives it again — so replicas racing to write it write the same bytes.

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod world;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// A member's standing in its fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    /// Takes its share.
    Active,
    /// Hands off what it holds and takes nothing new.
    Draining,
    /// Removed by an operator: its grants end at once and it takes nothing.
    Evicted,
}

/// What the fleet wants shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spec {
    /// The resources, each once.
    pub(crate) resources: BTreeSet<String>,
    /// How long a member has to release a resource moved away from it.
    pub(crate) drain_ms: u64,
    /// Most hand-offs in flight at once.
    pub(crate) max_moves: usize,
}

/// A live member, as the decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// Its name in the fleet.
    pub(crate) name: String,
    /// Its share's weight (at least 1).
    pub(crate) weight: u32,
    /// Its standing.
    pub(crate) state: State,
    /// Whether its principal may acquire every resource of the fleet (always, without
    /// authentication). A member that may not is given nothing, as a draining one.
    pub(crate) entitled: bool,
}

impl Member {
    fn eligible(&self) -> bool {
        self.state == State::Active && self.entitled && self.weight > 0
    }
}

/// Who should hold what, and until when a moved resource's holder may keep it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Assignment {
    /// Resource → the member it is assigned to.
    pub(crate) targets: BTreeMap<String, String>,
    /// Resource → the wall-clock instant (Unix ms) by which its holder, a member it is no
    /// longer assigned to, must have released it. Advice for liveness only: safety comes from
    /// granting only what nobody holds, and from the token.
    pub(crate) deadlines: BTreeMap<String, u64>,
}

/// Who holds a resource's ownership key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// A grant of this fleet on the session of this member.
    Member(String),
    /// A grant of this fleet on a session that is no member's any more.
    Orphan,
    /// A grant the fleet did not make: never touched, the resource waits for its end.
    Foreign,
}

/// A resource's current grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    /// Whose it is.
    pub(crate) holder: Holder,
    /// Its create revision (its token): a revocation deletes exactly this grant.
    pub(crate) revision: i64,
}

/// What the decision reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Input<'a> {
    /// The spec.
    pub(crate) spec: &'a Spec,
    /// The live members, in any order, names unique.
    pub(crate) members: &'a [Member],
    /// The assignment last written.
    pub(crate) current: &'a Assignment,
    /// The grants of the spec's resources and of the current assignment's (absent: free).
    pub(crate) holdings: &'a BTreeMap<String, Held>,
    /// Now, Unix ms (only compared with the deadlines).
    pub(crate) now_ms: u64,
}

/// A grant to make: the resource is free and assigned to the member.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Grant {
    /// The resource.
    pub(crate) resource: String,
    /// The member to grant it to.
    pub(crate) member: String,
}

/// Why a grant is revoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Why {
    /// Its holder did not release it by its hand-off deadline.
    Deadline,
    /// Its holder was evicted.
    Evicted,
    /// The resource left the fleet.
    Removed,
    /// Its session is no member's any more.
    Orphan,
}

impl Why {
    /// Its name in the audit log and the metrics.
    pub(crate) fn slug(self) -> &'static str {
        match self {
            Why::Deadline => "deadline",
            Why::Evicted => "evicted",
            Why::Removed => "removed",
            Why::Orphan => "orphan",
        }
    }
}

/// A grant to end: the one created at `revision`, not whatever holds the resource later.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Revoke {
    /// The resource.
    pub(crate) resource: String,
    /// The grant's create revision.
    pub(crate) revision: i64,
    /// Why.
    pub(crate) why: Why,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The assignment to write (if it differs from the current one).
    pub(crate) assignment: Assignment,
    /// Free resources to grant, in resource order.
    pub(crate) grants: Vec<Grant>,
    /// Grants to end, in resource order.
    pub(crate) revokes: Vec<Revoke>,
    /// The earliest deadline still in the future: decide again then.
    pub(crate) next_deadline: Option<u64>,
}

#[cfg(test)]
impl Plan {
    /// Whether the plan asks for nothing but (perhaps) waiting for a deadline.
    pub(crate) fn is_idle(&self, current: &Assignment) -> bool {
        self.grants.is_empty() && self.revokes.is_empty() && self.assignment == *current
    }
}

/// Decides. See the module's documentation for what the answer promises.
pub(crate) fn next(input: &Input<'_>) -> Plan {
    let roster = Roster::new(input.members);
    let holders = holders(input, &roster);
    let mut book = Book::initial(input, &roster, &holders);
    let quotas = quotas(input.spec.resources.len(), &roster, &book.counts);
    let mut budget = input
        .spec
        .max_moves
        .saturating_sub(book.in_flight(&holders, &roster));
    book.shed(&quotas, &holders);
    book.fill(input.spec, &roster, &quotas, &holders, &mut budget);
    settle(input, &roster, &book)
}

/// The members sorted by name (their index is their rank in every tie).
struct Roster<'a> {
    members: Vec<&'a Member>,
    index: BTreeMap<&'a str, usize>,
}

impl<'a> Roster<'a> {
    fn new(members: &'a [Member]) -> Self {
        let mut members: Vec<&Member> = members.iter().collect();
        members.sort_by(|a, b| a.name.cmp(&b.name));
        members.dedup_by(|a, b| a.name == b.name);
        let index = members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.name.as_str(), i))
            .collect();
        Self { members, index }
    }

    fn eligible(&self, i: usize) -> bool {
        self.members[i].eligible()
    }

    fn evicted(&self, i: usize) -> bool {
        self.members[i].state == State::Evicted
    }
}

/// The live member holding each resource, by index (resources held otherwise, or free, are
/// absent).
fn holders<'a>(input: &Input<'a>, roster: &Roster<'_>) -> BTreeMap<&'a str, usize> {
    input
        .holdings
        .iter()
        .filter_map(|(r, held)| match &held.holder {
            Holder::Member(name) => roster.index.get(name.as_str()).map(|&i| (r.as_str(), i)),
            Holder::Orphan | Holder::Foreign => None,
        })
        .collect()
}

/// The assignment being decided: resource → member index, with each member's count.
struct Book<'a> {
    targets: BTreeMap<&'a str, usize>,
    counts: Vec<usize>,
}

impl<'a> Book<'a> {
    /// Where the last assignment put each resource, if that member may still have it; else its
    /// holder, if that member may.
    fn initial(input: &Input<'a>, roster: &Roster<'_>, holders: &BTreeMap<&str, usize>) -> Self {
        let mut book = Book {
            targets: BTreeMap::new(),
            counts: vec![0; roster.members.len()],
        };
        for r in &input.spec.resources {
            let assigned = input
                .current
                .targets
                .get(r)
                .and_then(|m| roster.index.get(m.as_str()).copied())
                .filter(|&i| roster.eligible(i));
            let held = holders
                .get(r.as_str())
                .copied()
                .filter(|&i| roster.eligible(i));
            if let Some(i) = assigned.or(held) {
                book.assign(r, i);
            }
        }
        book
    }

    fn assign(&mut self, resource: &'a str, member: usize) {
        if let Some(old) = self.targets.insert(resource, member) {
            self.counts[old] -= 1;
        }
        self.counts[member] += 1;
    }

    fn unassign(&mut self, resource: &str) {
        if let Some(old) = self.targets.remove(resource) {
            self.counts[old] -= 1;
        }
    }

    /// Hand-offs under way: resources held by a live, not evicted member and assigned to
    /// another.
    fn in_flight(&self, holders: &BTreeMap<&str, usize>, roster: &Roster<'_>) -> usize {
        self.targets
            .iter()
            .filter(|(r, &t)| {
                holders
                    .get(**r)
                    .is_some_and(|&h| h != t && !roster.evicted(h))
            })
            .count()
    }

    /// Takes from each member what exceeds its quota: first what it does not hold (no
    /// hand-off), then what it holds, the last names first. What it holds is only put up for
    /// moving here: [`Book::fill`] moves it if the budget allows, else gives it back.
    fn shed(&mut self, quotas: &[usize], holders: &BTreeMap<&str, usize>) {
        for (m, &quota) in quotas.iter().enumerate() {
            if self.counts[m] <= quota {
                continue;
            }
            let mut own: Vec<(bool, &'a str)> = self
                .targets
                .iter()
                .filter(|(_, &t)| t == m)
                .map(|(r, _)| (holders.get(*r) == Some(&m), *r))
                .collect();
            // Unheld first; among each, the last names first.
            own.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(a.1)));
            let excess = self.counts[m] - quota;
            for (_, r) in own.into_iter().take(excess) {
                self.unassign(r);
            }
        }
    }

    /// Gives every unassigned resource a member: its holder if that member may take more, else
    /// the member furthest below its quota (lowest name on a tie). A resource held by a live
    /// member that must move costs the budget; without budget it stays with its holder.
    fn fill(
        &mut self,
        spec: &'a Spec,
        roster: &Roster<'_>,
        quotas: &[usize],
        holders: &BTreeMap<&str, usize>,
        budget: &mut usize,
    ) {
        let unassigned: Vec<&'a str> = spec
            .resources
            .iter()
            .map(String::as_str)
            .filter(|r| !self.targets.contains_key(r))
            .collect();
        let mut rest = Vec::new();
        for r in unassigned {
            match holders.get(r) {
                Some(&h) if roster.eligible(h) && self.counts[h] < quotas[h] => self.assign(r, h),
                _ => rest.push(r),
            }
        }
        for r in rest {
            let holder = holders.get(r).copied().filter(|&h| !roster.evicted(h));
            if holder.is_some() && *budget == 0 {
                // Deferred: kept by its (draining) holder until a hand-off may start.
                if let Some(h) = holder {
                    self.assign(r, h);
                }
                continue;
            }
            let neediest = (0..quotas.len())
                .filter(|&m| self.counts[m] < quotas[m])
                .max_by(|&a, &b| {
                    (quotas[a] - self.counts[a])
                        .cmp(&(quotas[b] - self.counts[b]))
                        .then(b.cmp(&a))
                });
            match (neediest, holder) {
                (Some(m), _) => {
                    if holder.is_some() {
                        *budget -= 1;
                    }
                    self.assign(r, m);
                }
                // Nobody may take it: its live holder keeps it.
                (None, Some(h)) => self.assign(r, h),
                (None, None) => {}
            }
        }
    }
}

/// Each member's share of `n` resources: its weight's, rounded down, and one more for as many
/// as the rounding left over — those with the largest remainders, then the furthest over their
/// rounded-down share already (so nothing moves for the sake of the rounding), then the lowest
/// names. Members that may take nothing get 0.
fn quotas(n: usize, roster: &Roster<'_>, counts: &[usize]) -> Vec<usize> {
    let mut quotas = vec![0; roster.members.len()];
    let eligible: Vec<usize> = (0..roster.members.len())
        .filter(|&i| roster.eligible(i))
        .collect();
    let total: u128 = eligible
        .iter()
        .map(|&i| u128::from(roster.members[i].weight))
        .sum();
    if total == 0 {
        return quotas;
    }
    let n128 = n as u128;
    let mut remainders = Vec::with_capacity(eligible.len());
    let mut given = 0;
    for &i in &eligible {
        let exact = n128 * u128::from(roster.members[i].weight);
        // At most `n`: it fits.
        quotas[i] = usize::try_from(exact / total).unwrap_or(n);
        given += quotas[i];
        remainders.push((exact % total, i));
    }
    // How far over its rounded-down share each member stands now: after a decision, exactly
    // the members given one more stand one over, so the next decision gives it to them again.
    let surplus = |i: usize| counts[i] as i128 - quotas[i] as i128;
    remainders.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then(surplus(b.1).cmp(&surplus(a.1)))
            .then(a.1.cmp(&b.1))
    });
    for &(_, i) in remainders.iter().take(n.saturating_sub(given)) {
        quotas[i] += 1;
    }
    quotas
}

/// The plan of a decided book: deadlines for the resources held by a member they are no longer
/// assigned to, revocations of what must end now, grants of what is free.
fn settle(input: &Input<'_>, roster: &Roster<'_>, book: &Book<'_>) -> Plan {
    let targets: BTreeMap<String, String> = book
        .targets
        .iter()
        .map(|(r, &m)| ((*r).to_owned(), roster.members[m].name.clone()))
        .collect();
    let mut deadlines = BTreeMap::new();
    let mut revokes = Vec::new();
    for (r, held) in input.holdings {
        let revoke = |why| Revoke {
            resource: r.clone(),
            revision: held.revision,
            why,
        };
        let holder = match &held.holder {
            Holder::Foreign => continue,
            Holder::Orphan => {
                revokes.push(revoke(Why::Orphan));
                continue;
            }
            Holder::Member(name) => match roster.index.get(name.as_str()) {
                Some(&i) => i,
                None => {
                    revokes.push(revoke(Why::Orphan));
                    continue;
                }
            },
        };
        if !input.spec.resources.contains(r) {
            revokes.push(revoke(Why::Removed));
        } else if roster.evicted(holder) {
            revokes.push(revoke(Why::Evicted));
        } else if book.targets.get(r.as_str()) != Some(&holder) {
            let due = input
                .current
                .deadlines
                .get(r)
                .copied()
                .unwrap_or_else(|| input.now_ms.saturating_add(input.spec.drain_ms));
            deadlines.insert(r.clone(), due);
            if due <= input.now_ms {
                revokes.push(revoke(Why::Deadline));
            }
        }
    }
    let grants = targets
        .iter()
        .filter(|(r, _)| !input.holdings.contains_key(*r))
        .map(|(r, m)| Grant {
            resource: r.clone(),
            member: m.clone(),
        })
        .collect();
    let next_deadline = deadlines
        .values()
        .copied()
        .filter(|&d| d > input.now_ms)
        .min();
    Plan {
        assignment: Assignment { targets, deadlines },
        grants,
        revokes,
        next_deadline,
    }
}
