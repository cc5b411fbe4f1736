//! What a member knows of its assignment, without I/O: the view the service answers, decoded
//! once ([`View`]), and what each new view means for the grants the member has handed out
//! ([`Book::apply`] → [`Plan`]).
//!
//! A grant is known by resource **and** token. One the view lists in `held` with the same token
//! stays; with another token it is a new grant (the old one ended). One that moves to
//! `releasing` was handed off: its guard is lost, and it must be released. One that leaves both
//! lists ended without a hand-off (revoked, the member evicted). A `releasing` entry the member
//! never handed out as a guard is released at once: nothing works on it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::u64_string;

/// A member's standing in its fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// It is given its share.
    Active,
    /// It hands everything off and is given nothing new (a drain).
    Draining,
    /// An operator evicted it: its grants ended, it gets nothing until it joins again.
    Evicted,
}

/// `GET /v1/fleets/{fleet}/members/{member}`, as the service answers it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct View {
    pub(crate) state: MemberState,
    #[serde(deserialize_with = "u64_string")]
    pub(crate) revision: u64,
    pub(crate) held: Vec<HeldGrant>,
    pub(crate) releasing: Vec<ReleasingEntry>,
}

/// One grant the member holds and is assigned.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct HeldGrant {
    pub(crate) resource: String,
    /// The session the grant lives on (decimal).
    pub(crate) lease_id: String,
    #[serde(deserialize_with = "u64_string")]
    pub(crate) token: u64,
    pub(crate) fencing_token: String,
}

/// One resource the member holds and must release.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct ReleasingEntry {
    pub(crate) resource: String,
    /// Milliseconds left, on the proxy's clock when it answered, before the service revokes it.
    pub(crate) deadline_ms: u64,
}

/// Where a known grant stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Handed out as a guard, assigned.
    Held,
    /// Moved away: lost with a hand-off, to be released.
    Releasing,
}

/// A grant the member knows of. `token` is `None` for a `releasing` entry never seen in
/// `held` (its token was never told).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Known {
    token: Option<u64>,
    stage: Stage,
}

/// A grant named by resource and token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GrantRef {
    pub(crate) resource: String,
    pub(crate) token: u64,
}

/// A grant handed off: lose its guard, release it by `deadline_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandedOff {
    pub(crate) grant: GrantRef,
    pub(crate) deadline_ms: u64,
}

/// What one view means for the grants handed out.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// New grants: a guard each.
    pub(crate) added: Vec<HeldGrant>,
    /// Guards to lose with a hand-off (their grants still to release).
    pub(crate) handed_off: Vec<HandedOff>,
    /// Guards to lose: their grants ended without a hand-off.
    pub(crate) removed: Vec<GrantRef>,
    /// Resources to release at once: moved away before any guard was handed out for them.
    pub(crate) release_now: Vec<String>,
    /// Every resource held and assigned now, in name order.
    pub(crate) held: Vec<String>,
}

/// The grants a member has handed out, by resource.
#[derive(Debug, Default)]
pub(crate) struct Book {
    known: BTreeMap<String, Known>,
}

impl Book {
    /// Whether the grant of `resource` with `token` is still this member's, as far as the last
    /// view says (held, or handed off and not released yet).
    pub(crate) fn holds(&self, resource: &str, token: u64) -> bool {
        self.known
            .get(resource)
            .is_some_and(|k| k.token == Some(token))
    }

    /// Forgets everything (a new session: nothing of the old one is held any more).
    pub(crate) fn clear(&mut self) {
        self.known.clear();
    }

    /// Takes in `view`; what to do with the guards. An evicted member holds nothing, whatever
    /// the view still lists (its grants are being ended at once).
    pub(crate) fn apply(&mut self, view: &View) -> Plan {
        let mut plan = Plan::default();
        let evicted = view.state == MemberState::Evicted;
        let (view_held, view_releasing) = if evicted {
            (&[][..], &[][..])
        } else {
            (&view.held[..], &view.releasing[..])
        };
        let held: BTreeMap<&str, &HeldGrant> =
            view_held.iter().map(|h| (h.resource.as_str(), h)).collect();
        let releasing: BTreeMap<&str, u64> = view_releasing
            .iter()
            .map(|r| (r.resource.as_str(), r.deadline_ms))
            .collect();
        let mut next = BTreeMap::new();
        for (resource, known) in &self.known {
            let gone = |token| GrantRef {
                resource: resource.clone(),
                token,
            };
            match (
                held.get(resource.as_str()),
                releasing.get(resource.as_str()),
            ) {
                (Some(h), _) if known.stage == Stage::Held && known.token == Some(h.token) => {
                    next.insert(resource.clone(), *known);
                }
                (Some(_), _) => {
                    // A new grant of it (taken in below); the old one ended, unless it was
                    // already lost with its hand-off.
                    if let (Some(token), Stage::Held) = (known.token, known.stage) {
                        plan.removed.push(gone(token));
                    }
                }
                (None, Some(&deadline_ms)) => {
                    if let (Some(token), Stage::Held) = (known.token, known.stage) {
                        plan.handed_off.push(HandedOff {
                            grant: gone(token),
                            deadline_ms,
                        });
                    }
                    next.insert(
                        resource.clone(),
                        Known {
                            token: known.token,
                            stage: Stage::Releasing,
                        },
                    );
                }
                (None, None) => {
                    if let (Some(token), Stage::Held) = (known.token, known.stage) {
                        plan.removed.push(gone(token));
                    }
                }
            }
        }
        for h in view_held {
            if !next.contains_key(&h.resource) {
                next.insert(
                    h.resource.clone(),
                    Known {
                        token: Some(h.token),
                        stage: Stage::Held,
                    },
                );
                plan.added.push(h.clone());
            }
        }
        for r in view_releasing {
            if !next.contains_key(&r.resource) && !held.contains_key(r.resource.as_str()) {
                next.insert(
                    r.resource.clone(),
                    Known {
                        token: None,
                        stage: Stage::Releasing,
                    },
                );
                plan.release_now.push(r.resource.clone());
            }
        }
        plan.held = held.keys().map(|r| (*r).to_owned()).collect();
        self.known = next;
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(resource: &str, token: u64) -> HeldGrant {
        HeldGrant {
            resource: resource.into(),
            lease_id: "7".into(),
            token,
            fencing_token: format!("v1.k1.{token}"),
        }
    }

    fn view(revision: u64, h: &[(&str, u64)], r: &[&str]) -> View {
        View {
            state: MemberState::Active,
            revision,
            held: h.iter().map(|&(res, t)| held(res, t)).collect(),
            releasing: r
                .iter()
                .map(|res| ReleasingEntry {
                    resource: (*res).into(),
                    deadline_ms: 3000,
                })
                .collect(),
        }
    }

    fn grant(resource: &str, token: u64) -> GrantRef {
        GrantRef {
            resource: resource.into(),
            token,
        }
    }

    #[test]
    fn the_view_decodes_as_the_service_writes_it() {
        let v: View = serde_json::from_str(
            r#"{"fleet":"f","member":"m","state":"draining","revision":"41",
                "held":[{"resource":"a","lease_id":"7","token":"12","fencing_token":"v1.x"}],
                "releasing":[{"resource":"b","deadline_ms":2500}]}"#,
        )
        .unwrap();
        assert_eq!(v.state, MemberState::Draining);
        assert_eq!((v.revision, v.held[0].token), (41, 12));
        assert_eq!(v.releasing[0].deadline_ms, 2500);
        for bad in [
            r#"{"state":"active","revision":41,"held":[],"releasing":[]}"#,
            r#"{"state":"gone","revision":"41","held":[],"releasing":[]}"#,
            r#"{"state":"active","revision":"41","held":[{"resource":"a"}],"releasing":[]}"#,
            r#"{"state":"active","revision":"41","releasing":[]}"#,
        ] {
            assert!(serde_json::from_str::<View>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn new_grants_are_added_once() {
        let mut book = Book::default();
        let plan = book.apply(&view(1, &[("a", 10), ("b", 11)], &[]));
        assert_eq!(plan.added, [held("a", 10), held("b", 11)]);
        assert_eq!(plan.held, ["a", "b"]);
        let plan = book.apply(&view(2, &[("a", 10), ("b", 11)], &[]));
        assert_eq!(
            plan,
            Plan {
                held: vec!["a".into(), "b".into()],
                ..Plan::default()
            }
        );
        assert!(book.holds("a", 10) && !book.holds("a", 9) && !book.holds("c", 10));
    }

    #[test]
    fn a_move_away_is_a_hand_off_and_then_forgotten() {
        let mut book = Book::default();
        book.apply(&view(1, &[("a", 10), ("b", 11)], &[]));
        let plan = book.apply(&view(2, &[("a", 10)], &["b"]));
        assert_eq!(
            plan.handed_off,
            [HandedOff {
                grant: grant("b", 11),
                deadline_ms: 3000
            }]
        );
        assert!(plan.removed.is_empty() && plan.added.is_empty());
        assert!(book.holds("b", 11), "still to release");
        // Told once, however many views list it.
        assert_eq!(book.apply(&view(3, &[("a", 10)], &["b"])).handed_off, []);
        // Released: it leaves the view, and nothing more is said of it.
        let plan = book.apply(&view(4, &[("a", 10)], &[]));
        assert!(plan.removed.is_empty() && plan.handed_off.is_empty());
        assert!(!book.holds("b", 11));
    }

    #[test]
    fn a_grant_that_leaves_without_a_hand_off_is_removed() {
        let mut book = Book::default();
        book.apply(&view(1, &[("a", 10), ("b", 11)], &[]));
        let plan = book.apply(&view(2, &[("a", 10)], &[]));
        assert_eq!(plan.removed, [grant("b", 11)]);
        // Evicted: nothing is held, whatever the view still lists.
        let plan = book.apply(&View {
            state: MemberState::Evicted,
            ..view(3, &[("a", 10)], &["c"])
        });
        assert_eq!(plan.removed, [grant("a", 10)]);
        assert!(plan.held.is_empty() && plan.release_now.is_empty());
    }

    #[test]
    fn a_new_token_is_a_new_grant_and_ends_the_old_one() {
        let mut book = Book::default();
        book.apply(&view(1, &[("a", 10)], &[]));
        let plan = book.apply(&view(2, &[("a", 20)], &[]));
        assert_eq!(plan.removed, [grant("a", 10)]);
        assert_eq!(plan.added, [held("a", 20)]);
        // Handed off, then given back (same token: the hand-off was undone): a new guard, the
        // old one stays lost.
        book.apply(&view(3, &[], &["a"]));
        let plan = book.apply(&view(4, &[("a", 20)], &[]));
        assert_eq!(plan.added, [held("a", 20)]);
        assert!(plan.removed.is_empty());
    }

    #[test]
    fn a_move_away_never_handed_out_is_released_at_once_and_once() {
        let mut book = Book::default();
        let plan = book.apply(&view(1, &[("a", 10)], &["b"]));
        assert_eq!(plan.release_now, ["b"]);
        assert!(plan.handed_off.is_empty());
        assert_eq!(
            book.apply(&view(2, &[("a", 10)], &["b"])).release_now,
            Vec::<String>::new()
        );
        assert!(!book.holds("b", 0));
        book.clear();
        assert!(!book.holds("a", 10));
    }
}
