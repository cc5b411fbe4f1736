//! The ordering gate: admits writes per resource so that storage sees tokens in non-decreasing
//! order, and never admits a token below one already admitted.
//!
//! Per resource the gate keeps the high-water mark (cached from the store) and the writes in
//! flight. A write carrying the mark runs at once, concurrently with others carrying it. A write
//! with a higher token first closes the door on lower tokens, waits until every in-flight write
//! with a lower token has finished, raises the mark durably in the store, and only then runs. A
//! write below the mark (or below a raise under way) is refused. Without the wait, an old
//! holder's write already in flight could land after the new holder's write.
//!
//! "In flight" lasts until the write's [`Permit`] is ended. A write whose exchange ended without
//! a complete answer ([`Outcome::Uncertain`]) keeps the resource closed to higher tokens for the
//! write grace, and so does every resource for the write grace after the gate starts: a
//! restarted enforcer cannot know what its previous life left in flight at the storage.
//!
//! Idle resources are forgotten after [`Gate::with_idle_eviction`]'s timeout (the mark stays in
//! the store and is read again on next use), so the gate's memory follows the resources in use,
//! not every resource ever seen.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::admission::{Admission, Outcome, Permit, Release, DEFAULT_WRITE_GRACE};
use crate::decide::{self, Drain, Step};
use crate::store::{HighWaterMarks, Readiness, StoreError};
use crate::Token;

/// Why a write was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The token is below the resource's mark (or a higher token is being admitted).
    #[error("fencing token {token} is below the high-water mark {mark}")]
    Stale {
        /// The refused token.
        token: Token,
        /// The mark it is below.
        mark: Token,
    },
    /// The store failed; nothing was admitted.
    #[error(transparent)]
    Store(#[from] StoreError),
}

struct State {
    /// The durable mark, once read from the store.
    mark: Option<Token>,
    /// Lowest token still admissible: the mark, or a higher token whose raise is under way.
    floor: Token,
    /// Admitted writes not yet finished, by token.
    in_flight: BTreeMap<Token, usize>,
    /// Until when no higher token may be raised: an uncertain write may still be applied.
    uncertain_until: Instant,
    /// When a write last touched the resource, for idle eviction.
    last_used: Instant,
}

struct Entry {
    state: Mutex<State>,
    /// Signalled whenever an in-flight write finishes.
    finished: Notify,
    /// Serialises loads and raises of this resource's mark.
    raising: tokio::sync::Mutex<()>,
}

/// How long a store call may take unless configured ([`Gate::with_store_timeout`]).
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an idle resource stays in the gate's memory unless configured.
pub const DEFAULT_IDLE_EVICTION: Duration = Duration::from_secs(300);

/// The gate over all resources, in front of one store.
pub struct Gate<S> {
    store: S,
    entries: DashMap<String, Arc<Entry>>,
    ordering: bool,
    write_grace: Duration,
    /// Until when every resource counts as uncertain: the gate's start plus the write grace.
    started_uncertain_until: Instant,
    idle_eviction: Duration,
    last_sweep: Mutex<Instant>,
    store_timeout: Duration,
    readiness: Readiness,
}

/// One in-flight write, counted until its permit ends.
struct InFlight {
    entry: Arc<Entry>,
    token: Token,
    grace: Duration,
}

impl Release for InFlight {
    fn release(self: Box<Self>, outcome: Outcome) {
        {
            let mut state = lock(&self.entry.state);
            if let Some(n) = state.in_flight.get_mut(&self.token) {
                *n -= 1;
                if *n == 0 {
                    state.in_flight.remove(&self.token);
                }
            }
            let now = Instant::now();
            state.uncertain_until =
                decide::closed_until(state.uncertain_until, outcome, now, self.grace);
            state.last_used = now;
        }
        self.entry.finished.notify_waiters();
    }
}

impl<S: HighWaterMarks> Gate<S> {
    /// A gate in front of `store`, with the default write grace and idle eviction.
    pub fn new(store: S) -> Self {
        let now = Instant::now();
        Self {
            store,
            entries: DashMap::new(),
            ordering: true,
            write_grace: DEFAULT_WRITE_GRACE,
            started_uncertain_until: now + DEFAULT_WRITE_GRACE,
            idle_eviction: DEFAULT_IDLE_EVICTION,
            last_sweep: Mutex::new(now),
            store_timeout: DEFAULT_STORE_TIMEOUT,
            readiness: Readiness::default(),
        }
    }

    /// Bounds every call to the store: past it the write is refused (fail closed) and the
    /// readiness probe answers not ready. A call that timed out may still complete in the
    /// store; the mark is read again before the next decision, so that never lowers it.
    pub fn with_store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = timeout;
        self
    }

    async fn bounded<T>(
        &self,
        op: &str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.store_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError(format!(
                "{op} did not answer within {:?}",
                self.store_timeout
            ))),
        }
    }

    /// How long an uncertain write (and the gate's own start) keeps a resource closed to higher
    /// tokens; must exceed the storage's longest processing time of a write.
    pub fn with_write_grace(mut self, grace: Duration) -> Self {
        self.started_uncertain_until = self.started_uncertain_until - self.write_grace + grace;
        self.write_grace = grace;
        self
    }

    /// How long a resource with nothing in flight stays in memory before it is forgotten (its
    /// mark stays in the store).
    pub fn with_idle_eviction(mut self, idle: Duration) -> Self {
        self.idle_eviction = idle;
        self
    }

    /// How many resources the gate holds in memory now.
    pub fn resident(&self) -> usize {
        self.entries.len()
    }

    /// TEST ONLY: skips waiting for lower in-flight writes before raising the mark, to show that
    /// the concurrency tests catch the reordering this wait prevents. Never use in production.
    #[doc(hidden)]
    pub fn without_ordering_for_tests(mut self) -> Self {
        self.ordering = false;
        self
    }

    /// The store behind the gate.
    pub fn store(&self) -> &S {
        &self.store
    }

    fn entry(&self, resource: &str) -> Arc<Entry> {
        self.sweep();
        if let Some(e) = self.entries.get(resource) {
            return e.clone();
        }
        self.entries
            .entry(resource.to_owned())
            .or_insert_with(|| {
                let now = Instant::now();
                Arc::new(Entry {
                    state: Mutex::new(State {
                        mark: None,
                        floor: Token::default(),
                        in_flight: BTreeMap::new(),
                        uncertain_until: self.started_uncertain_until,
                        last_used: now,
                    }),
                    finished: Notify::new(),
                    raising: tokio::sync::Mutex::new(()),
                })
            })
            .clone()
    }

    /// Forgets resources idle for longer than the eviction timeout, at most twice per timeout.
    /// An entry is forgotten only while nobody else holds it (no write in flight or being
    /// admitted: the map's shard lock keeps a new holder from taking it meanwhile) and no
    /// uncertain write is pending, so the next write reads its mark from the store again and a
    /// mark is never lowered.
    fn sweep(&self) {
        let now = Instant::now();
        {
            let mut last = match self.last_sweep.try_lock() {
                Ok(last) => last,
                Err(_) => return,
            };
            if now.duration_since(*last) < self.idle_eviction / 2 {
                return;
            }
            *last = now;
        }
        let before = self.entries.len();
        self.entries.retain(|_, entry| {
            if Arc::strong_count(entry) > 1 {
                return true;
            }
            let state = lock(&entry.state);
            !state.in_flight.is_empty()
                || state.uncertain_until > now
                || now.duration_since(state.last_used) < self.idle_eviction
        });
        if self.entries.len() < before / 2 {
            self.entries.shrink_to_fit();
        }
    }

    /// Admits a write with `token` on `resource`, waiting for lower in-flight writes to finish
    /// and raising the mark durably when `token` is above it.
    pub async fn admit(&self, resource: &str, token: Token) -> Result<Permit, GateError> {
        // A store that lost its file refuses writes at the mark too, not only raises.
        if let Some(failed) = self.store.failed() {
            return Err(failed.into());
        }
        let entry = self.entry(resource);
        loop {
            {
                let mut state = lock(&entry.state);
                match decide::admit_step(state.mark, state.floor, token) {
                    Step::Stale { floor } => return Err(GateError::Stale { token, mark: floor }),
                    Step::Admit => {
                        *state.in_flight.entry(token).or_default() += 1;
                        state.last_used = Instant::now();
                        return Ok(Permit::new(InFlight {
                            entry: entry.clone(),
                            token,
                            grace: self.write_grace,
                        }));
                    }
                    // Above the mark: from now on lower tokens are refused.
                    Step::Raise { floor } => state.floor = floor,
                    Step::Load => {}
                }
            }
            let _raising = entry.raising.lock().await;
            let loaded = lock(&entry.state).mark.is_some();
            if !loaded {
                let stored = self.bounded("get", self.store.get(resource)).await?;
                let mut state = lock(&entry.state);
                if state.mark.is_none() {
                    if stored.is_none() {
                        // Never written: nothing of an earlier life can be in flight.
                        state.uncertain_until = Instant::now();
                    }
                    let mark = stored.unwrap_or_default();
                    state.mark = Some(mark);
                    state.floor = state.floor.max(mark);
                }
                continue;
            }
            if lock(&entry.state).mark.is_some_and(|m| m >= token) {
                continue;
            }
            if self.ordering {
                self.drain_below(&entry, token).await;
            }
            match self
                .bounded("raise", self.store.raise(resource, token))
                .await
            {
                Ok(mark) => {
                    let mut state = lock(&entry.state);
                    state.mark = Some(state.mark.unwrap_or_default().max(mark));
                    state.floor = state.floor.max(mark);
                }
                Err(e) => {
                    // Fail closed, and do not leave the door shut on a raise that never happened
                    // beyond what is durable: re-read the mark next time.
                    let mut state = lock(&entry.state);
                    state.floor = state.mark.unwrap_or_default();
                    state.mark = None;
                    return Err(e.into());
                }
            }
        }
    }

    /// Waits until no admitted write with a token below `token` is in flight and no uncertain
    /// write's grace is running.
    async fn drain_below(&self, entry: &Entry, token: Token) {
        loop {
            let finished = entry.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            let drain = {
                let state = lock(&entry.state);
                let lower = state.in_flight.range(..token).next().is_some();
                decide::drain(lower, state.uncertain_until, Instant::now())
            };
            match drain {
                Drain::Clear => return,
                Drain::AwaitUntil(until) => {
                    let _ = tokio::time::timeout_at(until, finished).await;
                }
                Drain::AwaitEnd => finished.await,
            }
        }
    }

    /// The mark of `resource` as the gate knows it (loading it from the store if needed).
    pub async fn mark(&self, resource: &str) -> Result<Option<Token>, GateError> {
        if let Some(mark) = lock(&self.entry(resource).state).mark {
            return Ok(Some(mark).filter(|m| *m != Token::default()));
        }
        Ok(self.bounded("get", self.store.get(resource)).await?)
    }
}

impl<S: HighWaterMarks> Admission for Gate<S> {
    fn admit<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> futures::future::BoxFuture<'a, Result<Permit, GateError>> {
        Box::pin(Gate::admit(self, resource, token))
    }

    /// Ready when the store can make a raise: its write probe, within the store timeout (at
    /// most one probe per [`PROBE_TTL`](crate::store::PROBE_TTL)).
    fn ready(&self) -> futures::future::BoxFuture<'_, bool> {
        Box::pin(
            self.readiness
                .check(|| self.bounded("probe", self.store.probe())),
        )
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // A poisoned lock only means another thread panicked mid-update of plain data; the counters
    // are still consistent enough to keep refusing lower tokens.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn t(r: u64) -> Token {
        Token::new(0, r)
    }

    #[tokio::test]
    async fn lower_waits_are_refused_higher_raise() {
        let gate = Gate::new(MemoryStore::new());
        let p5 = gate.admit("r", t(5)).await.unwrap();
        p5.complete();
        assert!(matches!(
            gate.admit("r", t(4)).await,
            Err(GateError::Stale { .. })
        ));
        let _p5 = gate.admit("r", t(5)).await.unwrap();
        assert_eq!(gate.store().get("r").await.unwrap(), Some(t(5)));
    }

    /// On a paused clock: the 50 ms the newer write is given are advanced, not slept.
    #[tokio::test(start_paused = true)]
    async fn higher_token_waits_for_lower_in_flight() {
        let gate = Arc::new(Gate::new(MemoryStore::new()));
        let old = gate.admit("r", t(1)).await.unwrap();
        let g = gate.clone();
        let newer = tokio::spawn(async move { g.admit("r", t(2)).await.map(|_| ()) });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            !newer.is_finished(),
            "admitted while a lower write was in flight"
        );
        // Meanwhile the old holder is cut off.
        assert!(matches!(
            gate.admit("r", t(1)).await,
            Err(GateError::Stale { .. })
        ));
        old.complete();
        newer.await.unwrap().unwrap();
        assert_eq!(gate.store().get("r").await.unwrap(), Some(t(2)));
    }

    /// A store whose `get` of resource `held` waits until the test lets it answer: an
    /// admission of it stays under way meanwhile.
    struct HeldGet {
        inner: MemoryStore,
        held: &'static str,
        open: tokio::sync::Semaphore,
    }

    impl HighWaterMarks for HeldGet {
        fn get<'a>(
            &'a self,
            resource: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<Option<Token>, StoreError>> {
            Box::pin(async move {
                if resource == self.held {
                    let _open = self.open.acquire().await;
                }
                self.inner.get(resource).await
            })
        }

        fn raise<'a>(
            &'a self,
            resource: &'a str,
            token: Token,
        ) -> futures::future::BoxFuture<'a, Result<Token, StoreError>> {
            self.inner.raise(resource, token)
        }

        fn probe(&self) -> futures::future::BoxFuture<'_, Result<(), StoreError>> {
            self.inner.probe()
        }
    }

    /// Whether `admit` is decided within `within` (paused time: nothing else advances it).
    async fn admitted_within(
        gate: &Gate<impl HighWaterMarks>,
        token: Token,
        within: Duration,
    ) -> Option<Result<Permit, GateError>> {
        tokio::time::timeout(within, gate.admit("r", token))
            .await
            .ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_complete_write_lets_a_higher_token_in_at_once() {
        let gate = Gate::new(MemoryStore::new());
        gate.admit("r", t(1)).await.unwrap().complete();
        let p2 = admitted_within(&gate, t(2), Duration::from_millis(1)).await;
        assert!(
            matches!(p2, Some(Ok(_))),
            "a completed write imposed a wait"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_uncertain_write_holds_higher_tokens_for_the_grace() {
        let grace = Duration::from_secs(3);
        for end in [Permit::uncertain as fn(Permit), drop] {
            let gate = Gate::new(MemoryStore::new()).with_write_grace(grace);
            end(gate.admit("r", t(1)).await.unwrap());
            let started = Instant::now();
            let early = admitted_within(&gate, t(2), grace - Duration::from_millis(100)).await;
            assert!(
                early.is_none(),
                "a higher token was admitted within the grace"
            );
            // The refused wait raised the floor: the uncertain holder is cut off meanwhile.
            assert!(matches!(
                gate.admit("r", t(1)).await,
                Err(GateError::Stale { .. })
            ));
            tokio::time::timeout(grace, gate.admit("r", t(2)))
                .await
                .expect("not admitted after the grace")
                .unwrap()
                .complete();
            assert!(started.elapsed() >= grace);
            assert!(started.elapsed() < grace + Duration::from_millis(200));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_gate_waits_out_the_grace_for_written_resources_only() {
        let store = MemoryStore::new();
        store.raise("r", t(1)).await.unwrap();
        let grace = Duration::from_secs(2);
        let gate = Gate::new(store).with_write_grace(grace);
        // A resource never written: nothing of an earlier life can be in flight.
        let fresh = tokio::time::timeout(Duration::from_millis(1), gate.admit("fresh", t(1)));
        fresh.await.unwrap().unwrap().complete();
        // The mark itself is admitted at once; a higher token waits until start + grace.
        match admitted_within(&gate, t(1), Duration::from_millis(1)).await {
            Some(Ok(permit)) => permit.complete(),
            other => panic!("the mark was not admitted at once: {other:?}"),
        }
        let started = Instant::now();
        gate.admit("r", t(2)).await.unwrap().complete();
        assert!(started.elapsed() >= grace - Duration::from_millis(10));
        assert!(started.elapsed() <= grace + Duration::from_millis(10));
    }

    #[tokio::test]
    async fn mark_reports_what_was_admitted() {
        let gate = Gate::new(MemoryStore::new());
        assert_eq!(gate.mark("r").await.unwrap(), None);
        gate.admit("r", t(5)).await.unwrap().complete();
        assert_eq!(gate.mark("r").await.unwrap(), Some(t(5)));
        // Loaded but never written: the gate holds the zero token, reported as no mark.
        let _ = gate.admit("zero", Token::default()).await.unwrap();
        assert_eq!(gate.mark("zero").await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_resources_are_forgotten_and_their_marks_kept() {
        let idle = Duration::from_secs(10);
        let gate = Gate::new(MemoryStore::new())
            .with_write_grace(Duration::from_secs(1))
            .with_idle_eviction(idle);
        gate.admit("a", t(5)).await.unwrap().complete();
        tokio::time::sleep(Duration::from_secs(6)).await;
        // A sweep: "a", used 6 s ago, is kept.
        gate.admit("c", t(1)).await.unwrap().complete();
        assert_eq!(gate.resident(), 2);
        tokio::time::sleep(Duration::from_millis(4500)).await;
        // "a" is idle now, but the last sweep was 4.5 s ago: sweeps run at most every 5 s.
        gate.admit("d", t(1)).await.unwrap().complete();
        assert_eq!(
            gate.resident(),
            3,
            "swept more often than every half timeout"
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // 12 s after "a"'s last write and 6 s after the last sweep: "a" goes, "c" and "d" stay.
        gate.admit("b", t(1)).await.unwrap().complete();
        assert_eq!(
            gate.resident(),
            3,
            "idle `a` not forgotten, or `c` or `d` forgotten early"
        );
        assert!(matches!(
            gate.admit("a", t(4)).await,
            Err(GateError::Stale { .. })
        ));
        assert_eq!(gate.resident(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn resources_in_use_or_in_their_grace_are_never_forgotten() {
        // Sweeps run at most every 2 s; an uncertain write keeps its resource closed for 5 s.
        let gate = Arc::new(
            Gate::new(HeldGet {
                inner: MemoryStore::new(),
                held: "r",
                open: tokio::sync::Semaphore::new(0),
            })
            .with_write_grace(Duration::from_secs(5))
            .with_idle_eviction(Duration::from_secs(4))
            .with_store_timeout(Duration::from_secs(600)),
        );
        // "r": an admission under way (its store read has not answered), nothing in flight.
        let g = gate.clone();
        let loading = tokio::spawn(async move { g.admit("r", t(1)).await.map(Permit::complete) });
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_secs(6)).await;
        // A sweep runs (6 s after the start, past the gate's start grace): "r" is idle by
        // every clock but held by its admission.
        gate.admit("u", t(1)).await.unwrap().uncertain();
        assert_eq!(gate.resident(), 2, "an entry being admitted was forgotten");
        // 4.5 s later "u" is idle, but its uncertain write's grace runs 0.5 s more.
        tokio::time::sleep(Duration::from_millis(4500)).await;
        gate.admit("x", t(1)).await.unwrap().complete();
        assert_eq!(
            gate.resident(),
            3,
            "an entry in its write grace was forgotten"
        );
        gate.store().open.add_permits(1);
        loading.await.unwrap().unwrap();
    }

    proptest! {
        /// Against a reference model: a request is accepted iff its token is at least the mark,
        /// and the mark never goes down.
        #[test]
        fn matches_the_reference_model(ops in proptest::collection::vec((0u8..3, 0u64..20), 1..200)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let gate = Gate::new(MemoryStore::new());
                let mut model: HashMap<String, Token> = HashMap::new();
                for (r, rev) in ops {
                    let resource = format!("r{r}");
                    let token = t(rev);
                    let mark = model.get(&resource).copied().unwrap_or_default();
                    let accepted = gate.admit(&resource, token).await.map(Permit::complete).is_ok();
                    prop_assert_eq!(accepted, token >= mark, "{} {}", resource, token);
                    if accepted {
                        model.insert(resource.clone(), mark.max(token));
                    }
                    let stored = gate.store().get(&resource).await.unwrap().unwrap_or_default();
                    prop_assert!(stored >= mark, "mark went down");
                    prop_assert_eq!(stored, model.get(&resource).copied().unwrap_or_default());
                }
                Ok(())
            })?;
        }
    }
}
