package leaseproxy_test

// The operator's fleet calls against the real proxy: a fleet read back as it was put, an
// operator's drain (no secret) handing a member's work off, a missing fleet or member answered
// as ErrNotFound, an eviction ending the member, a delete that is idempotent.

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
)

func TestTheOperatorsFleetCalls(t *testing.T) {
	ctx := ctxT(t)
	fleet := resource(t)
	admin := client(t, "", leaseproxy.Options{})
	if _, err := admin.GetFleet(ctx, fleet); !errors.Is(err, leaseproxy.ErrNotFound) {
		t.Fatalf("GetFleet of no fleet: %v, want ErrNotFound", err)
	}
	aisles := []string{fleet + "-1", fleet + "-2"}
	if err := admin.PutFleet(ctx, fleet, leaseproxy.FleetSpec{Resources: aisles, Drain: 7 * time.Second, MaxMoves: 3}); err != nil {
		t.Fatal(err)
	}
	view, err := admin.GetFleet(ctx, fleet)
	if err != nil {
		t.Fatal(err)
	}
	if view.Fleet != fleet || strings.Join(view.Resources, ",") != strings.Join(aisles, ",") || view.Drain != 7*time.Second ||
		view.MaxMoves != 3 || view.Revision == "" || len(view.Members) != 0 || strings.Join(view.Unassigned, ",") != strings.Join(aisles, ",") {
		t.Fatalf("the fleet read back: %+v", view)
	}

	join := func(member string) (*leaseproxy.Member, *serving) {
		m, err := client(t, "", leaseproxy.Options{}).JoinFleet(ctx, fleet, &leaseproxy.JoinOptions{Member: member, TTL: 10 * time.Second, Poll: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Leave(ctx) })
		return m, serve(ctx, m)
	}
	m1, s1 := join("m1")
	take(t, s1.started, 2, 5*time.Second, "m1's assignments", leaseName)
	_, s2 := join("m2")
	take(t, s1.ended, 1, 5*time.Second, "m1's work on the resource moved to m2", workedName)
	take(t, s2.started, 1, 5*time.Second, "m2's share", leaseName)

	for _, call := range []func() error{
		func() error { return admin.DrainMember(ctx, fleet, "nobody") },
		func() error { return admin.EvictMember(ctx, fleet, "nobody") },
		func() error { return admin.DrainMember(ctx, fleet+"-none", "m1") },
	} {
		if err := call(); !errors.Is(err, leaseproxy.ErrNotFound) {
			t.Fatalf("an operator's call on no such member or fleet: %v, want ErrNotFound", err)
		}
	}

	// Drained by an operator, without the member's secret: its work is handed off to m2 (a
	// draining member with nobody to hand off to keeps what it holds).
	if err := admin.DrainMember(ctx, fleet, "m1"); err != nil {
		t.Fatal(err)
	}
	w := take(t, s1.ended, 1, 5*time.Second, "m1's work handed off by the operator's drain", workedName)[0]
	if reasonOf(w.cause) != leaseproxy.ReasonHandedOff {
		t.Fatalf("m1's work on %s ended with %v", w.lease.Resource(), w.cause)
	}
	if got := take(t, s2.started, 1, 5*time.Second, "the drained resource reaching m2", leaseName)[0]; got.Resource() != w.lease.Resource() {
		t.Fatalf("m1 handed off %s, m2 got %s", w.lease.Resource(), got.Resource())
	}
	eventually(t, 3*time.Second, "m1 draining", func() bool { return m1.State() == "draining" })
	view, err = admin.GetFleet(ctx, fleet)
	if err != nil {
		t.Fatal(err)
	}
	var members []string
	for _, m := range view.Members {
		members = append(members, fmt.Sprintf("%s %s %d", m.Member, m.State, len(m.Held)))
	}
	if got := strings.Join(members, ", "); got != "m1 draining 0, m2 active 2" || len(view.Unassigned) != 0 {
		t.Fatalf("the fleet after the drain: %s, unassigned %v", got, view.Unassigned)
	}

	if err := admin.EvictMember(ctx, fleet, "m1"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s1.done:
		if !errors.Is(err, leaseproxy.ErrLost) || !strings.Contains(err.Error(), "evicted") {
			t.Fatalf("m1's Serve returned %v after its eviction", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("m1's Serve did not return after its eviction")
	}

	for i := 0; i < 2; i++ {
		if err := admin.DeleteFleet(ctx, fleet); err != nil {
			t.Fatalf("delete #%d: %v", i+1, err)
		}
	}
	if _, err := admin.GetFleet(ctx, fleet); !errors.Is(err, leaseproxy.ErrNotFound) {
		t.Fatalf("GetFleet of a deleted fleet: %v, want ErrNotFound", err)
	}
}
