package leaseproxy

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"
)

// memberView is a member's assignment as the service answers it.
type memberView struct {
	state     string
	revision  uint64
	held      []heldGrant
	releasing []releasingEntry
}

// releasingEntry is a resource moved away from the member: release it by deadline, counted
// from the answer's arrival.
type releasingEntry struct {
	resource string
	deadline time.Duration
}

type heldGrant struct {
	resource, leaseID, fencingToken string
	token                           uint64
}

func parseMemberView(status int, body []byte) (*memberView, error) {
	f, err := decodeObject(status, body, "revision", "held", "releasing")
	if err != nil {
		return nil, err
	}
	v := &memberView{}
	if v.revision, err = f.decimal(status, "revision"); err != nil {
		return nil, err
	}
	if v.state, err = f.str(status, "state"); err != nil {
		return nil, err
	}
	var held, releasing []json.RawMessage
	if json.Unmarshal(f["held"], &held) != nil || json.Unmarshal(f["releasing"], &releasing) != nil {
		return nil, protocolErr(status, "held and releasing are not lists: %s", excerpt(body))
	}
	for _, raw := range held {
		h, err := decodeObject(status, raw, "resource", "lease_id", "token", "fencing_token")
		if err != nil {
			return nil, err
		}
		var g heldGrant
		if g.resource, err = h.str(status, "resource"); err != nil {
			return nil, err
		}
		if g.leaseID, err = h.str(status, "lease_id"); err != nil {
			return nil, err
		}
		if g.fencingToken, err = h.str(status, "fencing_token"); err != nil {
			return nil, err
		}
		if g.token, err = h.decimal(status, "token"); err != nil {
			return nil, err
		}
		v.held = append(v.held, g)
	}
	for _, raw := range releasing {
		r, err := decodeObject(status, raw, "resource", "deadline_ms")
		if err != nil {
			return nil, err
		}
		var e releasingEntry
		if e.resource, err = r.str(status, "resource"); err != nil {
			return nil, err
		}
		ms, err := r.count(status, "deadline_ms")
		if err != nil {
			return nil, err
		}
		if ms > uint64(maxRelease/time.Millisecond) {
			ms = uint64(maxRelease / time.Millisecond)
		}
		e.deadline = time.Duration(ms) * time.Millisecond
		v.releasing = append(v.releasing, e)
	}
	return v, nil
}

// maxRelease caps a hand-off's deadline_ms (the service allows drain_ms up to an hour).
const maxRelease = time.Hour

// releaseBy is when a hand-off told in an answer that arrived at received, with deadline left
// before the service revokes the grant, must be done: less a margin of a tenth of it, at least
// 100 ms (and never before received).
func releaseBy(received time.Time, deadline time.Duration) time.Time {
	margin := deadline / 10
	if margin < 100*time.Millisecond {
		margin = 100 * time.Millisecond
	}
	if deadline < margin {
		return received
	}
	return received.Add(deadline - margin)
}

// ReleaseBy is, for a fleet lease moved to another member (lost with ReasonHandedOff), when the
// work on it must be finished and the resource released, on the monotonic clock: the
// assignment's arrival plus the service's deadline_ms, less a safety margin (a tenth of it, at
// least 100 ms). Past the service's deadline it revokes the grant. ok is false for any other
// lease, and before the hand-off.
func (l *Lease) ReleaseBy() (by time.Time, ok bool) {
	if p := l.releaseBy.Load(); p != nil {
		return *p, true
	}
	return time.Time{}, false
}

// apply brings the member's leases to v, an answer that arrived at received: a newly held
// resource becomes a lease delivered on Assignments; one in releasing is lost (ReasonHandedOff,
// with its ReleaseBy) — or released at once if it was never delivered —; one in neither is lost
// (ReasonRevoked). Returns whether the member has ended
// (evicted).
func (m *Member) apply(s *Session, v *memberView, received time.Time) bool {
	m.mu.Lock()
	m.state, m.revision, m.applied = v.state, v.revision, true
	seen := map[string]bool{}
	var fresh []*Lease
	for _, h := range v.held {
		seen[h.resource] = true
		// The same grant: delivered once, and never again once lost here (its work returned and
		// released it while this view was on its way, say).
		if l := m.leases[h.resource]; l != nil && l.Token() == h.token {
			continue
		}
		if l, err := m.grantOf(s, h); err != nil {
			m.c.logf("leaseproxy: fleet %s: %v", m.fleet, err)
		} else {
			fresh = append(fresh, l)
		}
	}
	var handedOff, gone []*Lease
	var undelivered []string
	for _, r := range v.releasing {
		seen[r.resource] = true
		if l := m.leases[r.resource]; l != nil {
			// Told once: the deadline of the first view that listed the hand-off.
			by := releaseBy(received, r.deadline)
			l.releaseBy.CompareAndSwap(nil, &by)
			handedOff = append(handedOff, l)
		} else {
			undelivered = append(undelivered, r.resource)
		}
	}
	for r, l := range m.leases {
		if !seen[r] {
			gone = append(gone, l)
			delete(m.leases, r)
		}
	}
	for _, l := range fresh {
		if old := m.leases[l.Resource()]; old != nil {
			gone = append(gone, old)
		}
		m.leases[l.Resource()] = l
	}
	m.mu.Unlock()
	m.settle(s, fresh, handedOff, gone, undelivered)
	if v.state == "evicted" {
		m.end(s, errors.New("the member was evicted from the fleet"))
		return true
	}
	return false
}

// settle acts on what apply decided, outside the member's lock.
func (m *Member) settle(s *Session, fresh, handedOff, gone []*Lease, undelivered []string) {
	for _, l := range gone {
		l.live.lose(&LostError{Reason: ReasonRevoked, Err: errors.New("no longer assigned to this member")})
	}
	for _, l := range handedOff {
		l.live.lose(&LostError{Reason: ReasonHandedOff})
	}
	for _, r := range undelivered {
		r := r
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), m.c.opts.Timeout)
			defer cancel()
			_ = m.c.Release(ctx, r, s.secret)
		}()
	}
	for _, l := range fresh {
		m.delivery.push(l)
	}
}

// grantOf is the lease of a held grant: it lives on s, the member's session, proven by the
// session's secret (the service grants it so).
func (m *Member) grantOf(s *Session, h heldGrant) (*Lease, error) {
	g := &Grant{Resource: h.resource, Holder: m.name, LeaseID: h.leaseID, Secret: s.secret,
		Token: h.token, FencingToken: h.fencingToken, Session: s.id}
	if err := checkGrant(200, g, h.resource); err != nil {
		return nil, err
	}
	l := m.c.newLease(g, s.live.under(g.Resource, g.Token))
	l.member = m
	return l, nil
}

// holds reports whether l is the member's grant of its resource as last read (held, or to
// hand off).
func (m *Member) holds(l *Lease) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leases[l.Resource()] == l
}

// delivery hands leases to Assignments in order without ever blocking the member's loop: a
// reader that is slow holds back no loss.
type delivery struct {
	out   chan *Lease
	mu    sync.Mutex
	queue []*Lease
	wake  chan struct{}
	quit  chan struct{}
}

func (d *delivery) start() {
	d.out, d.wake, d.quit = make(chan *Lease), make(chan struct{}, 1), make(chan struct{})
	go d.run()
}

func (d *delivery) push(l *Lease) {
	d.mu.Lock()
	d.queue = append(d.queue, l)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *delivery) stop() { close(d.quit) }

func (d *delivery) run() {
	defer close(d.out)
	for {
		d.mu.Lock()
		queue := d.queue
		d.queue = nil
		d.mu.Unlock()
		for _, l := range queue {
			if l.live.check() != nil {
				continue // lost before anyone took it
			}
			select {
			case d.out <- l:
			case <-d.quit:
				return
			}
		}
		select {
		case <-d.wake:
		case <-d.quit:
			return
		}
	}
}
