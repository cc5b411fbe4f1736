//! What the fleet model holds to: safety in every state, the settled properties once nothing is
//! left to happen, and the behaviours the checker must reach at least once.

use stateright::Property;

use super::{Delete, Fleet, Standing, State};

/// Every property the checker holds the fleet to.
pub(super) fn all() -> Vec<Property<Fleet>> {
    vec![
        Property::always("never granted while another grant lives", |_, s: &State| {
            !s.double_grant
        }),
        Property::always("no resource moves twice for one change", |_, s: &State| {
            s.moves.iter().all(|&m| m <= 1)
        }),
        Property::always(
            "nothing held once the fleet's end is done",
            |_, s: &State| {
                let done = s.ended && !s.ending;
                !done || s.holders.iter().all(Option::is_none)
            },
        ),
        Property::always("a DELETE answers once nothing is held", |_, s: &State| {
            let answered = s.deletes.contains(&Delete::Answered);
            !answered || s.holders.iter().all(Option::is_none)
        }),
        Property::always(
            "settled: nothing held once the fleet has ended",
            |m: &Fleet, s: &State| !m.quiet(s) || !s.ended || s.holders.iter().all(Option::is_none),
        ),
        Property::always(
            "settled: no end is left unfinished",
            |m: &Fleet, s: &State| !m.quiet(s) || !s.ending,
        ),
        Property::always(
            "settled: every resource held by an active member",
            |m: &Fleet, s: &State| {
                let quiet = m.quiet(s);
                let anyone = s.members.contains(&Standing::Active);
                !quiet
                    || !anyone
                    || s.ended
                    || s.holders.iter().all(|h| {
                        h.is_some_and(|(holder, _)| s.members[holder as usize] == Standing::Active)
                    })
            },
        ),
        Property::sometimes("a resource is handed off", |_, s: &State| {
            s.moves.contains(&1)
        }),
        Property::sometimes(
            "a member whose process died is granted a resource",
            |_, s: &State| s.granted_to_dead,
        ),
    ]
}
