//! One decision of one fleet, with its I/O around it: read the fleet's keys at one revision and
//! the grants of its resources, decide ([`assign::next`]), then act — the assignment written
//! with a compare on the one read (a replica that loses the race reads again), and only then
//! the revocations and the grants, each a transaction of its own guarded by what the decision
//! read.
//!
//! Every replica runs this for every fleet. Two that read the same state decide the same
//! assignment (the decision is deterministic; deadlines already written are kept, new ones are
//! written by whoever wins the compare), so the second's compare fails and its second read finds
//! nothing to change. Grants race harmlessly: a resource is created only if absent, so of two
//! replicas granting the same free resource one succeeds and the other's compare fails.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::assign::{self, Input, Plan};
use super::records::{encode, AssignmentRecord, MemberRecord, Read, Snapshot};
use super::{each, Fleets, Owned};
use crate::audit::{Event, Kind};
use crate::etcd::Unchanged;
use crate::lease::{is_session_gone, OnSession};
use crate::Result;

/// What one decision came to.
#[derive(Debug)]
pub(super) enum Pass {
    /// The fleet does not exist (any more).
    Gone,
    /// Another replica wrote the assignment first: decide again.
    Raced,
    /// Done: the spec's resources (for the watch's index), the next deadline to decide again
    /// at, and whether every action succeeded.
    Done {
        resources: BTreeSet<String>,
        next_deadline: Option<u64>,
        complete: bool,
    },
}

/// What a decision came to before it is carried out.
pub(super) enum Decision {
    /// The fleet does not exist (any more).
    Gone,
    /// Another replica wrote the assignment first.
    Raced,
    /// Decided, its assignment written.
    Made(Box<Decided>),
}

/// A decision to carry out: what it read, what it plans, and the assignment's revision it
/// read or wrote — every grant is guarded by that and by each member's record as read.
pub(super) struct Decided {
    snap: Snapshot,
    owned: BTreeMap<String, Owned>,
    pub(super) plan: Plan,
    pub(super) assignment_revision: i64,
}

impl Fleets {
    /// Decides for `fleet` and acts on the decision; counted by outcome.
    pub(super) async fn reconcile(&self, fleet: &str) -> Result<Pass> {
        let pass = self.decide_and_act(fleet).await;
        let outcome = match &pass {
            Ok(Pass::Done { complete: true, .. } | Pass::Gone) => "settled",
            Ok(Pass::Done {
                complete: false, ..
            }) => "unsettled",
            Ok(Pass::Raced) => "raced",
            Err(_) => "failed",
        };
        self.inner.parts.metrics.fleet_decision(outcome);
        pass
    }

    async fn decide_and_act(&self, fleet: &str) -> Result<Pass> {
        Ok(match self.decide(fleet).await? {
            Decision::Gone => Pass::Gone,
            Decision::Raced => Pass::Raced,
            Decision::Made(decided) => self.act(decided).await,
        })
    }

    /// Reads the fleet, decides, and writes the assignment if it changed (with a compare on
    /// the one read): what [`Fleets::act`] then carries out.
    pub(super) async fn decide(&self, fleet: &str) -> Result<Decision> {
        let Some(snap) = self.snapshot(fleet).await? else {
            return Ok(Decision::Gone);
        };
        let owned = self.owned(&snap, snap.watched()).await?;
        let spec = snap.spec.record.to_spec();
        let members = self.decision_members(&snap);
        let current = snap.assignment.record.to_assignment();
        let holdings: BTreeMap<String, assign::Held> = owned
            .iter()
            .map(|(r, o)| (r.clone(), o.held.clone()))
            .collect();
        let plan = assign::next(&Input {
            spec: &spec,
            members: &members,
            current: &current,
            holdings: &holdings,
            now_ms: crate::lease::unix_millis(),
        });
        #[cfg(feature = "negative-controls")]
        let plan = grant_what_is_held(plan, &holdings);
        let assignment_revision = if plan.assignment == current {
            snap.assignment.mod_revision
        } else {
            match self.write_assignment(&snap, &plan).await? {
                Some(revision) => {
                    let begun = (plan.assignment.deadlines.keys())
                        .filter(|r| !current.deadlines.contains_key(*r))
                        .count();
                    self.inner
                        .parts
                        .metrics
                        .fleet
                        .handoffs
                        .add(begun as u64, &[]);
                    revision
                }
                None => return Ok(Decision::Raced),
            }
        };
        Ok(Decision::Made(Box::new(Decided {
            snap,
            owned,
            plan,
            assignment_revision,
        })))
    }

    /// Carries out a decision: its revocations, then its grants, each refused by etcd if what
    /// the decision read has changed since — however long ago it was made.
    pub(super) async fn act(&self, decided: Box<Decided>) -> Pass {
        let Decided {
            snap,
            owned,
            plan,
            assignment_revision,
        } = *decided;
        let revoked = self.revoke(&snap, &plan, &owned).await;
        let granted = self.grant(&snap, &plan, assignment_revision).await;
        Pass::Done {
            resources: snap.spec.record.resources.iter().cloned().collect(),
            next_deadline: plan.next_deadline,
            complete: revoked && granted,
        }
    }

    /// The members as the decision reads them, each judged once per principal: may it acquire
    /// every resource of the fleet?
    fn decision_members(&self, snap: &Snapshot) -> Vec<assign::Member> {
        let resources = &snap.spec.record.resources;
        let mut judged: HashMap<Option<&str>, bool> = HashMap::new();
        snap.members
            .iter()
            .map(|(name, m)| {
                let principal = m.record.principal.as_deref();
                let entitled = *judged
                    .entry(principal)
                    .or_insert_with(|| (self.inner.parts.entitled)(principal, resources));
                assign::Member {
                    name: name.clone(),
                    weight: m.record.weight,
                    state: m.record.state,
                    entitled,
                }
            })
            .collect()
    }

    /// Writes the plan's assignment if the one read (and the spec) are unchanged; its revision,
    /// or `None` if another write came first.
    async fn write_assignment(&self, snap: &Snapshot, plan: &Plan) -> Result<Option<i64>> {
        let layout = &self.inner.parts.layout;
        let (key, spec_key) = (
            layout.fleet_assignment(&snap.fleet),
            layout.fleet_spec(&snap.fleet),
        );
        let value = encode(&AssignmentRecord::of(&plan.assignment));
        let guards = [
            Unchanged {
                key: &key,
                mod_revision: snap.assignment.mod_revision,
            },
            Unchanged {
                key: &spec_key,
                mod_revision: snap.spec.mod_revision,
            },
        ];
        let written = self
            .inner
            .parts
            .commit
            .put_if(&key, &value, 0, &guards)
            .await?;
        if written.is_some() {
            tracing::debug!(fleet = %snap.fleet, bytes = value.len(), "fleet assignment written");
        }
        Ok(written)
    }

    /// Ends the grants the plan revokes (each only if it is still the one decided on); whether
    /// every revocation got an answer.
    async fn revoke(&self, snap: &Snapshot, plan: &Plan, owned: &BTreeMap<String, Owned>) -> bool {
        let revokes: Vec<_> = plan
            .revokes
            .iter()
            .map(|revoke| self.revoke_one(snap, revoke, owned.get(&revoke.resource)))
            .collect();
        each(revokes).await.into_iter().all(|ok| ok)
    }

    async fn revoke_one(
        &self,
        snap: &Snapshot,
        revoke: &assign::Revoke,
        owned: Option<&Owned>,
    ) -> bool {
        let (lease, principal) = owned.map_or((0, None), |o| (o.lease, o.principal.as_deref()));
        let ended = self
            .inner
            .parts
            .leases
            .revoke_assigned(
                (&snap.fleet, &revoke.resource),
                revoke.revision,
                lease,
                principal,
            )
            .await;
        match ended {
            Ok(ended) => {
                if ended {
                    let member = owned.and_then(|o| match &o.held.holder {
                        assign::Holder::Member(m) => Some(m.as_str()),
                        _ => None,
                    });
                    self.revoked(&snap.fleet, (member, lease), revoke, principal);
                }
                true
            }
            Err(e) => {
                tracing::warn!(resource = %revoke.resource, error = %e, "fleet could not revoke a grant");
                false
            }
        }
    }

    /// Counts and audits a grant this replica's fleet service ended: `holder` is its member
    /// (if still one) and lease.
    pub(super) fn revoked(
        &self,
        fleet: &str,
        (member, lease): (Option<&str>, i64),
        revoke: &assign::Revoke,
        principal: Option<&str>,
    ) {
        let why = revoke.why.slug();
        tracing::info!(%fleet, resource = %revoke.resource, why, "fleet revoked a grant");
        self.inner.parts.metrics.fleet_revocation(why);
        self.inner.parts.audit.record(Event {
            principal: principal.map(str::to_owned),
            resource: Some(revoke.resource.clone()),
            token: Some(revoke.revision.to_string()),
            session: (lease != 0).then(|| lease.to_string()),
            fleet: Some(fleet.to_owned()),
            member: member.map(str::to_owned),
            ..Event::unrequested(Kind::FleetRevoke, why)
        });
    }

    /// Makes the plan's grants, each guarded by the member's record, the spec and the
    /// assignment as the decision read (or wrote) them; whether every grant got an answer.
    ///
    /// The grants to the members of a principal under a held quota are made one after the
    /// other: each counts the principal's grants and is refused if another of its grants was
    /// made since, so made at once all but one would be refused.
    async fn grant(&self, snap: &Snapshot, plan: &Plan, assignment_revision: i64) -> bool {
        let mut free = Vec::new();
        let mut counted: BTreeMap<&str, Vec<(&assign::Grant, &Read<MemberRecord>)>> =
            BTreeMap::new();
        for grant in &plan.grants {
            let Some(member) = snap.members.get(&grant.member) else {
                continue;
            };
            match member.record.principal.as_deref() {
                Some(p) if self.inner.parts.leases.held_quota_applies(Some(p)) => {
                    counted.entry(p).or_default().push((grant, member));
                }
                _ => free.push((grant, member)),
            }
        }
        let one = |(grant, member)| self.grant_one(snap, grant, member, assignment_revision);
        let mut chains: Vec<futures::future::BoxFuture<'_, bool>> = free
            .into_iter()
            .map(|g| -> futures::future::BoxFuture<'_, bool> { Box::pin(one(g)) })
            .collect();
        for grants in counted.into_values() {
            chains.push(Box::pin(async move {
                let mut ok = true;
                for g in grants {
                    ok &= one(g).await;
                }
                ok
            }));
        }
        each(chains).await.into_iter().all(|ok| ok)
    }

    async fn grant_one(
        &self,
        snap: &Snapshot,
        grant: &assign::Grant,
        member: &Read<MemberRecord>,
        assignment_revision: i64,
    ) -> bool {
        let layout = &self.inner.parts.layout;
        let (member_key, assignment_key, spec_key) = (
            layout.fleet_member(&snap.fleet, &grant.member),
            layout.fleet_assignment(&snap.fleet),
            layout.fleet_spec(&snap.fleet),
        );
        let guards = [
            Unchanged {
                key: &member_key,
                mod_revision: member.mod_revision,
            },
            Unchanged {
                key: &assignment_key,
                mod_revision: assignment_revision,
            },
            Unchanged {
                key: &spec_key,
                mod_revision: snap.spec.mod_revision,
            },
        ];
        let granted = self
            .inner
            .parts
            .leases
            .grant_assigned(OnSession {
                resource: &grant.resource,
                session: member.record.session,
                fleet: &snap.fleet,
                guards: &guards,
            })
            .await;
        match granted {
            Ok(Some(assigned)) => {
                self.inner.parts.metrics.fleet.grants.add(1, &[]);
                self.inner.parts.audit.record(Event {
                    principal: member.record.principal.clone(),
                    resource: Some(grant.resource.clone()),
                    token: Some(assigned.revision.to_string()),
                    session: Some(member.record.session.to_string()),
                    fleet: Some(snap.fleet.clone()),
                    member: Some(grant.member.clone()),
                    ..Event::unrequested(Kind::FleetGrant, "ok")
                });
                true
            }
            // Another replica granted it first, or the guards changed: the watch brings the
            // next decision.
            Ok(None) => true,
            // The member's session ended meanwhile: its record goes with it, and the watch
            // brings the next decision.
            Err(e) if is_session_gone(&e) => true,
            Err(e) => {
                tracing::warn!(resource = %grant.resource, member = %grant.member, error = %e, "fleet could not grant");
                false
            }
        }
    }
}

/// Under the negative control `no-revoke-before-grant` (`crate::negative_control`): `plan`
/// with a grant of every resource its assignment targets at a member while another of the
/// fleet's members holds it — no hand-off, no deadline, no release first.
#[cfg(feature = "negative-controls")]
fn grant_what_is_held(mut plan: Plan, holdings: &BTreeMap<String, assign::Held>) -> Plan {
    use assign::{Grant, Holder};
    if !crate::negative_control::no_revoke_before_grant() {
        return plan;
    }
    for (resource, member) in &plan.assignment.targets {
        let held_by_another = holdings
            .get(resource)
            .is_some_and(|h| matches!(&h.holder, Holder::Member(m) if m != member));
        if held_by_another {
            plan.grants.push(Grant {
                resource: resource.clone(),
                member: member.clone(),
            });
        }
    }
    plan.grants.sort();
    plan
}
