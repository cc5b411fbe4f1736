//! Model 1: the enforcer's admission. Writers holding tokens 1, 2, … write one resource through
//! one gateway with the in-process gate over a durable store ([`Enforcer::Local`]), or through
//! gateways sharing their marks and registrations in PostgreSQL ([`Enforcer::Shared`]). The
//! storage applies each write within `processing` ticks of receiving it (below the write
//! grace). Invariant: the storage applies tokens in non-decreasing order.
//!
//! Every step of a gateway is an action of its own, so between any two the gateway can pause
//! (time passes, its clock drifting within `drift` of the database's) or crash. What the code
//! decides is decided by `fencing::decide`, the functions the gates and the layer call; the
//! database's statements are modelled as atomic steps with their SQL's meaning. An end of a
//! registration reaches the database at once or never: a later arrival only makes it last
//! longer, and a duplicate changes nothing.

use std::fmt::Write as _;
use std::time::Duration;

use fencing::decide::{self, AtMark, Drain, Lower, Polled, Registered, Step, Timing};
use fencing::{Outcome, Token};
use stateright::{Model, Property};

/// Which enforcer the writers go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Enforcer {
    /// One gateway, the in-process gate over a durable store (`fencing/src/gate.rs`).
    Local,
    /// `n` gateways sharing PostgreSQL (`fencing/src/store/postgres/gate.rs`, `inflight.rs`).
    Shared(u8),
}

/// A change to the protocol or to a shared decision, which the checker must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// The F1 mechanism, as the campaign's `deadline-from-admission` control: the exchange's
    /// deadline counts from when the layer reads its admission, ignoring the permit's.
    DeadlineFromAdmission,
    /// `decide::drain` ignores an uncertain write's grace.
    DrainIgnoresGrace,
    /// `decide::polled` lets a waiting write go while lower registrations are live.
    PollIgnoresLower,
}

/// The model's bounds and settings (durations in ticks).
#[derive(Debug, Clone)]
pub struct Admission {
    /// Local or shared.
    pub enforcer: Enforcer,
    /// Writers; writer `w` holds token `w + 1` and writes once.
    pub writers: u8,
    /// `--upstream-timeout`.
    pub max_exchange: u64,
    /// `--write-grace`.
    pub write_grace: u64,
    /// `--store-timeout`.
    pub store_deadline: u64,
    /// The storage applies a write at most this long after receiving it.
    pub processing: u64,
    /// How far a gateway's clock may lag the database's.
    pub drift: u8,
    /// Gateway crashes (restarts at once).
    pub crashes: u8,
    /// The last tick explored.
    pub horizon: u64,
    /// The broken variant to check, if any.
    pub mutation: Option<Mutation>,
}

impl Admission {
    /// The test bounds: `writers` writers through `enforcer`, timings 2/2/1 ticks, the storage
    /// taking up to one tick, one crash.
    pub fn new(enforcer: Enforcer, writers: u8) -> Self {
        Self {
            enforcer,
            writers,
            max_exchange: 2,
            write_grace: 2,
            store_deadline: 1,
            processing: 1,
            drift: 0,
            crashes: 1,
            horizon: 8,
            mutation: None,
        }
    }

    fn timing(&self) -> Timing {
        Timing {
            max_exchange: ticks(self.max_exchange),
            write_grace: ticks(self.write_grace),
            deadline: ticks(self.store_deadline),
        }
    }

    fn gateways(&self) -> u8 {
        match self.enforcer {
            Enforcer::Local => 1,
            Enforcer::Shared(n) => n,
        }
    }
}

/// Model time: ticks, as `Duration`s so that the code's generic decisions take them.
fn ticks(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn tick_of(d: Duration) -> u64 {
    d.as_secs()
}

fn token(w: usize) -> Token {
    Token::new(0, w as u64 + 1)
}

/// A database statement's answer, not yet read by the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Raw {
    /// `REGISTER_AT_MARK` + `LOWER_LIVE_AT_REGISTRATION`.
    AtMark(Option<AtMark>, Lower),
    /// `check_and_raise` + `REGISTER` + `LOWER_LIVE_AT_REGISTRATION`: the mark before.
    Raised(Token, Lower),
    /// `POLL`: the mark and the lower registrations.
    Polled(Token, Lower),
}

/// Where one writer's write is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not sent yet.
    Idle,
    /// Shared: a database step sent at `step` (gateway clock); `answer` once it ran.
    Step {
        /// The gateway.
        gw: u8,
        /// Before the first step (the give-up counts from it).
        started: u64,
        /// Before the step that registers (the permit's deadline counts from it).
        registering: u64,
        /// When this step was sent.
        step: u64,
        /// Which statement: register at the mark, raise, or poll.
        kind: StepKind,
        /// Its answer, once the database ran it.
        answer: Option<Raw>,
    },
    /// Shared: registered, waiting for lower registrations (polls when it wakes).
    Waiting {
        /// The gateway.
        gw: u8,
        /// See [`Phase::Step`].
        started: u64,
        /// See [`Phase::Step`].
        registering: u64,
    },
    /// Local: in the gate's admit loop.
    Gate(GateAt),
    /// Admitted: the permit (with the gate's deadline) is on its way to the layer.
    Admitted {
        /// The gateway.
        gw: u8,
        /// `Permit::deadline`.
        deadline: Option<u64>,
    },
    /// The layer holds the permit; nothing sent yet.
    Exchange {
        /// The gateway.
        gw: u8,
        /// `exchange_until`'s answer.
        until: u64,
    },
    /// Sent to the storage; the exchange not ended.
    Sent {
        /// The gateway.
        gw: u8,
        /// See [`Phase::Exchange`].
        until: u64,
    },
    /// Over (refused, failed, or its exchange ended: the trace says which).
    Done,
}

/// Which shared database step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// `register_at_mark`.
    AtMark,
    /// `raise_and_register`.
    Raise,
    /// `poll`.
    Poll,
}

/// Local: where in `Gate::admit`'s loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GateAt {
    /// At the top of the loop.
    Look,
    /// Waiting for the raise lock.
    Lock,
    /// Holding it.
    Locked,
}

/// A registration row of `fence_inflight`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reg {
    writer: u8,
    token: Token,
    expires: u64,
}

/// The in-process gate's state of the resource (`gate.rs`, `State`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LocalGate {
    mark: Option<Token>,
    floor: Token,
    in_flight: Vec<u8>,
    uncertain_until: u64,
    raising: Option<u8>,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Real time: the database's clock.
    pub now: u64,
    /// How far each gateway's monotonic clock lags `now`.
    pub lag: Vec<u8>,
    /// Crashes left.
    pub crashes: u8,
    /// Each writer's write.
    pub writes: Vec<Phase>,
    /// The durable mark (`fence_marks`, or the local store).
    pub stored: Option<Token>,
    /// `fence_inflight`.
    pub regs: Vec<Reg>,
    /// The local gate (one gateway).
    pub local: LocalGate,
    /// At the storage, not applied yet: (writer, apply by).
    pub pending: Vec<(u8, u64)>,
    /// The highest token the storage applied.
    pub applied: Option<Token>,
    /// How many writes the storage applied.
    pub applied_count: u8,
    /// A write applied below one applied before it.
    pub reordered: bool,
}

/// One step of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time passes; each gateway's clock lags by the new amount.
    Tick(u8, u8),
    /// A writer sends its write to gateway `gw`.
    Start(u8, u8),
    /// The gateway reads the statement's answer and decides.
    Read(u8),
    /// The gateway's step deadline fires first (`bounded`).
    StepTimeout(u8),
    /// A waiting write wakes and polls (or gives up past `W`).
    Wake(u8),
    /// Local: the gate's loop takes its next step.
    GateStep(u8),
    /// The layer reads the permit and sets the exchange's deadline.
    LayerRead(u8),
    /// The layer hands the write to the storage (or answers admitted-too-late).
    Send(u8),
    /// The storage applies a write.
    Apply(u8),
    /// The exchange ends: complete (`true`) or uncertain; `lost` ends never reach the database.
    End(u8, bool, bool),
    /// A gateway crashes and restarts.
    Crash(u8),
}

impl Admission {
    fn clock(&self, s: &State, gw: u8) -> u64 {
        s.now - u64::from(s.lag[gw as usize])
    }

    fn lower(&self, s: &State, token: Token) -> Lower {
        let live = s
            .regs
            .iter()
            .filter(|r| r.token < token && r.expires > s.now)
            .count();
        Lower {
            live: live as i64,
            next_expiry: None,
        }
    }

    /// Inserts writer `w`'s registration and counts the lower ones, lengthening it by `W` when
    /// there are any (`LOWER_LIVE_AT_REGISTRATION`).
    fn register(&self, s: &mut State, w: usize) -> Lower {
        let t = self.timing();
        let lower = self.lower(s, token(w));
        let mut expires = s.now + tick_of(t.lifetime());
        if lower.live > 0 {
            expires += tick_of(t.max_wait());
        }
        s.regs.push(Reg {
            writer: w as u8,
            token: token(w),
            expires,
        });
        lower
    }

    /// Runs writer `w`'s statement in the database, atomically, at `now`.
    fn db(&self, s: &mut State, w: usize, kind: StepKind) -> Raw {
        let tk = token(w);
        match kind {
            StepKind::AtMark => match s.stored {
                None => Raw::AtMark(None, self.lower(s, tk)),
                Some(mark) => {
                    let registered = mark == tk;
                    let lower = if registered {
                        self.register(s, w)
                    } else {
                        self.lower(s, tk)
                    };
                    Raw::AtMark(Some(AtMark { mark, registered }), lower)
                }
            },
            StepKind::Raise => {
                let before = s.stored.unwrap_or(tk);
                if tk < before {
                    return Raw::Raised(before, self.lower(s, tk));
                }
                s.stored = Some(before.max(tk));
                let lower = self.register(s, w);
                Raw::Raised(before, lower)
            }
            StepKind::Poll => Raw::Polled(s.stored.unwrap_or_default(), self.lower(s, tk)),
        }
    }

    /// Ends writer `w`'s registration in the database (`inflight::end`).
    fn end_registration(&self, s: &mut State, w: usize, outcome: Outcome) {
        let grace = self.write_grace;
        let now = s.now;
        match outcome {
            Outcome::Complete => s.regs.retain(|r| r.writer as usize != w),
            Outcome::Uncertain => {
                for r in s.regs.iter_mut().filter(|r| r.writer as usize == w) {
                    r.expires = r.expires.min(now + grace);
                }
            }
        }
    }

    /// Writer `w` sends a statement of `kind` at its gateway's `clock`: the database runs it
    /// at once. (Run later — a lock wait, a slow network — it would only commit later, which
    /// lengthens the registration it makes; the answer's own delay is the pause before
    /// [`Action::Read`].)
    #[allow(clippy::too_many_arguments)]
    fn send_step(
        &self,
        s: &mut State,
        w: usize,
        gw: u8,
        started: u64,
        registering: u64,
        kind: StepKind,
    ) {
        let clock = self.clock(s, gw);
        let raw = self.db(s, w, kind);
        s.writes[w] = Phase::Step {
            gw,
            started,
            registering,
            step: clock,
            kind,
            answer: Some(raw),
        };
    }

    /// What the gateway does with a statement's answer (the code's decisions).
    fn read(&self, s: &mut State, w: usize) {
        let Phase::Step {
            gw,
            started,
            registering,
            answer: Some(raw),
            ..
        } = s.writes[w].clone()
        else {
            return;
        };
        let tk = token(w);
        let timing = self.timing();
        let clock = self.clock(s, gw);
        let decided = match raw {
            Raw::AtMark(answer, lower) => Ok(decide::at_mark(answer, tk, lower)),
            Raw::Raised(before, lower) => Ok(decide::raised(before, tk, lower)),
            Raw::Polled(mark, lower) => Err(self.polled(mark, tk, lower)),
        };
        s.writes[w] = match decided {
            Ok(Registered::Stale(_)) => Phase::Done,
            Ok(Registered::NeedsRaise) => {
                return self.send_step(s, w, gw, started, clock, StepKind::Raise);
            }
            Ok(Registered::Yes { lower }) if lower.live == 0 => Phase::Admitted {
                gw,
                deadline: Some(tick_of(timing.permit_deadline(ticks(registering), false))),
            },
            Ok(Registered::Yes { .. }) | Err(Polled::Waiting(_)) => Phase::Waiting {
                gw,
                started,
                registering,
            },
            Err(Polled::Clear) => Phase::Admitted {
                gw,
                deadline: Some(tick_of(timing.permit_deadline(ticks(registering), true))),
            },
            Err(Polled::Overtaken(_)) => {
                self.end_registration(s, w, Outcome::Complete);
                Phase::Done
            }
        };
    }

    fn polled(&self, mark: Token, tk: Token, lower: Lower) -> Polled {
        let polled = decide::polled(mark, tk, lower);
        match (self.mutation, polled) {
            (Some(Mutation::PollIgnoresLower), Polled::Waiting(_)) => Polled::Clear,
            _ => polled,
        }
    }

    fn drain(&self, lower: bool, uncertain_until: u64, now: u64) -> Drain<Duration> {
        let until = match self.mutation {
            Some(Mutation::DrainIgnoresGrace) => 0,
            _ => uncertain_until,
        };
        decide::drain(lower, ticks(until), ticks(now))
    }

    /// Local: one turn of `Gate::admit`'s loop for writer `w`.
    fn gate_step(&self, s: &mut State, w: usize, at: GateAt) {
        let tk = token(w);
        let clock = self.clock(s, 0);
        let g = &mut s.local;
        s.writes[w] = match at {
            GateAt::Look => match decide::admit_step(g.mark, g.floor, tk) {
                Step::Stale { .. } => Phase::Done,
                Step::Admit => {
                    g.in_flight.push(w as u8);
                    Phase::Admitted {
                        gw: 0,
                        deadline: None,
                    }
                }
                Step::Raise { floor } => {
                    g.floor = floor;
                    Phase::Gate(GateAt::Lock)
                }
                Step::Load => Phase::Gate(GateAt::Lock),
            },
            GateAt::Lock => {
                g.raising = Some(w as u8);
                Phase::Gate(GateAt::Locked)
            }
            GateAt::Locked => {
                match g.mark {
                    None => {
                        if s.stored.is_none() {
                            g.uncertain_until = clock;
                        }
                        let mark = s.stored.unwrap_or_default();
                        g.mark = Some(mark);
                        g.floor = g.floor.max(mark);
                    }
                    Some(mark) if mark >= tk => {}
                    Some(mark) => {
                        let lower = g.in_flight.iter().any(|&o| token(o as usize) < tk);
                        if self.drain(lower, g.uncertain_until, clock) != Drain::Clear {
                            return;
                        }
                        let raised = s.stored.unwrap_or_default().max(tk);
                        s.stored = Some(raised);
                        g.mark = Some(mark.max(raised));
                        g.floor = g.floor.max(raised);
                    }
                }
                g.raising = None;
                Phase::Gate(GateAt::Look)
            }
        };
    }

    /// Whether writer `w` can take `action`'s step, and the step.
    fn step(&self, s: &mut State, action: Action) -> bool {
        let timing = self.timing();
        match action {
            Action::Tick(g, lag) => {
                s.now += 1;
                s.lag[g as usize] = lag;
            }
            Action::Start(w, gw) => {
                let clock = self.clock(s, gw);
                match self.enforcer {
                    Enforcer::Local => s.writes[w as usize] = Phase::Gate(GateAt::Look),
                    Enforcer::Shared(_) => {
                        self.send_step(s, w as usize, gw, clock, clock, StepKind::AtMark);
                    }
                }
            }
            Action::Read(w) => self.read(s, w as usize),
            Action::StepTimeout(w) => {
                // The registration may have committed without our hearing of it.
                self.end_registration(s, w as usize, Outcome::Complete);
                s.writes[w as usize] = Phase::Done;
            }
            Action::Wake(w) => {
                let Phase::Waiting {
                    gw,
                    started,
                    registering,
                } = s.writes[w as usize]
                else {
                    return false;
                };
                let clock = self.clock(s, gw);
                let give_up = tick_of(ticks(started) + timing.max_wait());
                if clock >= give_up {
                    self.end_registration(s, w as usize, Outcome::Complete);
                    s.writes[w as usize] = Phase::Done;
                } else {
                    self.send_step(s, w as usize, gw, started, registering, StepKind::Poll);
                }
            }
            Action::GateStep(w) => {
                if let Phase::Gate(at) = s.writes[w as usize] {
                    let before = s.clone();
                    self.gate_step(s, w as usize, at);
                    return *s != before;
                }
            }
            Action::LayerRead(w) => {
                let Phase::Admitted { gw, deadline } = s.writes[w as usize] else {
                    return false;
                };
                let gate = match self.mutation {
                    Some(Mutation::DeadlineFromAdmission) => None,
                    _ => deadline.map(ticks),
                };
                let read_at = ticks(self.clock(s, gw));
                let until = decide::exchange_until(read_at, ticks(self.max_exchange), gate);
                s.writes[w as usize] = Phase::Exchange {
                    gw,
                    until: tick_of(until),
                };
            }
            Action::Send(w) => {
                let Phase::Exchange { gw, until } = s.writes[w as usize] else {
                    return false;
                };
                if decide::may_send(self.clock(s, gw), until) {
                    s.pending.push((w, s.now + self.processing));
                    s.writes[w as usize] = Phase::Sent { gw, until };
                } else {
                    // Admitted too late: nothing was sent.
                    self.end_permit(s, w as usize, Outcome::Complete, false);
                    s.writes[w as usize] = Phase::Done;
                }
            }
            Action::Apply(w) => {
                s.pending.retain(|p| p.0 != w);
                let tk = token(w as usize);
                if s.applied.is_some_and(|a| a > tk) {
                    s.reordered = true;
                }
                s.applied = s.applied.max(Some(tk));
                s.applied_count += 1;
            }
            Action::End(w, complete, lost) => {
                let outcome = if complete {
                    Outcome::Complete
                } else {
                    Outcome::Uncertain
                };
                self.end_permit(s, w as usize, outcome, lost);
                s.writes[w as usize] = Phase::Done;
            }
            Action::Crash(gw) => self.crash(s, gw),
        }
        true
    }

    /// The permit of writer `w` ends with `outcome` (its end reaching the database unless
    /// `lost`).
    fn end_permit(&self, s: &mut State, w: usize, outcome: Outcome, lost: bool) {
        match self.enforcer {
            Enforcer::Shared(_) if !lost => self.end_registration(s, w, outcome),
            Enforcer::Shared(_) => {}
            Enforcer::Local => {
                let clock = self.clock(s, 0);
                let g = &mut s.local;
                g.in_flight.retain(|&o| o as usize != w);
                let until = decide::closed_until(
                    ticks(g.uncertain_until),
                    outcome,
                    ticks(clock),
                    ticks(self.write_grace),
                );
                g.uncertain_until = tick_of(until);
            }
        }
    }

    /// Gateway `gw` dies and starts again: what it was admitting is gone (registrations stay
    /// until they expire); its exchanges end with the connection, the storage applying what it
    /// received within its processing time; a local gate starts over, every written resource
    /// uncertain for the grace.
    fn crash(&self, s: &mut State, gw: u8) {
        s.crashes -= 1;
        for phase in &mut s.writes {
            let mine = match phase {
                Phase::Step { gw: g, .. }
                | Phase::Waiting { gw: g, .. }
                | Phase::Admitted { gw: g, .. }
                | Phase::Exchange { gw: g, .. }
                | Phase::Sent { gw: g, .. } => *g == gw,
                Phase::Gate(_) => true,
                Phase::Idle | Phase::Done => false,
            };
            if mine {
                *phase = Phase::Done;
            }
        }
        if self.enforcer == Enforcer::Local {
            s.local = LocalGate {
                uncertain_until: self.clock(s, 0) + self.write_grace,
                ..LocalGate::default()
            };
        }
    }
}

impl Model for Admission {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            lag: vec![0; self.gateways() as usize],
            crashes: self.crashes,
            writes: vec![Phase::Idle; self.writers as usize],
            stored: None,
            regs: Vec::new(),
            local: LocalGate {
                // A gate starting: every resource counts as uncertain for the grace.
                uncertain_until: self.write_grace,
                ..LocalGate::default()
            },
            pending: Vec::new(),
            applied: None,
            applied_count: 0,
            reordered: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let urgent = s.pending.iter().any(|p| p.1 <= s.now);
        if s.now < self.horizon && !urgent {
            // Every clock advances a tick; one of them may instead stand still (lagging one
            // more) or catch up one.
            actions.push(Action::Tick(0, s.lag[0]));
            for g in 0..self.gateways() {
                let lag = s.lag[g as usize];
                if lag < self.drift {
                    actions.push(Action::Tick(g, lag + 1));
                }
                if lag > 0 {
                    actions.push(Action::Tick(g, lag - 1));
                }
            }
        }
        for p in &s.pending {
            actions.push(Action::Apply(p.0));
        }
        for (w, phase) in s.writes.iter().enumerate() {
            let w = w as u8;
            match phase {
                Phase::Idle => {
                    // The gateways are alike until someone uses one: the first write to start
                    // goes to gateway 0 (symmetry), while clocks do not drift apart.
                    let fresh = s.writes.iter().all(|p| *p == Phase::Idle) && self.drift == 0;
                    let gateways = if fresh { 1 } else { self.gateways() };
                    for gw in 0..gateways {
                        actions.push(Action::Start(w, gw));
                    }
                }
                Phase::Step { gw, step, .. } => {
                    actions.push(Action::Read(w));
                    if self.clock(s, *gw) >= step + self.store_deadline {
                        actions.push(Action::StepTimeout(w));
                    }
                }
                Phase::Waiting { .. } => actions.push(Action::Wake(w)),
                Phase::Gate(_) => actions.push(Action::GateStep(w)),
                Phase::Admitted { .. } => actions.push(Action::LayerRead(w)),
                Phase::Exchange { .. } => actions.push(Action::Send(w)),
                Phase::Sent { gw, until } => {
                    let applied = !s.pending.iter().any(|p| p.0 == w);
                    let lossy = matches!(self.enforcer, Enforcer::Shared(_));
                    // Complete once the storage answered (it answers after applying), and
                    // if the layer reads the answer before the deadline cuts it off;
                    // uncertain at any time (a client gone mid-body, a reset, the deadline).
                    if applied && self.clock(s, *gw) < *until {
                        actions.push(Action::End(w, true, false));
                    }
                    actions.push(Action::End(w, false, false));
                    if lossy {
                        actions.push(Action::End(w, false, true));
                    }
                }
                Phase::Done => {}
            }
        }
        if s.crashes > 0 {
            for gw in 0..self.gateways() {
                actions.push(Action::Crash(gw));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        self.step(&mut s, action).then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "storage applies tokens in non-decreasing order",
                |_, s: &State| !s.reordered,
            ),
            Property::sometimes(
                "a newer write is applied after an older one",
                |_, s: &State| s.applied_count >= 2,
            ),
        ]
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= self.horizon
    }
}

/// A readable account of one step.
pub fn describe(m: &Admission, before: &State, action: Action, after: &State) -> String {
    let mut line = format!("t={:<2} ", before.now);
    let who = |w: u8| format!("writer {w} (token {})", token(w as usize));
    let _ = match action {
        Action::Tick(g, lag) if m.drift > 0 => write!(line, "time passes (gateway {g} lags {lag})"),
        Action::Tick(..) => write!(line, "time passes"),
        Action::Start(w, gw) => write!(
            line,
            "{} sends its write to gateway {gw}{}",
            who(w),
            statement_text(after, w)
        ),
        Action::Read(w) => write!(
            line,
            "gateway reads {}'s answer → {}{}",
            who(w),
            phase_text(&after.writes[w as usize]),
            statement_text(after, w)
        ),
        Action::StepTimeout(w) => write!(line, "{}: the step deadline fires first", who(w)),
        Action::Wake(w) => write!(line, "{} wakes{}", who(w), statement_text(after, w)),
        Action::GateStep(w) => write!(
            line,
            "gate, for {}: → {} (mark {:?}, floor {}, uncertain until {})",
            who(w),
            phase_text(&after.writes[w as usize]),
            after.local.mark.map(|t| t.to_string()),
            after.local.floor,
            after.local.uncertain_until
        ),
        Action::LayerRead(w) => write!(
            line,
            "layer reads {}'s permit → {}",
            who(w),
            phase_text(&after.writes[w as usize])
        ),
        Action::Send(w) => match &after.writes[w as usize] {
            Phase::Done => write!(line, "layer, for {}: admitted too late, not sent", who(w)),
            phase => write!(line, "layer, for {}: {}", who(w), phase_text(phase)),
        },
        Action::Apply(w) => write!(
            line,
            "STORAGE APPLIES {}{}",
            who(w),
            if after.reordered && !before.reordered {
                "  <-- below a token already applied"
            } else {
                ""
            }
        ),
        Action::End(w, complete, lost) => write!(
            line,
            "{}'s exchange ends {}{}; registrations {}",
            who(w),
            if complete { "complete" } else { "uncertain" },
            if lost {
                " (its end never reaches the database)"
            } else {
                ""
            },
            regs_text(after)
        ),
        Action::Crash(gw) => write!(line, "gateway {gw} crashes and restarts"),
    };
    line
}

/// The statement writer `w` has just sent, as the database answered it.
fn statement_text(s: &State, w: u8) -> String {
    match &s.writes[w as usize] {
        Phase::Step {
            kind,
            answer: Some(raw),
            ..
        } => format!(
            "\n        database runs its {kind:?} statement: {}; registrations {}",
            raw_text(*raw),
            regs_text(s)
        ),
        _ => String::new(),
    }
}

fn raw_text(raw: Raw) -> String {
    match raw {
        Raw::AtMark(None, _) => "no mark yet".into(),
        Raw::AtMark(Some(a), l) => format!(
            "mark {}, registered {}, {} lower live",
            a.mark, a.registered, l.live
        ),
        Raw::Raised(before, l) => format!("mark was {before}, raised; {} lower live", l.live),
        Raw::Polled(mark, l) => format!("mark {mark}, {} lower live", l.live),
    }
}

fn regs_text(s: &State) -> String {
    let regs: Vec<String> = s
        .regs
        .iter()
        .map(|r| format!("token {} until t={}", r.token, r.expires))
        .collect();
    format!("[{}]", regs.join(", "))
}

fn phase_text(p: &Phase) -> String {
    match p {
        Phase::Step { kind, .. } => format!("{kind:?} statement sent"),
        Phase::Waiting { .. } => "waits for lower registrations".into(),
        Phase::Gate(at) => format!("{at:?}"),
        Phase::Admitted { deadline, .. } => match deadline {
            Some(d) => format!("admitted, permit deadline t={d}"),
            None => "admitted".into(),
        },
        Phase::Exchange { until, .. } => format!("exchange deadline t={until}"),
        Phase::Sent { until, .. } => format!("sent to the storage (deadline t={until})"),
        Phase::Done => "done: refused, failed, or not sent".into(),
        other => format!("{other:?}"),
    }
}
