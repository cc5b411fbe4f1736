package leaseproxy_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
)

// holdFrom acquires "r" (TTL 2 s) from a fake whose renewals renew answers.
func holdFrom(t *testing.T, renew func(w http.ResponseWriter, n int32)) (*leaseproxy.Lease, *fake) {
	var n int32
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/leases/r":
			write(w, 201, grantJSON("r", 5, 2, 2000))
		case strings.HasSuffix(r.URL.Path, "/renew"):
			renew(w, atomic.AddInt32(&n, 1))
		default:
			w.WriteHeader(204)
		}
	})
	c := client(t, f.URL, leaseproxy.Options{NoLossWatch: true, Timeout: 3 * time.Second})
	l, err := c.Acquire(ctxT(t), "r", &leaseproxy.AcquireOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l, f
}

func lostFor(t *testing.T, l *leaseproxy.Lease, within time.Duration) *leaseproxy.LostError {
	t.Helper()
	select {
	case <-l.Lost():
	case <-time.After(within):
		t.Fatalf("not lost within %s", within)
	}
	var lost *leaseproxy.LostError
	if !errors.As(l.Err(), &lost) {
		t.Fatalf("lost with %v", l.Err())
	}
	return lost
}

func TestHostileRenewalAnswersNeverExtendALease(t *testing.T) {
	t.Parallel()
	renewal := func(token, ttl, ms int) string {
		return fmt.Sprintf(`{"ttl_seconds":%d,"expires_in_ms":%d,"token":"%d"}`, ttl, ms, token)
	}
	cases := map[string]struct {
		answer func(w http.ResponseWriter, n int32)
		reason leaseproxy.LostReason
	}{
		"another grant's token (reordered)": {func(w http.ResponseWriter, n int32) { write(w, 200, renewal(4, 2, 2000)) }, leaseproxy.ReasonRevoked},
		"a renewal of no time":              {func(w http.ResponseWriter, n int32) { write(w, 200, renewal(5, 0, 0)) }, leaseproxy.ReasonRevoked},
		"malformed, every time":             {func(w http.ResponseWriter, n int32) { write(w, 200, `{"ttl_seconds":2`) }, leaseproxy.ReasonExpired},
		"502, every time":                   {func(w http.ResponseWriter, n int32) { write(w, 502, `bad gateway`) }, leaseproxy.ReasonExpired},
		"a 403 not-holder": {func(w http.ResponseWriter, n int32) {
			write(w, 403, `{"type":"https://lease-proxy.dev/problems/not-holder","title":"t","status":403}`)
		}, leaseproxy.ReasonRevoked},
		"an answer that arrives after the stop-by deadline": {func(w http.ResponseWriter, n int32) {
			time.Sleep(2 * time.Second)
			write(w, 200, renewal(5, 2, 2000))
		}, leaseproxy.ReasonExpired},
	}
	for name, tc := range cases {
		tc := tc
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l, _ := holdFrom(t, tc.answer)
			stopBy := l.StopBy()
			lost := lostFor(t, l, 3*time.Second)
			if lost.Reason != tc.reason {
				t.Fatalf("lost %v, want %s", lost, tc.reason)
			}
			if l.StopBy().After(stopBy) {
				t.Fatalf("the deadline moved on by %s", l.StopBy().Sub(stopBy))
			}
			time.Sleep(300 * time.Millisecond) // anything late changes nothing
			if l.Err() == nil || l.Context().Err() == nil {
				t.Fatal("held again")
			}
		})
	}
}

func TestHostileASlowRenewalGrantsOnlyFromBeforeItWasSent(t *testing.T) {
	t.Parallel()
	l, _ := holdFrom(t, func(w http.ResponseWriter, n int32) {
		time.Sleep(700 * time.Millisecond)
		write(w, 200, `{"ttl_seconds":2,"expires_in_ms":2000,"token":"5"}`)
	})
	var sent time.Time
	for i := 0; i < 2; i++ { // two renewals, each answered 700 ms after it was sent
		before := l.StopBy()
		eventually(t, 3*time.Second, "renewed", func() bool { return l.StopBy().After(before) })
		sent = time.Now().Add(-700 * time.Millisecond)
	}
	if limit := sent.Add(2 * time.Second); l.StopBy().After(limit.Add(50 * time.Millisecond)) {
		t.Fatalf("stop-by %s after the send + lifetime", l.StopBy().Sub(limit))
	}
}
