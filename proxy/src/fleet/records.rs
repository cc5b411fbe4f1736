//! What a fleet keeps in etcd, under `{prefix}fleets/{fleet}/` (see `keys.rs`), decoded once
//! into named structs: the spec, the members, the assignment, and a snapshot of all three read
//! at one revision.
//!
//! - `spec`: [`SpecRecord`], written by `PUT /v1/fleets/{fleet}` with a compare on its last mod
//!   revision.
//! - `members/{member}`: [`MemberRecord`], on the member's session lease, so it goes when the
//!   session does.
//! - `assignment`: [`AssignmentRecord`], each member's resources and the hand-offs' deadlines,
//!   written only with a compare on its last mod revision (and the spec's).

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::KeyValue;
use serde::{Deserialize, Serialize};

use super::assign::{self, Assignment, State};
use crate::etcd::Listed;
use crate::keys::Layout;
use crate::lease::i64_string;
use crate::{Error, Result};

/// Most resources in one fleet.
pub(crate) const MAX_RESOURCES: usize = 10_000;
/// Most bytes of resource names in one fleet. The assignment carries every name once in its
/// members' lists and once more in its deadlines while that resource is handed off (up to
/// every resource at once), besides every member's name, and must stay under etcd's 1.5 MiB
/// request limit even then (tested below, worst case).
pub(crate) const MAX_NAME_BYTES: usize = 512 * 1024;
/// Most members of one fleet.
pub(crate) const MAX_MEMBERS: usize = 1_000;
/// Largest member weight.
pub(crate) const MAX_WEIGHT: u32 = 1_000;
/// How long a member has to release a resource moved away from it, unless the spec says.
pub(crate) const DEFAULT_DRAIN_MS: u64 = 5_000;
/// Longest `drain_ms`.
pub(crate) const MAX_DRAIN_MS: u64 = 3_600_000;

/// The hand-offs in flight at once, unless the spec says: a tenth of the resources, at least
/// 10.
pub(crate) fn default_max_moves(resources: usize) -> usize {
    (resources / 10).max(10)
}

/// The stored spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpecRecord {
    /// The resources, in name order, each once.
    pub(crate) resources: Vec<String>,
    /// How long a member has to release a resource moved away from it.
    pub(crate) drain_ms: u64,
    /// Most hand-offs in flight; absent: [`default_max_moves`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_moves: Option<usize>,
    /// The principal that made the fleet (with authentication on): only it may change or end
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) principal: Option<String>,
    /// Wall-clock time of the last change, Unix ms, for display.
    pub(crate) changed_at: u64,
}

impl SpecRecord {
    /// The hand-offs allowed in flight.
    pub(crate) fn max_moves(&self) -> usize {
        self.max_moves
            .unwrap_or_else(|| default_max_moves(self.resources.len()))
    }

    /// Whether `other` asks for the same as this one (whenever either was written).
    pub(crate) fn same_as(&self, other: &Self) -> bool {
        self.resources == other.resources
            && self.drain_ms == other.drain_ms
            && self.max_moves == other.max_moves
            && self.principal == other.principal
    }

    /// The spec as the decision reads it.
    pub(crate) fn to_spec(&self) -> assign::Spec {
        assign::Spec {
            resources: self.resources.iter().cloned().collect(),
            drain_ms: self.drain_ms,
            max_moves: self.max_moves(),
        }
    }
}

/// The stored member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MemberRecord {
    /// The principal that joined it (with authentication on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) principal: Option<String>,
    /// Its session, whose lease the record is on.
    #[serde(with = "i64_string")]
    pub(crate) session: i64,
    /// Its share's weight.
    pub(crate) weight: u32,
    /// Its standing.
    pub(crate) state: State,
    /// Wall-clock join time, Unix ms, for display.
    pub(crate) joined_at: u64,
}

/// The stored assignment: each member's resources (name order), and the deadlines of the
/// hand-offs in flight. Maps in key order, so replicas deciding the same write the same bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AssignmentRecord {
    /// Member → the resources assigned to it.
    pub(crate) members: BTreeMap<String, Vec<String>>,
    /// Resource → Unix ms by which its holder must release it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) deadlines: BTreeMap<String, u64>,
}

impl AssignmentRecord {
    /// The stored form of `assignment`.
    pub(crate) fn of(assignment: &Assignment) -> Self {
        let mut members: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (resource, member) in &assignment.targets {
            members
                .entry(member.clone())
                .or_default()
                .push(resource.clone());
        }
        Self {
            members,
            deadlines: assignment.deadlines.clone(),
        }
    }

    /// The assignment as the decision reads it.
    pub(crate) fn to_assignment(&self) -> Assignment {
        let targets = self
            .members
            .iter()
            .flat_map(|(m, rs)| rs.iter().map(move |r| (r.clone(), m.clone())))
            .collect();
        Assignment {
            targets,
            deadlines: self.deadlines.clone(),
        }
    }
}

/// A member as read: its name, record and the mod revision of its key.
#[derive(Debug, Clone)]
pub(crate) struct Read<T> {
    /// The record.
    pub(crate) record: T,
    /// Its key's mod revision (the decision's guard).
    pub(crate) mod_revision: i64,
}

/// A fleet's keys, read at one revision and decoded.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// The fleet.
    pub(crate) fleet: String,
    /// The revision read at.
    pub(crate) revision: i64,
    /// The spec.
    pub(crate) spec: Read<SpecRecord>,
    /// The members by name.
    pub(crate) members: BTreeMap<String, Read<MemberRecord>>,
    /// The assignment (empty, mod revision 0, before the first is written).
    pub(crate) assignment: Read<AssignmentRecord>,
}

impl Snapshot {
    /// Decodes the keys of `fleet` listed under `layout`; `None` when it has no spec (no such
    /// fleet). A member record that does not parse is left out (its key is reported); a spec
    /// or assignment that does not parse is an error — nothing is decided on a guess.
    pub(crate) fn decode(layout: &Layout, fleet: &str, listed: Listed) -> Result<Option<Self>> {
        let (spec_key, assignment_key) = (layout.fleet_spec(fleet), layout.fleet_assignment(fleet));
        let members_prefix = layout.fleet_member(fleet, "");
        let mut spec = None;
        let mut assignment = Read {
            record: AssignmentRecord::default(),
            mod_revision: 0,
        };
        let mut members = Vec::new();
        for kv in &listed.kvs {
            let key = String::from_utf8_lossy(kv.key());
            if key == spec_key {
                spec = Some(read(&key, kv)?);
            } else if key == assignment_key {
                assignment = read(&key, kv)?;
            } else if let Some(name) = key.strip_prefix(&members_prefix) {
                match read::<MemberRecord>(&key, kv) {
                    Ok(member) => members.push((name.to_owned(), kv.create_revision(), member)),
                    Err(e) => tracing::warn!(error = %e, "a fleet member record is unreadable"),
                }
            }
        }
        Ok(spec.map(|spec| Self {
            fleet: fleet.to_owned(),
            revision: listed.revision,
            spec,
            members: first_members(members),
            assignment,
        }))
    }

    /// The resources whose ownership the decision reads: the spec's, and those the current
    /// assignment still names (they may have left the spec while held).
    pub(crate) fn watched(&self) -> BTreeSet<String> {
        let mut watched: BTreeSet<String> = self.spec.record.resources.iter().cloned().collect();
        for resources in self.assignment.record.members.values() {
            watched.extend(resources.iter().cloned());
        }
        watched.extend(self.assignment.record.deadlines.keys().cloned());
        watched
    }

    /// The member whose session is `session`, if any.
    pub(crate) fn member_on(&self, session: i64) -> Option<&str> {
        self.members
            .iter()
            .find(|(_, m)| m.record.session == session)
            .map(|(name, _)| name.as_str())
    }
}

/// The members that count: the first [`MAX_MEMBERS`] created (`(name, create revision,
/// record)`). Joins that raced past the bound wrote records of their own before they could
/// count them; until those leave again they are nobody's members — no decision assigns them
/// anything, no view shows them — so a refused join never holds a resource, even briefly.
fn first_members(
    mut members: Vec<(String, i64, Read<MemberRecord>)>,
) -> BTreeMap<String, Read<MemberRecord>> {
    if members.len() > MAX_MEMBERS {
        members.sort_by_key(|(_, created, _)| *created);
        members.truncate(MAX_MEMBERS);
    }
    members
        .into_iter()
        .map(|(name, _, member)| (name, member))
        .collect()
}

fn read<T: serde::de::DeserializeOwned>(key: &str, kv: &KeyValue) -> Result<Read<T>> {
    let record = serde_json::from_slice(kv.value()).map_err(|e| Error::CorruptRecord {
        key: key.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(Read {
        record,
        mod_revision: kv.mod_revision(),
    })
}

/// Encodes a record (plain strings, numbers and maps always serialise).
pub(crate) fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    serde_json::to_vec(record).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_is_stored_per_member_and_read_back_the_same() {
        let assignment = Assignment {
            targets: [("r1", "b"), ("r2", "a"), ("r3", "b")]
                .into_iter()
                .map(|(r, m)| (r.to_owned(), m.to_owned()))
                .collect(),
            deadlines: [("r2".to_owned(), 1234)].into_iter().collect(),
        };
        let stored = AssignmentRecord::of(&assignment);
        assert_eq!(
            String::from_utf8(encode(&stored)).unwrap(),
            r#"{"members":{"a":["r2"],"b":["r1","r3"]},"deadlines":{"r2":1234}}"#
        );
        assert_eq!(stored.to_assignment(), assignment);
        assert_eq!(
            encode(&AssignmentRecord::default()),
            br#"{"members":{}}"#.to_vec()
        );
    }

    #[test]
    fn the_largest_assignment_fits_in_one_etcd_request() {
        // etcd's default `--max-request-bytes`; the put also carries its key and two compares.
        const ETCD_MAX_REQUEST_BYTES: usize = 1536 * 1024;
        const KEY_AND_COMPARES: usize = 4 * 1024;
        // Every resource named at the longest the byte budget allows, handed off at once (its
        // deadline far off), to members of the longest names, each assigned some.
        let long = MAX_NAME_BYTES / MAX_RESOURCES;
        let resources: Vec<String> = (0..MAX_RESOURCES).map(|i| format!("{i:0long$}")).collect();
        assert!(resources.iter().map(String::len).sum::<usize>() <= MAX_NAME_BYTES);
        let member = |m: usize| format!("{m:0200}");
        let assignment = Assignment {
            targets: resources
                .iter()
                .enumerate()
                .map(|(i, r)| (r.clone(), member(i % MAX_MEMBERS)))
                .collect(),
            deadlines: resources
                .iter()
                .map(|r| (r.clone(), 9_999_999_999_999))
                .collect(),
        };
        let bytes = encode(&AssignmentRecord::of(&assignment)).len();
        assert!(
            bytes + KEY_AND_COMPARES <= ETCD_MAX_REQUEST_BYTES,
            "the largest assignment is {bytes} bytes"
        );
    }

    #[test]
    fn members_past_the_bound_by_creation_do_not_count() {
        let member = |i: usize| {
            let read = Read {
                record: MemberRecord {
                    principal: None,
                    session: i as i64,
                    weight: 1,
                    state: State::Active,
                    joined_at: 0,
                },
                mod_revision: 1,
            };
            // Names in the opposite order of creation: the bound goes by creation.
            (format!("m{:04}", MAX_MEMBERS + 5 - i), 100 + i as i64, read)
        };
        let at_bound: Vec<_> = (0..MAX_MEMBERS).map(member).collect();
        assert_eq!(first_members(at_bound).len(), MAX_MEMBERS);
        let past: Vec<_> = (0..MAX_MEMBERS + 3).map(member).collect();
        let counted = first_members(past);
        assert_eq!(counted.len(), MAX_MEMBERS);
        for late in MAX_MEMBERS..MAX_MEMBERS + 3 {
            assert!(!counted.contains_key(&member(late).0), "{late} counted");
        }
        assert!(counted.contains_key(&member(0).0));
    }

    #[test]
    fn the_default_budget_is_a_tenth_of_the_resources_and_at_least_ten() {
        assert_eq!(default_max_moves(0), 10);
        assert_eq!(default_max_moves(100), 10);
        assert_eq!(default_max_moves(10_000), 1_000);
    }

    #[test]
    fn member_records_keep_their_session_exact() {
        let m = MemberRecord {
            principal: None,
            session: 7_587_869_420_498_113_795,
            weight: 2,
            state: State::Draining,
            joined_at: 1,
        };
        let text = String::from_utf8(encode(&m)).unwrap();
        assert_eq!(
            text,
            r#"{"session":"7587869420498113795","weight":2,"state":"draining","joined_at":1}"#
        );
        assert_eq!(serde_json::from_str::<MemberRecord>(&text).unwrap(), m);
    }
}
