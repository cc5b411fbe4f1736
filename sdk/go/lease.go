package leaseproxy

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// errDeadOnArrival: a grant's stop-by deadline passed before its answer arrived.
var errDeadOnArrival = errors.New("the grant's stop-by deadline passed before its answer arrived")

// AcquireOptions say how to acquire a resource. A nil *AcquireOptions, and every zero field,
// take the client's defaults.
type AcquireOptions struct {
	// Holder names who holds it (default: Options.Holder).
	Holder string
	// TTL is the lease's time to live, sent in whole seconds rounded up (default: Options.TTL).
	TTL time.Duration
	// Wait makes a held resource's acquire wait up to this long (server-side, first come first
	// served) for the holder to release or expire.
	Wait time.Duration
	// IdempotencyKey makes a retried acquire return the same grant; the client retries a
	// transport failure or a 502–504 with it by itself. Use an unguessable value
	// (NewIdempotencyKey).
	IdempotencyKey string
	// Metadata is a JSON object stored with the grant.
	Metadata map[string]any
	// SafetyMargin overrides Options.SafetyMargin for this lease.
	SafetyMargin time.Duration
}

// Lease is a held resource. It renews itself in the background and reports its loss — a
// refused renewal, the server's event, or its stop-by deadline passing while renewals cannot
// reach the server — by cancelling Context(), closing Lost() and setting Err().
//
// Present FencingToken() with every write to protected storage (Transport and Admit do it for
// you), so that a write made after the loss anyway is refused there.
type Lease struct {
	c     *Client
	grant Grant
	live  *liveness
	ctx   *leaseContext
	stop  chan struct{}
	// member is the fleet member it was assigned to (nil for any other lease): its release
	// is sent only while the member still holds this grant.
	member *Member
	// releaseBy is when a fleet lease handed off must be released (nil: not handed off).
	releaseBy atomic.Pointer[time.Time]

	once   sync.Once
	relErr error
}

// Acquire acquires resource and returns a Lease that keeps it. The stop-by deadline counts
// from the instant read just before sending the request that succeeded: its lifetime (the
// answer's expires_in_ms, at most its TTL plus the wait) less the safety margin. A grant whose
// deadline has passed by the time its answer arrives is released and reported as a *LostError
// (ReasonExpired), never returned as held.
func (c *Client) Acquire(ctx context.Context, resource string, opts *AcquireOptions) (*Lease, error) {
	o := c.acquireDefaults(opts)
	g, sent, err := c.grant(ctx, resource, acquireRequest{
		holder: o.Holder, ttl: o.TTL, wait: o.Wait, key: o.IdempotencyKey, metadata: o.Metadata})
	if err != nil {
		return nil, err
	}
	life := lifetime(g.TTLSeconds, g.ExpiresIn, o.Wait)
	m := margin(o.SafetyMargin, life)
	stopBy := sent.Add(life - m)
	l := c.newLease(g, newLiveness(stopBy, g.Resource, g.Token))
	if life == 0 || !time.Now().Before(stopBy) {
		l.live.lose(&LostError{Reason: ReasonExpired, Err: errDeadOnArrival})
		go func() { _ = l.Release(context.Background()) }()
		return nil, l.live.err()
	}
	r := &renewer{c: c, live: l.live, margin: m, token: g.Token, stop: l.stop,
		renew: func(ctx context.Context) (renewed, error) {
			rn, err := c.Renew(ctx, g.Resource, g.Secret)
			if err != nil {
				return renewed{}, err
			}
			return renewed{ttlSeconds: rn.TTLSeconds, expiresIn: rn.ExpiresIn, token: rn.Token}, nil
		},
		abandon: func() { _ = c.Release(context.Background(), g.Resource, g.Secret) },
	}
	go r.run(sent, life)
	return l, nil
}

// WithLease acquires resource, runs fn with a context cancelled when the lease is lost (or
// ctx is done) and carrying the lease (for Transport and Admit), then releases it. It returns
// fn's error; when the lease was lost while fn ran and fn returned nil or a cancellation, it
// returns the *LostError instead, so a loss is never mistaken for success.
func (c *Client) WithLease(ctx context.Context, resource string, opts *AcquireOptions,
	fn func(ctx context.Context, l *Lease) error) (err error) {
	l, err := c.Acquire(ctx, resource, opts)
	if err != nil {
		return err
	}
	work, cancel := l.Bind(ctx)
	defer func() { // also when fn panics: the lease is released either way
		cancel()
		lost := l.Err()
		relCtx, relCancel := context.WithTimeout(context.Background(), c.opts.Timeout)
		defer relCancel()
		relErr := l.Release(relCtx)
		switch {
		case lost != nil && (err == nil || errors.Is(err, context.Canceled)):
			err = lost
		case err == nil:
			err = relErr
		}
	}()
	return fn(work, l)
}

func (c *Client) acquireDefaults(opts *AcquireOptions) AcquireOptions {
	var o AcquireOptions
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
	return o
}

func (c *Client) newLease(g *Grant, live *liveness) *Lease {
	l := &Lease{c: c, grant: *g, live: live, stop: make(chan struct{})}
	l.ctx = &leaseContext{parent: context.Background(), live: live, lease: l, done: live.done}
	c.feed.register(l)
	go func() {
		<-live.done
		c.feed.unregister(l)
	}()
	return l
}

// Resource is the resource held.
func (l *Lease) Resource() string { return l.grant.Resource }

// Holder is the holder named in the grant.
func (l *Lease) Holder() string { return l.grant.Holder }

// LeaseID is the etcd lease id (decimal; the session id under a session).
func (l *Lease) LeaseID() string { return l.grant.LeaseID }

// Token is the fencing token's revision: larger for every later grant of the resource.
func (l *Lease) Token() uint64 { return l.grant.Token }

// FencingToken is the signed token, for the Fencing-Token header of protected writes.
func (l *Lease) FencingToken() string { return l.grant.FencingToken }

// Secret is the grant's secret (Lease-Secret).
func (l *Lease) Secret() string { return l.grant.Secret }

// Grant is the grant as the proxy answered it.
func (l *Lease) Grant() Grant { return l.grant }

// StopBy is the stop-by deadline (monotonic): the lease is held at least until then unless
// reported lost earlier; each successful renewal moves it forward.
func (l *Lease) StopBy() time.Time { return l.live.deadline() }

// Lost is closed when the lease is lost or released.
func (l *Lease) Lost() <-chan struct{} { return l.live.done }

// Err is nil while the lease is held, then the *LostError that says why it is not. It reads
// the clock: past the stop-by deadline it reports the loss even if no background work has run
// since (a process resumed after SIGSTOP).
func (l *Lease) Err() error {
	if lost := l.live.check(); lost != nil {
		return lost
	}
	return nil
}

// Cause is Err under the name of Go 1.20's context.Cause, which Go 1.19 lacks: the reason the
// lease's contexts were cancelled.
func (l *Lease) Cause() error { return l.Err() }

// Context is cancelled when the lease is lost or released (Err is then context.Canceled, and
// Cause(ctx) the *LostError), and carries the lease for Transport and Admit.
func (l *Lease) Context() context.Context { return l.ctx }

// Bind derives from parent a context that is also cancelled when the lease is lost, and
// carries the lease. Call cancel when done with it.
func (l *Lease) Bind(parent context.Context) (context.Context, context.CancelFunc) {
	inner, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-l.live.done:
			cancel()
		case <-inner.Done():
		}
	}()
	return &leaseContext{parent: inner, live: l.live, lease: l, done: inner.Done(), cancel: cancel}, cancel
}

// Release stops renewing, marks the lease lost (ReasonReleased, unless it was lost already)
// and releases it on the server. Idempotent: later calls return the first one's result.
//
// A fleet's lease is released only while its member still holds that grant (its assignment
// lists it held or to hand off): the session's secret proves every grant under the session,
// so a late release of a grant already taken back could end a later grant of the same
// resource to the same member.
func (l *Lease) Release(ctx context.Context) error {
	l.once.Do(func() {
		close(l.stop)
		l.live.lose(&LostError{Reason: ReasonReleased})
		if l.member != nil && !l.member.holds(l) {
			return
		}
		l.relErr = l.c.Release(ctx, l.grant.Resource, l.grant.Secret)
	})
	return l.relErr
}
