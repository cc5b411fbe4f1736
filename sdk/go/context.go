package leaseproxy

import (
	"context"
	"time"
)

type leaseKey struct{}

// leaseContext is a context cancelled when its lease is lost (or its parent is done) that
// carries the lease. Err reads the lease's clock first, so right after a pause past the
// stop-by deadline it is already context.Canceled, before any timer has run.
type leaseContext struct {
	parent context.Context
	live   *liveness
	// lease is carried for Transport and Admit (nil for a session's context).
	lease *Lease
	done  <-chan struct{}
	// cancel cancels parent (Bind's), so that Done is closed whenever Err reports the loss.
	cancel context.CancelFunc
}

func (c *leaseContext) Deadline() (time.Time, bool) { return c.parent.Deadline() }

func (c *leaseContext) Done() <-chan struct{} { return c.done }

func (c *leaseContext) Err() error {
	if c.live.check() != nil {
		if c.cancel != nil {
			c.cancel()
		}
		return context.Canceled
	}
	return c.parent.Err()
}

func (c *leaseContext) Value(key any) any {
	if key == (leaseKey{}) && c.lease != nil {
		return c.lease
	}
	return c.parent.Value(key)
}

// ContextWithLease returns ctx carrying l, for Transport and Admit. The lease's own contexts
// (Context, Bind, WithLease) carry it already. It does not cancel ctx on loss: Bind does.
func ContextWithLease(ctx context.Context, l *Lease) context.Context {
	return context.WithValue(ctx, leaseKey{}, l)
}

// LeaseFromContext is the lease ctx carries, or nil.
func LeaseFromContext(ctx context.Context) *Lease {
	l, _ := ctx.Value(leaseKey{}).(*Lease)
	return l
}

// Cause is what Go 1.20's context.Cause would say for a context of a lease: the lease's
// *LostError once it is lost, else ctx.Err().
func Cause(ctx context.Context) error {
	if l := LeaseFromContext(ctx); l != nil {
		if err := l.Err(); err != nil {
			return err
		}
	}
	return ctx.Err()
}
