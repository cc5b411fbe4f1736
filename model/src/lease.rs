//! Model 2: the lease lifecycle. Clients acquire (under an idempotency key, retrying after a
//! lost answer; or under a session), renew, forward and release through two proxy replicas whose
//! watch-fed views lag etcd by any amount; leases lapse as time passes; refused acquires' leases
//! are pooled as spares. etcd is one linearizable store: each transaction is atomic, which is
//! what group commit keeps (two transactions on one key never share a batch).
//!
//! Invariants: at most one client believes it holds a resource at any instant (its deadline,
//! counted as the SDKs count it, not passed); no renewal or forward received after a release was
//! answered succeeds; a new holder's token is above every earlier holder's; the event feed calls
//! a released grant's end `released`. The proxy's decisions come from `lease_proxy::model`.

use std::fmt::Write as _;
use std::time::Duration;

use lease_proxy::model as code;
use stateright::{Model, Property};

/// A change to the protocol or to a shared decision, which the checker must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// `view_may_confirm` trusts the view for renewing a session grant.
    ViewRenewsSessionGrants,
    /// A release deletes the key and pools its lease instead of revoking it.
    PoolReleasedLeases,
}

/// How one client holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kind {
    /// Under a session of its own (else a lease per grant).
    pub session: bool,
    /// With an `Idempotency-Key` (one per client), retrying after a lost answer.
    pub keyed: bool,
}

/// The model's bounds and settings (durations in ticks of one second).
#[derive(Debug, Clone)]
pub struct Lifecycle {
    /// The clients; client `c` wants resource `c % resources`.
    pub clients: Vec<Kind>,
    /// Resources.
    pub resources: u8,
    /// The grants' (and sessions') TTL.
    pub ttl: u8,
    /// `--idempotency-window`.
    pub window: u8,
    /// Requests each client sends.
    pub ops: u8,
    /// The last tick explored.
    pub horizon: u8,
    /// The broken variant to check, if any.
    pub mutation: Option<Mutation>,
}

impl Lifecycle {
    /// The test bounds: a keyed client and a session client contending for one resource
    /// through two replicas; TTL 3 s, window 4 s.
    pub fn new() -> Self {
        Self {
            clients: vec![
                Kind {
                    session: false,
                    keyed: true,
                },
                Kind {
                    session: true,
                    keyed: false,
                },
            ],
            resources: 1,
            ttl: 3,
            window: 4,
            ops: 2,
            horizon: 5,
            mutation: None,
        }
    }
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}

/// An ownership key `holders/{resource}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    /// Create revision: the token.
    pub rev: u8,
    /// The lease it is on.
    pub lease: u8,
    /// Which grant (its record and secret hash).
    pub grant: u8,
    /// On a session's lease.
    pub session: bool,
}

/// An etcd lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// Lapses at this tick.
    pub expires: u8,
    /// Revoked.
    pub revoked: bool,
    /// When its TTL last (re)started, as the proxy counts it (before the call).
    pub counted: u8,
    /// A release marker on it, naming this grant.
    pub marker: Option<u8>,
}

/// The replay window's key `idempotency/{resource}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    /// The grant it was written with (its marker names its holder and key).
    pub grant: u8,
    /// Its mod revision (the grant's create revision).
    pub rev: u8,
    /// It lapses with the window lease.
    pub expires: u8,
}

/// A grant etcd made, announced or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grant {
    /// Resource.
    pub resource: u8,
    /// Who asked.
    pub client: u8,
    /// Its token.
    pub token: u8,
    /// Its lease.
    pub lease: u8,
    /// Under a session.
    pub session: bool,
    /// A release of it began (confirmed).
    pub releasing: bool,
    /// A release of it was answered 204.
    pub released: bool,
    /// A release ended it (deleted its key, or revoked its lease with the key on it).
    pub ended_by_release: bool,
    /// How the feed labelled its end: released (`true`) or expired.
    pub label: Option<bool>,
}

/// An answer on its way to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// 201: the grant, believed until this tick.
    Granted(u8, u8),
    /// 409, 410, 503…: nothing held.
    Refused,
    /// 200: renewed until this tick.
    Renewed(u8),
    /// 410: the grant is gone.
    Lost,
    /// 204.
    Released,
}

/// What a client's request has got to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Request {
    /// Nothing in flight.
    None,
    /// An acquire: sent at `sent`; the lease (id, counted from) once taken.
    Acquire {
        /// When it was sent (the proxy receives it at once; a delay is a later send).
        sent: u8,
        /// The lease taken.
        lease: Option<(u8, u8)>,
    },
    /// A release of grant `grant`.
    Release {
        /// The grant.
        grant: u8,
        /// Confirmed; marker written.
        step: u8,
    },
    /// Answered (the answer travelling).
    Answered(Answer),
}

/// A renewal or a forward, sent while the client's other request goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Background {
    /// A renewal of `grant` sent at `sent`; once the proxy has it, whether that was after the
    /// grant's release was answered, and whether it confirmed the holder.
    Renew {
        /// The grant.
        grant: u8,
        /// When sent.
        sent: u8,
        /// Received (and confirmed) by the proxy: after the release's answer?
        received: Option<bool>,
    },
    /// A forward for `grant`, on its way to the proxy.
    Forward {
        /// The grant.
        grant: u8,
    },
}

/// A client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Client {
    /// Its session's lease.
    pub session: Option<u8>,
    /// What it believes it holds: the grant and until when.
    pub holding: Option<(u8, u8)>,
    /// Its request.
    pub request: Request,
    /// A renewal or forward it sent meanwhile (from another thread), on its way or under way.
    pub background: Option<Background>,
    /// Requests left.
    pub ops: u8,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Time (etcd's clock; the proxies' and clients' clocks agree with it).
    pub now: u8,
    /// etcd's revision.
    pub rev: u8,
    /// Ownership keys per resource.
    pub keys: Vec<Option<Key>>,
    /// Leases (id = index + 1).
    pub leases: Vec<Lease>,
    /// Replay windows per resource.
    pub windows: Vec<Option<Window>>,
    /// Spare leases.
    pub pool: Vec<u8>,
    /// Every grant made.
    pub grants: Vec<Grant>,
    /// Clients.
    pub clients: Vec<Client>,
    /// The highest token a client believed it held, per resource.
    pub believed: Vec<u8>,
    /// Violations seen on a step (the rest are checked on states).
    pub renewed_after_release: bool,
    /// A forward passed after its grant's release was answered.
    pub forwarded_after_release: bool,
    /// A holder believed a token below an earlier holder's.
    pub token_fell: bool,
}

/// One step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time passes; lapsed leases take their keys with them.
    Tick,
    /// A session client opens its session.
    OpenSession(u8),
    /// A session client's heartbeat.
    Heartbeat(u8),
    /// A client sends an acquire (again, if keyed).
    Acquire(u8),
    /// The replica takes the acquire's lease (a spare, a new one, or the session's).
    TakeLease(u8),
    /// The replica sends the create transaction and answers.
    Create(u8),
    /// A holder renews.
    Renew(u8),
    /// The proxy confirms the holder (`true`: through a view that has not seen what happened
    /// since the grant; else etcd as it is).
    RenewConfirm(u8, bool),
    /// The replica sends the keepalive and answers.
    Keepalive(u8),
    /// A holder sends a forward.
    Forward(u8),
    /// The forward reaches the proxy, which reads the holder linearizably.
    ForwardArrives(u8),
    /// A holder releases (it stops believing now).
    Release(u8),
    /// The proxy takes the release's next step (confirm, through a stale view or not; marker;
    /// revoke or delete).
    ReleaseStep(u8, bool),
    /// An answer reaches its client.
    Deliver(u8),
    /// An answer is lost.
    Lose(u8),
}

impl Lifecycle {
    fn alive(s: &State, lease: u8) -> bool {
        let l = &s.leases[lease as usize - 1];
        !l.revoked && s.now < l.expires
    }

    fn new_lease(&self, s: &mut State) -> u8 {
        s.leases.push(Lease {
            expires: s.now + self.ttl,
            revoked: false,
            counted: s.now,
            marker: None,
        });
        s.leases.len() as u8
    }

    fn keepalive(&self, s: &mut State, lease: u8) -> bool {
        if !Self::alive(s, lease) {
            return false;
        }
        let now = s.now;
        let l = &mut s.leases[lease as usize - 1];
        l.expires = now + self.ttl;
        l.counted = now;
        true
    }

    /// Deletes resource `r`'s key, the feed labelling its end from the markers written with
    /// the deletion (`marker.rs`, the code's classifier).
    fn delete(&self, s: &mut State, r: usize, markers: &[(String, String)]) {
        if let Some(key) = s.keys[r].take() {
            let name = format!("r{r}");
            let released =
                code::labelled_released(markers, &name, i64::from(key.rev), i64::from(key.lease));
            s.grants[key.grant as usize].label = Some(released);
        }
    }

    /// A lease ends (revoked or lapsed): its keys go, with its marker if any.
    fn end_lease(&self, s: &mut State, lease: u8) {
        let marker = s.leases[lease as usize - 1].marker;
        for r in 0..s.keys.len() {
            if s.keys[r].is_some_and(|k| k.lease == lease) {
                let markers: Vec<_> = marker
                    .map(|g| {
                        let g = s.grants[g as usize];
                        code::release_marker(
                            &format!("r{}", g.resource),
                            i64::from(g.token),
                            i64::from(lease),
                        )
                    })
                    .into_iter()
                    .collect();
                self.delete(s, r, &markers);
            }
        }
    }

    /// Whether the proxy confirms grant `g` for `for_release` (`confirm.rs`): from the replica's
    /// watch-fed view when the code allows it, else by a linearizable read. A view lags etcd
    /// by any amount, so with `stale` it still shows `g`'s key, whatever happened since.
    fn confirm(&self, s: &State, g: u8, for_release: bool, stale: bool) -> bool {
        let grant = s.grants[g as usize];
        let r = grant.resource as usize;
        if stale {
            let trusted = match self.mutation {
                Some(Mutation::ViewRenewsSessionGrants) => true,
                _ => code::view_may_confirm(for_release, grant.session),
            };
            if trusted {
                return true;
            }
        }
        s.keys[r].is_some_and(|k| k.lease == grant.lease && k.grant == g)
    }

    fn resource(&self, c: usize) -> usize {
        c % self.resources as usize
    }

    /// The acquire's first step at the replica: a keyed retry whose grant ended is refused; a
    /// lease is taken.
    fn take_lease(&self, s: &mut State, c: usize) -> Option<Answer> {
        let Request::Acquire { sent, .. } = s.clients[c].request else {
            return None;
        };
        let r = self.resource(c);
        if self.clients[c].keyed {
            if let Some(w) = s.windows[r].filter(|w| s.now < w.expires) {
                let used = s.grants[w.grant as usize].client as usize == c;
                let alive = s.keys[r].is_some_and(|k| k.rev == w.rev);
                if code::key_spent(used, alive) {
                    return Some(Answer::Refused);
                }
            }
        }
        let lease = match s.clients[c].session {
            Some(session) => {
                if !self.keepalive(s, session) {
                    return Some(Answer::Refused);
                }
                (session, s.now)
            }
            None => loop {
                let Some(spare) = s.pool.pop() else {
                    break (self.new_lease(s), s.now);
                };
                let counted = s.leases[spare as usize - 1].counted;
                let age = Duration::from_secs(u64::from(s.now - counted));
                if code::spare_is_fresh(age) && Self::alive(s, spare) {
                    break (spare, counted);
                }
                if self.keepalive(s, spare) {
                    break (spare, s.now);
                }
            },
        };
        s.clients[c].request = Request::Acquire {
            sent,
            lease: Some(lease),
        };
        None
    }

    /// The create transaction, and what its answer means.
    fn create(&self, s: &mut State, c: usize) -> Answer {
        let Request::Acquire {
            sent,
            lease: Some((lease, counted)),
            ..
        } = s.clients[c].request
        else {
            return Answer::Refused;
        };
        let r = self.resource(c);
        let kind = self.clients[c];
        let session = s.clients[c].session;
        let session_alive = session.is_none_or(|l| Self::alive(s, l));
        if s.keys[r].is_none() && session_alive {
            if !Self::alive(s, lease) {
                // etcd refuses a put on a lapsed lease: nothing written.
                return Answer::Refused;
            }
            s.rev += 1;
            let grant = s.grants.len() as u8;
            s.grants.push(Grant {
                resource: r as u8,
                client: c as u8,
                token: s.rev,
                lease,
                session: session.is_some(),
                releasing: false,
                released: false,
                ended_by_release: false,
                label: None,
            });
            s.keys[r] = Some(Key {
                rev: s.rev,
                lease,
                grant,
                session: session.is_some(),
            });
            if kind.keyed {
                s.windows[r] = Some(Window {
                    grant,
                    rev: s.rev,
                    expires: s.now + self.window,
                });
            }
            // expires_in_ms counts from the lease's start, measured from the request's arrival
            // (here its sending): the client's deadline.
            return Answer::Granted(grant, (counted + self.ttl).saturating_sub(s.now - sent));
        }
        if session.is_none() && Self::alive(s, lease) {
            // Held: the lease carried no key; kept for the next acquire.
            s.pool.push(lease);
        }
        let Some(key) = s.keys[r] else {
            return Answer::Refused;
        };
        if kind.keyed && Self::alive(s, key.lease) {
            let in_window = s.windows[r].is_some_and(|w| w.rev == key.rev && s.now < w.expires);
            let mine = s.grants[key.grant as usize].client as usize == c;
            let found = key.session.then_some(i64::from(key.lease));
            let asked = session.map(i64::from);
            if code::is_replayed(in_window, mine, mine, found, asked) {
                let expires = s.leases[key.lease as usize - 1].expires;
                return Answer::Granted(key.grant, expires.saturating_sub(s.now - sent));
            }
        }
        Answer::Refused
    }

    /// The release's next step at the replica; its answer when it has one.
    fn release_step(&self, s: &mut State, c: usize, stale: bool) -> Option<Answer> {
        let Request::Release { grant: g, step } = s.clients[c].request else {
            return None;
        };
        let grant = s.grants[g as usize];
        let r = grant.resource as usize;
        let next = |step| Request::Release { grant: g, step };
        match step {
            0 => {
                if !self.confirm(s, g, true, stale) {
                    // Nothing to end: idempotent 204.
                    return Some(Answer::Released);
                }
                s.grants[g as usize].releasing = true;
                s.clients[c].request = next(1);
                None
            }
            1 if grant.session => {
                // Compare-and-delete on the create revision, with the marker, in one txn.
                if s.keys[r].is_some_and(|k| k.rev == grant.token) {
                    let name = format!("r{r}");
                    let marker =
                        code::release_marker(&name, i64::from(grant.token), i64::from(grant.lease));
                    self.delete(s, r, &[marker]);
                    s.grants[g as usize].ended_by_release = true;
                }
                s.grants[g as usize].released = true;
                Some(Answer::Released)
            }
            1 => {
                // The marker, written only while the key is on the lease.
                if s.keys[r].is_some_and(|k| k.lease == grant.lease) {
                    s.leases[grant.lease as usize - 1].marker = Some(g);
                }
                s.clients[c].request = next(2);
                None
            }
            _ => {
                if self.mutation == Some(Mutation::PoolReleasedLeases) {
                    if s.keys[r].is_some_and(|k| k.rev == grant.token) {
                        let name = format!("r{r}");
                        let marker = code::release_marker(
                            &name,
                            i64::from(grant.token),
                            i64::from(grant.lease),
                        );
                        self.delete(s, r, &[marker]);
                        s.grants[g as usize].ended_by_release = true;
                    }
                    s.leases[grant.lease as usize - 1].marker = None;
                    if Self::alive(s, grant.lease) {
                        s.pool.push(grant.lease);
                    }
                } else if Self::alive(s, grant.lease) {
                    s.grants[g as usize].ended_by_release = s.keys[r].is_some_and(|k| k.grant == g);
                    s.leases[grant.lease as usize - 1].revoked = true;
                    self.end_lease(s, grant.lease);
                }
                s.grants[g as usize].released = true;
                Some(Answer::Released)
            }
        }
    }

    /// A renewal's answer reaches its client (the answer's own delay is not modelled: a late
    /// 200 only extends a deadline counted from before the renewal was sent).
    fn renewed(&self, s: &mut State, c: usize, answer: Answer) {
        let client = &mut s.clients[c];
        match answer {
            Answer::Renewed(until) => {
                if let Some((g, old)) = client.holding {
                    client.holding = Some((g, old.max(until)));
                }
            }
            _ => client.holding = None,
        }
    }

    fn deliver(&self, s: &mut State, c: usize, answer: Answer) {
        let client = &mut s.clients[c];
        match answer {
            Answer::Granted(g, until) if until > s.now => {
                client.holding = Some((g, until));
                let token = s.grants[g as usize].token;
                let r = s.grants[g as usize].resource as usize;
                if token < s.believed[r] {
                    s.token_fell = true;
                }
                s.believed[r] = s.believed[r].max(token);
            }
            Answer::Renewed(until) => {
                if let Some((g, old)) = client.holding {
                    client.holding = Some((g, old.max(until)));
                }
            }
            Answer::Lost => client.holding = None,
            _ => {}
        }
        client.request = Request::None;
    }
}

impl Model for Lifecycle {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let r = self.resources as usize;
        vec![State {
            now: 0,
            rev: 0,
            keys: vec![None; r],
            leases: Vec::new(),
            windows: vec![None; r],
            pool: Vec::new(),
            grants: Vec::new(),
            clients: self
                .clients
                .iter()
                .map(|_| Client {
                    session: None,
                    holding: None,
                    request: Request::None,
                    background: None,
                    ops: self.ops,
                })
                .collect(),
            believed: vec![0; r],
            renewed_after_release: false,
            forwarded_after_release: false,
            token_fell: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now < self.horizon {
            actions.push(Action::Tick);
        }
        for (c, client) in s.clients.iter().enumerate() {
            let c8 = c as u8;
            let kind = self.clients[c];
            if kind.session {
                match client.session {
                    None => {
                        actions.push(Action::OpenSession(c8));
                        continue;
                    }
                    Some(l) if Self::alive(s, l) => actions.push(Action::Heartbeat(c8)),
                    Some(_) => {}
                }
            }
            match client.request {
                Request::None if client.ops > 0 => match client.holding {
                    None => actions.push(Action::Acquire(c8)),
                    Some(_) => actions.push(Action::Release(c8)),
                },
                Request::None => {}
                Request::Acquire { lease: None, .. } => actions.push(Action::TakeLease(c8)),
                Request::Acquire { .. } => actions.push(Action::Create(c8)),
                Request::Release { step: 0, .. } => {
                    actions.push(Action::ReleaseStep(c8, false));
                    actions.push(Action::ReleaseStep(c8, true));
                }
                Request::Release { .. } => actions.push(Action::ReleaseStep(c8, false)),
                Request::Answered(answer) => {
                    actions.push(Action::Deliver(c8));
                    if matches!(answer, Answer::Granted(..) | Answer::Refused) {
                        actions.push(Action::Lose(c8));
                    }
                }
            }
            match client.background {
                None if client.ops > 0 && client.holding.is_some() => {
                    actions.push(Action::Renew(c8));
                    actions.push(Action::Forward(c8));
                }
                None => {}
                Some(Background::Renew { received: None, .. }) => {
                    actions.push(Action::RenewConfirm(c8, false));
                    actions.push(Action::RenewConfirm(c8, true));
                }
                Some(Background::Renew { .. }) => actions.push(Action::Keepalive(c8)),
                Some(Background::Forward { .. }) => actions.push(Action::ForwardArrives(c8)),
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => {
                s.now += 1;
                for lease in 1..=s.leases.len() as u8 {
                    let l = s.leases[lease as usize - 1];
                    if !l.revoked && l.expires == s.now {
                        self.end_lease(&mut s, lease);
                    }
                }
                let now = s.now;
                for c in &mut s.clients {
                    if c.holding.is_some_and(|(_, until)| until <= now) {
                        c.holding = None;
                    }
                }
            }
            Action::OpenSession(c) => {
                let lease = self.new_lease(&mut s);
                s.clients[c as usize].session = Some(lease);
            }
            Action::Heartbeat(c) => {
                let c = c as usize;
                let session = s.clients[c].session?;
                self.keepalive(&mut s, session);
                let now = s.now;
                let client = &mut s.clients[c];
                // The heartbeat renews every grant on the session.
                if let Some((g, _)) = client.holding {
                    client.holding = Some((g, now + self.ttl));
                }
            }
            Action::Acquire(c) => {
                let client = &mut s.clients[c as usize];
                client.ops -= 1;
                client.request = Request::Acquire {
                    sent: s.now,
                    lease: None,
                };
            }
            Action::TakeLease(c) => {
                if let Some(answer) = self.take_lease(&mut s, c as usize) {
                    s.clients[c as usize].request = Request::Answered(answer);
                }
            }
            Action::Create(c) => {
                let answer = self.create(&mut s, c as usize);
                s.clients[c as usize].request = Request::Answered(answer);
            }
            Action::Renew(c) => {
                let client = &mut s.clients[c as usize];
                let (grant, _) = client.holding?;
                client.ops -= 1;
                client.background = Some(Background::Renew {
                    grant,
                    sent: s.now,
                    received: None,
                });
            }
            Action::RenewConfirm(c, stale) => {
                let Some(Background::Renew { grant, sent, .. }) = s.clients[c as usize].background
                else {
                    return None;
                };
                let after_release = s.grants[grant as usize].released;
                s.clients[c as usize].background = if self.confirm(&s, grant, false, stale) {
                    Some(Background::Renew {
                        grant,
                        sent,
                        received: Some(after_release),
                    })
                } else {
                    self.renewed(&mut s, c as usize, Answer::Lost);
                    None
                };
            }
            Action::Keepalive(c) => {
                let Some(Background::Renew {
                    grant,
                    sent,
                    received: Some(after_release),
                }) = s.clients[c as usize].background
                else {
                    return None;
                };
                let lease = s.grants[grant as usize].lease;
                let answer = if self.keepalive(&mut s, lease) {
                    s.renewed_after_release |= after_release;
                    Answer::Renewed(sent + self.ttl)
                } else {
                    Answer::Lost
                };
                s.clients[c as usize].background = None;
                self.renewed(&mut s, c as usize, answer);
            }
            Action::Forward(c) => {
                let client = &mut s.clients[c as usize];
                let (grant, _) = client.holding?;
                client.ops -= 1;
                client.background = Some(Background::Forward { grant });
            }
            Action::ForwardArrives(c) => {
                let Some(Background::Forward { grant: g }) = s.clients[c as usize].background
                else {
                    return None;
                };
                let grant = s.grants[g as usize];
                // Always a linearizable read (`holding_for_forward`).
                let holds = s.keys[grant.resource as usize]
                    .is_some_and(|k| k.lease == grant.lease && k.grant == g);
                s.forwarded_after_release |= holds && grant.released;
                s.clients[c as usize].background = None;
            }
            Action::Release(c) => {
                let client = &mut s.clients[c as usize];
                let (grant, _) = client.holding.take()?;
                client.ops -= 1;
                client.request = Request::Release { grant, step: 0 };
            }
            Action::ReleaseStep(c, stale) => {
                if let Some(answer) = self.release_step(&mut s, c as usize, stale) {
                    s.clients[c as usize].request = Request::Answered(answer);
                }
            }
            Action::Deliver(c) => {
                let Request::Answered(answer) = s.clients[c as usize].request else {
                    return None;
                };
                self.deliver(&mut s, c as usize, answer);
            }
            Action::Lose(c) => s.clients[c as usize].request = Request::None,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "at most one holder per resource",
                |m: &Lifecycle, s: &State| {
                    (0..m.resources as usize).all(|r| {
                        s.clients
                            .iter()
                            .filter(|c| {
                                c.holding.is_some_and(|(g, _)| {
                                    s.grants[g as usize].resource as usize == r
                                })
                            })
                            .count()
                            <= 1
                    })
                },
            ),
            Property::always("nothing renews after a release", |_, s: &State| {
                !s.renewed_after_release
            }),
            Property::always("nothing forwards after a release", |_, s: &State| {
                !s.forwarded_after_release
            }),
            Property::always("tokens rise with every new holder", |_, s: &State| {
                !s.token_fell && s.grants.windows(2).all(|g| g[0].token < g[1].token)
            }),
            Property::always(
                "a released grant's end is labelled released",
                |_, s: &State| {
                    s.grants.iter().all(|g| match g.label {
                        Some(true) => g.releasing,
                        Some(false) => !g.ended_by_release,
                        None => true,
                    })
                },
            ),
            Property::sometimes("a second holder takes over", |_, s: &State| {
                s.grants
                    .iter()
                    .map(|g| g.client)
                    .collect::<std::collections::BTreeSet<_>>()
                    .len()
                    >= 2
            }),
            Property::sometimes("a keyed retry gets its grant back", |_, s: &State| {
                s.grants.len() == 1 && s.clients[0].holding.is_some() && s.clients[0].ops <= 2
            }),
        ]
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= self.horizon
    }
}

/// A readable account of one step.
pub fn describe(_: &Lifecycle, before: &State, action: Action, after: &State) -> String {
    let mut line = format!("t={:<2} ", before.now);
    let answer = |c: u8| match after.clients[c as usize].request {
        Request::Answered(a) => format!(" → answers {}", answer_text(a, after)),
        _ => String::new(),
    };
    let _ = match action {
        Action::Tick => write!(line, "time passes; keys {}", keys_text(&after.keys)),
        Action::OpenSession(c) => write!(
            line,
            "client {c} opens a session (lease {})",
            after.leases.len()
        ),
        Action::Heartbeat(c) => write!(line, "client {c} heartbeats its session"),
        Action::Acquire(c) => write!(line, "client {c} sends an acquire"),
        Action::TakeLease(c) => write!(
            line,
            "proxy takes a lease for client {c}'s acquire{}",
            answer(c)
        ),
        Action::Create(c) => write!(
            line,
            "proxy sends client {c}'s create txn; keys {}{}",
            keys_text(&after.keys),
            answer(c)
        ),
        Action::Renew(c) => write!(line, "client {c} sends a renewal"),
        Action::Keepalive(c) => write!(
            line,
            "proxy sends client {c}'s keepalive; client {c} holds {:?}",
            after.clients[c as usize].holding
        ),
        Action::RenewConfirm(c, stale) => write!(
            line,
            "proxy looks up client {c}'s grant{}",
            if stale {
                " in a view that has not seen the latest events"
            } else {
                ""
            },
        ),
        Action::Forward(c) => write!(line, "client {c} sends a forward"),
        Action::ForwardArrives(c) => write!(line, "client {c}'s forward reaches the proxy"),
        Action::Release(c) => write!(line, "client {c} sends a release"),
        Action::ReleaseStep(c, stale) => write!(
            line,
            "proxy, client {c}'s release: next step{}; keys {}{}",
            if stale { " (through a stale view)" } else { "" },
            keys_text(&after.keys),
            answer(c)
        ),
        Action::Deliver(c) => write!(
            line,
            "client {c} receives its answer; it holds {:?}",
            after.clients[c as usize].holding
        ),
        Action::Lose(c) => write!(line, "client {c}'s answer is lost"),
    };
    line
}

fn answer_text(a: Answer, s: &State) -> String {
    match a {
        Answer::Granted(g, until) => {
            format!("201 token {} until t={until}", s.grants[g as usize].token)
        }
        Answer::Renewed(until) => format!("200 until t={until}"),
        other => format!("{other:?}"),
    }
}

fn keys_text(keys: &[Option<Key>]) -> String {
    let keys: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(r, k)| match k {
            Some(k) => format!("r{r}: token {} on lease {}", k.rev, k.lease),
            None => format!("r{r}: free"),
        })
        .collect();
    format!("[{}]", keys.join(", "))
}
