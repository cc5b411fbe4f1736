package leaseproxy

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// JoinOptions say how to join a fleet (nil: the client's defaults).
type JoinOptions struct {
	// Member names the member (default: Options.Holder). Joining again under the name of a
	// live member of the same principal replaces it.
	Member string
	// TTL is the member's session TTL (default: Options.TTL).
	TTL time.Duration
	// Weight is the member's share's weight (0: the service's default).
	Weight int
	// SafetyMargin overrides Options.SafetyMargin for the session.
	SafetyMargin time.Duration
	// Poll is how long one long poll of the assignment waits for a change (default 20 s; a
	// proxy whose --max-wait is shorter refuses it, and the member polls with its maximum).
	Poll time.Duration
	// Rejoin says whether a member whose session ended (its TTL passed without a keepalive,
	// its etcd lease revoked: the service answers 404 no-member, or its keepalives are
	// refused) joins again under the same name with a new session (true) — its old leases are
	// lost, and what it is granted under the new session arrives on Assignments (static
	// membership: within the TTL, what it still held comes back to it first, under new
	// tokens) — or ends, Err reporting the loss (false, the default).
	Rejoin bool
}

// Member is this process in a fleet (DESIGN §5.5): a session the service grants the fleet's
// resources under. Each resource granted to it arrives on Assignments as a *Lease living on
// the member's session; when the service moves it to another member, the lease is lost with
// ReasonHandedOff — its context cancelled at once — and must be released (Serve does it when
// the work returns; past the fleet's drain deadline the service revokes it).
type Member struct {
	c     *Client
	fleet string
	name  string
	opts  JoinOptions
	poll  time.Duration

	mu      sync.Mutex
	session *Session
	leases  map[string]*Lease
	state   string
	// revision is the assignment's last applied (applied: one was).
	revision uint64
	applied  bool
	// rejoins counts the sessions opened after the first (Rejoin).
	rejoins int
	// stopped: Leave was called, or the member ended; no rejoin follows.
	stopped bool
	// final is why a rejoining member ended when no session says it (a join refused).
	final error

	delivery delivery
	ended    chan struct{}
	// quit is cancelled by Leave: it stops a rejoin's retries.
	quit       context.Context
	cancelQuit context.CancelFunc
}

// JoinFleet joins fleet and starts following the member's assignment.
func (c *Client) JoinFleet(ctx context.Context, fleet string, opts *JoinOptions) (*Member, error) {
	var o JoinOptions
	if opts != nil {
		o = *opts
	}
	if o.Member == "" {
		o.Member = c.opts.Holder
	}
	if o.TTL <= 0 {
		o.TTL = c.opts.TTL
	}
	if o.SafetyMargin <= 0 {
		o.SafetyMargin = c.opts.SafetyMargin
	}
	if o.Poll <= 0 {
		o.Poll = 20 * time.Second
	}
	s, err := c.openMember(ctx, fleet, &o)
	if err != nil {
		return nil, err
	}
	m := &Member{c: c, fleet: fleet, name: o.Member, opts: o, session: s, poll: o.Poll,
		leases: map[string]*Lease{}, ended: make(chan struct{})}
	m.quit, m.cancelQuit = context.WithCancel(context.Background())
	m.delivery.start()
	go m.run()
	return m, nil
}

// openMember is one join (POST /v1/fleets/{fleet}/members): the member's session, kept alive.
func (c *Client) openMember(ctx context.Context, fleet string, o *JoinOptions) (*Session, error) {
	body := map[string]any{"member": o.Member, "ttl_seconds": wholeSeconds(o.TTL)}
	if o.Weight > 0 {
		body["weight"] = o.Weight
	}
	sent := time.Now()
	a, err := c.do(ctx, call{method: http.MethodPost, path: fleetPath(fleet) + "/members", body: body})
	if err != nil {
		return nil, err
	}
	s, t, err := parseOpened(a)
	if err != nil {
		return nil, err
	}
	s.holder = o.Member
	return c.keepSession(s, sent, t, o.SafetyMargin)
}

// Fleet is the fleet's name.
func (m *Member) Fleet() string { return m.fleet }

// Name is the member's name.
func (m *Member) Name() string { return m.name }

// Session is the member's session now: its loss (or Leave) loses every assignment. With
// Rejoin, a rejoin replaces it.
func (m *Member) Session() *Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.session
}

// Rejoins is how many times the member joined again after its session ended (Rejoin).
func (m *Member) Rejoins() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rejoins
}

// State is the member's state as last read: "active", "draining" or "evicted" ("" before
// the first read).
func (m *Member) State() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state
}

// Assignments delivers each resource granted to the member, as a *Lease, once. It is closed
// when the member ends (left, evicted, replaced, or its session lost without Rejoin). After a
// rejoin, the grants of the new session arrive on it too.
func (m *Member) Assignments() <-chan *Lease { return m.delivery.out }

// Err is nil while the member follows its assignment, then why it stopped: its session's
// *LostError (matching ErrLost and ErrSessionLost), whose Unwrap is what ended it — the
// service's 404 no-member when the session ended under it, the eviction, a refusal —
// or ReasonReleased after Leave. With Rejoin, a lost session is nil here while the member joins
// again; a refused rejoin ends the member with a *LostError (ReasonRevoked) wrapping the
// refusal.
func (m *Member) Err() error {
	m.mu.Lock()
	s, final, stopped := m.session, m.final, m.stopped
	m.mu.Unlock()
	if final != nil {
		return final
	}
	if err := s.Err(); err != nil && (stopped || !m.opts.Rejoin) {
		return err
	}
	return nil
}

// Serve runs fn for each assignment, in a goroutine of its own, with a context cancelled when
// the resource is handed off or lost (or ctx is done), and releases the resource when fn
// returns. It returns once ctx is done or the member has ended, after every fn has returned:
// ctx's error, or why the member ended.
func (m *Member) Serve(ctx context.Context, fn func(ctx context.Context, l *Lease) error) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case l, ok := <-m.Assignments():
			if !ok {
				wg.Wait()
				return m.Err()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				work, cancel := l.Bind(ctx)
				if err := fn(work, l); err != nil && !errors.Is(err, context.Canceled) {
					m.c.logf("leaseproxy: fleet %s: work on %s: %v", m.fleet, l.Resource(), err)
				}
				cancel()
				rctx, rcancel := context.WithTimeout(context.Background(), m.c.opts.Timeout)
				_ = l.Release(rctx)
				rcancel()
			}()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Drain asks the service to hand off everything the member holds and give it nothing new
// (202); the assignments are then lost with ReasonHandedOff one by one.
func (m *Member) Drain(ctx context.Context) error {
	_, err := m.c.do(ctx, call{method: http.MethodPost, path: m.memberPath() + "/drain",
		header: secretHeader(m.Session().secret)})
	return err
}

// Leave ends the member: its session is closed, which ends every grant under it.
func (m *Member) Leave(ctx context.Context) error {
	m.mu.Lock()
	m.stopped = true
	s := m.session
	m.mu.Unlock()
	m.cancelQuit()
	err := s.Close(ctx)
	<-m.ended
	return err
}

func (m *Member) memberPath() string {
	return fleetPath(m.fleet) + "/members/" + segment(m.name)
}

func fleetPath(fleet string) string { return "/v1/fleets/" + segment(fleet) }

func (m *Member) pollWait() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.poll
}

// minPoll is the shortest long poll a member settles for: below it, a proxy that refuses the
// wait is a refusal.
const minPoll = 100 * time.Millisecond

// shorterPoll: when err is the proxy's refusal of a poll's wait_ms (400 invalid-field, longer
// than its --max-wait), the wait to use instead — the "at most N" it names, else half of
// current.
func shorterPoll(err error, current time.Duration) (time.Duration, bool) {
	var pe *ProblemError
	if !errors.As(err, &pe) || pe.Status != http.StatusBadRequest || pe.Slug() != "invalid-field" ||
		!strings.Contains(pe.Detail, "wait_ms") {
		return 0, false
	}
	next := current / 2
	if i := strings.Index(pe.Detail, "at most "); i >= 0 {
		digits := pe.Detail[i+len("at most "):]
		if j := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); j >= 0 {
			digits = digits[:j]
		}
		if ms, err := strconv.ParseInt(digits, 10, 64); err == nil && time.Duration(ms)*time.Millisecond < current {
			next = time.Duration(ms) * time.Millisecond
		}
	}
	return next, next >= minPoll
}

// run follows the assignment by long polls until the member ends.
func (m *Member) run() {
	defer close(m.ended)
	defer m.delivery.stop()
	defer m.cancelQuit()
	backoff := firstRetryPause
	for {
		s := m.Session()
		if s.Err() != nil {
			if !m.rejoin(s, s.Err()) {
				return
			}
			continue
		}
		v, err := m.readView(s)
		received := time.Now()
		if err == nil {
			backoff = firstRetryPause
			switch last, applied := m.lastApplied(); {
			case applied && v.revision < last:
				// Older than what was applied (a lagging replica, a reordering relay): applying
				// it would bring back grants handed off or revoked since. Asked again after a
				// pause, so that a server answering so at once is not polled in a tight loop.
				m.c.logf("leaseproxy: fleet %s: an assignment of revision %d after %d: ignored", m.fleet, v.revision, last)
				sleepCtx(s.Context(), firstRetryPause)
			case applied && v.revision == last:
				// The wait ended without a change.
			default:
				if m.apply(s, v, received) {
					return
				}
			}
			continue
		}
		if s.Err() != nil {
			continue // lost meanwhile: ended, or rejoined above
		}
		if shorter, ok := shorterPoll(err, m.pollWait()); ok {
			m.c.logf("leaseproxy: fleet %s: the proxy waits at most %s: polling with that", m.fleet, shorter)
			m.mu.Lock()
			m.poll = shorter
			m.mu.Unlock()
			continue
		}
		if refused(err) {
			// Not a member any more (evicted, replaced, or its session ended): its grants are
			// gone or going. A session that ended is joined again with Rejoin.
			if m.opts.Rejoin && noMember(err) {
				m.lose(s, err)
				continue
			}
			m.end(s, err)
			return
		}
		m.c.logf("leaseproxy: fleet %s: reading the assignment: %v (retrying)", m.fleet, err)
		sleepCtx(s.Context(), backoff)
		if backoff *= 2; backoff > maxRetryPause {
			backoff = maxRetryPause
		}
	}
}

// noMember reports whether err is the service's 404 no-member: the member's session ended.
func noMember(err error) bool {
	var pe *ProblemError
	return errors.As(err, &pe) && pe.Status == http.StatusNotFound && pe.Slug() == "no-member"
}

// rejoin joins again after s, the member's session, was lost for why: true once a new session
// is installed, false when the member ends instead (no Rejoin, left, evicted, a join refused).
// Transient failures are retried until Leave.
func (m *Member) rejoin(s *Session, why error) bool {
	m.mu.Lock()
	stopped := m.stopped
	m.mu.Unlock()
	if !m.opts.Rejoin || stopped {
		return false
	}
	m.c.logf("leaseproxy: fleet %s: member %s lost its session (%v): joining again", m.fleet, m.name, why)
	backoff := firstRetryPause
	for {
		ctx, cancel := context.WithTimeout(m.quit, m.c.opts.Timeout)
		next, err := m.c.openMember(ctx, m.fleet, &m.opts)
		cancel()
		if err == nil {
			m.mu.Lock()
			if m.stopped {
				m.mu.Unlock()
				_ = next.Close(context.Background())
				return false
			}
			m.session, m.leases, m.revision, m.applied = next, map[string]*Lease{}, 0, false
			m.rejoins++
			m.mu.Unlock()
			return true
		}
		if m.quit.Err() != nil {
			return false
		}
		if refused(err) {
			m.c.logf("leaseproxy: fleet %s: joining again as %s: %v", m.fleet, m.name, err)
			m.mu.Lock()
			m.final, m.stopped = &LostError{Reason: ReasonRevoked, Err: err}, true
			m.mu.Unlock()
			return false
		}
		if !sleepCtx(m.quit, backoff) {
			return false
		}
		if backoff *= 2; backoff > maxRetryPause {
			backoff = maxRetryPause
		}
	}
}

// lose: s, the member's session, ended on the service (err says so): it and every assignment
// under it are lost, and it is closed.
func (m *Member) lose(s *Session, err error) {
	s.live.lose(&LostError{Reason: ReasonRevoked, Err: err})
	go func() { _ = s.Close(context.Background()) }()
}

// end stops the member for err: s, its session (and so every assignment), is lost, and closed.
func (m *Member) end(s *Session, err error) {
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.lose(s, err)
}

// lastApplied is the revision of the assignment last applied, and whether one was.
func (m *Member) lastApplied() (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.revision, m.applied
}

// readView is one long poll of the member's assignment: answered once it changes past the last
// revision applied, or after m.poll.
func (m *Member) readView(s *Session) (*memberView, error) {
	m.mu.Lock()
	poll := m.poll
	q := url.Values{"wait_ms": {strconv.FormatInt(poll.Milliseconds(), 10)}}
	if m.applied {
		q.Set("after", strconv.FormatUint(m.revision, 10))
	}
	m.mu.Unlock()
	a, err := m.c.do(s.Context(), call{method: http.MethodGet, path: m.memberPath(), query: q,
		header: secretHeader(s.secret), timeout: poll + m.c.opts.Timeout})
	if err != nil {
		return nil, err
	}
	v, err := parseMemberView(a.status, a.body)
	if err != nil {
		return nil, err
	}
	// A fleet grant lives on the member's session: one under another lease is not this
	// member's, and a view listing it is not believed at all.
	for _, h := range v.held {
		if h.leaseID != s.id {
			return nil, protocolErr(a.status, "fleet assignment: %s held under lease %s, not the member's session %s",
				h.resource, h.leaseID, s.id)
		}
	}
	return v, nil
}
