//! [`SharedGate`]: the ordering gate across every enforcer sharing one PostgreSQL database.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::inflight::{self, Entry, Lower, Polled, Registered};
use super::listener::Listener;
use super::session::bounded;
use super::PostgresStore;
use crate::admission::{Admission, Outcome, Permit, Release};
use crate::error::GateError;
use crate::store::{HighWaterMarks, Readiness, StoreError, StoreLatency};
use crate::Token;
use runtime::backoff::Backoff;

/// How often at most a gate sweeps expired registrations left behind.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The longest pause between two polls of a write waiting for lower in-flight writes: the
/// fallback for when a wake-up (a local permit's end, or another gateway's notification) is
/// missed.
const MAX_POLL_INTERVAL: Duration = Duration::from_millis(25);

/// Pauses between polls: doubling from 1 ms up to [`MAX_POLL_INTERVAL`].
pub(super) const POLL: Backoff = Backoff::new(Duration::from_millis(1), MAX_POLL_INTERVAL);

/// The next poll's pause: `backoff`'s, but never past the moment the first lower registration
/// expires (just past it, so that the registration is expired when we look).
pub(super) fn poll_pause(backoff: &mut Backoff, next_expiry: Option<Duration>) -> Duration {
    let pause = backoff.pause();
    match next_expiry {
        Some(expiry) => pause.min(expiry + Duration::from_millis(1)),
        None => pause,
    }
}

/// The ordering gate across every enforcer sharing one PostgreSQL database.
///
/// Each admitted write is *registered* in the database for as long as it is in flight: a row
/// in `fence_inflight` with an expiry on the database's clock, not a lock held by a session,
/// so a killed session, a restarted database or a cut network does not end it. The
/// registration lasts `L = max_exchange + write_grace + deadline` (see
/// [`PostgresStore::with_max_exchange`], [`PostgresStore::with_write_grace`],
/// [`PostgresStore::connect_with_deadline`]) unless the permit ends sooner: a complete end
/// deletes it, an uncertain one shortens it to the write grace. A write with a higher token
/// raises the mark — refusing lower tokens from then on — and waits until no registration of a
/// lower token is live, on any enforcer (woken by notifications, polling as a fallback); it
/// gives up with a 503 after `W = L + deadline`. A write waiting like this is refused (409) if
/// a still higher token raises the mark meanwhile.
///
/// Admission is cancellation-safe: the database work runs in a task the gate owns, and a
/// registration whose caller went away is deleted. Every database step answers within the
/// store's deadline or fails with [`GateError::Store`].
///
/// # What breaks it
///
/// - **Session settings must stick.** PgBouncer in *transaction* pooling mode (or any pooler
///   that moves a session's statements between server connections) loses the timeouts set per
///   session and breaks the prepared statements. Use session pooling or direct connections.
/// - **A pause in the last instructions before the kernel takes the write's bytes.** The
///   permit carries a deadline ([`Permit::deadline`]) measured from *before* the registration
///   was sent: `max_exchange + deadline` later (plus `W` if it waited), so the registration
///   outlasts it by the write grace. The fencing layer sends nothing of the write after it (it
///   looks at the clock before the call and before each body frame), so a pause of the
///   gateway anywhere else — between the registration's commit and reading its answer, during
///   a wait or its last poll, before the exchange, mid-body: GC, SIGSTOP, a VM freeze,
///   cgroup throttling, swapping — cancels or shortens the exchange instead of moving it past
///   the registration. What remains is a pause between that last look and the kernel
///   accepting the bytes, near the deadline. Configure `max_exchange` as the gateway's
///   exchange deadline (`--upstream-timeout`); storage that checks the `Fencing-Token` itself
///   is not exposed to this.
/// - **A gateway that dies while a higher token waits for its write** holds that token back
///   until its registration expires (`L`, or `L + W` if it was itself waiting); the waiting
///   write gives up with 503 after `W` and is retried.
/// - **The database clock must not jump forward** by more than the deadline (a jump shortens
///   every registration), nor run much faster than the gateways' clocks; slew it (chrony/ntpd
///   default), don't step it.
/// - **Committed must mean durable.** A raise and a registration are committed synchronously;
///   `synchronous_commit = off` on the role or database, or a failover to an asynchronous
///   standby, can lose them (and lower a mark). Use synchronous replication if you fail over.
/// - **All gateways sharing a database must run this protocol** with consistent
///   `max_exchange` and `write_grace`: an older gateway ordering writes with advisory locks, or
///   an in-process [`Gate`](crate::Gate) over a [`PostgresStore`], does not see registrations
///   and is not seen by them.
/// - **The storage must finish or abandon a write within the write grace** of its exchange
///   ending (as for every gate).
///
/// Cost per admitted write: one pipelined transaction (a row lock on the mark, an insert, a
/// count) committed synchronously (one WAL flush), and a delete at the end committed
/// asynchronously (losing it in a crash only makes the registration last until it expires);
/// plus one idle connection per gate for notifications.
#[derive(Clone, Debug)]
pub struct SharedGate {
    store: PostgresStore,
    latency: StoreLatency,
    tasks: TaskTracker,
    /// Signalled when one of this gate's permits has ended in the database, so local waiters
    /// poll at once instead of at their next backoff.
    ended: Arc<Notify>,
    /// Wakes `ended` on the ends of other gateways' permits; stops with the last clone.
    _listener: Option<Arc<Listener>>,
    last_sweep: Arc<Mutex<Instant>>,
    /// The bound on an admission step: the store deadline (longer only for a negative control,
    /// `negative_control_late_answers`, compiled with the `negative-controls` feature).
    step_deadline: Duration,
    readiness: Arc<Readiness>,
}

impl SharedGate {
    /// A gate over `store`, timing its database calls on the process-wide meter provider.
    /// Registrations last as configured on the store ([`PostgresStore::with_max_exchange`],
    /// [`PostgresStore::with_write_grace`]).
    ///
    /// Within a tokio runtime, the gate also keeps one connection of its own (outside the pool)
    /// listening for other gateways' permits ending, so that its waiting writes go ahead at once;
    /// without one they notice at their next poll.
    pub fn new(store: PostgresStore) -> Self {
        let ended = Arc::new(Notify::new());
        let listener = Listener::start(store.config.clone(), store.deadline, ended.clone());
        Self {
            latency: StoreLatency::global(),
            tasks: TaskTracker::new(),
            ended,
            _listener: listener.map(Arc::new),
            last_sweep: Arc::new(Mutex::new(Instant::now())),
            step_deadline: store.deadline,
            store,
            readiness: Arc::default(),
        }
    }

    /// **Broken on purpose**, for the negative controls only: an admission step waits ten store
    /// deadlines for its answer, so an answer that a paused gateway reads late is always taken
    /// (without this, whether it is depends on which of the answer and the step's timer the
    /// runtime sees first on waking). Only unsafe together with the layer's
    /// `negative_control_deadline_from_admission`.
    #[cfg(feature = "negative-controls")]
    pub fn negative_control_late_answers(mut self) -> Self {
        self.step_deadline = self.store.deadline * 10;
        self
    }

    /// Times the database calls into `latency` instead.
    pub fn with_latency(mut self, latency: StoreLatency) -> Self {
        self.latency = latency;
        self
    }

    /// The store behind the gate.
    pub fn store(&self) -> &PostgresStore {
        &self.store
    }

    /// Waits until the database work this gate runs in the background has finished: admissions
    /// whose callers went away, the ends of permits, sweeps (each bounded by the store
    /// deadline). Call it before exiting, so that ended writes stop holding back higher tokens
    /// now rather than when their registrations expire.
    pub async fn drain(&self) {
        self.tasks.close();
        self.tasks.wait().await;
        self.tasks.reopen();
    }

    async fn admit_inner(&self, resource: &str, token: Token) -> Result<Permit, GateError> {
        self.sweep_now_and_then();
        let (reply, answer) = oneshot::channel();
        let gate = self.clone();
        let resource = resource.to_owned();
        self.tasks
            .spawn(async move { gate.admission(resource, token, reply).await });
        let mut answer = Answer(answer);
        // The task bounds each step itself; this is the last resort.
        let last_resort = self.store.max_wait() + self.store.deadline * 4;
        match tokio::time::timeout(last_resort, &mut answer.0).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(store_error("the admission task ended without an answer")),
            Err(_) => Err(store_error(format!(
                "admission did not finish within {last_resort:?}"
            ))),
        }
    }

    /// Registers the write and waits out lower in-flight writes, then hands the permit to the
    /// caller — or, if the caller has gone, ends it at once.
    async fn admission(
        self,
        resource: String,
        token: Token,
        mut reply: oneshot::Sender<Result<Permit, GateError>>,
    ) {
        if reply.is_closed() {
            return;
        }
        let result = self.register_and_wait(&resource, token, &mut reply).await;
        match result {
            Ok(permit) => {
                if let Err(Ok(permit)) = reply.send(Ok(permit)) {
                    // Nothing was sent to the storage under it.
                    permit.complete();
                }
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    async fn register_and_wait(
        &self,
        resource: &str,
        token: Token,
        reply: &mut oneshot::Sender<Result<Permit, GateError>>,
    ) -> Result<Permit, GateError> {
        // Armed before each look at the database, so that an end between the look and the
        // wait is not missed.
        let wake = self.ended.notified();
        tokio::pin!(wake);
        let entry = Entry {
            id: rand::random(),
            resource,
            token,
            lifetime: self.store.lifetime(),
            max_wait: self.store.max_wait(),
        };
        // Taken before the registration is sent, so that the registration (lengthened by the
        // longest wait if it has to wait) outlasts the wait by a whole lifetime.
        let started = Instant::now();
        let (lower, registering) = self.register(&entry, started).await?;
        // From here on every way out ends the registration: a permit that never reached its
        // caller protected no write, so it ends as complete.
        let registration = self.permit(entry.id);
        let timing = self.store.timing();
        if lower.live == 0 {
            return Ok(registration.with_deadline(timing.permit_deadline(registering, false)));
        }
        tracing::debug!(resource, %token, lower = lower.live, "waiting for lower in-flight writes");
        let waited = self
            .wait_for_lower(&entry, lower, started + entry.max_wait, reply, wake)
            .await;
        match waited {
            // Lengthened by the longest wait: so is the deadline.
            Ok(()) => Ok(registration.with_deadline(timing.permit_deadline(registering, true))),
            Err(e) => {
                registration.complete();
                Err(e)
            }
        }
    }

    /// Registers `entry`'s write at the mark (the first step sent at `started`), raising the
    /// mark first if its token is above it: the lower-token writes in flight, and the instant
    /// the permit's deadline counts from — before the step that made the registration (the raise's, when the first step found the
    /// token above the mark), so that it falls inside the registration however late this
    /// process reads the answers, and a slow first step does not eat into the exchange.
    async fn register(
        &self,
        entry: &Entry<'_>,
        started: Instant,
    ) -> Result<(Lower, Instant), GateError> {
        let deadline = self.step_deadline;
        let mut registering = started;
        let mut registered = self
            .latency
            .time(
                "get",
                bounded(deadline, "register the write", async {
                    let session = self.store.session().await?;
                    let registered = inflight::register_at_mark(&session, entry).await?;
                    session.done();
                    Ok(registered)
                }),
            )
            .await;
        if let Ok(Registered::NeedsRaise) = registered {
            registering = Instant::now();
            registered = self
                .latency
                .time(
                    "raise",
                    bounded(deadline, "raise the mark", async {
                        let mut session = self.store.session().await?;
                        let registered = inflight::raise_and_register(&mut session, entry).await?;
                        session.done();
                        Ok(registered)
                    }),
                )
                .await;
        }
        match registered {
            Ok(Registered::Yes { lower }) => Ok((lower, registering)),
            Ok(Registered::Stale(mark)) => Err(GateError::Stale {
                token: entry.token,
                mark,
            }),
            Ok(Registered::NeedsRaise) => {
                Err(store_error("the mark changed twice during admission"))
            }
            Err(e) => {
                // The registration may have committed without our hearing of it.
                self.permit(entry.id).complete();
                Err(e.into())
            }
        }
    }

    /// Waits, until `give_up`, for the `lower` writes in flight below `entry`'s token to end
    /// (woken by `wake`, the ends this gate hears of, or by polling). Ends early if the caller
    /// goes away or the mark passes the token.
    async fn wait_for_lower<'g>(
        &'g self,
        entry: &Entry<'_>,
        lower: Lower,
        give_up: Instant,
        reply: &mut oneshot::Sender<Result<Permit, GateError>>,
        mut wake: std::pin::Pin<&mut tokio::sync::futures::Notified<'g>>,
    ) -> Result<(), GateError> {
        let mut backoff = POLL;
        let mut next_expiry = lower.next_expiry;
        loop {
            tokio::select! {
                _ = reply.closed() => return Err(store_error("the caller went away")),
                _ = &mut wake => {}
                _ = tokio::time::sleep(poll_pause(&mut backoff, next_expiry)) => {}
            }
            wake.set(self.ended.notified());
            // Past this, the registration would no longer cover a whole exchange.
            if Instant::now() >= give_up {
                return Err(store_error(format!(
                    "lower-token writes still in flight after {:?}",
                    entry.max_wait
                )));
            }
            let polled = self
                .latency
                .time(
                    "wait",
                    bounded(self.step_deadline, "wait for lower writes", async {
                        let session = self.store.session().await?;
                        let polled = inflight::poll(&session, entry).await?;
                        session.done();
                        Ok(polled)
                    }),
                )
                .await;
            match polled {
                Ok(Polled::Clear) => return Ok(()),
                Ok(Polled::Waiting(expiry)) => next_expiry = expiry,
                Ok(Polled::Overtaken(mark)) => {
                    return Err(GateError::Stale {
                        token: entry.token,
                        mark,
                    })
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The permit of registration `id`.
    fn permit(&self, id: i64) -> Permit {
        Permit::new(Registration {
            gate: self.clone(),
            id,
        })
    }

    /// Ends registration `id` in the database (see [`inflight::end`]) and wakes local waiters.
    /// Tried twice: a pooled session whose backend was ended (a restart, an operator's
    /// `pg_terminate_backend`) fails the first try and is dropped, and the second takes another.
    /// Ending a registration twice is ending it once.
    async fn end(&self, id: i64, outcome: Outcome) {
        let attempt = || {
            bounded(self.store.deadline, "end the write", async {
                let session = self.store.session().await?;
                inflight::end(&session, id, outcome, self.store.write_grace).await?;
                session.done();
                Ok(())
            })
        };
        let ended = async {
            match attempt().await {
                Err(e) => {
                    tracing::debug!(id, error = %e, "ending a write's registration: trying again");
                    attempt().await
                }
                ended => ended,
            }
        };
        match self.latency.time("release", ended).await {
            Ok(()) => self.ended.notify_waiters(),
            Err(e) => tracing::warn!(
                id,
                ?outcome,
                error = %e,
                "could not end a write's registration: it lasts until it expires"
            ),
        }
    }

    /// Starts a sweep of expired registrations if none ran for a while.
    fn sweep_now_and_then(&self) {
        {
            let mut last = match self.last_sweep.try_lock() {
                Ok(last) => last,
                Err(_) => return,
            };
            if last.elapsed() < SWEEP_EVERY {
                return;
            }
            *last = Instant::now();
        }
        let gate = self.clone();
        self.tasks.spawn(async move {
            let swept = bounded(gate.store.deadline, "sweep", async {
                let session = gate.store.session().await?;
                let n = inflight::sweep(&session).await?;
                session.done();
                Ok(n)
            })
            .await;
            match swept {
                Ok(n) => tracing::debug!(deleted = n, "swept expired write registrations"),
                Err(e) => tracing::debug!(error = %e, "sweep of expired registrations failed"),
            }
        });
    }
}

fn store_error(message: impl Into<String>) -> GateError {
    GateError::Store(StoreError(message.into()))
}

/// The caller's end of an admission. If the caller goes away (or times out) after the task has
/// already answered, the permit in the channel protected no write: end it as complete rather
/// than let it drop as uncertain.
struct Answer(oneshot::Receiver<Result<Permit, GateError>>);

impl Drop for Answer {
    fn drop(&mut self) {
        self.0.close();
        if let Ok(Ok(permit)) = self.0.try_recv() {
            permit.complete();
        }
    }
}

/// An admitted write's registration; ending the permit ends it in the database.
struct Registration {
    gate: SharedGate,
    id: i64,
}

impl Release for Registration {
    fn release(self: Box<Self>, outcome: Outcome) {
        let Registration { gate, id } = *self;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let tasks = gate.tasks.clone();
                tasks.spawn_on(async move { gate.end(id, outcome).await }, &runtime);
            }
            // Nowhere to talk to the database from: the registration's expiry covers the write.
            Err(_) => tracing::debug!(id, "no runtime to end a write's registration"),
        }
    }
}

impl Admission for SharedGate {
    fn admit<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<Permit, GateError>> {
        Box::pin(self.admit_inner(resource, token))
    }

    /// Ready when the database takes a write: the store's probe (at most one per
    /// [`PROBE_TTL`](crate::store::PROBE_TTL)), timed as `probe`.
    fn ready(&self) -> BoxFuture<'_, bool> {
        Box::pin(self.readiness.check(|| async {
            // `probe` is bounded by the deadline; the timeout is the last resort.
            let probe = self.latency.time("probe", self.store.probe());
            match tokio::time::timeout(self.store.deadline * 2, probe).await {
                Ok(probed) => probed,
                Err(_) => Err(StoreError("the write probe did not finish".into())),
            }
        }))
    }
}
