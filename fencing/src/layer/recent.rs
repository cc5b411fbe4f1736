//! What the enforcer decided lately, for an operator's feed (fence-gateway's
//! `GET /fence-gateway/feed`, the dashboard's "enforcer" panel): the highest token admitted per
//! resource and the latest refusals of a token, each with its reason. Bounded, in memory, this
//! process only; never the presented token itself (only its number, once verified) — the mark
//! store is the record, this is a window onto it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use tokio::time::Instant;

use crate::{Token, TokenError};

use super::Rejection;

/// Resources whose mark is remembered (the least recently raised is forgotten first).
const MARKS: usize = 1024;
/// Refusals remembered.
const REFUSALS: usize = 256;

/// The sequence number a feed's query asks after: none or an empty query is `0`, exactly
/// `after=DIGITS` (at most 19) is that number, anything else (another parameter, a
/// percent-encoded digit, more digits) is `None` and is refused. One reading for
/// fence-gateway's feed and lease-proxy's relay of it.
pub fn feed_after(query: Option<&str>) -> Option<u64> {
    match query.filter(|q| !q.is_empty()) {
        None => Some(0),
        Some(q) => q
            .strip_prefix("after=")
            .filter(|n| !n.is_empty() && n.len() <= 19 && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse().ok()),
    }
}

/// The window: see the module documentation.
#[derive(Debug)]
pub struct Recent {
    inner: Mutex<Inner>,
    /// Tells this process's window from the next one's (whose sequence numbers start again).
    process: String,
}

impl Default for Recent {
    fn default() -> Self {
        // The start time (ns) and the pid: distinct across restarts of one gateway and
        // between gateways.
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            inner: Mutex::default(),
            process: format!(
                "{:x}-{:x}",
                started & u128::from(u64::MAX),
                std::process::id()
            ),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// resource → (highest token admitted, when it was first admitted).
    marks: HashMap<String, (Token, Instant)>,
    /// Resources in the order their marks were raised, oldest first (stale entries skipped).
    raised: VecDeque<(String, Token)>,
    refusals: VecDeque<(u64, Instant, Refusal)>,
    /// Sequence number of the last refusal.
    last: u64,
}

/// Why a token was refused, as the feed names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Below the resource's mark: a holder that was replaced.
    Stale,
    /// Not signed by a key of the keyring (altered, or an unknown key).
    Forged,
    /// Genuine, but for another resource.
    Misdirected,
    /// Not a token.
    Malformed,
}

impl Reason {
    /// Its name in the feed.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Stale => "stale",
            Reason::Forged => "forged",
            Reason::Misdirected => "misdirected",
            Reason::Malformed => "malformed",
        }
    }
}

/// One refusal of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refusal {
    resource: String,
    reason: Reason,
    /// The refused token and the mark it was below (stale: both verified).
    token: Option<Token>,
    mark: Option<Token>,
}

/// A mark in a [`Feed`].
#[derive(Debug)]
pub struct FeedMark {
    /// The resource.
    pub resource: String,
    /// The highest token this process admitted for it.
    pub mark: Token,
    /// How long ago it was first admitted, in milliseconds.
    pub age_ms: u64,
}

/// A refusal in a [`Feed`].
#[derive(Debug)]
pub struct FeedRefusal {
    /// Its sequence number: ask for those after the last one seen.
    pub seq: u64,
    /// How long ago, in milliseconds (a duration: compare it with no wall clock).
    pub age_ms: u64,
    /// The resource.
    pub resource: String,
    /// Why.
    pub reason: Reason,
    /// The refused token, when verified (stale).
    pub token: Option<Token>,
    /// The mark it was below (stale).
    pub mark: Option<Token>,
}

/// What [`Recent::feed`] answers.
#[derive(Debug)]
pub struct Feed {
    /// Which process's window: with another, sequence numbers start again (ask from 0).
    pub process: String,
    /// Marks, most recently raised first.
    pub marks: Vec<FeedMark>,
    /// Refusals after the asked sequence number, newest first.
    pub refusals: Vec<FeedRefusal>,
    /// The sequence number of the newest refusal (0: none yet).
    pub last: u64,
}

impl Recent {
    /// Notes that `token` was admitted for `resource`.
    pub fn admitted(&self, resource: &str, token: Token) {
        let mut inner = self.lock();
        let now = Instant::now();
        match inner.marks.get_mut(resource) {
            Some((mark, _)) if *mark >= token => return,
            Some(entry) => *entry = (token, now),
            None => {
                inner.marks.insert(resource.to_owned(), (token, now));
            }
        }
        inner.raised.push_back((resource.to_owned(), token));
        // Forget the least recently raised resources beyond the bound. `raised` also holds
        // raises superseded since (the map holds a newer token): skipped here, and dropped all at
        // once when they outnumber the live ones.
        while inner.marks.len() > MARKS {
            let Some((old, at)) = inner.raised.pop_front() else {
                break;
            };
            if inner.marks.get(&old).is_some_and(|(t, _)| *t == at) {
                inner.marks.remove(&old);
            }
        }
        if inner.raised.len() > 2 * MARKS {
            let Inner { marks, raised, .. } = &mut *inner;
            raised.retain(|(r, at)| marks.get(r).is_some_and(|(t, _)| t == at));
        }
    }

    /// Notes a refusal of a token for `resource`, if it is one the feed shows.
    pub fn refused(&self, resource: &str, rejection: &Rejection) {
        let (reason, token, mark) = match rejection {
            Rejection::Stale { token, mark } => (Reason::Stale, Some(*token), Some(*mark)),
            Rejection::Token(TokenError::BadSignature | TokenError::UnknownKey) => {
                (Reason::Forged, None, None)
            }
            Rejection::Token(TokenError::WrongResource) => (Reason::Misdirected, None, None),
            Rejection::Token(TokenError::Malformed) => (Reason::Malformed, None, None),
            _ => return,
        };
        let mut inner = self.lock();
        inner.last += 1;
        let seq = inner.last;
        inner.refusals.push_back((
            seq,
            Instant::now(),
            Refusal {
                resource: resource.to_owned(),
                reason,
                token,
                mark,
            },
        ));
        if inner.refusals.len() > REFUSALS {
            inner.refusals.pop_front();
        }
    }

    /// The marks and the refusals after `after`.
    pub fn feed(&self, after: u64) -> Feed {
        let inner = self.lock();
        let now = Instant::now();
        let age =
            |at: Instant| u64::try_from(now.duration_since(at).as_millis()).unwrap_or(u64::MAX);
        let mut marks: Vec<_> = inner
            .marks
            .iter()
            .map(|(resource, (mark, at))| (*at, resource, *mark))
            .collect();
        marks.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        Feed {
            process: self.process.clone(),
            marks: marks
                .into_iter()
                .map(|(at, resource, mark)| FeedMark {
                    resource: resource.clone(),
                    mark,
                    age_ms: age(at),
                })
                .collect(),
            refusals: inner
                .refusals
                .iter()
                .rev()
                .take_while(|(seq, _, _)| *seq > after)
                .map(|(seq, at, r)| FeedRefusal {
                    seq: *seq,
                    age_ms: age(*at),
                    resource: r.resource.clone(),
                    reason: r.reason,
                    token: r.token,
                    mark: r.mark,
                })
                .collect(),
            last: inner.last,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Nothing here can leave the window half-changed in a way that matters: a poisoned
        // lock (a panic elsewhere while holding it) still holds a usable window.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(revision: u64) -> Token {
        Token { era: 0, revision }
    }

    #[test]
    fn a_mark_only_rises_and_the_oldest_resources_are_forgotten() {
        let recent = Recent::default();
        recent.admitted("a", t(5));
        recent.admitted("a", t(3));
        assert_eq!(recent.feed(0).marks[0].mark, t(5));
        recent.admitted("a", t(7));
        assert_eq!(recent.feed(0).marks.len(), 1);
        assert_eq!(recent.feed(0).marks[0].mark, t(7));
        for i in 0..MARKS + 10 {
            recent.admitted(&format!("r{i}"), t(1));
        }
        // A hot resource raised again and again leaves no trail behind.
        for i in 2..10 * MARKS as u64 {
            recent.admitted("hot", t(i));
        }
        assert!(recent.lock().raised.len() <= 2 * MARKS + 1);
        let feed = recent.feed(0);
        assert_eq!(feed.marks.len(), MARKS);
        assert!(feed
            .marks
            .iter()
            .all(|m| m.resource != "a" && m.resource != "r0"));
        assert!(feed
            .marks
            .iter()
            .any(|m| m.resource == format!("r{}", MARKS + 9)));
        assert_eq!(
            feed.marks[0].resource, "hot",
            "the most recently raised first"
        );
    }

    #[test]
    fn a_feed_query_is_after_digits_or_nothing() {
        assert_eq!(feed_after(None), Some(0));
        assert_eq!(feed_after(Some("")), Some(0));
        assert_eq!(feed_after(Some("after=0")), Some(0));
        assert_eq!(feed_after(Some("after=42")), Some(42));
        // At most 19 digits: every such number is a u64.
        assert_eq!(
            feed_after(Some("after=9999999999999999999")),
            Some(9_999_999_999_999_999_999)
        );
        for bad in [
            "after=",
            "after=x",
            "after=-1",
            "after=+1",
            "after=%31",
            "after=1&x=2",
            "x=2&after=1",
            "before=1",
            "after=18446744073709551615",
            "after=00000000000000000001",
        ] {
            assert_eq!(feed_after(Some(bad)), None, "{bad}");
        }
    }

    #[test]
    fn refusals_come_after_the_asked_one_newest_first_and_bounded() {
        let recent = Recent::default();
        let stale = Rejection::Stale {
            token: t(3),
            mark: t(5),
        };
        recent.refused("a", &stale);
        recent.refused("b", &Rejection::Token(TokenError::BadSignature));
        recent.refused("c", &Rejection::Token(TokenError::WrongResource));
        recent.refused("d", &Rejection::StoreUnavailable); // not a token's refusal
        let feed = recent.feed(0);
        assert_eq!(feed.last, 3);
        let reasons: Vec<_> = feed.refusals.iter().map(|r| (r.seq, r.reason)).collect();
        assert_eq!(
            reasons,
            [
                (3, Reason::Misdirected),
                (2, Reason::Forged),
                (1, Reason::Stale)
            ]
        );
        assert_eq!(feed.refusals[2].token, Some(t(3)));
        assert_eq!(feed.refusals[2].mark, Some(t(5)));
        assert_eq!(recent.feed(2).refusals.len(), 1);
        assert!(recent.feed(3).refusals.is_empty());
        for _ in 0..REFUSALS + 5 {
            recent.refused("a", &stale);
        }
        assert_eq!(recent.feed(0).refusals.len(), REFUSALS);
    }
}
