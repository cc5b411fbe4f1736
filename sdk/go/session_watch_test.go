package leaseproxy_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
)

func TestASessionKeepsItsLeasesAndCloseEndsThem(t *testing.T) {
	c := client(t, "", leaseproxy.Options{})
	s, err := c.OpenSession(ctxT(t), &leaseproxy.SessionOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r1, r2 := resource(t), resource(t)
	a, err := s.Acquire(ctxT(t), r1, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(ctxT(t), r2, &leaseproxy.SessionAcquireOptions{Holder: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if a.LeaseID() != s.ID() || b.Token() <= a.Token() || b.Holder() != "b" {
		t.Fatalf("grants %+v %+v under %s", a.Grant(), b.Grant(), s.ID())
	}
	time.Sleep(2500 * time.Millisecond) // past the TTL: the heartbeat keeps both
	if a.Err() != nil || b.Err() != nil || s.Err() != nil {
		t.Fatalf("lost: %v %v %v", a.Err(), b.Err(), s.Err())
	}
	if err := b.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctxT(t), r2); !errors.Is(err, leaseproxy.ErrNotFound) || a.Err() != nil {
		t.Fatalf("released one: %v; the other %v", err, a.Err())
	}
	if err := s.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	within(t, a.Lost(), time.Second, "a lease of a closed session")
	if !errors.Is(a.Err(), leaseproxy.ErrSessionLost) {
		t.Fatalf("lost %v", a.Err())
	}
	if _, err := c.Get(ctxT(t), r1); !errors.Is(err, leaseproxy.ErrNotFound) {
		t.Fatalf("after close: %v", err)
	}
	if _, err := s.Acquire(ctxT(t), r1, nil); !errors.Is(err, leaseproxy.ErrLost) {
		t.Fatalf("acquire under a closed session: %v", err)
	}
}

func TestARevokedSessionLosesItsLeases(t *testing.T) {
	c := client(t, "", leaseproxy.Options{NoLossWatch: true})
	s, err := c.OpenSession(ctxT(t), &leaseproxy.SessionOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctxT(t))
	l, err := s.Acquire(ctxT(t), resource(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.etcd.Revoke(s.ID()); err != nil {
		t.Fatal(err)
	}
	within(t, l.Context().Done(), 1500*time.Millisecond, "the session's lease")
	var lost, session *leaseproxy.LostError
	if !errors.As(l.Err(), &lost) || lost.Reason != leaseproxy.ReasonSessionLost ||
		!errors.As(lost.Err, &session) || session.Reason != leaseproxy.ReasonRevoked {
		t.Fatalf("lost %v", l.Err())
	}
}

func TestTheEventStreamResumesAfterItsLastId(t *testing.T) {
	c := client(t, "", leaseproxy.Options{})
	prefix := resource(t)
	ctx := ctxT(t)
	// A stream without a last id starts where its connection (made in the background) lands,
	// which may be after the acquire below: this one starts after a revision read first.
	mark, err := c.Acquire(ctx, "mark-"+prefix, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := mark.Release(ctx); err != nil {
		t.Fatal(err)
	}
	events := c.Watch(ctx, prefix, strconv.FormatUint(mark.Token(), 10))
	l, err := c.Acquire(ctx, prefix+"-a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"acquired", "released"}
	for _, typ := range want {
		ev, err := events.Next()
		if err != nil || ev.Type != typ || ev.Token != l.Token() || ev.Resource != prefix+"-a" {
			t.Fatalf("event %+v (%v), want %s of token %d", ev, err, typ, l.Token())
		}
	}
	last := events.LastEventID()
	events.Close()
	if _, err := events.Next(); !errors.Is(err, context.Canceled) {
		t.Fatalf("after Close: %v", err)
	}
	l2, err := c.Acquire(ctx, prefix+"-b", &leaseproxy.AcquireOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release(ctx)
	resumed := c.Watch(ctx, prefix, last)
	defer resumed.Close()
	ev, err := resumed.Next()
	if err != nil || ev.Type != "acquired" || ev.Token != l2.Token() {
		t.Fatalf("resumed with %+v (%v), want only what came after %s", ev, err, last)
	}
}
