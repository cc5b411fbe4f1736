//! The fleet's end in model 3 (`proxy/src/fleet/spec.rs`): `DELETE` requests racing, each
//! reading the fleet, deleting its keys with a guard on the spec read (one wins, the others
//! read again and find it gone), then releasing what the fleet's index names; a replica dying
//! between its delete and its releases; and the drivers finishing an end left unfinished.
//!
//! The index names every grant the fleet made that is still there (each grant writes its key,
//! each end of a grant deletes it), and in the model every grant is the fleet's: so the index,
//! read after the delete, is the grants held then. After the delete no grant can be made (its
//! guards have moved), so a release of the index leaves nothing held.

use super::{Action, Fleet, Mutation, State};

/// The grants as the model keeps them: each resource's (member, revision), if held.
type Grants = Vec<Option<(u8, u8)>>;

/// Where one `DELETE` request is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Delete {
    /// Not begun, or its guarded delete lost and it reads again.
    Idle,
    /// It read the fleet: the grants then (`Some`), or no fleet (`None`).
    Read(Option<Grants>),
    /// Its delete is done; what its read found (the grants the broken variant releases).
    Releasing(Grants),
    /// It answered.
    Answered,
    /// Its replica died before it answered.
    Died,
}

impl Fleet {
    /// The steps the `DELETE`s and the drivers can take in `s`.
    pub(super) fn end_actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (d, delete) in (0u8..).zip(&s.deletes) {
            match delete {
                Delete::Idle => actions.push(Action::EndRead(d)),
                Delete::Read(Some(_)) => actions.push(Action::EndDelete(d)),
                Delete::Read(None) => actions.push(Action::EndRelease(d)),
                Delete::Releasing(_) => {
                    actions.push(Action::EndRelease(d));
                    if self.end_dies {
                        actions.push(Action::EndDies(d));
                    }
                }
                Delete::Answered | Delete::Died => {}
            }
        }
        if s.ending && self.mutation != Some(Mutation::EndLeftToItsReplica) {
            actions.push(Action::FinishEnd);
        }
    }

    /// `DELETE` `d` takes `action`.
    pub(super) fn end_step(&self, s: &mut State, action: Action, d: u8) {
        let d = usize::from(d);
        let delete = std::mem::replace(&mut s.deletes[d], Delete::Idle);
        s.deletes[d] = match (action, delete) {
            (Action::EndRead(_), Delete::Idle) => {
                Delete::Read((!s.ended).then(|| s.holders.clone()))
            }
            // The guard on the spec read fails: it reads again.
            (Action::EndDelete(_), Delete::Read(Some(_))) if s.ended => Delete::Idle,
            (Action::EndDelete(_), Delete::Read(Some(read))) => {
                // The keys go, so every guard a grant compares has moved; the end's key is
                // written in the same revision.
                s.ended = true;
                s.ending = true;
                s.assignment_rev += 1;
                for rev in s.member_revs.iter_mut() {
                    *rev += 1;
                }
                Delete::Releasing(read)
            }
            (Action::EndRelease(_), Delete::Read(None)) => {
                if self.mutation != Some(Mutation::DeleteAnswersAFleetGone) {
                    self.release_index(s, None);
                }
                Delete::Answered
            }
            (Action::EndRelease(_), Delete::Releasing(read)) => {
                self.release_index(s, Some(read));
                Delete::Answered
            }
            (Action::EndDies(_), Delete::Releasing(_)) => Delete::Died,
            (_, unchanged) => unchanged,
        };
    }

    /// An ended fleet's grants released (`spec.rs::release_ended`): each grant its index names
    /// by a compare-and-delete on its revision, then its end's key; nothing once the end is
    /// done. `read` is what the `DELETE`'s own read found, which the broken variant releases
    /// instead of the index.
    pub(super) fn release_index(&self, s: &mut State, read: Option<Grants>) {
        if !s.ending {
            return;
        }
        let named = match read {
            Some(read) if self.mutation == Some(Mutation::EndReleasesWhatItRead) => read,
            _ => s.holders.clone(),
        };
        for (r, grant) in named.into_iter().enumerate() {
            if grant.is_some() && s.holders[r] == grant {
                s.holders[r] = None;
            }
        }
        s.ending = false;
    }
}
