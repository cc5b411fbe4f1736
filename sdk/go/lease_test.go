package leaseproxy_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
	"lease-proxy.dev/leaseproxy/internal/stack"
)

func TestALeaseRenewsItselfAndReleases(t *testing.T) {
	c := client(t, "", leaseproxy.Options{})
	r := resource(t)
	l, err := c.Acquire(ctxT(t), r, &leaseproxy.AcquireOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	first := l.StopBy()
	if left := time.Until(first); left > 2*time.Second-100*time.Millisecond || left < time.Second {
		t.Fatalf("stop-by %s away, want TTL 2 s less the margin", left)
	}
	time.Sleep(2500 * time.Millisecond) // past the TTL: only renewals keep it
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	if !l.StopBy().After(first) {
		t.Fatal("the stop-by deadline did not move on with the renewals")
	}
	h, err := c.Get(ctxT(t), r)
	if err != nil || h.Token != l.Token() || h.Holder != "go-test" {
		t.Fatalf("held as %+v (%v), want token %d", h, err, l.Token())
	}
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	within(t, l.Lost(), time.Second, "lost after release")
	var lost *leaseproxy.LostError
	if !errors.As(l.Err(), &lost) || lost.Reason != leaseproxy.ReasonReleased || l.Context().Err() != context.Canceled {
		t.Fatalf("after release: %v, context %v", l.Err(), l.Context().Err())
	}
	if _, err := c.Get(ctxT(t), r); !errors.Is(err, leaseproxy.ErrNotFound) {
		t.Fatalf("get after release: %v, want ErrNotFound", err)
	}
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatalf("a second release: %v", err)
	}
}

func TestAHeldResourceIsATypedError(t *testing.T) {
	c := client(t, "", leaseproxy.Options{})
	r := resource(t)
	l, err := c.Acquire(ctxT(t), r, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctxT(t))
	_, err = c.Acquire(ctxT(t), r, &leaseproxy.AcquireOptions{Holder: "other"})
	var pe *leaseproxy.ProblemError
	if !errors.Is(err, leaseproxy.ErrHeld) || !errors.As(err, &pe) {
		t.Fatalf("got %v, want ErrHeld", err)
	}
	if pe.Status != 409 || pe.Holder != "go-test" || pe.HolderToken != l.Token() || pe.ExpiresIn <= 0 {
		t.Fatalf("problem %+v", pe)
	}
}

func TestAWaitingAcquireGetsTheResourceWhenReleased(t *testing.T) {
	c := client(t, "", leaseproxy.Options{})
	r := resource(t)
	first, err := c.Acquire(ctxT(t), r, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = first.Release(context.Background())
	}()
	start := time.Now()
	second, err := c.Acquire(ctxT(t), r, &leaseproxy.AcquireOptions{Holder: "waiter", Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctxT(t))
	if waited := time.Since(start); waited < 250*time.Millisecond || second.Token() <= first.Token() {
		t.Fatalf("waited %s for token %d after %d", waited, second.Token(), first.Token())
	}
}

func TestAnAcquireWhoseAnswerIsLostIsRetriedWithItsKey(t *testing.T) {
	relay, err := stack.NewRelay(strings.TrimPrefix(env.proxy.URL, "http://"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	c := client(t, relay.URL, leaseproxy.Options{})
	r := resource(t)
	l, err := c.Acquire(ctxT(t), r, &leaseproxy.AcquireOptions{IdempotencyKey: leaseproxy.NewIdempotencyKey()})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctxT(t))
	h, err := c.Get(ctxT(t), r)
	if err != nil || h.Token != l.Token() || h.LeaseID != l.LeaseID() {
		t.Fatalf("held as %+v (%v); the retry got token %d", h, err, l.Token())
	}
	// Without a key the lost answer is an error, and the grant nobody heard of holds it.
	r2 := resource(t)
	relay2, err := stack.NewRelay(strings.TrimPrefix(env.proxy.URL, "http://"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer relay2.Close()
	_, err = client(t, relay2.URL, leaseproxy.Options{}).Acquire(ctxT(t), r2, &leaseproxy.AcquireOptions{TTL: 2 * time.Second})
	if !leaseproxy.IsTransient(err) {
		t.Fatalf("a lost answer without a key: %v, want a transport error", err)
	}
}

func TestARevokedLeaseIsLostByTheServersEvent(t *testing.T) {
	c := client(t, "", leaseproxy.Options{})
	r := resource(t)
	l, err := c.Acquire(ctxT(t), r, &leaseproxy.AcquireOptions{TTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the shared stream is connected
	if err := env.etcd.Revoke(l.LeaseID()); err != nil {
		t.Fatal(err)
	}
	// The next renewal is ~6 s away: only the event can report it this soon.
	took := within(t, l.Context().Done(), 3*time.Second, "lost by the event")
	var lost *leaseproxy.LostError
	if !errors.As(leaseproxy.Cause(l.Context()), &lost) || lost.Reason != leaseproxy.ReasonRevoked ||
		lost.Event == nil || lost.Event.Token != l.Token() || !errors.Is(lost, leaseproxy.ErrLost) {
		t.Fatalf("cause %v", leaseproxy.Cause(l.Context()))
	}
	t.Logf("revocation reported by the event after %s (%s)", took, lost)
}

func TestARevokedLeaseIsLostByARefusedRenewal(t *testing.T) {
	c := client(t, "", leaseproxy.Options{NoLossWatch: true})
	r := resource(t)
	l, err := c.Acquire(ctxT(t), r, &leaseproxy.AcquireOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.etcd.Revoke(l.LeaseID()); err != nil {
		t.Fatal(err)
	}
	within(t, l.Lost(), 1500*time.Millisecond, "lost by the renewal")
	var lost *leaseproxy.LostError
	var pe *leaseproxy.ProblemError
	if !errors.As(l.Err(), &lost) || lost.Reason != leaseproxy.ReasonRevoked || lost.Event != nil ||
		!errors.As(l.Err(), &pe) || pe.Status != 410 {
		t.Fatalf("lost %v", l.Err())
	}
}

func TestWithLeaseCancelsTheWorkAndReturnsTheLoss(t *testing.T) {
	c := client(t, "", leaseproxy.Options{})
	r := resource(t)
	var leaseID string
	started := make(chan struct{})
	go func() {
		<-started
		_ = env.etcd.Revoke(leaseID)
	}()
	err := c.WithLease(ctxT(t), r, &leaseproxy.AcquireOptions{TTL: 20 * time.Second},
		func(ctx context.Context, l *leaseproxy.Lease) error {
			if leaseproxy.LeaseFromContext(ctx) != l {
				t.Error("the work's context does not carry its lease")
			}
			leaseID = l.LeaseID()
			close(started)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Second):
				return errors.New("not cancelled")
			}
		})
	if !errors.Is(err, leaseproxy.ErrLost) {
		t.Fatalf("WithLease returned %v, want the loss", err)
	}
	// Work that finishes returns its result and the lease is released.
	got := c.WithLease(ctxT(t), r, nil, func(ctx context.Context, l *leaseproxy.Lease) error { return nil })
	if got != nil {
		t.Fatal(got)
	}
	if _, err := c.Get(ctxT(t), r); !errors.Is(err, leaseproxy.ErrNotFound) {
		t.Fatalf("after WithLease: %v", err)
	}
}

func TestAKilledProxyCancelsTheWorkAtTheStopByDeadline(t *testing.T) {
	proxy, err := stack.StartProxy(env.dir, "doomed-proxy", env.etcd.URL, "/lease-proxy-go-doomed/", env.keyFile, "http", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Kill()
	c := client(t, proxy.URL, leaseproxy.Options{SafetyMargin: 300 * time.Millisecond})
	l, err := c.Acquire(ctxT(t), resource(t), &leaseproxy.AcquireOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(800 * time.Millisecond) // a renewal or two went through
	proxy.Kill()
	stopBy := l.StopBy()
	within(t, l.Context().Done(), 3*time.Second, "work cancelled")
	late := time.Since(stopBy)
	var lost *leaseproxy.LostError
	if !errors.As(l.Err(), &lost) || lost.Reason != leaseproxy.ReasonExpired || lost.Err == nil {
		t.Fatalf("lost %v, want expired with the last renewal failure", l.Err())
	}
	if late < -20*time.Millisecond || late > 200*time.Millisecond {
		t.Fatalf("cancelled %s after the stop-by deadline", late)
	}
	t.Logf("cancelled %s after the stop-by deadline: %v", late, lost)
}
