//! Members joining, draining and evicted.
//!
//! A join opens a session and writes the member's record on its lease, with a compare on the
//! record's last mod revision (and the spec's): two joins of one name never both win. A join
//! that names a live member of the same principal replaces it (static membership, as Kafka's
//! KIP-345): the record moves to the new session *before* the old one is closed, so the member
//! never leaves the assignment, and what the old session held — its grants end with it — is
//! granted to the new one first. Another principal's live member is not replaced (409).
//!
//! Draining and eviction rewrite the record's state on the member's own lease. Eviction then
//! ends the member's grants of the fleet at once, so the next grant of each is pre-fenced past
//! it.

use serde::Serialize;
use tokio::time::Instant;

use super::assign::{Holder, Revoke, State, Why};
use super::records::{encode, MemberRecord, Read, Snapshot, MAX_MEMBERS, MAX_WEIGHT};
use super::spec::{Gate, ATTEMPTS};
use super::Fleets;
use crate::etcd::Unchanged;
use crate::lease::{i64_string, is_session_gone};
use crate::{Error, Result};

/// A join, as the request gives it.
#[derive(Debug, Clone)]
pub(crate) struct Join {
    /// The member's name.
    pub(crate) member: String,
    /// Its session's TTL, seconds (validated).
    pub(crate) ttl_seconds: u64,
    /// Its share's weight.
    pub(crate) weight: Option<u64>,
    /// The caller (`None` with authentication off).
    pub(crate) principal: Option<String>,
    /// When the request arrived (`expires_in_ms` counts from it).
    pub(crate) received: Instant,
}

/// A member joined: the only answer that shows its session's secret.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct Joined {
    /// The fleet.
    pub(crate) fleet: String,
    /// The member.
    pub(crate) member: String,
    /// Its session (keep it alive with `POST /v1/sessions/{session_id}/keepalive`, leave with
    /// `DELETE /v1/sessions/{session_id}`).
    #[serde(with = "i64_string")]
    #[schema(value_type = String, example = "7587869420498113795")]
    pub(crate) session_id: i64,
    /// The session's secret: proves the member (its assignment, drain) and every grant the
    /// fleet gives it (renew, release, forward).
    pub(crate) secret: String,
    /// The session's TTL.
    pub(crate) ttl_seconds: u64,
    /// The session lasts at least this long from when the request reached the proxy.
    pub(crate) expires_in_ms: u64,
}

/// A member's standing after a drain.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct Standing {
    /// The fleet.
    pub(crate) fleet: String,
    /// The member.
    pub(crate) member: String,
    /// Its state now.
    pub(crate) state: State,
}

/// Who asks for a drain. Either is judged for the fleet's resources first, so that a caller
/// who may not act on them learns nothing of the fleet's members.
pub(crate) enum Drainer<'a> {
    /// The member itself, with its session's secret.
    Member {
        /// The secret shown.
        secret: &'a str,
        /// The caller (`None` with authentication off).
        principal: Option<&'a str>,
        /// Judges the caller for the fleet's resources.
        gate: Gate<'a>,
    },
    /// An operator, judged for the fleet's resources.
    Operator(Gate<'a>),
}

impl Drainer<'_> {
    fn gate(&self) -> Gate<'_> {
        match self {
            Drainer::Member { gate, .. } | Drainer::Operator(gate) => *gate,
        }
    }
}

/// A fleet's name: the resource grammar.
pub(crate) fn check_fleet(name: &str) -> Result<()> {
    named("fleet", name)
}

/// Checks `name` by the resource grammar, its refusal naming `field` (a fleet, a member).
fn named(field: &'static str, name: &str) -> Result<()> {
    fencing::check_resource_name(name).map_err(|why| Error::InvalidField {
        field,
        reason: why.to_string().replace("resource", field),
    })
}

/// A member's weight as asked (default 1), within 1 to [`MAX_WEIGHT`].
fn weight(asked: Option<u64>) -> Result<u32> {
    match asked {
        None => Ok(1),
        Some(w) if (1..=u64::from(MAX_WEIGHT)).contains(&w) => Ok(w as u32),
        Some(_) => Err(Error::InvalidField {
            field: "weight",
            reason: format!("1 to {MAX_WEIGHT}"),
        }),
    }
}

/// A member name: the resource grammar.
pub(crate) fn check_member(name: &str) -> Result<()> {
    named("member", name)
}

impl Fleets {
    /// Joins `join.member` to `fleet` on a new session. `gate` judges the caller for the
    /// fleet's resources.
    pub(crate) async fn join(&self, fleet: &str, join: Join, gate: Gate<'_>) -> Result<Joined> {
        check_member(&join.member)?;
        let weight = weight(join.weight)?;
        for _ in 0..ATTEMPTS {
            let snap = self.snapshot(fleet).await?.ok_or(Error::NoFleet)?;
            gate(&snap.spec.record.resources)?;
            let old = snap.members.get(&join.member);
            if let Some(old) = old {
                if old.record.principal != join.principal {
                    return Err(Error::MemberTaken);
                }
            } else if snap.members.len() >= MAX_MEMBERS {
                return Err(Error::FleetFull(MAX_MEMBERS));
            }
            let opened = self
                .inner
                .parts
                .leases
                .open_session(
                    join.member.clone(),
                    join.principal.clone(),
                    join.ttl_seconds,
                    join.received,
                )
                .await?;
            let record = MemberRecord {
                principal: join.principal.clone(),
                session: opened.session_id,
                weight,
                state: State::Active,
                joined_at: crate::lease::unix_millis(),
            };
            let written = self.write_member(&snap, &join.member, old, &record).await;
            let revision = match written {
                Ok(Some(revision)) => revision,
                Ok(None) | Err(_) => {
                    // Lost to a concurrent write (or unknown): this session is nobody's.
                    let _ = self.inner.parts.leases.end_session(opened.session_id).await;
                    written?;
                    continue;
                }
            };
            self.joined(fleet, &join.member, old, (opened.session_id, revision))
                .await?;
            return Ok(Joined {
                fleet: fleet.to_owned(),
                member: join.member,
                session_id: opened.session_id,
                secret: opened.secret,
                ttl_seconds: opened.ttl_seconds,
                expires_in_ms: opened.expires_in_ms,
            });
        }
        Err(Error::FleetChanged)
    }

    /// After `member`'s record was written at `revision` with its new session: a new member
    /// past the fleet's bound leaves again; a member that joined again ends its old session.
    async fn joined(
        &self,
        fleet: &str,
        member: &str,
        old: Option<&Read<MemberRecord>>,
        (session, revision): (i64, i64),
    ) -> Result<()> {
        let leases = &self.inner.parts.leases;
        let Some(old) = old else {
            let within = self.within_bound(fleet, revision).await;
            if !matches!(within, Ok(true)) {
                // Its record goes with its session.
                let _ = leases.end_session(session).await;
                within?;
                return Err(Error::FleetFull(MAX_MEMBERS));
            }
            tracing::info!(%fleet, %member, "fleet member joined");
            return Ok(());
        };
        // Its grants end with it; the assignment still names the member, so they are granted
        // to the new session before anyone else is considered.
        leases.end_session(old.record.session).await?;
        tracing::info!(%fleet, %member, "fleet member rejoined on a new session");
        Ok(())
    }

    /// Whether a new member written at `revision` is among the first [`MAX_MEMBERS`] of the
    /// fleet. Concurrent joins each counted fewer members than the bound before writing, and
    /// all may have written: each then counts the members created up to its own write, so that
    /// those past the bound (and only they) leave again.
    async fn within_bound(&self, fleet: &str, revision: i64) -> Result<bool> {
        let members = self.inner.parts.layout.fleet_member(fleet, "");
        let created = self
            .inner
            .parts
            .etcd
            .count_created(&members, revision)
            .await?;
        Ok(created <= MAX_MEMBERS)
    }

    /// Writes `record` as `name`'s, if the member's record (`old`, or none) and the spec are as
    /// read; the revision it was written at, or `None` if it was not.
    async fn write_member(
        &self,
        snap: &Snapshot,
        name: &str,
        old: Option<&Read<MemberRecord>>,
        record: &MemberRecord,
    ) -> Result<Option<i64>> {
        let key = self.inner.parts.layout.fleet_member(&snap.fleet, name);
        let spec_key = self.inner.parts.layout.fleet_spec(&snap.fleet);
        let guards = [
            Unchanged {
                key: &key,
                mod_revision: old.map_or(0, |o| o.mod_revision),
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
            .put_if(&key, &encode(record), record.session, &guards)
            .await?;
        Ok(written)
    }

    /// Sets `member`'s state to `state` (on its own lease), once `by` is judged; the snapshot
    /// it acted on and the record written.
    async fn restate(
        &self,
        fleet: &str,
        member: &str,
        state: State,
        by: &Drainer<'_>,
    ) -> Result<(Snapshot, MemberRecord)> {
        for _ in 0..ATTEMPTS {
            let snap = self.snapshot(fleet).await?.ok_or(Error::NoFleet)?;
            // Before anything tells whether the member exists.
            by.gate()(&snap.spec.record.resources)?;
            let old = snap.members.get(member).ok_or(Error::NoMember)?;
            if let Drainer::Member {
                secret, principal, ..
            } = by
            {
                prove(
                    &self.inner.parts.leases,
                    old.record.session,
                    secret,
                    *principal,
                )
                .await?;
            }
            // An evicted member stays evicted until its session ends (or it joins again).
            let state = if old.record.state == State::Evicted {
                State::Evicted
            } else {
                state
            };
            let record = MemberRecord {
                state,
                ..old.record.clone()
            };
            if record == old.record
                || self
                    .write_member(&snap, member, Some(old), &record)
                    .await?
                    .is_some()
            {
                return Ok((snap, record));
            }
        }
        Err(Error::FleetChanged)
    }

    /// Drains `member`: it hands off everything and takes nothing new. Its standing after.
    pub(crate) async fn drain(
        &self,
        fleet: &str,
        member: &str,
        by: Drainer<'_>,
    ) -> Result<Standing> {
        let (_, record) = self.restate(fleet, member, State::Draining, &by).await?;
        tracing::info!(%fleet, %member, state = ?record.state, "fleet member draining");
        Ok(Standing {
            fleet: fleet.to_owned(),
            member: member.to_owned(),
            state: record.state,
        })
    }

    /// Evicts `member`: its state becomes `evicted` and its grants of the fleet end at once.
    pub(crate) async fn evict(&self, fleet: &str, member: &str, gate: Gate<'_>) -> Result<()> {
        let by = Drainer::Operator(gate);
        let (snap, record) = self.restate(fleet, member, State::Evicted, &by).await?;
        let owned = self.owned(&snap, snap.watched()).await?;
        for (resource, o) in owned {
            let theirs =
                o.held.holder == Holder::Member(member.to_owned()) && o.lease == record.session;
            if theirs && o.revoke(&self.inner.parts.leases, fleet, &resource).await? {
                let revoke = Revoke {
                    resource,
                    revision: o.held.revision,
                    why: Why::Evicted,
                };
                let principal = o.principal.as_deref();
                self.revoked(fleet, (Some(member), o.lease), &revoke, principal);
            }
        }
        tracing::info!(%fleet, %member, "fleet member evicted");
        Ok(())
    }
}

/// Whether `secret` proves `session` for `principal`: [`Error::NotMember`] if not.
pub(super) async fn prove(
    leases: &crate::lease::Leases,
    session: i64,
    secret: &str,
    principal: Option<&str>,
) -> Result<()> {
    match leases.verify_session(session, secret, principal).await {
        Ok(_) => Ok(()),
        Err(e) if is_session_gone(&e) => Err(Error::NotMember),
        Err(e) => Err(e),
    }
}
