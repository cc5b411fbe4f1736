//! Model 3: fleet hand-off, against the contract of DESIGN §5.5: members join, leave, die,
//! drain, are evicted and rejoin; replicas race to decide and write the next assignment (each
//! from what it read, maybe stale) and to carry out its grants and revocations; a member told to
//! hand a resource off releases it, or is revoked at the deadline. Grants are etcd's
//! create-if-absent on the member's session, guarded as the server guards them (by the member's
//! record and the assignment as the decision read or wrote them); revocations are a
//! compare-and-delete on the grant's revision.
//!
//! Safety: a resource is never granted while another grant of it lives. Stability: no resource
//! moves twice for one membership change. Liveness (fair scheduling, the changes over): with an
//! eligible member alive, every resource ends up held by one.
//!
//! The decision is the server's own (`proxy/src/fleet/assign.rs`, `next`, pure), called through
//! the door `lease_proxy::fleet_model`: the model builds the door's `Input` from its state (members
//! as the service [`sees`] them, deadlines in the door's unit, here ticks) and carries out its
//! `Plan` as it comes.
//!
//! `end.rs` is the fleet's end (`DELETE`: its keys, then its grants from the index, and a
//! replica's driver finishing an end left half-way); `properties.rs` what the checker holds the
//! model to.

use std::fmt::Write as _;

use lease_proxy::fleet_model::{self as door, Plan};
use stateright::{Model, Property};

mod end;
mod properties;

pub use end::Delete;

/// A member's standing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Standing {
    /// Not a member (never joined, left, or its session lapsed).
    Absent,
    /// Takes its share.
    Active,
    /// Hands off what it holds, takes nothing new.
    Draining,
    /// Removed by an operator.
    Evicted,
    /// Its process died: its session lapses at this tick.
    Dead(u8),
}

/// A member's standing as the service sees it: a member whose process died is still a member
/// to it until its session lapses (it cannot tell a dead process from a slow one).
pub fn sees(standing: Standing) -> door::Standing {
    match standing {
        Standing::Absent => door::Standing::Absent,
        Standing::Active | Standing::Dead(_) => door::Standing::Active,
        Standing::Draining => door::Standing::Draining,
        Standing::Evicted => door::Standing::Evicted,
    }
}

/// A change to the protocol or to the decision, which the checker must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// Grants overwrite the ownership key instead of creating it only if absent, and the
    /// decision grants what it assigns even while another member holds it: the assignment
    /// (advice) is taken for the authority. The campaign's negative control
    /// `no-revoke-before-grant` makes the same two changes in the server.
    GrantWithoutCreateIfAbsent,
    /// The decision is not sticky: it deals the resources out afresh each time, by order.
    NotSticky,
    /// A replica's grants are not guarded by the assignment and the member's record it decided
    /// on: a stale plan grants after another replica's decision or a member's drain.
    UnguardedGrants,
    /// The fleet's end releases the grants as its snapshot read them, before its delete,
    /// instead of those there after the delete: a grant made in between outlives the fleet.
    EndReleasesWhatItRead,
    /// A `DELETE` that finds the fleet gone answers at once, without releasing what an end
    /// under way (or one whose replica stopped) has not released yet.
    DeleteAnswersAFleetGone,
    /// No replica finishes an end another began: an end whose replica dies after its delete
    /// leaves the fleet's grants held.
    EndLeftToItsReplica,
}

/// The model's bounds.
#[derive(Debug, Clone)]
pub struct Fleet {
    /// Resources.
    pub resources: u8,
    /// Members (by index).
    pub members: u8,
    /// Replicas deciding.
    pub replicas: u8,
    /// Membership changes.
    pub changes: u8,
    /// Changes happen before this tick.
    pub settle_from: u8,
    /// The drain deadline and the session TTL.
    pub drain: u8,
    /// How many `DELETE /v1/fleets/{fleet}` requests race to end the fleet (0: it never ends).
    pub deletes: u8,
    /// Whether a replica serving a `DELETE` may die between its delete and its releases.
    pub end_dies: bool,
    /// The broken variant, if any.
    pub mutation: Option<Mutation>,
}

impl Fleet {
    /// The test bounds: 2 resources, 2 members, 2 replicas, 2 changes.
    pub fn new() -> Self {
        Self {
            resources: 2,
            members: 2,
            replicas: 2,
            changes: 2,
            settle_from: 2,
            drain: 1,
            deletes: 0,
            end_dies: false,
            mutation: None,
        }
    }

    fn horizon(&self) -> u8 {
        self.settle_from + 2 * self.drain + 1
    }

    /// The server's decision (`proxy/src/fleet/assign.rs`, `next`, through the door) on `s`
    /// with these targets and holders.
    fn next(&self, s: &State, targets: &[Option<u8>], holders: &[Option<u8>]) -> Plan {
        let members: Vec<door::Standing> = s.members.iter().copied().map(sees).collect();
        door::next(&door::Input {
            members: &members,
            targets,
            deadlines: &s.deadlines,
            holders,
            drain: self.drain.into(),
            now: s.now.into(),
        })
    }

    /// What a replica reading `s` decides.
    fn decide(&self, s: &State) -> Plan {
        let holders: Vec<Option<u8>> = s.holders.iter().map(|h| h.map(|(m, _)| m)).collect();
        let mut plan = self.next(s, &s.targets, &holders);
        if self.mutation == Some(Mutation::GrantWithoutCreateIfAbsent) {
            for (r, target) in plan.targets.iter().enumerate() {
                if let (Some(m), Some(h)) = (*target, holders[r]) {
                    if m != h {
                        plan.grants.push((r as u8, m));
                    }
                }
            }
        }
        if self.mutation == Some(Mutation::NotSticky) {
            let active: Vec<u8> = (0..s.members.len() as u8)
                .filter(|&m| s.members[m as usize] == Standing::Active)
                .collect();
            if !active.is_empty() {
                let offset = s.now as usize;
                let dealt: Vec<Option<u8>> = (0..s.targets.len())
                    .map(|r| Some(active[(r + offset) % active.len()]))
                    .collect();
                plan = self.next(s, &dealt, &vec![None; dealt.len()]);
                plan.grants.retain(|&(r, _)| holders[r as usize].is_none());
                for r in 0..dealt.len() {
                    if let Some(h) = holders[r] {
                        if dealt[r] != Some(h) {
                            plan.revokes.push((r as u8, h));
                        }
                    }
                }
            }
        }
        plan
    }
}

impl Default for Fleet {
    fn default() -> Self {
        Self::new()
    }
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Time.
    pub now: u8,
    /// Changes left.
    pub changes: u8,
    /// Members.
    pub members: Vec<Standing>,
    /// The assignment in etcd.
    pub targets: Vec<Option<u8>>,
    /// Its deadlines (ticks, in the door's unit).
    pub deadlines: Vec<Option<u64>>,
    /// Ownership keys: (member, revision).
    pub holders: Vec<Option<(u8, u8)>>,
    /// etcd's revision.
    pub rev: u8,
    /// The assignment's revision: it moves when a decision writes a different assignment.
    pub assignment_rev: u8,
    /// Each member record's revision: it moves when the record is written (join, drain,
    /// evict) or goes (leave, a lapsed session).
    pub member_revs: Vec<u8>,
    /// Each replica's plan being carried out: grants and revokes left.
    pub work: Vec<Option<Work>>,
    /// Moves of each resource since the last membership change.
    pub moves: Vec<u8>,
    /// The last holder of each resource.
    pub last: Vec<Option<u8>>,
    /// A grant was made while another lived.
    pub double_grant: bool,
    /// A grant was made to a member whose process had died (its session not yet lapsed).
    pub granted_to_dead: bool,
    /// The fleet's keys are deleted.
    pub ended: bool,
    /// Its end's key (`{prefix}fleet-ending/{fleet}`) is there: the end is not finished.
    pub ending: bool,
    /// Each `DELETE` request's progress.
    pub deletes: Vec<Delete>,
}

/// A replica's plan being carried out, with what its grants are guarded by: the revisions of
/// the assignment and of the member records when it decided
/// (`proxy/src/fleet/reconcile.rs`, `grant_one`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Work {
    /// Grants and revokes left.
    pub plan: Plan,
    /// The assignment's revision it read or wrote.
    pub assignment: u8,
    /// The member records' revisions it read.
    pub members: Vec<u8>,
}

/// One step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time passes; dead members' sessions lapse.
    Tick,
    /// A member joins (or rejoins).
    Join(u8),
    /// A member leaves (its session closed: its grants end).
    Leave(u8),
    /// A member's process dies (its session lapses after the TTL).
    Die(u8),
    /// A member is drained.
    Drain(u8),
    /// A member is evicted (its grants end at once).
    Evict(u8),
    /// A replica reads etcd, decides, and writes the assignment (compare-and-set).
    Decide(u8),
    /// A replica carries out its plan's next grant or revocation (from what it read then).
    Carry(u8),
    /// A live member releases a resource assigned away from it.
    Release(u8, u8),
    /// A `DELETE` reads the fleet (`proxy/src/fleet/spec.rs`, `delete`).
    EndRead(u8),
    /// A `DELETE` that found the fleet deletes its keys and writes its end's key, guarded by
    /// the spec read (`spec.rs`, `end_keys`); it reads again if the guard fails.
    EndDelete(u8),
    /// A `DELETE` releases what the fleet's index names, deletes its end's key (`spec.rs`,
    /// `release_ended`), and answers.
    EndRelease(u8),
    /// The replica serving a `DELETE` dies after its delete, before its releases.
    EndDies(u8),
    /// A replica's driver finishes an end that is not finished (`spec.rs`, `finish_ends`).
    FinishEnd,
}

impl Fleet {
    /// A membership change to `m`'s record: the moves count again.
    fn changed(&self, s: &mut State, m: u8) {
        s.changes -= 1;
        s.moves = vec![0; s.moves.len()];
        s.member_revs[m as usize] += 1;
    }

    /// `replica` decides on `s` and writes the assignment; its plan waits in its work.
    fn decided(&self, s: &mut State, replica: u8) {
        let mut plan = self.decide(s);
        // Replicas race: each writes what it decided (the same bytes from the same state), and
        // carries out its plan from what it read. Nothing counts the writes: a decision that
        // changes nothing (a grant refused because the resource is still held, planned again)
        // leaves the state as it was, so deciding again and again is one state, not one per
        // decision.
        if plan.targets != s.targets || plan.deadlines != s.deadlines {
            s.assignment_rev += 1;
        }
        s.targets = plan.targets.clone();
        s.deadlines = plan.deadlines.clone();
        // The revocations name the grant read (its revision).
        plan.revokes = plan
            .revokes
            .iter()
            .map(|&(r, _)| (r, s.holders[r as usize].map_or(0, |(_, rev)| rev)))
            .collect();
        s.work[replica as usize] = Some(Work {
            plan,
            assignment: s.assignment_rev,
            members: s.member_revs.clone(),
        });
    }

    /// `replica` carries out one step of its plan: a revocation, then the grants; `None` when it
    /// has nothing to carry out.
    fn carried(&self, s: &mut State, replica: u8) -> Option<()> {
        let mut work = s.work[replica as usize].take()?;
        if let Some((r, rev)) = work.plan.revokes.pop() {
            if s.holders[r as usize].is_some_and(|(_, held)| held == rev) {
                s.holders[r as usize] = None;
            }
        } else if let Some((r, m)) = work.plan.grants.pop() {
            // The guards: refused (nothing written) once the assignment or the member's record
            // has changed since the decision.
            let guarded = s.assignment_rev == work.assignment
                && s.member_revs[m as usize] == work.members[m as usize];
            if guarded || self.mutation == Some(Mutation::UnguardedGrants) {
                self.grant(s, r as usize, m);
            }
        }
        if !work.plan.grants.is_empty() || !work.plan.revokes.is_empty() {
            s.work[replica as usize] = Some(work);
        }
        Some(())
    }

    /// Every grant of member `m` ends (its session closed or lapsed, or it was evicted).
    fn end_session(&self, s: &mut State, m: u8) {
        for h in s.holders.iter_mut() {
            if h.is_some_and(|(holder, _)| holder == m) {
                *h = None;
            }
        }
    }

    /// A grant to `m` as etcd takes it: a put on `m`'s session lease, refused once the session
    /// has ended; a member whose process died still has a live session until it lapses.
    fn grant(&self, s: &mut State, r: usize, m: u8) {
        if s.members[m as usize] == Standing::Absent {
            return;
        }
        if s.holders[r].is_some() {
            if self.mutation != Some(Mutation::GrantWithoutCreateIfAbsent) {
                return;
            }
            if s.holders[r].is_some_and(|(h, _)| h != m) {
                s.double_grant = true;
            }
        }
        s.rev += 1;
        s.holders[r] = Some((m, s.rev));
        s.granted_to_dead |= matches!(s.members[m as usize], Standing::Dead(_));
        if s.last[r].is_some_and(|l| l != m) {
            s.moves[r] += 1;
        }
        s.last[r] = Some(m);
    }
}

impl Fleet {
    /// Whether nothing is left to do in `s`: the changes are over and every step taken (the
    /// end states of the bounded graph, which are the fair runs' ends).
    fn quiet(&self, s: &State) -> bool {
        let mut actions = Vec::new();
        self.actions(s, &mut actions);
        actions.is_empty()
    }
}

impl Model for Fleet {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let r = self.resources as usize;
        vec![State {
            now: 0,
            changes: self.changes,
            members: vec![Standing::Absent; self.members as usize],
            targets: vec![None; r],
            deadlines: vec![None; r],
            holders: vec![None; r],
            rev: 0,
            assignment_rev: 0,
            member_revs: vec![0; self.members as usize],
            work: vec![None; self.replicas as usize],
            moves: vec![0; r],
            last: vec![None; r],
            double_grant: false,
            granted_to_dead: false,
            ended: false,
            ending: false,
            deletes: vec![Delete::Idle; self.deletes as usize],
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now < self.horizon() {
            actions.push(Action::Tick);
        }
        self.end_actions(s, actions);
        if s.changes > 0 && s.now < self.settle_from && !s.ended {
            for m in 0..self.members {
                match s.members[m as usize] {
                    Standing::Absent | Standing::Evicted => actions.push(Action::Join(m)),
                    Standing::Active => {
                        actions.push(Action::Leave(m));
                        actions.push(Action::Die(m));
                        actions.push(Action::Drain(m));
                        actions.push(Action::Evict(m));
                    }
                    Standing::Draining => actions.push(Action::Leave(m)),
                    Standing::Dead(_) => {}
                }
            }
        }
        for replica in 0..self.replicas {
            match &s.work[replica as usize] {
                // A replica finds no fleet to decide for.
                None if s.ended => {}
                None => {
                    let plan = self.decide(s);
                    let idle = plan.grants.is_empty()
                        && plan.revokes.is_empty()
                        && plan.targets == s.targets
                        && plan.deadlines == s.deadlines;
                    if !idle {
                        actions.push(Action::Decide(replica));
                    }
                }
                Some(_) => actions.push(Action::Carry(replica)),
            }
        }
        for r in 0..self.resources {
            if let Some((h, _)) = s.holders[r as usize] {
                let live = matches!(s.members[h as usize], Standing::Active | Standing::Draining);
                if live && s.targets[r as usize] != Some(h) {
                    actions.push(Action::Release(h, r));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => {
                s.now += 1;
                for m in 0..self.members {
                    if s.members[m as usize] == Standing::Dead(s.now) {
                        // The service sees the member go only now: the change it acts on.
                        s.moves = vec![0; s.moves.len()];
                        s.members[m as usize] = Standing::Absent;
                        s.member_revs[m as usize] += 1;
                        self.end_session(&mut s, m);
                    }
                }
            }
            Action::Join(m) => {
                self.changed(&mut s, m);
                s.members[m as usize] = Standing::Active;
            }
            Action::Leave(m) => {
                self.changed(&mut s, m);
                s.members[m as usize] = Standing::Absent;
                self.end_session(&mut s, m);
            }
            Action::Die(m) => {
                // Unseen by the service until the session lapses (the moves count again then).
                s.changes -= 1;
                s.members[m as usize] = Standing::Dead(s.now + self.drain);
            }
            Action::Drain(m) => {
                self.changed(&mut s, m);
                s.members[m as usize] = Standing::Draining;
            }
            Action::Evict(m) => {
                self.changed(&mut s, m);
                s.members[m as usize] = Standing::Evicted;
                self.end_session(&mut s, m);
            }
            Action::Decide(replica) => self.decided(&mut s, replica),
            Action::Carry(replica) => self.carried(&mut s, replica)?,
            Action::Release(m, r) => {
                if s.holders[r as usize].is_some_and(|(h, _)| h == m) {
                    s.holders[r as usize] = None;
                }
            }
            Action::EndRead(d)
            | Action::EndDelete(d)
            | Action::EndRelease(d)
            | Action::EndDies(d) => self.end_step(&mut s, action, d),
            Action::FinishEnd => self.release_index(&mut s, None),
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}

/// A readable account of one step.
pub fn describe(_: &Fleet, before: &State, action: Action, after: &State) -> String {
    let mut line = format!("t={:<2} ", before.now);
    let _ = write!(line, "{action:?}");
    let _ = write!(
        line,
        " → members {:?}, assigned {:?}, held {:?}",
        after.members, after.targets, after.holders
    );
    line
}
