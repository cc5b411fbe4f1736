//! The fleet decision, for the model checker (`model/`) only: feature `model`, which nothing else
//! turns on. [`next`] is a thin door onto [`assign::next`], the one every replica calls: it names
//! the model's members and resources by index, builds the decision's `Input` from them and reads
//! its `Plan` back, so the checker explores the server's own decision.

use std::collections::{BTreeMap, BTreeSet};

use super::assign::{self, Assignment, Held, Holder, Member, Spec, State};

/// A member's standing as the service sees it: no live session, or a member in one of its states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Standing {
    /// No live session: never joined, left, or its session lapsed.
    Absent,
    /// Takes its share.
    Active,
    /// Hands off what it holds, takes nothing new.
    Draining,
    /// Removed by an operator.
    Evicted,
}

/// What the decision reads, by index: resource `r` is named `r{r}`, member `m` `m{m}`.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// Each member's standing.
    pub members: &'a [Standing],
    /// Resource → the member the assignment last written gives it to.
    pub targets: &'a [Option<u8>],
    /// Resource → the deadline of its hand-off in that assignment.
    pub deadlines: &'a [Option<u64>],
    /// Resource → the member whose session holds its grant (a member that is absent: an
    /// orphaned grant).
    pub holders: &'a [Option<u8>],
    /// How long a holder has to release a resource moved away from it.
    pub drain: u64,
    /// Now, in the deadlines' unit.
    pub now: u64,
}

/// What the decision answers, by index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Plan {
    /// The assignment to write: resource → member.
    pub targets: Vec<Option<u8>>,
    /// Its hand-off deadlines.
    pub deadlines: Vec<Option<u64>>,
    /// (resource, member): free resources to grant.
    pub grants: Vec<(u8, u8)>,
    /// (resource, holder): grants to end.
    pub revokes: Vec<(u8, u8)>,
}

fn resource(r: usize) -> String {
    format!("r{r}")
}

fn member(m: u8) -> String {
    format!("m{m}")
}

/// Indexes back from names this door made (`None` for anything else).
fn index(name: &str, prefix: char) -> Option<u8> {
    name.strip_prefix(prefix)?.parse().ok()
}

/// [`assign::next`] on the model's state: unit weights, every member entitled, no churn budget
/// (the model's bounds are smaller than any budget).
pub fn next(input: &Input<'_>) -> Plan {
    let n = input.targets.len();
    let spec = Spec {
        resources: (0..n).map(resource).collect::<BTreeSet<_>>(),
        drain_ms: input.drain,
        max_moves: n,
    };
    let members: Vec<Member> = (0u8..)
        .zip(input.members)
        .filter_map(|(m, standing)| {
            let state = match standing {
                Standing::Absent => return None,
                Standing::Active => State::Active,
                Standing::Draining => State::Draining,
                Standing::Evicted => State::Evicted,
            };
            Some(Member {
                name: member(m),
                weight: 1,
                state,
                entitled: true,
            })
        })
        .collect();
    let current = Assignment {
        targets: by_resource(input.targets, |&m| member(m)),
        deadlines: by_resource(input.deadlines, |&d| d),
    };
    let holdings: BTreeMap<String, Held> = by_resource(input.holders, |&m| Held {
        holder: Holder::Member(member(m)),
        revision: 1,
    });
    let plan = assign::next(&assign::Input {
        spec: &spec,
        members: &members,
        current: &current,
        holdings: &holdings,
        now_ms: input.now,
    });
    let mut out = Plan {
        targets: vec![None; n],
        deadlines: vec![None; n],
        grants: Vec::new(),
        revokes: Vec::new(),
    };
    for (r, m) in &plan.assignment.targets {
        if let Some(r) = index(r, 'r').filter(|&r| usize::from(r) < n) {
            out.targets[usize::from(r)] = index(m, 'm');
        }
    }
    for (r, &d) in &plan.assignment.deadlines {
        if let Some(r) = index(r, 'r').filter(|&r| usize::from(r) < n) {
            out.deadlines[usize::from(r)] = Some(d);
        }
    }
    out.grants = plan
        .grants
        .iter()
        .filter_map(|g| Some((index(&g.resource, 'r')?, index(&g.member, 'm')?)))
        .collect();
    out.revokes = plan
        .revokes
        .iter()
        .filter_map(|v| {
            let r = index(&v.resource, 'r')?;
            Some((r, (*input.holders.get(usize::from(r))?)?))
        })
        .collect();
    out
}

/// The resources with a value, by name.
fn by_resource<T, U>(values: &[Option<T>], f: impl Fn(&T) -> U) -> BTreeMap<String, U> {
    values
        .iter()
        .enumerate()
        .filter_map(|(r, v)| Some((resource(r), f(v.as_ref()?))))
        .collect()
}
