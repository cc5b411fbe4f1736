package leaseproxy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestTheEventStreamParserIgnoresChunkBoundaries(t *testing.T) {
	const stream = "id: 41\n\n: keepalive\n\nid: 42.0\nevent: acquired\ndata: {\"a\":1}\n\n" +
		"id:43.1\r\nevent:released\r\ndata: one\r\ndata:two\r\nretry: 1000\r\nunknown: x\r\n\r\ndata\n\n"
	want := []sseMessage{
		{id: "41", hasID: true},
		{id: "42.0", hasID: true, event: "acquired", data: `{"a":1}`, hasData: true},
		{id: "43.1", hasID: true, event: "released", data: "one\ntwo", hasData: true},
		{hasData: true},
	}
	for size := 1; size <= len(stream); size++ {
		p := &sseParser{}
		var got []sseMessage
		for i := 0; i < len(stream); i += size {
			end := i + size
			if end > len(stream) {
				end = len(stream)
			}
			got = append(got, p.feed([]byte(stream[i:end]))...)
		}
		if len(got) != len(want) {
			t.Fatalf("chunks of %d: %+v", size, got)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("chunks of %d: message %d is %+v, want %+v", size, i, got[i], want[i])
			}
		}
	}
	p := &sseParser{}
	if got := p.feed([]byte("data: " + strings.Repeat("x", maxLine) + "\n\nid: 2\n\n")); len(got) != 0 || !p.overflowed {
		t.Fatalf("an oversized line: %+v", got)
	}
}

func TestMessageIdsAreOrderedWithinARevision(t *testing.T) {
	order := []string{"9", "10.0", "10.1", "10", "11.0", "12"}
	for i := 1; i < len(order); i++ {
		a, _ := parsePosition(order[i-1])
		b, _ := parsePosition(order[i])
		if !a.before(b) || b.before(a) {
			t.Fatalf("%s is not before %s", order[i-1], order[i])
		}
	}
	for _, bad := range []string{"", "x", "1.x", "-1", "1.2.3"} {
		if _, ok := parsePosition(bad); ok {
			t.Fatalf("%q parsed", bad)
		}
	}
}

func TestALifetimeIsCappedByTheTTLAndZeroWithoutOne(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		ttl     uint64
		expires time.Duration
		slack   time.Duration
		want    time.Duration
	}{
		{3, 2900 * ms, 0, 2900 * ms},
		{3, maxLifetime, 0, 3 * time.Second},
		{3, 7 * time.Second, 5 * time.Second, 7 * time.Second}, // a queued acquire
		{3, maxLifetime, 5 * time.Second, 8 * time.Second},
		{1 << 62, maxLifetime, 0, maxLifetime},
		{0, 5 * time.Second, 0, 0},
	} {
		if got := lifetime(c.ttl, c.expires, c.slack); got != c.want {
			t.Fatalf("lifetime(%d, %s, %s) = %s, want %s", c.ttl, c.expires, c.slack, got, c.want)
		}
	}
	if margin(0, 10*time.Second) != time.Second || margin(0, 200*ms) != 100*ms || margin(ms, time.Second) != ms {
		t.Fatal("margins")
	}
	if wholeSeconds(1500*ms) != 2 || wholeSeconds(2*time.Second) != 2 {
		t.Fatal("whole seconds round up")
	}
}

func TestNamesAreSentAsOneSegment(t *testing.T) {
	for in, want := range map[string]string{"aisle-1": "aisle-1", "x/../victim": "x%2F..%2Fvictim",
		"job?x": "job%3Fx", "": "...", "..": "...", "é": "%C3%A9"} {
		if got := segment(in); got != want {
			t.Fatalf("segment(%q) = %q, want %q", in, got, want)
		}
	}
}

// A process stopped past its deadline (SIGSTOP, a VM pause) sees the loss on its first look,
// before any timer has run.
func TestPastTheDeadlineTheLeaseIsLostWithoutAnyTimer(t *testing.T) {
	session := &liveness{stopBy: time.Now().Add(-time.Millisecond), done: make(chan struct{}),
		children: map[*liveness]struct{}{}, resource: "session:1"}
	lease := session.under("r", 7)
	l := &Lease{live: lease}
	ctx, cancel := l.Bind(context.Background())
	defer cancel()
	if ctx.Err() != context.Canceled {
		t.Fatalf("context: %v", ctx.Err())
	}
	select {
	case <-ctx.Done():
	default:
		t.Fatal("Err reported the loss while Done was open")
	}
	var lost *LostError
	if !errors.As(l.Err(), &lost) || lost.Reason != ReasonSessionLost || !errors.Is(lost, ErrSessionLost) {
		t.Fatalf("lease: %v", l.Err())
	}
	if err := session.err(); err == nil || err.Reason != ReasonExpired {
		t.Fatalf("session: %v", err)
	}
}

func TestTheFirstLossStaysAndARenewalNeverRevivesOrShortens(t *testing.T) {
	l := newLiveness(time.Now().Add(time.Hour), "r", 1)
	later := time.Now().Add(2 * time.Hour)
	l.extend(later)
	l.extend(time.Now().Add(time.Minute))
	if !l.deadline().Equal(later) {
		t.Fatal("a renewal shortened the deadline")
	}
	l.lose(&LostError{Reason: ReasonRevoked})
	l.lose(&LostError{Reason: ReasonReleased})
	l.extend(time.Now().Add(3 * time.Hour))
	if l.check().Reason != ReasonRevoked || !l.deadline().Equal(later) {
		t.Fatalf("after the loss: %v, deadline moved %v", l.check(), l.deadline().Sub(later))
	}
}

func TestProblemsMatchTheirSentinels(t *testing.T) {
	for slug, want := range map[string]error{"lease-held": ErrHeld, "lease-lost": ErrLost,
		"session-lost": ErrSessionLost, "not-found": ErrNotFound, "no-session": ErrNotFound,
		"events-compacted": ErrCompacted, "stale-fencing-token": ErrStaleToken} {
		body := `{"type":"` + ProblemBase + slug + `","title":"t","holder":"h","token":"3","expires_in_ms":900}`
		err := problemFrom(400, map[string][]string{"Retry-After": {"2"}}, []byte(body))
		var pe *ProblemError
		if !errors.Is(err, want) || !errors.As(err, &pe) || pe.RetryAfter != 2*time.Second {
			t.Fatalf("%s: %v", slug, err)
		}
	}
	err := problemFrom(502, nil, []byte("bad gateway"))
	if !IsTransient(err) || !strings.Contains(err.Error(), "bad gateway") || errors.Is(err, ErrHeld) {
		t.Fatalf("a non-problem 502: %v", err)
	}
}
