//! What a fleet looks like: to a reader, the whole fleet without secrets; to a member, its own
//! assignment with its tokens — at once, or once it has changed past a revision the member
//! names (a long poll, woken by the replica's watch: `signals.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::assign::{Holder, State};
use super::members::prove;
use super::records::{AssignmentRecord, Snapshot};
use super::spec::Gate;
use super::{Fleets, Owned};
use crate::lease::i64_string;
use crate::{Error, Result};

/// A fleet as it stands, without secrets.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct FleetView {
    /// The fleet.
    pub(crate) fleet: String,
    /// Its resources, in name order.
    pub(crate) resources: Vec<String>,
    /// How long a member has to release a resource moved away from it, in milliseconds.
    pub(crate) drain_ms: u64,
    /// Most hand-offs in flight at once.
    pub(crate) max_moves: usize,
    /// The etcd revision this view was read at (decimal string).
    #[serde(with = "i64_string")]
    #[schema(value_type = String, example = "4711")]
    pub(crate) revision: i64,
    /// The members, in name order.
    pub(crate) members: Vec<MemberSummary>,
    /// The resources no member holds now (free, in a hand-off's gap, or held outside the
    /// fleet), in name order.
    pub(crate) unassigned: Vec<String>,
}

/// A member, as a reader of the fleet sees it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct MemberSummary {
    /// The member.
    pub(crate) member: String,
    /// Its share's weight.
    pub(crate) weight: u32,
    /// `active`, `draining` or `evicted`.
    pub(crate) state: State,
    /// What it holds and is assigned, in name order.
    pub(crate) held: Vec<String>,
    /// What it holds and must give up by its deadline, in name order.
    pub(crate) releasing: Vec<String>,
}

/// A member's own assignment.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct MemberView {
    /// The fleet.
    pub(crate) fleet: String,
    /// The member.
    pub(crate) member: String,
    /// `active`, `draining` or `evicted`.
    pub(crate) state: State,
    /// Rises whenever this view changes (decimal string): pass it as `?after=` to wait for
    /// the next change.
    #[serde(with = "i64_string")]
    #[schema(value_type = String, example = "4711")]
    pub(crate) revision: i64,
    /// What it holds and is assigned, in name order: each an ordinary session grant.
    pub(crate) held: Vec<HeldGrant>,
    /// What it holds and must release (`DELETE /v1/leases/{resource}` with the session's
    /// secret) within `deadline_ms`, after which the service revokes it.
    pub(crate) releasing: Vec<Releasing>,
}

/// A resource a member holds.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct HeldGrant {
    /// The resource.
    pub(crate) resource: String,
    /// The lease it lives on: the member's session.
    #[serde(with = "i64_string")]
    #[schema(value_type = String, example = "7587869420498113795")]
    pub(crate) lease_id: i64,
    /// The fencing token's revision (decimal string).
    pub(crate) token: String,
    /// The signed fencing token to present to protected storage.
    pub(crate) fencing_token: String,
}

/// A resource a member must release.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct Releasing {
    /// The resource.
    pub(crate) resource: String,
    /// Milliseconds left, from when the request reached the proxy, before the service revokes
    /// it (0: due now). Measured on the proxy's wall clock: advice, not a promise of time.
    pub(crate) deadline_ms: u64,
}

/// A member's question about its assignment.
pub(crate) struct Asked<'a> {
    /// Judges the caller for the fleet's resources (before anything tells whether the member
    /// exists).
    pub(crate) gate: Gate<'a>,
    /// The member.
    pub(crate) member: &'a str,
    /// Its session's secret.
    pub(crate) secret: &'a str,
    /// The caller (`None` with authentication off).
    pub(crate) principal: Option<&'a str>,
    /// Answer once the view's revision passes this (or `wait` ends).
    pub(crate) after: Option<i64>,
    /// How long to wait for that.
    pub(crate) wait: Duration,
}

/// A fleet read for its waiters: its keys, and the grants of every resource it watches.
pub(super) struct Reading {
    snap: Snapshot,
    owned: BTreeMap<String, Owned>,
}

impl Fleets {
    /// `fleet` and its grants, for the waiters woken by a change; `None` if it has gone.
    async fn reading(&self, fleet: &str) -> Result<Option<Reading>> {
        let Some(snap) = self.snapshot(fleet).await? else {
            return Ok(None);
        };
        let owned = self.owned(&snap, snap.watched()).await?;
        Ok(Some(Reading { snap, owned }))
    }

    /// `fleet` as it stands. [`Error::NoFleet`] if there is none; `gate` judges the caller for
    /// its resources before their grants are read.
    pub(crate) async fn view(&self, fleet: &str, gate: Gate<'_>) -> Result<FleetView> {
        let snap = self.snapshot(fleet).await?.ok_or(Error::NoFleet)?;
        gate(&snap.spec.record.resources)?;
        let owned = self.owned(&snap, snap.watched()).await?;
        let targets = snap.assignment.record.to_assignment().targets;
        let mut members: BTreeMap<&str, MemberSummary> = snap
            .members
            .iter()
            .map(|(name, m)| {
                let summary = MemberSummary {
                    member: name.clone(),
                    weight: m.record.weight,
                    state: m.record.state,
                    held: Vec::new(),
                    releasing: Vec::new(),
                };
                (name.as_str(), summary)
            })
            .collect();
        let mut held_by_members = BTreeSet::new();
        for (resource, o) in &owned {
            let Holder::Member(name) = &o.held.holder else {
                continue;
            };
            let Some(summary) = members.get_mut(name.as_str()) else {
                continue;
            };
            held_by_members.insert(resource.as_str());
            if targets.get(resource) == Some(name) {
                summary.held.push(resource.clone());
            } else {
                summary.releasing.push(resource.clone());
            }
        }
        let spec = &snap.spec.record;
        Ok(FleetView {
            fleet: fleet.to_owned(),
            unassigned: spec
                .resources
                .iter()
                .filter(|r| !held_by_members.contains(r.as_str()))
                .cloned()
                .collect(),
            resources: spec.resources.clone(),
            drain_ms: spec.drain_ms,
            max_moves: spec.max_moves(),
            revision: snap.revision,
            members: members.into_values().collect(),
        })
    }

    /// `asked.member`'s assignment in `fleet`, proved by its session's secret: at once, or once
    /// its revision passes `asked.after` (at the latest when `asked.wait` ends, as it stands).
    pub(crate) async fn member_view(&self, fleet: &str, asked: &Asked<'_>) -> Result<MemberView> {
        let deadline = Instant::now() + asked.wait;
        // Subscribed before the first read: a change after it wakes the wait. That read is the
        // request's own; after a wake-up the waiters of the fleet share one.
        let mut waiter = self.inner.signals.subscribe(fleet);
        let snap = self.snapshot(fleet).await?.ok_or(Error::NoFleet)?;
        let mut proven = None;
        let mut view = self.member_view_of(&snap, None, asked, &mut proven).await?;
        loop {
            if asked.after.is_none_or(|after| view.revision > after) || Instant::now() >= deadline {
                return Ok(view);
            }
            tokio::select! {
                () = self.inner.stopping.cancelled() => return Ok(view),
                () = tokio::time::sleep_until(deadline) => return Ok(view),
                () = waiter.changed() => {}
            }
            let reading = waiter.reading(|| self.reading(fleet)).await?;
            let reading = reading.as_deref().ok_or(Error::NoFleet)?;
            view = self
                .member_view_of(&reading.snap, Some(&reading.owned), asked, &mut proven)
                .await?;
        }
    }

    /// The view of `asked.member` in `snap`, with the grants `shared` read for every waiter
    /// (else read here, of its own resources only). The secret is proved once per session:
    /// `proven` keeps the session it proved (a session that ends takes the member's record with
    /// it, and a new session is proved again).
    async fn member_view_of(
        &self,
        snap: &Snapshot,
        shared: Option<&BTreeMap<String, Owned>>,
        asked: &Asked<'_>,
        proven: &mut Option<i64>,
    ) -> Result<MemberView> {
        let fleet = snap.fleet.as_str();
        (asked.gate)(&snap.spec.record.resources)?;
        let member = snap.members.get(asked.member).ok_or(Error::NoMember)?;
        let session = member.record.session;
        if *proven != Some(session) {
            prove(
                &self.inner.parts.leases,
                session,
                asked.secret,
                asked.principal,
            )
            .await?;
            *proven = Some(session);
        }
        let assignment = &snap.assignment.record;
        let assigned: Vec<String> = assignment
            .members
            .get(asked.member)
            .cloned()
            .unwrap_or_default();
        let moving: Vec<String> = assignment.deadlines.keys().cloned().collect();
        let read;
        let owned = match shared {
            Some(owned) => owned,
            None => {
                read = self
                    .owned(snap, assigned.iter().chain(&moving).cloned())
                    .await?;
                &read
            }
        };
        let (held, releasing) =
            self.grants_of(asked.member, (&assigned, &moving), assignment, owned);
        Ok(MemberView {
            fleet: fleet.to_owned(),
            member: asked.member.to_owned(),
            state: member.record.state,
            revision: view_revision(snap, asked.member, assigned.iter().chain(&moving), owned),
            held,
            releasing,
        })
    }
}

impl Fleets {
    /// What `member` holds of `assigned` (with its tokens) and has to release of `moving` (with
    /// the time left), as `owned` says.
    fn grants_of(
        &self,
        member: &str,
        (assigned, moving): (&[String], &[String]),
        assignment: &AssignmentRecord,
        owned: &BTreeMap<String, Owned>,
    ) -> (Vec<HeldGrant>, Vec<Releasing>) {
        let holder = Holder::Member(member.to_owned());
        let mine = |r: &str| owned.get(r).filter(|o| o.held.holder == holder);
        let held = assigned
            .iter()
            .filter_map(|r| {
                let o = mine(r)?;
                let (token, fencing_token) =
                    self.inner.parts.leases.signed_token(r, o.held.revision);
                Some(HeldGrant {
                    resource: r.clone(),
                    lease_id: o.lease,
                    token,
                    fencing_token,
                })
            })
            .collect();
        let now = crate::lease::unix_millis();
        let releasing = moving
            .iter()
            .filter(|r| mine(r).is_some())
            .map(|r| Releasing {
                resource: r.clone(),
                deadline_ms: assignment
                    .deadlines
                    .get(r)
                    .map_or(0, |d| d.saturating_sub(now)),
            })
            .collect();
        (held, releasing)
    }
}

/// A member view's revision: the latest of its assignment's, its record's and its grants'
/// create revisions — each change of what the view shows moves one of them (a release moves
/// the assignment, whose deadline then goes).
fn view_revision<'a>(
    snap: &Snapshot,
    member: &str,
    shown: impl Iterator<Item = &'a String>,
    owned: &BTreeMap<String, Owned>,
) -> i64 {
    let record = snap.members.get(member).map_or(0, |m| m.mod_revision);
    shown
        .filter_map(|r| owned.get(r))
        .filter(|o| o.held.holder == Holder::Member(member.to_owned()))
        .map(|o| o.held.revision)
        .chain([snap.assignment.mod_revision, record])
        .max()
        .unwrap_or_default()
}
