//! What the loss watch knows, without I/O: the grants a client's guards hold, what an ownership
//! event means for each of them ([`loss`]), and what the watch's one stream must cover
//! ([`Book::wanted`]). The stream itself is `loss_watch.rs`'s.
//!
//! An event is matched to a grant by resource **and** token (the grant's create revision): an
//! end (`released`, `expired`) ends the grant whose token it carries and no other, so an event
//! of an older grant of the same resource never ends a newer one; an `acquired` with a larger
//! token means a later grant exists, so ours has ended whatever told us so (a taken-over grant).

use std::collections::{HashMap, VecDeque};

use crate::EventKind;

/// How many recent events are kept for a grant registered after its own end was read.
const RECENT: usize = 1024;

/// How a held grant ended, as an event tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    /// Released: by someone with its secret, or its session was closed.
    Released,
    /// Its lease (or its session's) ended without a release.
    Expired,
    /// A later grant of the resource was made.
    TakenOver,
}

/// What an event of `kind` for a grant with token `event` means for the held grant of the same
/// resource with token `held`.
pub(crate) fn loss(kind: EventKind, event: u64, held: u64) -> Option<Loss> {
    match kind {
        EventKind::Released if event == held => Some(Loss::Released),
        EventKind::Expired if event == held => Some(Loss::Expired),
        EventKind::Acquired if event > held => Some(Loss::TakenOver),
        _ => None,
    }
}

/// Where the stream stands: the prefix it watches and the revision it reads after (every event
/// of a later revision under the prefix reaches it, or has). `after` is `None` for a stream
/// opened "from now" whose start is not known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Coverage {
    pub(crate) prefix: String,
    pub(crate) after: Option<u64>,
}

/// What the stream should watch: every held resource starts with `prefix`, and no held grant
/// has a token below `from`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    pub(crate) prefix: String,
    pub(crate) from: u64,
}

/// The held grants (each with the `T` to tell when it is lost) and recent events.
#[derive(Debug)]
pub(crate) struct Book<T> {
    held: HashMap<String, Vec<(u64, u64, T)>>,
    next_id: u64,
    recent: VecDeque<(String, EventKind, u64)>,
    /// What the running stream covers; `None` when none runs.
    pub(crate) coverage: Option<Coverage>,
    /// The smallest token of the grants registered that the stream does not cover: it must be
    /// reopened to read from there (taken when it is).
    pub(crate) uncovered: Option<u64>,
}

impl<T: Clone> Book<T> {
    pub(crate) fn new() -> Self {
        Self {
            held: HashMap::new(),
            next_id: 0,
            recent: VecDeque::new(),
            coverage: None,
            uncovered: None,
        }
    }

    /// Registers the grant of `resource` with `token`; its id (to deregister it), and its loss
    /// if an event already read ended it.
    pub(crate) fn register(
        &mut self,
        resource: &str,
        token: u64,
        target: T,
    ) -> (u64, Option<Loss>) {
        let id = self.next_id;
        self.next_id += 1;
        let ended = self
            .recent
            .iter()
            .filter(|(r, _, _)| r == resource)
            .find_map(|&(_, kind, t)| loss(kind, t, token));
        if ended.is_none() {
            self.held
                .entry(resource.to_owned())
                .or_default()
                .push((id, token, target));
            let covered = self.coverage.as_ref().is_some_and(|c| {
                resource.starts_with(&c.prefix) && c.after.is_some_and(|after| after <= token)
            });
            if !covered {
                self.uncovered = Some(self.uncovered.map_or(token, |t| t.min(token)));
            }
        }
        (id, ended)
    }

    /// Forgets grant `id` (released, or its guard dropped).
    pub(crate) fn deregister(&mut self, id: u64) {
        self.held.retain(|_, grants| {
            grants.retain(|(i, _, _)| *i != id);
            !grants.is_empty()
        });
    }

    /// Whether no grant is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Takes in an event: the held grants it ends (forgotten from here on) and how.
    pub(crate) fn see(&mut self, resource: &str, kind: EventKind, token: u64) -> Vec<(T, Loss)> {
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((resource.to_owned(), kind, token));
        let Some(grants) = self.held.get_mut(resource) else {
            return Vec::new();
        };
        let mut lost = Vec::new();
        grants.retain(|(_, held, target)| match loss(kind, token, *held) {
            Some(how) => {
                lost.push((target.clone(), how));
                false
            }
            None => true,
        });
        if grants.is_empty() {
            self.held.remove(resource);
        }
        lost
    }

    /// What the stream must cover: the longest prefix every held resource starts with, and
    /// the smallest held token. `None` when nothing is held.
    pub(crate) fn wanted(&self) -> Option<Wanted> {
        let from = self
            .held
            .values()
            .flatten()
            .map(|(_, token, _)| *token)
            .min()?;
        let mut names = self.held.keys();
        let mut prefix = names.next()?.clone();
        for name in names {
            let common = prefix
                .char_indices()
                .zip(name.chars())
                .find(|((_, a), b)| a != b)
                .map_or(prefix.len().min(name.len()), |((i, _), _)| i);
            prefix.truncate(common);
        }
        Some(Wanted { prefix, from })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EventKind::{Acquired, Expired, Released};

    #[test]
    fn an_event_ends_only_the_grant_whose_token_it_carries_or_a_later_grant() {
        assert_eq!(loss(Released, 7, 7), Some(Loss::Released));
        assert_eq!(loss(Expired, 7, 7), Some(Loss::Expired));
        assert_eq!(loss(Acquired, 9, 7), Some(Loss::TakenOver));
        // An older grant's end, or its acquisition, or our own: nothing.
        for (kind, event) in [(Released, 5), (Expired, 5), (Acquired, 5), (Acquired, 7)] {
            assert_eq!(loss(kind, event, 7), None, "{kind:?} {event}");
        }
        // A later grant's end cannot concern ours (ours ended before it began).
        assert_eq!(loss(Expired, 9, 7), None);
    }

    #[test]
    fn events_reach_the_grants_they_end_and_stale_ones_reach_none() {
        let mut book = Book::new();
        let (_, none) = book.register("aisle-1", 10, "a1");
        assert_eq!(none, None);
        book.register("aisle-2", 12, "a2");
        book.register("aisle-3", 14, "a3");
        assert!(
            book.see("aisle-1", Expired, 4).is_empty(),
            "an older grant's"
        );
        assert!(
            book.see("aisle-9", Expired, 10).is_empty(),
            "another resource's"
        );
        assert_eq!(book.see("aisle-1", Expired, 10), [("a1", Loss::Expired)]);
        assert_eq!(book.see("aisle-2", Acquired, 20), [("a2", Loss::TakenOver)]);
        assert!(book.see("aisle-2", Released, 12).is_empty(), "told once");
        assert_eq!(book.see("aisle-3", Released, 14), [("a3", Loss::Released)]);
        assert!(book.is_empty());
    }

    #[test]
    fn a_grant_registered_after_its_end_was_read_is_lost_at_once() {
        let mut book = Book::new();
        book.see("dock", Released, 30);
        book.see("dock", Expired, 31);
        assert_eq!(book.register("dock", 31, ()).1, Some(Loss::Expired));
        assert_eq!(book.register("dock", 30, ()).1, Some(Loss::Released));
        book.see("dock", Acquired, 40);
        assert_eq!(book.register("dock", 35, ()).1, Some(Loss::TakenOver));
        // A newer grant than anything read is held.
        assert_eq!(book.register("dock", 41, ()).1, None);
        assert!(!book.is_empty());
    }

    #[test]
    fn the_stream_wanted_covers_every_held_grant() {
        let mut book: Book<()> = Book::new();
        assert_eq!(book.wanted(), None);
        let (a, _) = book.register("aisle-12", 50, ());
        assert_eq!(
            book.wanted(),
            Some(Wanted {
                prefix: "aisle-12".into(),
                from: 50
            })
        );
        book.register("aisle-3", 70, ());
        book.register("aisle-14", 60, ());
        assert_eq!(
            book.wanted(),
            Some(Wanted {
                prefix: "aisle-".into(),
                from: 50
            })
        );
        book.register("dock", 80, ());
        assert_eq!(book.wanted().unwrap().prefix, "");
        book.deregister(a);
        assert_eq!(book.wanted().unwrap().from, 60);
    }

    #[test]
    fn a_grant_the_stream_does_not_cover_is_read_from_its_token() {
        let mut book: Book<()> = Book::new();
        book.register("aisle-1", 80, ());
        assert_eq!(book.uncovered, Some(80), "no stream runs");
        book.uncovered = None;
        book.coverage = Some(Coverage {
            prefix: "aisle-".into(),
            after: Some(100),
        });
        book.register("aisle-1", 120, ());
        assert_eq!(book.uncovered, None, "under the prefix, after the start");
        book.register("aisle-2", 95, ());
        book.register("dock", 130, ());
        book.register("aisle-3", 90, ());
        assert_eq!(
            book.uncovered,
            Some(90),
            "older than the start, or outside the prefix"
        );
        book.uncovered = None;
        book.coverage = Some(Coverage {
            prefix: String::new(),
            after: None,
        });
        book.register("x", 140, ());
        assert_eq!(book.uncovered, Some(140), "a start not known yet");
    }
}
