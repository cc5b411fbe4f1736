//! The replica's memory for watch answers, in budgets: what every stream holds for its client —
//! answers queued, taken by the client's front and not yet handed to HTTP/2, and handed to
//! HTTP/2 and not yet written — is counted until it is written (or dropped), against the
//! stream's principal ([`Limits::principal`]; with authentication off every caller is one
//! principal, whose budget is the replica's) and the replica ([`Limits::replica`]).
//!
//! An answer that would take a principal past its budget ends that principal's stream that
//! holds the most; one that would take the replica past its own ends the largest stream of the
//! principal that holds the most — the stream that holds the memory, never whoever receives
//! next (a tenant's stalled streams cut off another tenant's ordinary stream when the budget
//! was shared and a refused answer ended its receiver). The stream whose answer it is ends
//! instead when it is the one to end, and an answer larger than a budget is refused outright.
//! The queue's own bound per stream ([`super::MAX_BUFFERED_BYTES`]) is the outbox's.
//!
//! Ending a stream gives back what it queued and what its front had not handed to HTTP/2 yet
//! (the outbox's [`Holder::cut`]); what HTTP/2 holds — at most its send buffer per stream — is
//! given back as it is written or the stream is reset. Decisions are taken under one lock, in
//! [`Books::admit`]; the streams are cut after it is released.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::metrics::Metrics;

/// Most bytes of watch answers one principal's streams hold at once.
pub(crate) const PRINCIPAL: usize = 64 << 20;

/// Most bytes of watch answers the replica's streams hold at once.
pub(crate) const REPLICA: usize = 256 << 20;

/// The budgets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) principal: usize,
    pub(crate) replica: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            principal: PRINCIPAL,
            replica: REPLICA,
        }
    }
}

/// Which bound a stream went past: why it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    /// Its own queue (its client does not read).
    Stream,
    /// Its principal's budget, and it held the most of the principal's.
    Principal,
    /// The replica's, and it was the largest stream of the principal holding the most.
    Replica,
    /// One answer larger than its principal's budget.
    TooLarge,
}

impl Over {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Over::Stream => "stream",
            Over::Principal => "principal",
            Over::Replica => "replica",
            Over::TooLarge => "too_large",
        }
    }
}

/// A stream that can be ended to give back what it holds.
pub(super) trait Holder: Send + Sync {
    /// Ends the stream for `why`, giving back (through its [`Meter`]) what it queued and what
    /// its front has not handed to HTTP/2 yet.
    fn cut(&self, why: Over);
}

/// The replica's books.
pub(crate) struct Budgets {
    limits: Limits,
    books: Mutex<Books>,
    metrics: Arc<Metrics>,
}

/// A principal, as the books key it (`None`: authentication off).
type Principal = Option<Arc<str>>;

#[derive(Default)]
struct Books {
    total: usize,
    principals: HashMap<Principal, usize>,
    streams: HashMap<u64, Stream>,
    next: u64,
}

struct Stream {
    principal: Principal,
    bytes: usize,
    /// Chosen to end: never chosen again, its bytes counted until given back.
    cut: bool,
    holder: Weak<dyn Holder>,
}

/// What [`Books::admit`] decides for an answer.
#[derive(Debug, PartialEq, Eq)]
enum Admit {
    Yes,
    No(Over),
    /// End this other stream first, then ask again.
    Cut(u64, Over),
}

impl Books {
    /// Whether stream `id` may hold `n` more bytes within `limits`.
    fn admit(&self, id: u64, n: usize, limits: Limits) -> Admit {
        let Some(me) = self.streams.get(&id) else {
            return Admit::No(Over::Stream);
        };
        if me.cut {
            return Admit::No(Over::Stream);
        }
        // Without authentication the one principal's budget is the replica's.
        let (budget, over) = match me.principal {
            Some(_) => (limits.principal.min(limits.replica), Over::Principal),
            None => (limits.replica, Over::Replica),
        };
        if n > budget {
            return Admit::No(Over::TooLarge);
        }
        let principal = self.principals.get(&me.principal).copied().unwrap_or(0);
        if principal + n > budget {
            return self.largest_of(&me.principal, id, over);
        }
        if self.total + n > limits.replica {
            return match self.heaviest() {
                Some(heaviest) => self.largest_of(&heaviest, id, Over::Replica),
                None => Admit::No(Over::Replica),
            };
        }
        Admit::Yes
    }

    /// The stream of `principal` holding the most, not yet cut, to end — unless it is `id`
    /// (the asking stream), which then ends itself.
    fn largest_of(&self, principal: &Principal, id: u64, over: Over) -> Admit {
        let largest = self
            .streams
            .iter()
            .filter(|(_, s)| !s.cut && s.bytes > 0 && s.principal == *principal)
            .max_by_key(|(_, s)| s.bytes)
            .map(|(&other, _)| other);
        match largest {
            Some(other) if other != id => Admit::Cut(other, over),
            _ => Admit::No(over),
        }
    }

    /// The principal whose streams not yet cut hold the most.
    fn heaviest(&self) -> Option<Principal> {
        let mut held: HashMap<&Principal, usize> = HashMap::new();
        for s in self.streams.values().filter(|s| !s.cut) {
            *held.entry(&s.principal).or_default() += s.bytes;
        }
        held.into_iter()
            .max_by_key(|(_, bytes)| *bytes)
            .map(|(p, _)| p.clone())
    }

    fn add(&mut self, id: u64, n: usize) {
        if let Some(s) = self.streams.get_mut(&id) {
            s.bytes += n;
            *self.principals.entry(s.principal.clone()).or_default() += n;
            self.total += n;
        }
    }

    fn sub(&mut self, id: u64, n: usize) {
        if let Some(s) = self.streams.get_mut(&id) {
            let n = n.min(s.bytes);
            s.bytes -= n;
            self.total = self.total.saturating_sub(n);
            if let Some(p) = self.principals.get_mut(&s.principal) {
                *p = p.saturating_sub(n);
            }
        }
    }
}

impl Budgets {
    /// The replica's budgets ([`Limits::default`]), reported in `metrics`.
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        Self::with_limits(Limits::default(), metrics)
    }

    pub(crate) fn with_limits(limits: Limits, metrics: Arc<Metrics>) -> Self {
        Self {
            limits,
            books: Mutex::new(Books::default()),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Books> {
        // Poisoned only by a panic between plain integer updates: the books are whole.
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new stream's meter, for `principal`'s stream `holder`.
    pub(super) fn open(
        self: &Arc<Self>,
        principal: Option<&str>,
        holder: Weak<dyn Holder>,
    ) -> Meter {
        let mut books = self.lock();
        let id = books.next;
        books.next += 1;
        books.streams.insert(
            id,
            Stream {
                principal: principal.map(Arc::from),
                bytes: 0,
                cut: false,
                holder,
            },
        );
        Meter {
            budgets: self.clone(),
            id,
        }
    }

    /// The gauges, from the books as they are now (held under their lock).
    fn report(&self, books: &Books) {
        let total = i64::try_from(books.total).unwrap_or(i64::MAX);
        self.metrics.watch_held.store(total, Ordering::Relaxed);
        self.metrics
            .watch_held_peak
            .fetch_max(total, Ordering::Relaxed);
    }
}

/// One stream's account in the books; closed (what it still holds given back) when dropped.
pub(super) struct Meter {
    budgets: Arc<Budgets>,
    id: u64,
}

impl Meter {
    /// Counts `n` more bytes held by the stream, ending the streams that hold the memory first
    /// when a budget would be passed ([`Books::admit`]); refused when this stream is the one to
    /// end, or the answer is larger than a budget.
    pub(super) fn charge(&self, n: usize) -> Result<(), Over> {
        let budgets = &self.budgets;
        loop {
            let (victim, over) = {
                let mut books = budgets.lock();
                match books.admit(self.id, n, budgets.limits) {
                    Admit::Yes => {
                        books.add(self.id, n);
                        budgets.report(&books);
                        return Ok(());
                    }
                    Admit::No(over) => {
                        drop(books);
                        self.refused(over);
                        return Err(over);
                    }
                    Admit::Cut(other, over) => match books.streams.get_mut(&other) {
                        Some(s) => {
                            s.cut = true;
                            (s.holder.clone(), over)
                        }
                        None => continue,
                    },
                }
            };
            self.refused(over);
            // Not under the books' lock: cutting gives bytes back through them.
            if let Some(holder) = victim.upgrade() {
                holder.cut(over);
            }
        }
    }

    /// Gives back `n` bytes the stream held (written, dropped, or ended).
    pub(super) fn release(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut books = self.budgets.lock();
        books.sub(self.id, n);
        self.budgets.report(&books);
    }

    /// Counts a stream ended for `over`.
    pub(super) fn refused(&self, over: Over) {
        self.budgets.metrics.watch_cut_off(over.as_str());
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        let mut books = self.budgets.lock();
        if let Some(held) = books.streams.get(&self.id).map(|s| s.bytes) {
            books.sub(self.id, held);
        }
        if let Some(s) = books.streams.remove(&self.id) {
            if books.principals.get(&s.principal) == Some(&0) {
                books.principals.remove(&s.principal);
            }
        }
        self.budgets.report(&books);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A stream that counts its cuts and gives back everything it holds when cut — unless
    /// HTTP/2 holds it (`gives_back` false).
    struct Fake {
        meter: Mutex<Option<Meter>>,
        cuts: AtomicUsize,
        gives_back: bool,
    }

    impl Holder for Fake {
        fn cut(&self, _: Over) {
            self.cuts.fetch_add(1, Ordering::Relaxed);
            let meter = self.meter.lock().unwrap();
            if let (Some(m), true) = (meter.as_ref(), self.gives_back) {
                let held = m.budgets.lock().streams[&m.id].bytes;
                m.release(held);
            }
        }
    }

    fn stream(budgets: &Arc<Budgets>, principal: Option<&str>) -> Arc<Fake> {
        held_stream(budgets, principal, true)
    }

    fn held_stream(budgets: &Arc<Budgets>, principal: Option<&str>, gives_back: bool) -> Arc<Fake> {
        let fake = Arc::new(Fake {
            meter: Mutex::new(None),
            cuts: AtomicUsize::new(0),
            gives_back,
        });
        let holder: Weak<dyn Holder> = Arc::downgrade(&fake) as Weak<dyn Holder>;
        *fake.meter.lock().unwrap() = Some(budgets.open(principal, holder));
        fake
    }

    fn charge(s: &Fake, n: usize) -> Result<(), Over> {
        s.meter.lock().unwrap().as_ref().unwrap().charge(n)
    }

    fn budgets(principal: usize, replica: usize) -> Arc<Budgets> {
        let metrics = Arc::new(Metrics::new().unwrap());
        Arc::new(Budgets::with_limits(Limits { principal, replica }, metrics))
    }

    #[test]
    fn a_principal_past_its_budget_ends_its_own_largest_stream_never_anothers() {
        let b = budgets(100, 1000);
        let (a1, a2, a3) = (
            stream(&b, Some("a")),
            stream(&b, Some("a")),
            stream(&b, Some("a")),
        );
        let other = stream(&b, Some("o"));
        charge(&other, 10).unwrap();
        charge(&a1, 60).unwrap();
        charge(&a2, 30).unwrap();
        // a3's answer would take `a` past 100: a1 (the largest) ends, not `o`'s stream.
        charge(&a3, 40).unwrap();
        assert_eq!(a1.cuts.load(Ordering::Relaxed), 1);
        assert_eq!(other.cuts.load(Ordering::Relaxed), 0);
        // a2 holds the most of `a` now, but the asking stream is the largest: it ends itself.
        assert_eq!(charge(&a3, 40), Err(Over::Principal));
        assert_eq!(a2.cuts.load(Ordering::Relaxed), 0);
        assert_eq!(charge(&a3, 101), Err(Over::TooLarge));
        assert_eq!(b.lock().total, 80);
    }

    #[test]
    fn the_replica_past_its_budget_ends_the_heaviest_principals_largest_stream() {
        let b = budgets(100, 150);
        let (a1, a2) = (stream(&b, Some("a")), stream(&b, Some("a")));
        let (o1, p1) = (stream(&b, Some("o")), stream(&b, Some("p")));
        charge(&a1, 50).unwrap();
        charge(&a2, 40).unwrap();
        charge(&o1, 55).unwrap();
        // 145 held; p's 20 would pass 150: `a` holds the most (90), its largest (a1) ends,
        // although o1 is the largest stream.
        charge(&p1, 20).unwrap();
        assert_eq!(a1.cuts.load(Ordering::Relaxed), 1);
        assert_eq!(o1.cuts.load(Ordering::Relaxed), 0);
        assert_eq!(b.lock().total, 115);
    }

    #[test]
    fn a_closed_stream_gives_back_what_it_held_and_a_cut_one_is_not_chosen_twice() {
        let b = budgets(100, 1000);
        let a1 = stream(&b, Some("a"));
        charge(&a1, 70).unwrap();
        drop(a1.meter.lock().unwrap().take());
        assert_eq!(b.lock().total, 0);
        assert!(b.lock().principals.is_empty());
        // Without authentication every caller is one principal with the replica's budget.
        let held = held_stream(&b, None, false);
        let (n2, n3) = (stream(&b, None), stream(&b, None));
        charge(&held, 600).unwrap();
        charge(&n2, 300).unwrap();
        // `held` is cut but HTTP/2 still holds its bytes: n2 is cut next, and that is enough.
        charge(&n3, 200).unwrap();
        assert_eq!(held.cuts.load(Ordering::Relaxed), 1);
        assert_eq!(n2.cuts.load(Ordering::Relaxed), 1);
        assert_eq!(b.lock().total, 800);
        // Nothing else to end: the asker ends, and `held` is not cut again.
        assert_eq!(charge(&n3, 300), Err(Over::Replica));
        assert_eq!(held.cuts.load(Ordering::Relaxed), 1);
    }
}
