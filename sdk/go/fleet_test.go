package leaseproxy_test

// Fleet members against the real proxy (DESIGN §5.5): a member receives its resources and
// writes through fence-gateway with their tokens; a second member joining takes some of them
// — the first member's work on each is cancelled (handed-off) and the resource released well
// within the drain deadline, the new member writes, the old token is refused —; a drain hands
// off the rest; an evicted member ends; a member whose session ends is told; a join under a live
// member's name replaces it and gets back what it held.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
	"lease-proxy.dev/leaseproxy/internal/stack"
)

// worked is one run of a member's work: the lease it ran for and how it ended.
type worked struct {
	lease *leaseproxy.Lease
	cause error
	at    time.Time
}

// serving runs m.Serve with work that reports its start and end and waits for its context.
type serving struct {
	started chan *leaseproxy.Lease
	ended   chan worked
	done    chan error
}

func serve(ctx context.Context, m *leaseproxy.Member) *serving {
	s := &serving{started: make(chan *leaseproxy.Lease, 16), ended: make(chan worked, 16), done: make(chan error, 1)}
	go func() {
		s.done <- m.Serve(ctx, func(ctx context.Context, l *leaseproxy.Lease) error {
			s.started <- l
			<-ctx.Done()
			s.ended <- worked{lease: l, cause: leaseproxy.Cause(ctx), at: time.Now()}
			return nil
		})
	}()
	return s
}

// take reads n leases from ch within d, sorted by resource.
func take[T any](t *testing.T, ch <-chan T, n int, d time.Duration, what string, resourceOf func(T) string) []T {
	t.Helper()
	var got []T
	deadline := time.After(d)
	for len(got) < n {
		select {
		case v, open := <-ch:
			if !open {
				t.Fatalf("%s: closed after %d of %d", what, len(got), n)
			}
			got = append(got, v)
		case <-deadline:
			t.Fatalf("%s: %d of %d within %s", what, len(got), n, d)
		}
	}
	sort.Slice(got, func(i, j int) bool { return resourceOf(got[i]) < resourceOf(got[j]) })
	return got
}

func leaseName(l *leaseproxy.Lease) string { return l.Resource() }
func workedName(w worked) string           { return w.lease.Resource() }

func reasonOf(err error) leaseproxy.LostReason {
	var lost *leaseproxy.LostError
	if errors.As(err, &lost) {
		return lost.Reason
	}
	return ""
}

// staleWrite presents l's fencing token to the gateway itself, as a member that missed the
// hand-off would.
func staleWrite(t *testing.T, l *leaseproxy.Lease, robot string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, env.warehouse.Gateway.URL+"/aisles/"+l.Resource()+"/count",
		strings.NewReader(fmt.Sprintf(`{"robot":%q,"count":99}`, robot)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(leaseproxy.HeaderFencingToken, l.FencingToken())
	req.Header.Set(leaseproxy.HeaderFencingResource, l.Resource())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Fencing-Rejection")
}

func TestAFleetMemberReceivesWritesHandsOffAndDrains(t *testing.T) {
	ctx := ctxT(t)
	fleet := resource(t)
	var aisles []string
	for i := 1; i <= 4; i++ {
		aisles = append(aisles, fmt.Sprintf("%s-%d", fleet, i))
	}
	// A long drain deadline: a hand-off completed within a few seconds was the member's own
	// release, not the service's revocation.
	const drain = 20 * time.Second
	admin := client(t, "", leaseproxy.Options{})
	if err := admin.PutFleet(ctx, fleet, leaseproxy.FleetSpec{Resources: aisles, Drain: drain}); err != nil {
		t.Fatal(err)
	}
	hc := leaseproxy.NewHTTPClient(nil)

	m1, err := client(t, "", leaseproxy.Options{}).JoinFleet(ctx, fleet, &leaseproxy.JoinOptions{Member: "m1", TTL: 10 * time.Second, Poll: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s1 := serve(ctx, m1)
	first := take(t, s1.started, 4, 5*time.Second, "m1's assignments", leaseName)
	for i, l := range first {
		if l.Resource() != aisles[i] || l.Holder() != "m1" || l.LeaseID() != m1.Session().ID() {
			t.Fatalf("assigned %s held by %s on %s, want %s by m1 on the session %s", l.Resource(), l.Holder(), l.LeaseID(), aisles[i], m1.Session().ID())
		}
		if status, _, err := putCount(t, l.Context(), hc, l.Resource(), "m1", 1); err != nil || status != 200 {
			t.Fatalf("m1 writes %s: %d %v", l.Resource(), status, err)
		}
	}

	m2, err := client(t, "", leaseproxy.Options{}).JoinFleet(ctx, fleet, &leaseproxy.JoinOptions{Member: "m2", TTL: 10 * time.Second, Poll: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	joined := time.Now()
	s2 := serve(ctx, m2)
	moved := take(t, s1.ended, 2, 5*time.Second, "m1's work on the moved resources cancelled", workedName)
	taken := take(t, s2.started, 2, 5*time.Second, "m2's assignments", leaseName)
	if took := time.Since(joined); took > drain/4 {
		t.Fatalf("the hand-off took %s: the service's revocation at the drain deadline, not the member's release", took)
	}
	for i, w := range moved {
		if reasonOf(w.cause) != leaseproxy.ReasonHandedOff {
			t.Fatalf("m1's work on %s ended with %v, want handed-off", w.lease.Resource(), w.cause)
		}
		// To be released within the drain deadline (20 s on the proxy's clock, less 2 s).
		if by, ok := w.lease.ReleaseBy(); !ok || by.Before(joined.Add(drain/2)) || by.After(time.Now().Add(drain*9/10)) {
			t.Fatalf("m1's %s: ReleaseBy %v (%v), want about %s after the hand-off", w.lease.Resource(), by, ok, drain*9/10)
		}
		l := taken[i]
		if l.Resource() != w.lease.Resource() || l.Token() <= w.lease.Token() {
			t.Fatalf("m2 got %s@%d for m1's %s@%d", l.Resource(), l.Token(), w.lease.Resource(), w.lease.Token())
		}
		if status, _, err := putCount(t, l.Context(), hc, l.Resource(), "m2", 2); err != nil || status != 200 {
			t.Fatalf("m2 writes %s: %d %v", l.Resource(), status, err)
		}
		// The old member's late write: its SDK sends nothing for the handed-off lease; the
		// token itself, presented anyway, is refused by the gateway.
		if _, _, err := putCount(t, w.lease.Context(), hc, l.Resource(), "m1", 3); !errors.Is(err, leaseproxy.ErrLost) {
			t.Fatalf("m1's write of handed-off %s through the Transport: %v, want ErrLost", l.Resource(), err)
		}
		if status, rejection := staleWrite(t, w.lease, "m1"); status != 409 || rejection != "stale-fencing-token" {
			t.Fatalf("m1's old token for %s: %d %q, want 409 stale-fencing-token", l.Resource(), status, rejection)
		}
		want := []string{fmt.Sprintf("m1@%d", w.lease.Token()), fmt.Sprintf("m2@%d", l.Token())}
		if got := writesTo(t, l.Resource()); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("the inventory has %v for %s, want %v", got, l.Resource(), want)
		}
	}

	// Drain: m1 hands off the rest and takes nothing new.
	if err := m1.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	drained := take(t, s1.ended, 2, 5*time.Second, "m1's remaining work cancelled by the drain", workedName)
	rest := take(t, s2.started, 2, 5*time.Second, "the drained resources reaching m2", leaseName)
	for i, w := range drained {
		if reasonOf(w.cause) != leaseproxy.ReasonHandedOff || rest[i].Resource() != w.lease.Resource() {
			t.Fatalf("drained %s (%v), m2 got %s", w.lease.Resource(), w.cause, rest[i].Resource())
		}
	}
	eventually(t, 3*time.Second, "m1 draining", func() bool { return m1.State() == "draining" })
	if m1.Err() != nil {
		t.Fatalf("a drained member is still a member: %v", m1.Err())
	}
	view, err := admin.GetFleet(ctx, fleet)
	if err != nil {
		t.Fatal(err)
	}
	var members []string
	for _, m := range view.Members {
		members = append(members, fmt.Sprintf("%s %s %d", m.Member, m.State, len(m.Held)))
	}
	if got := strings.Join(members, ", "); got != "m1 draining 0, m2 active 4" {
		t.Fatalf("the fleet's members: %s", got)
	}
	// Evicted by an operator: the member is told and ends.
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
	_ = m1.Leave(ctx)

	// m2's session ends under it (its etcd lease revoked): the member is told, its work on
	// every resource cancelled, its assignments closed.
	if err := env.etcd.Revoke(m2.Session().ID()); err != nil {
		t.Fatal(err)
	}
	ended := take(t, s2.ended, 4, 3*time.Second, "m2's work cancelled when its session ended", workedName)
	for _, w := range ended {
		if !errors.Is(w.cause, leaseproxy.ErrLost) {
			t.Fatalf("m2's work on %s ended with %v", w.lease.Resource(), w.cause)
		}
	}
	select {
	case err := <-s2.done:
		if !errors.Is(err, leaseproxy.ErrLost) {
			t.Fatalf("m2's Serve returned %v, want the session's loss", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("m2's Serve did not return after its session ended")
	}
	if err := m2.Err(); !errors.Is(err, leaseproxy.ErrLost) {
		t.Fatalf("m2.Err() = %v", err)
	}
	if _, open := <-m2.Assignments(); open {
		t.Fatal("m2's assignments still open")
	}
	if err := admin.DeleteFleet(ctx, fleet); err != nil {
		t.Fatal(err)
	}
}

func TestAFleetMemberPollsWithinTheProxysMaxWait(t *testing.T) {
	// A proxy that lets a request wait 1 s at most refuses the member's 20 s poll (400
	// invalid-field): the member polls within that instead of ending.
	p, err := stack.StartProxy(env.dir, "short-wait-proxy", env.etcd.URL, "/lease-proxy-go-short-wait/", env.keyFile, "http", nil,
		"--max-wait", "1s")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	ctx := ctxT(t)
	fleet := resource(t)
	c := client(t, p.URL, leaseproxy.Options{})
	if err := c.PutFleet(ctx, fleet, leaseproxy.FleetSpec{Resources: []string{fleet + "-1"}}); err != nil {
		t.Fatal(err)
	}
	m, err := c.JoinFleet(ctx, fleet, &leaseproxy.JoinOptions{Member: "m", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave(context.Background())
	got := take(t, m.Assignments(), 1, 3*time.Second, "the first assignment", leaseName)
	if err := c.PutFleet(ctx, fleet, leaseproxy.FleetSpec{Resources: []string{fleet + "-1", fleet + "-2"}}); err != nil {
		t.Fatal(err)
	}
	got = append(got, take(t, m.Assignments(), 1, 3*time.Second, "the resource added later", leaseName)...)
	if got[0].Resource() != fleet+"-1" || got[1].Resource() != fleet+"-2" || m.Err() != nil {
		t.Fatalf("assigned %s, %s; member %v", got[0].Resource(), got[1].Resource(), m.Err())
	}
}

func TestAMemberJoiningAgainUnderItsNameGetsBackWhatItHeld(t *testing.T) {
	// Static membership: a join under a live member's name replaces it — the old session is
	// closed, and what it held goes to the new one before anyone else.
	ctx := ctxT(t)
	fleet := resource(t)
	aisles := []string{fleet + "-1", fleet + "-2"}
	if err := client(t, "", leaseproxy.Options{}).PutFleet(ctx, fleet, leaseproxy.FleetSpec{Resources: aisles}); err != nil {
		t.Fatal(err)
	}
	join := func() (*leaseproxy.Member, *serving) {
		m, err := client(t, "", leaseproxy.Options{}).JoinFleet(ctx, fleet, &leaseproxy.JoinOptions{Member: "m1", TTL: 10 * time.Second, Poll: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Leave(ctx) })
		return m, serve(ctx, m)
	}
	old, so := join()
	before := take(t, so.started, 2, 5*time.Second, "the first member's assignments", leaseName)
	again, sa := join()
	for _, w := range take(t, so.ended, 2, 5*time.Second, "the replaced member's work cancelled", workedName) {
		if !errors.Is(w.cause, leaseproxy.ErrLost) {
			t.Fatalf("the replaced member's work on %s ended with %v", w.lease.Resource(), w.cause)
		}
	}
	select {
	case err := <-so.done:
		if !errors.Is(err, leaseproxy.ErrLost) {
			t.Fatalf("the replaced member's Serve returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the replaced member's Serve did not return")
	}
	after := take(t, sa.started, 2, 5*time.Second, "the new member's assignments", leaseName)
	for i, l := range after {
		if l.Resource() != before[i].Resource() || l.Token() <= before[i].Token() || l.LeaseID() != again.Session().ID() {
			t.Fatalf("the new member got %s@%d on %s for %s@%d", l.Resource(), l.Token(), l.LeaseID(), before[i].Resource(), before[i].Token())
		}
	}
	if old.Session().ID() == again.Session().ID() {
		t.Fatal("the same session")
	}
}

// keepalivesCut is a transport that, once cut, refuses every call on a session — its
// keepalives, and the close the SDK sends when it gives the session up — as a partition
// between the member and the proxy would, and passes the fleet's calls.
type keepalivesCut struct {
	cut  atomic.Bool
	next http.RoundTripper
}

func (k *keepalivesCut) RoundTrip(r *http.Request) (*http.Response, error) {
	if k.cut.Load() && strings.HasPrefix(r.URL.Path, "/v1/sessions/") {
		return nil, errors.New("keepalives cut")
	}
	return k.next.RoundTrip(r)
}

func TestAMemberWhoseSessionEndsJoinsAgainWithRejoin(t *testing.T) {
	// Rejoin: a member whose session ends joins again under its name with a new session; its
	// old leases are lost and it is granted again under new tokens. Twice: its etcd lease
	// revoked (the member record gone with it), then its keepalives cut until the SDK gives the
	// session up while the service still has it (within the TTL: the rejoin replaces the live
	// member, and what it held comes back to it, not to the other member).
	ctx := ctxT(t)
	fleet := resource(t)
	aisles := []string{fleet + "-1", fleet + "-2", fleet + "-3", fleet + "-4"}
	admin := client(t, "", leaseproxy.Options{})
	if err := admin.PutFleet(ctx, fleet, leaseproxy.FleetSpec{Resources: aisles, Drain: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	cut := &keepalivesCut{next: http.DefaultTransport}
	m1, err := client(t, "", leaseproxy.Options{HTTPClient: &http.Client{Transport: cut}}).JoinFleet(ctx, fleet,
		&leaseproxy.JoinOptions{Member: "m1", TTL: 6 * time.Second, SafetyMargin: 2 * time.Second, Poll: 2 * time.Second, Rejoin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m1.Leave(context.Background())
	s1 := serve(ctx, m1)
	before := take(t, s1.started, 4, 5*time.Second, "m1's assignments", leaseName)
	first := m1.Session().ID()

	// Its etcd lease revoked: every lease lost, a new session, granted again.
	if err := env.etcd.Revoke(first); err != nil {
		t.Fatal(err)
	}
	for _, w := range take(t, s1.ended, 4, 5*time.Second, "m1's work cancelled when its session ended", workedName) {
		if !errors.Is(w.cause, leaseproxy.ErrLost) {
			t.Fatalf("m1's work on %s ended with %v", w.lease.Resource(), w.cause)
		}
	}
	again := take(t, s1.started, 4, 5*time.Second, "m1's assignments after joining again", leaseName)
	second := m1.Session().ID()
	if second == first || m1.Rejoins() != 1 || m1.Err() != nil {
		t.Fatalf("after the revocation: session %s (was %s), %d rejoins, Err %v", second, first, m1.Rejoins(), m1.Err())
	}
	hc := leaseproxy.NewHTTPClient(nil)
	for i, l := range again {
		if l.Resource() != before[i].Resource() || l.Token() <= before[i].Token() || l.LeaseID() != second {
			t.Fatalf("after joining again: %s@%d on %s, was %s@%d", l.Resource(), l.Token(), l.LeaseID(), before[i].Resource(), before[i].Token())
		}
		if status, _, err := putCount(t, l.Context(), hc, l.Resource(), "m1", 1); err != nil || status != 200 {
			t.Fatalf("m1 writes %s after joining again: %d %v", l.Resource(), status, err)
		}
		if status, rejection := staleWrite(t, before[i], "m1"); status != 409 || rejection != "stale-fencing-token" {
			t.Fatalf("m1's token of the lost session for %s: %d %q, want 409 stale-fencing-token", l.Resource(), status, rejection)
		}
	}

	// A second member takes half; then m1's keepalives are cut: the SDK gives its session up
	// before the service's TTL passes, joins again, and gets back what it held.
	m2, err := client(t, "", leaseproxy.Options{}).JoinFleet(ctx, fleet, &leaseproxy.JoinOptions{Member: "m2", TTL: 10 * time.Second, Poll: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Leave(context.Background())
	s2 := serve(ctx, m2)
	take(t, s1.ended, 2, 5*time.Second, "m1's work on the resources moved to m2", workedName)
	theirs := take(t, s2.started, 2, 5*time.Second, "m2's assignments", leaseName)
	var kept []*leaseproxy.Lease
	for _, l := range again {
		if l.Resource() != theirs[0].Resource() && l.Resource() != theirs[1].Resource() {
			kept = append(kept, l)
		}
	}
	cut.cut.Store(true)
	cutAt := time.Now()
	for _, w := range take(t, s1.ended, 2, 10*time.Second, "m1's work cancelled when it gave its session up", workedName) {
		if !errors.Is(w.cause, leaseproxy.ErrLost) {
			t.Fatalf("m1's work on %s ended with %v", w.lease.Resource(), w.cause)
		}
	}
	cut.cut.Store(false)
	back := take(t, s1.started, 2, 5*time.Second, "what m1 held, granted to its new session", leaseName)
	if took := time.Since(cutAt); took > 6*time.Second {
		t.Fatalf("m1 got its resources back %s after its keepalives were cut: past the TTL", took)
	}
	third := m1.Session().ID()
	if third == second || m1.Rejoins() != 2 || m1.Err() != nil {
		t.Fatalf("after the cut: session %s (was %s), %d rejoins, Err %v", third, second, m1.Rejoins(), m1.Err())
	}
	for i, l := range back {
		if l.Resource() != kept[i].Resource() || l.Token() <= kept[i].Token() || l.LeaseID() != third {
			t.Fatalf("m1 got back %s@%d on %s, it held %s@%d", l.Resource(), l.Token(), l.LeaseID(), kept[i].Resource(), kept[i].Token())
		}
	}
	// m2 kept its own throughout: static membership gave m1's to nobody else.
	select {
	case w := <-s2.ended:
		t.Fatalf("m2's work on %s ended (%v) while m1 joined again", w.lease.Resource(), w.cause)
	default:
	}
	if m2.Err() != nil {
		t.Fatalf("m2: %v", m2.Err())
	}

	// Leave ends it for good: no rejoin after that.
	if err := m1.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s1.done:
		if !errors.Is(err, leaseproxy.ErrLost) {
			t.Fatalf("m1's Serve returned %v after Leave", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("m1's Serve did not return after Leave")
	}
	if m1.Rejoins() != 2 || m1.Err() == nil {
		t.Fatalf("after Leave: %d rejoins, Err %v", m1.Rejoins(), m1.Err())
	}
}
