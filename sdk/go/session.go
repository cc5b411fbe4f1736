package leaseproxy

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// SessionOptions say how to open a session (nil: the client's defaults).
type SessionOptions struct {
	// Holder names who opens it (default: Options.Holder).
	Holder string
	// TTL is the session's time to live, whole seconds rounded up (default: Options.TTL).
	TTL time.Duration
	// SafetyMargin overrides Options.SafetyMargin.
	SafetyMargin time.Duration
}

// SessionAcquireOptions say how to acquire a resource under a session: its TTL is the
// session's.
type SessionAcquireOptions struct {
	// Holder names the grant's holder (default: the session's).
	Holder         string
	Wait           time.Duration
	IdempotencyKey string
	Metadata       map[string]any
}

// Session is one etcd lease kept alive by one heartbeat, holding any number of resources.
// Its leases need no renewal of their own and are lost (ReasonSessionLost) when it is.
type Session struct {
	c      *Client
	id     string
	secret string
	holder string
	live   *liveness
	ctx    *leaseContext
	stop   chan struct{}

	once     sync.Once
	closeErr error
}

// OpenSession opens a session and keeps it alive (a keepalive at a third of its lifetime)
// until it is closed or lost.
func (c *Client) OpenSession(ctx context.Context, opts *SessionOptions) (*Session, error) {
	var o SessionOptions
	if opts != nil {
		o = *opts
	}
	if o.Holder == "" {
		o.Holder = c.opts.Holder
	}
	if o.TTL <= 0 {
		o.TTL = c.opts.TTL
	}
	if o.SafetyMargin <= 0 {
		o.SafetyMargin = c.opts.SafetyMargin
	}
	sent := time.Now()
	a, err := c.do(ctx, call{method: http.MethodPost, path: "/v1/sessions",
		body: map[string]any{"holder": o.Holder, "ttl_seconds": wholeSeconds(o.TTL)}})
	if err != nil {
		return nil, err
	}
	s, t, err := parseOpened(a)
	if err != nil {
		return nil, err
	}
	return c.keepSession(s, sent, t, o.SafetyMargin)
}

// keepSession starts keeping s alive: opened by a request sent at sent, granting t. A session
// whose stop-by deadline passed before its answer arrived is closed and reported lost.
func (c *Client) keepSession(s *Session, sent time.Time, t timing, safety time.Duration) (*Session, error) {
	life := lifetime(t.ttlSeconds, t.expiresIn, 0)
	m := margin(safety, life)
	s.c, s.stop = c, make(chan struct{})
	s.live = newLiveness(sent.Add(life-m), "session:"+s.id, 0)
	s.ctx = &leaseContext{parent: context.Background(), live: s.live, done: s.live.done}
	if life == 0 || !time.Now().Before(sent.Add(life-m)) {
		s.live.lose(&LostError{Reason: ReasonExpired, Err: errDeadOnArrival})
		go func() { _ = s.Close(context.Background()) }()
		return nil, s.live.err()
	}
	r := &renewer{c: c, live: s.live, margin: m, stop: s.stop, renew: s.keepalive,
		abandon: func() { _ = c.closeSession(context.Background(), s.id, s.secret) }}
	go r.run(sent, life)
	return s, nil
}

// keepalive is one POST /v1/sessions/{id}/keepalive.
func (s *Session) keepalive(ctx context.Context) (renewed, error) {
	a, err := s.c.do(ctx, call{method: http.MethodPost, path: sessionPath(s.id) + "/keepalive",
		header: secretHeader(s.secret)})
	if err != nil {
		return renewed{}, err
	}
	f, err := decodeObject(a.status, a.body, "ttl_seconds", "expires_in_ms")
	if err != nil {
		return renewed{}, err
	}
	t, err := parseTiming(a.status, f)
	return renewed{ttlSeconds: t.ttlSeconds, expiresIn: t.expiresIn}, err
}

func parseOpened(a *answer) (*Session, timing, error) {
	f, err := decodeObject(a.status, a.body, "session_id", "secret", "ttl_seconds", "expires_in_ms")
	if err != nil {
		return nil, timing{}, err
	}
	s := &Session{}
	if s.id, err = f.str(a.status, "session_id"); err != nil {
		return nil, timing{}, err
	}
	if s.secret, err = f.str(a.status, "secret"); err != nil {
		return nil, timing{}, err
	}
	if s.holder, err = f.str(a.status, "holder"); err != nil {
		return nil, timing{}, err
	}
	if s.id == "" || s.secret == "" {
		return nil, timing{}, protocolErr(a.status, "a session without an id or a secret")
	}
	t, err := parseTiming(a.status, f)
	return s, t, err
}

// ID is the session id (its etcd lease id, decimal).
func (s *Session) ID() string { return s.id }

// Secret is the session's secret (Lease-Secret of its keepalive and of acquires under it).
func (s *Session) Secret() string { return s.secret }

// Holder is who opened it.
func (s *Session) Holder() string { return s.holder }

// StopBy is the session's stop-by deadline (also its leases').
func (s *Session) StopBy() time.Time { return s.live.deadline() }

// Lost is closed when the session is lost or closed.
func (s *Session) Lost() <-chan struct{} { return s.live.done }

// Err is nil while the session is held, then its *LostError (reads the clock, as Lease.Err).
func (s *Session) Err() error {
	if lost := s.live.check(); lost != nil {
		return lost
	}
	return nil
}

// Context is cancelled when the session is lost or closed.
func (s *Session) Context() context.Context { return s.ctx }

// Acquire acquires resource under the session. A *LostError without asking the proxy when
// the session is known lost; an answer of 410 session-lost loses the session.
func (s *Session) Acquire(ctx context.Context, resource string, opts *SessionAcquireOptions) (*Lease, error) {
	if err := s.Err(); err != nil {
		return nil, err
	}
	var o SessionAcquireOptions
	if opts != nil {
		o = *opts
	}
	if o.Holder == "" {
		o.Holder = s.holder
	}
	g, _, err := s.c.grant(ctx, resource, acquireRequest{holder: o.Holder, wait: o.Wait,
		key: o.IdempotencyKey, metadata: o.Metadata, session: s.id, secret: s.secret})
	if err != nil {
		if refused(err) && isSessionLost(err) {
			s.live.lose(&LostError{Reason: ReasonRevoked, Err: err})
		}
		return nil, err
	}
	if g.Session != "" && g.Session != s.id {
		return nil, protocolErr(http.StatusCreated, "a grant under session %q answered an acquire under %q", g.Session, s.id)
	}
	return s.c.newLease(g, s.live.under(g.Resource, g.Token)), nil
}

// Close stops the heartbeat, marks the session (and so its leases) lost and closes it, which
// ends every grant under it. Idempotent.
func (s *Session) Close(ctx context.Context) error {
	s.once.Do(func() {
		close(s.stop)
		s.live.lose(&LostError{Reason: ReasonReleased})
		s.closeErr = s.c.closeSession(ctx, s.id, s.secret)
	})
	return s.closeErr
}

func (c *Client) closeSession(ctx context.Context, id, secret string) error {
	_, err := c.do(ctx, call{method: http.MethodDelete, path: sessionPath(id), header: secretHeader(secret)})
	return err
}

func isSessionLost(err error) bool {
	pe, ok := err.(*ProblemError)
	return ok && pe.Slug() == "session-lost"
}
