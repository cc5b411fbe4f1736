package leaseproxy_test

// A member's assignment loop against a fake fleet service that answers scripted views: what
// arrives, what is handed off and released, what an eviction ends.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
)

type fleetFake struct {
	*fake
	mu      sync.Mutex
	views   []string
	step    int
	changed chan struct{}
	// after is the largest revision a poll asked to wait past: the member applied that view.
	after int
	// served counts the answers given at each step.
	served map[int]int
}

func (ff *fleetFake) servedAt(step int) int {
	ff.mu.Lock()
	defer ff.mu.Unlock()
	return ff.served[step]
}

func (ff *fleetFake) polledAfter() int {
	ff.mu.Lock()
	defer ff.mu.Unlock()
	return ff.after
}

func heldJSON(resource string, token int) string {
	return fmt.Sprintf(`{"resource":%q,"lease_id":"900","token":"%d","fencing_token":"v1.k1.0.%d.n.m"}`, resource, token, token)
}

func view(rev int, state string, held []string, releasing ...string) string {
	var rel []string
	for _, r := range releasing {
		rel = append(rel, fmt.Sprintf(`{"resource":%q,"deadline_ms":500}`, r))
	}
	return fmt.Sprintf(`{"fleet":"f","member":"m1","state":%q,"revision":"%d","held":[%s],"releasing":[%s]}`,
		state, rev, strings.Join(held, ","), strings.Join(rel, ","))
}

func newFleetFake(t *testing.T, views ...string) *fleetFake {
	ff := &fleetFake{views: views, changed: make(chan struct{}), served: map[int]int{}}
	ff.fake = newFake(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/fleets/f/members":
			write(w, 201, `{"fleet":"f","member":"m1","session_id":"900","secret":"member-secret","ttl_seconds":10,"expires_in_ms":10000}`)
		case strings.HasSuffix(r.URL.Path, "/keepalive"):
			write(w, 200, `{"session_id":"900","ttl_seconds":10,"expires_in_ms":10000}`)
		case r.Method == http.MethodGet && r.URL.Path == "/v1/fleets/f/members/m1":
			if r.Header.Get("Lease-Secret") != "member-secret" {
				write(w, 403, `{"type":"https://lease-proxy.dev/problems/not-member","title":"t","status":403}`)
				return
			}
			after, _ := strconv.Atoi(r.URL.Query().Get("after"))
			ff.mu.Lock()
			if after > ff.after {
				ff.after = after
			}
			ff.mu.Unlock()
			for {
				ff.mu.Lock()
				v, changed, step := ff.views[ff.step], ff.changed, ff.step
				// A view older than the one asked past is answered at once: a reordered answer.
				answer := revisionOf(v) != after || r.URL.Query().Get("after") == ""
				if answer {
					ff.served[step]++
				}
				ff.mu.Unlock()
				if answer {
					write(w, 200, v)
					return
				}
				select {
				case <-changed:
				case <-r.Context().Done():
					return
				}
			}
		default:
			w.WriteHeader(204)
		}
	})
	return ff
}

func revisionOf(v string) int {
	i := strings.Index(v, `"revision":"`) + len(`"revision":"`)
	n, _ := strconv.Atoi(v[i : i+strings.IndexByte(v[i:], '"')])
	return n
}

func (ff *fleetFake) advance() {
	ff.mu.Lock()
	ff.step++
	close(ff.changed)
	ff.changed = make(chan struct{})
	ff.mu.Unlock()
}

func TestAFleetMemberFollowsItsAssignment(t *testing.T) {
	t.Parallel()
	ff := newFleetFake(t,
		view(1, "active", []string{heldJSON("a", 10), heldJSON("b", 11)}),
		view(2, "active", []string{heldJSON("a", 10)}, "b"),
		view(3, "active", []string{heldJSON("a", 10), heldJSON("c", 12)}),
		view(4, "evicted", nil))
	c := client(t, ff.URL, leaseproxy.Options{NoLossWatch: true, Timeout: time.Second})
	m, err := c.JoinFleet(ctxT(t), "f", &leaseproxy.JoinOptions{Member: "m1", Poll: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string]error{}
	releaseBy := map[string]time.Time{}
	started := make(chan string, 10)
	served := make(chan error)
	go func() {
		served <- m.Serve(ctxT(t), func(ctx context.Context, l *leaseproxy.Lease) error {
			started <- fmt.Sprintf("%s@%d", l.Resource(), l.Token())
			<-ctx.Done()
			mu.Lock()
			got[l.Resource()] = leaseproxy.Cause(ctx)
			if by, ok := l.ReleaseBy(); ok {
				releaseBy[l.Resource()] = by
			}
			mu.Unlock()
			return ctx.Err()
		})
	}()
	recv := func() string {
		select {
		case s := <-started:
			return s
		case <-time.After(3 * time.Second):
			t.Fatal("no assignment")
			return ""
		}
	}
	if a, b := recv(), recv(); !(a == "a@10" && b == "b@11" || a == "b@11" && b == "a@10") {
		t.Fatalf("assignments %s %s", a, b)
	}
	before := time.Now()
	ff.advance() // b handed off, to be released within 500 ms
	eventually(t, 2*time.Second, "b released with the session's secret", func() bool { return ff.asked("DELETE", "/v1/leases/b") == 1 })
	mu.Lock()
	if !errors.Is(got["b"], leaseproxy.ErrLost) || !strings.Contains(got["b"].Error(), "handed-off") {
		t.Fatalf("b ended with %v", got["b"])
	}
	// The answer's arrival (between before and now) plus 500 ms less the 100 ms margin.
	if by, ok := releaseBy["b"]; !ok || by.Before(before.Add(400*time.Millisecond)) || by.After(time.Now().Add(400*time.Millisecond)) {
		t.Fatalf("b's ReleaseBy %v (%v), told between %v and now + 400 ms", by, ok, before.Add(400*time.Millisecond))
	}
	mu.Unlock()
	ff.advance() // c arrives
	if c := recv(); c != "c@12" {
		t.Fatalf("then %s", c)
	}
	ff.advance() // evicted
	select {
	case err := <-served:
		if err == nil || !strings.Contains(err.Error(), "evicted") {
			t.Fatalf("Serve returned %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Serve did not return after the eviction")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range []string{"a", "c"} {
		if !errors.Is(got[r], leaseproxy.ErrLost) {
			t.Fatalf("%s ended with %v", r, got[r])
		}
		if by, ok := releaseBy[r]; ok {
			t.Fatalf("%s, revoked rather than handed off, has a ReleaseBy: %v", r, by)
		}
	}
	if _, open := <-m.Assignments(); open {
		t.Fatal("assignments still open")
	}
}

func TestAFleetGrantIsDeliveredOnce(t *testing.T) {
	t.Parallel()
	ff := newFleetFake(t,
		view(1, "active", []string{heldJSON("a", 10)}),
		// Read before the release of a@10 (its work returned) reached the service.
		view(2, "active", []string{heldJSON("a", 10)}),
		view(3, "active", []string{heldJSON("a", 11)}),
		view(4, "evicted", nil))
	c := client(t, ff.URL, leaseproxy.Options{NoLossWatch: true, Timeout: time.Second})
	m, err := c.JoinFleet(ctxT(t), "f", &leaseproxy.JoinOptions{Member: "m1", Poll: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 10)
	served := make(chan error, 1)
	go func() {
		served <- m.Serve(ctxT(t), func(ctx context.Context, l *leaseproxy.Lease) error {
			started <- fmt.Sprintf("%s@%d", l.Resource(), l.Token())
			return nil // done at once: Serve gives the resource back
		})
	}()
	recv := func() string {
		select {
		case s := <-started:
			return s
		case <-time.After(3 * time.Second):
			t.Fatal("no assignment")
			return ""
		}
	}
	if got := recv(); got != "a@10" {
		t.Fatalf("first %s", got)
	}
	eventually(t, 2*time.Second, "a@10 given back", func() bool { return ff.asked("DELETE", "/v1/leases/a") == 1 })
	ff.advance()
	eventually(t, 2*time.Second, "the stale view applied", func() bool { return ff.polledAfter() >= 2 })
	ff.advance()
	if got := recv(); got != "a@11" {
		t.Fatalf("then %s, want a@11: a grant already released was delivered again", got)
	}
	ff.advance()
	select {
	case <-served:
	case <-time.After(3 * time.Second):
		t.Fatal("Serve did not return after the eviction")
	}
}

func TestALeaseTakenBackIsNotReleasedOverItsSuccessor(t *testing.T) {
	t.Parallel()
	ff := newFleetFake(t,
		view(1, "active", []string{heldJSON("a", 10)}),
		// a@10 was taken back and a granted again to the same member while the work on a@10
		// still ran: the session's secret would release a@11 too.
		view(2, "active", []string{heldJSON("a", 11)}),
		view(3, "evicted", nil))
	c := client(t, ff.URL, leaseproxy.Options{NoLossWatch: true, Timeout: time.Second})
	m, err := c.JoinFleet(ctxT(t), "f", &leaseproxy.JoinOptions{Member: "m1", Poll: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan *leaseproxy.Lease, 10)
	finish := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		served <- m.Serve(ctxT(t), func(ctx context.Context, l *leaseproxy.Lease) error {
			started <- l
			<-ctx.Done()
			if l.Token() == 10 {
				<-finish // slow to stop
			}
			return nil
		})
	}()
	first := <-started
	ff.advance()
	select {
	case l := <-started:
		if l.Token() != 11 {
			t.Fatalf("then %s@%d", l.Resource(), l.Token())
		}
	case <-time.After(3 * time.Second):
		t.Fatal("no second grant")
	}
	if reason := first.Err(); !errors.Is(reason, leaseproxy.ErrLost) {
		t.Fatalf("a@10 is %v", reason)
	}
	close(finish) // the work on a@10 returns now; Serve must not release a (a@11 is the member's)
	ff.advance()
	select {
	case <-served:
	case <-time.After(3 * time.Second):
		t.Fatal("Serve did not return after the eviction")
	}
	if n := ff.asked("DELETE", "/v1/leases/a"); n != 0 {
		t.Fatalf("%d releases of a sent for grants the member no longer held", n)
	}
}

func TestAnOlderAssignmentNeverBringsBackALease(t *testing.T) {
	t.Parallel()
	ff := newFleetFake(t,
		view(1, "active", []string{heldJSON("a", 10), heldJSON("b", 11)}),
		view(2, "active", []string{heldJSON("a", 10)}, "b"),
		view(3, "active", []string{heldJSON("a", 10)}),
		// Answered after revision 3 was read (a lagging replica, a reordering relay): b@11,
		// handed off and released since, is not this member's any more.
		view(1, "active", []string{heldJSON("a", 10), heldJSON("b", 11)}),
		view(4, "evicted", nil))
	c := client(t, ff.URL, leaseproxy.Options{NoLossWatch: true, Timeout: time.Second})
	m, err := c.JoinFleet(ctxT(t), "f", &leaseproxy.JoinOptions{Member: "m1", Poll: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 10)
	served := make(chan error, 1)
	go func() {
		served <- m.Serve(ctxT(t), func(ctx context.Context, l *leaseproxy.Lease) error {
			started <- fmt.Sprintf("%s@%d", l.Resource(), l.Token())
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	for i := 0; i < 2; i++ {
		select {
		case <-started:
		case <-time.After(3 * time.Second):
			t.Fatal("no assignment")
		}
	}
	ff.advance() // b handed off
	eventually(t, 2*time.Second, "b released", func() bool { return ff.asked("DELETE", "/v1/leases/b") == 1 })
	ff.advance() // b gone
	eventually(t, 2*time.Second, "revision 3 read", func() bool { return ff.polledAfter() == 3 })
	ff.advance() // the older view
	eventually(t, 3*time.Second, "the member still polling past revision 3 after the older view", func() bool {
		return ff.servedAt(3) >= 2 && ff.polledAfter() == 3
	})
	select {
	case s := <-started:
		t.Fatalf("an older view delivered %s again", s)
	default:
	}
	ff.advance() // evicted
	select {
	case err := <-served:
		if err == nil || !strings.Contains(err.Error(), "evicted") {
			t.Fatalf("Serve returned %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Serve did not return after the eviction")
	}
	select {
	case s := <-started:
		t.Fatalf("an older view delivered %s again", s)
	default:
	}
}

func TestHostileAMalformedAssignmentChangesNothing(t *testing.T) {
	t.Parallel()
	ff := newFleetFake(t,
		view(1, "active", []string{heldJSON("a", 10)}),
		// b granted under another lease than the member's session (900): not the member's.
		view(2, "active", []string{heldJSON("a", 10), `{"resource":"b","lease_id":"901","token":"11","fencing_token":"v1.k1.0.11.n.m"}`}),
		view(3, "active", []string{heldJSON("a", 10), `{"resource":"c","lease_id":"900","token":"twelve","fencing_token":"v1.k1.0.12.n.m"}`}),
		view(4, "active", []string{heldJSON("a", 10)}, "d-without-deadline"),
		view(5, "evicted", nil))
	ff.views[3] = strings.Replace(ff.views[3], `,"deadline_ms":500`, "", 1)
	c := client(t, ff.URL, leaseproxy.Options{NoLossWatch: true, Timeout: time.Second})
	m, err := c.JoinFleet(ctxT(t), "f", &leaseproxy.JoinOptions{Member: "m1", Poll: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 10)
	ended := make(chan error, 10)
	served := make(chan error, 1)
	go func() {
		served <- m.Serve(ctxT(t), func(ctx context.Context, l *leaseproxy.Lease) error {
			started <- fmt.Sprintf("%s@%d", l.Resource(), l.Token())
			<-ctx.Done()
			ended <- leaseproxy.Cause(ctx)
			return ctx.Err()
		})
	}()
	select {
	case s := <-started:
		if s != "a@10" {
			t.Fatalf("started %s", s)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("no assignment")
	}
	for step := 1; step <= 3; step++ {
		ff.advance()
		// Read, refused, and read again (a view applied would be waited past instead).
		eventually(t, 3*time.Second, fmt.Sprintf("malformed view %d read again", step), func() bool { return ff.servedAt(step) >= 2 })
		select {
		case s := <-started:
			t.Fatalf("malformed view %d delivered %s", step, s)
		case err := <-ended:
			t.Fatalf("malformed view %d ended a's work: %v", step, err)
		default:
		}
	}
	ff.advance() // evicted
	select {
	case err := <-served:
		if err == nil || !strings.Contains(err.Error(), "evicted") {
			t.Fatalf("Serve returned %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Serve did not return after the eviction")
	}
}
