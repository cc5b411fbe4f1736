package leaseproxy

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// LostReason says how the client learnt that a lease (or session) is lost.
type LostReason string

const (
	// ReasonExpired: the stop-by deadline passed without a successful renewal (the server
	// may be unreachable; nobody said "lost").
	ReasonExpired LostReason = "expired"
	// ReasonRevoked: the server said so: a renewal refused (410, or a permanent 4xx) or
	// answering a grant of no time or another grant's token, the proxy's 410 to a forward, or
	// the client's event stream reporting the grant ended or the resource acquired under a
	// newer token (then LostError.Event is that event).
	ReasonRevoked LostReason = "revoked"
	// ReasonSessionLost: the session it lives under was lost.
	ReasonSessionLost LostReason = "session-lost"
	// ReasonReleased: released (or its session closed) by this process.
	ReasonReleased LostReason = "released"
	// ReasonHandedOff: a fleet moved the resource to another member.
	ReasonHandedOff LostReason = "handed-off"
)

// LostError says why a lease or session is lost. It matches ErrLost (and ErrSessionLost for
// a session, or a lease lost with its session). Unwrap gives what caused it: the refusal, the
// last renewal failure before the deadline, or the session's own LostError.
type LostError struct {
	// Resource and Token of the lease; Resource is "session:ID" for a session.
	Resource string
	Token    uint64
	Reason   LostReason
	// Event is the event that reported the loss, when the event stream did.
	Event *Event
	// Injected is true when the test mode caused the loss.
	Injected bool
	Err      error
}

func (e *LostError) Error() string {
	msg := fmt.Sprintf("leaseproxy: %s (token %d) lost: %s", e.Resource, e.Token, e.Reason)
	if e.Event != nil {
		msg += fmt.Sprintf(" (%s, token %d, revision %d)", e.Event.Type, e.Event.Token, e.Event.Revision)
	}
	if e.Injected {
		msg += " [injected by the test mode]"
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is matches ErrLost, and ErrSessionLost for a session's loss and its leases'.
func (e *LostError) Is(target error) bool {
	return target == ErrLost || (target == ErrSessionLost &&
		(e.Reason == ReasonSessionLost || strings.HasPrefix(e.Resource, "session:")))
}

func (e *LostError) Unwrap() error { return e.Err }

// liveness is whether a lease or session is still held: its stop-by deadline on the
// monotonic clock, its done channel and why it was lost. A lease under a session has no
// deadline of its own: it is its parent's, and the parent's loss reaches it.
type liveness struct {
	mu       sync.Mutex
	stopBy   time.Time
	lost     *LostError
	done     chan struct{}
	timer    *time.Timer
	parent   *liveness
	children map[*liveness]struct{}
	resource string
	token    uint64
	// lastFailure is the last renewal failure, the cause of an expiry.
	lastFailure error
}

// newLiveness is held until stopBy (a time.Now()-based instant: monotonic) unless extended;
// a timer marks it lost at the deadline.
func newLiveness(stopBy time.Time, resource string, token uint64) *liveness {
	l := &liveness{stopBy: stopBy, done: make(chan struct{}), resource: resource, token: token,
		children: map[*liveness]struct{}{}}
	l.mu.Lock()
	l.timer = time.AfterFunc(time.Until(stopBy), l.onTimer)
	l.mu.Unlock()
	return l
}

// under is held as long as parent is, until lost on its own.
func (parent *liveness) under(resource string, token uint64) *liveness {
	l := &liveness{done: make(chan struct{}), parent: parent, resource: resource, token: token,
		children: map[*liveness]struct{}{}}
	parent.mu.Lock()
	lost := parent.lost
	if lost == nil {
		parent.children[l] = struct{}{}
	}
	parent.mu.Unlock()
	if lost != nil {
		l.lose(&LostError{Reason: ReasonSessionLost, Err: lost})
	}
	return l
}

func (l *liveness) onTimer() {
	if l.check() != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost == nil {
		l.timer.Reset(time.Until(l.stopBy))
	}
}

// deadline is the stop-by deadline (the parent's under a session).
func (l *liveness) deadline() time.Time {
	if l.parent != nil {
		return l.parent.deadline()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopBy
}

// extend moves the deadline to t when that is later and it is not lost: a renewal never
// shortens a lease, and a loss, once seen, stays.
func (l *liveness) extend(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastFailure = nil
	if l.lost == nil && t.After(l.stopBy) {
		l.stopBy = t
	}
}

// failed records a renewal failure (the cause an expiry will carry).
func (l *liveness) failed(err error) {
	l.mu.Lock()
	l.lastFailure = err
	l.mu.Unlock()
}

// lose marks it lost with e (its Resource and Token filled in), unless it already was: the
// first loss stays. Its children are lost with it. Returns whether this call lost it.
func (l *liveness) lose(e *LostError) bool {
	e.Resource, e.Token = l.resource, l.token
	l.mu.Lock()
	if l.lost != nil {
		l.mu.Unlock()
		return false
	}
	l.lost = e
	close(l.done)
	if l.timer != nil {
		l.timer.Stop()
	}
	children := l.children
	l.children = nil
	l.mu.Unlock()
	if l.parent != nil {
		l.parent.mu.Lock()
		delete(l.parent.children, l)
		l.parent.mu.Unlock()
	}
	for child := range children {
		child.lose(&LostError{Reason: ReasonSessionLost, Injected: e.Injected, Err: e})
	}
	return true
}

// check reads the clock: past the deadline it is lost now, even if no timer has run yet (a
// process resumed after being stopped). Returns the loss, or nil while held.
func (l *liveness) check() *LostError {
	if l.parent != nil {
		l.parent.check()
	}
	l.mu.Lock()
	lost, stopBy, cause := l.lost, l.stopBy, l.lastFailure
	l.mu.Unlock()
	if lost != nil || l.parent != nil {
		return l.err()
	}
	if !time.Now().Before(stopBy) {
		l.lose(&LostError{Reason: ReasonExpired, Err: cause, Injected: errors.Is(cause, errInjected)})
	}
	return l.err()
}

// err is the loss, without reading the clock.
func (l *liveness) err() *LostError {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// margin is the safety margin for a lifetime: configured, or a tenth of it, at least 100 ms.
func margin(configured, life time.Duration) time.Duration {
	if configured > 0 {
		return configured
	}
	m := life / 10
	if m < 100*time.Millisecond {
		m = 100 * time.Millisecond
	}
	return m
}
