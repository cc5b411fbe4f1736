package leaseproxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"time"
)

const (
	// firstRetryPause is the pause before retrying a failed renewal (doubled up to maxRetryPause).
	firstRetryPause = 100 * time.Millisecond
	maxRetryPause   = time.Second
	// minRenewInterval is the shortest pause between two renewals, whatever the answers say.
	minRenewInterval = 100 * time.Millisecond
)

// renewed is what one successful renewal (or keepalive) answered.
type renewed struct {
	ttlSeconds uint64
	expiresIn  time.Duration
	// token is the grant's token (0 for a session: it has none).
	token uint64
}

// renewer keeps one grant or session alive: renewals at a third of the lifetime last granted
// (±10 %, at least 100 ms apart) after the last successful one was sent, retries of anything
// but a refusal until the stop-by deadline, and the deadline moved forward by each success.
type renewer struct {
	c      *Client
	live   *liveness
	margin time.Duration
	// token is what each renewal must answer (0: not checked).
	token uint64
	renew func(ctx context.Context) (renewed, error)
	// abandon ends the grant or session on the server after an injected loss.
	abandon func()
	stop    chan struct{}
}

// run renews from sent (the instant read before the request that made the grant) and life
// (what it granted) until stopped or lost.
func (r *renewer) run(sent time.Time, life time.Duration) {
	for {
		if !r.sleepUntil(sent.Add(renewInterval(life))) {
			return
		}
		if r.c.isClosed() {
			return
		}
		if r.c.chaos.fire(FaultLoss, r.live.resource) {
			r.live.lose(&LostError{Reason: ReasonRevoked, Injected: true, Err: errInjected})
			go r.abandon()
			return
		}
		if r.c.chaos.fire(FaultLateRenewal, r.live.resource) {
			late := time.Duration(float64(life) * r.c.chaos.float())
			r.live.failed(fmt.Errorf("renewal held back %s: %w", late, errInjected))
			if !r.sleepUntil(time.Now().Add(late)) {
				return
			}
		}
		var ok bool
		if sent, life, ok = r.renewOnce(); !ok {
			return
		}
	}
}

// renewOnce renews until a renewal succeeds (then its send instant and the lifetime it
// granted), or the lease is refused, lost or stopped (ok false).
func (r *renewer) renewOnce() (time.Time, time.Duration, bool) {
	pause := firstRetryPause
	for r.live.check() == nil {
		sent := time.Now()
		got, err := r.attempt()
		if err == nil {
			life := lifetime(got.ttlSeconds, got.expiresIn, 0)
			switch {
			case r.token != 0 && got.token != r.token:
				err = protocolErr(200, "a renewal answered token %d for a grant of token %d", got.token, r.token)
			case life == 0:
				err = protocolErr(200, "a renewal granted no time")
			default:
				r.live.extend(sent.Add(life - r.margin))
				return sent, life, true
			}
			r.live.lose(&LostError{Reason: ReasonRevoked, Err: err})
			return sent, 0, false
		}
		if refused(err) {
			r.live.lose(&LostError{Reason: ReasonRevoked, Err: err})
			return sent, 0, false
		}
		r.live.failed(err)
		r.c.logf("leaseproxy: renewing %s: %v (retrying until the stop-by deadline)", r.live.resource, err)
		if !r.sleepUntil(time.Now().Add(pause)) {
			break
		}
		if pause *= 2; pause > maxRetryPause {
			pause = maxRetryPause
		}
	}
	return time.Time{}, 0, false
}

// attempt is one renewal, bounded by the client's timeout and by the server's earliest
// possible expiry (past it no answer can help), and cancelled by a release.
func (r *renewer) attempt() (renewed, error) {
	if r.c.chaos.fire(FaultFailedRenewal, r.live.resource) {
		return renewed{}, &TransportError{Method: "POST", Path: "renew", Err: errInjected}
	}
	ctx, cancel := context.WithDeadline(context.Background(), r.live.deadline().Add(r.margin))
	defer cancel()
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return r.renew(ctx)
}

// sleepUntil waits until t; false when stopped or lost first.
func (r *renewer) sleepUntil(t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-r.stop:
		return false
	case <-r.live.done:
		return false
	}
}

// refused reports whether err says the grant (or session) is gone or will never be renewed
// for this caller: a 410, or any 4xx but a timeout (408) or a quota (429).
func refused(err error) bool {
	var pe *ProblemError
	if !errors.As(err, &pe) {
		return false
	}
	return pe.Status >= 400 && pe.Status < 500 && pe.Status != 408 && pe.Status != 429
}

// renewInterval is a third of life ±10 %, at least minRenewInterval.
func renewInterval(life time.Duration) time.Duration {
	d := time.Duration(float64(life/3) * (0.9 + 0.2*rand.Float64()))
	if d < minRenewInterval {
		return minRenewInterval
	}
	return d
}
