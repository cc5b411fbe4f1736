package leaseproxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
)

// putCount writes a count for aisle straight to fence-gateway with the token of the lease in
// ctx (added by the Transport); returns the status and the Fencing-Rejection header.
func putCount(t *testing.T, ctx context.Context, hc *http.Client, aisle, robot string, count int) (int, string, error) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"robot": robot, "count": count})
	req, err := http.NewRequestWithContext(ctx, http.MethodPut,
		env.warehouse.Gateway.URL+"/aisles/"+aisle+"/count", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Fencing-Rejection"), nil
}

func writesTo(t *testing.T, aisle string) []string {
	t.Helper()
	log, err := env.warehouse.Log()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, w := range log {
		if w.Aisle == aisle {
			out = append(out, fmt.Sprintf("%s@%d", w.Robot, w.Revision))
		}
	}
	return out
}

func TestThePropagatedTokenIsRefusedAtTheGatewayOnceANewerHolderWrote(t *testing.T) {
	// The old holder learns nothing (no event stream, renewals far off): only fencing stops it.
	old := client(t, "", leaseproxy.Options{NoLossWatch: true})
	newer := client(t, "", leaseproxy.Options{})
	hc := leaseproxy.NewHTTPClient(nil)
	aisle := resource(t)
	a, err := old.Acquire(ctxT(t), aisle, &leaseproxy.AcquireOptions{Holder: "old", TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctxT(t))
	if status, _, err := putCount(t, a.Context(), hc, aisle, "old", 1); err != nil || status != 200 {
		t.Fatalf("the holder's write: %d %v", status, err)
	}
	// Without a lease in the context the gateway sees no token.
	if status, rejection, _ := putCount(t, context.Background(), hc, aisle, "nobody", 0); status != 428 || rejection != "missing-fencing-token" {
		t.Fatalf("a write without a lease: %d %s", status, rejection)
	}
	if err := env.etcd.Revoke(a.LeaseID()); err != nil {
		t.Fatal(err)
	}
	b, err := newer.Acquire(ctxT(t), aisle, &leaseproxy.AcquireOptions{Holder: "new", Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctxT(t))
	if status, _, err := putCount(t, b.Context(), hc, aisle, "new", 2); err != nil || status != 200 {
		t.Fatalf("the new holder's write: %d %v", status, err)
	}
	if a.Err() != nil {
		t.Fatalf("the old holder knows already (%v): the test must show the gateway refusing", a.Err())
	}
	status, rejection, err := putCount(t, a.Context(), hc, aisle, "old", 3)
	if err != nil || status != 409 || rejection != "stale-fencing-token" {
		t.Fatalf("the old holder's late write: %d %q %v, want 409 stale-fencing-token", status, rejection, err)
	}
	want := []string{fmt.Sprintf("old@%d", a.Token()), fmt.Sprintf("new@%d", b.Token())}
	if got := writesTo(t, aisle); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("inventory has %v, want %v", got, want)
	}
}

func TestTheTransportSendsNothingForALeaseKnownLost(t *testing.T) {
	c := client(t, "", leaseproxy.Options{})
	aisle := resource(t)
	l, err := c.Acquire(ctxT(t), aisle, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	_, _, err = putCount(t, leaseproxy.ContextWithLease(context.Background(), l), leaseproxy.NewHTTPClient(nil), aisle, "late", 9)
	if !errors.Is(err, leaseproxy.ErrLost) {
		t.Fatalf("a write for a released lease: %v, want ErrLost", err)
	}
	if got := writesTo(t, aisle); len(got) != 0 {
		t.Fatalf("written: %v", got)
	}
}

func TestForwardWritesThroughTheProxyAndStopsAtTheLoss(t *testing.T) {
	c := client(t, "", leaseproxy.Options{NoLossWatch: true})
	aisle := resource(t)
	l, err := c.Acquire(ctxT(t), aisle, &leaseproxy.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctxT(t))
	body := []byte(`{"robot":"fwd","count":4}`)
	resp, err := l.Forward(ctxT(t), http.MethodPut, "aisles/"+aisle+"/count", bytes.NewReader(body),
		http.Header{"Content-Type": {"application/json"}})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("forward: %v %v", resp, err)
	}
	resp.Body.Close()
	if err := env.etcd.Revoke(l.LeaseID()); err != nil {
		t.Fatal(err)
	}
	// The proxy refuses to forward for the ended grant: the answer is its 410, and the lease
	// is lost from then on.
	resp, err = l.Forward(ctxT(t), http.MethodPut, "aisles/"+aisle+"/count", bytes.NewReader(body), nil)
	if err != nil || resp.StatusCode != 410 {
		t.Fatalf("forward after the revocation: %v %v", resp, err)
	}
	resp.Body.Close()
	if !errors.Is(l.Err(), leaseproxy.ErrLost) {
		t.Fatalf("after the proxy's 410: %v", l.Err())
	}
	if _, err := l.Forward(ctxT(t), http.MethodPut, "aisles/"+aisle+"/count", bytes.NewReader(body), nil); !errors.Is(err, leaseproxy.ErrLost) {
		t.Fatalf("forward of a lost lease: %v", err)
	}
	if got := writesTo(t, aisle); len(got) != 1 {
		t.Fatalf("written: %v", got)
	}
}
