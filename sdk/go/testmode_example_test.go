package leaseproxy_test

// How an application tests its on-lost paths with the test mode: countAisle below is
// application code, the tests are the application's, run against a real proxy.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
)

// errRefused is the application's own error for a write the storage refused as stale.
var errRefused = errors.New("the storage refused our token: a newer holder has written")

// countAisle is application code: under a lease on aisle, it writes up to 40 counts through
// the fenced store (hc carries the lease's token), and must stop the moment the lease is lost
// or the storage refuses its token.
func countAisle(ctx context.Context, c *leaseproxy.Client, hc *http.Client, store, aisle string) (int, error) {
	written := 0
	err := c.WithLease(ctx, aisle, &leaseproxy.AcquireOptions{TTL: 2 * time.Second},
		func(ctx context.Context, l *leaseproxy.Lease) error {
			for i := 0; i < 40; i++ {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(50 * time.Millisecond): // counting takes a while
				}
				body := bytes.NewReader([]byte(fmt.Sprintf(`{"robot":"app","count":%d}`, i)))
				req, err := http.NewRequestWithContext(ctx, http.MethodPut, store+"/aisles/"+aisle+"/count", body)
				if err != nil {
					return err
				}
				resp, err := hc.Do(req)
				if err != nil {
					return err
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusConflict {
					return errRefused
				}
				written++
			}
			return nil
		})
	return written, err
}

func TestExampleTestModeAnInjectedLossStopsTheApplication(t *testing.T) {
	var injected []leaseproxy.Fault
	c := client(t, "", leaseproxy.Options{TestMode: &leaseproxy.TestMode{LossRate: 1, Seed: 1,
		OnFault: func(f leaseproxy.Fault, resource string) { injected = append(injected, f) }}})
	written, err := countAisle(ctxT(t), c, leaseproxy.NewHTTPClient(nil), env.warehouse.Gateway.URL, resource(t))
	var lost *leaseproxy.LostError
	if !errors.As(err, &lost) || !lost.Injected || lost.Reason != leaseproxy.ReasonRevoked {
		t.Fatalf("the application returned %v, want the injected loss", err)
	}
	if written == 0 || written >= 40 || len(injected) != 1 || injected[0] != leaseproxy.FaultLoss {
		t.Fatalf("wrote %d counts; faults %v", written, injected)
	}
}

func TestExampleTestModeARefusedTokenStopsTheApplication(t *testing.T) {
	c := client(t, "", leaseproxy.Options{TestMode: &leaseproxy.TestMode{TokenRefusalRate: 0.2, Seed: 3}})
	written, err := countAisle(ctxT(t), c, leaseproxy.NewHTTPClient(nil), env.warehouse.Gateway.URL, resource(t))
	if !errors.Is(err, errRefused) || written >= 40 {
		t.Fatalf("the application returned %v after %d counts, want its refused path", err, written)
	}
}

func TestExampleTestModeRenewalsThatNeverArriveExpireTheLease(t *testing.T) {
	c := client(t, "", leaseproxy.Options{NoLossWatch: true,
		TestMode: &leaseproxy.TestMode{FailedRenewalRate: 1, Seed: 5}})
	written, err := countAisle(ctxT(t), c, leaseproxy.NewHTTPClient(nil), env.warehouse.Gateway.URL, resource(t))
	var lost *leaseproxy.LostError
	if !errors.As(err, &lost) || lost.Reason != leaseproxy.ReasonExpired || !lost.Injected || written >= 40 {
		t.Fatalf("the application returned %v after %d counts, want the stop-by deadline", err, written)
	}
}

func TestExampleTestModeLateRenewalsSometimesCrossTheDeadline(t *testing.T) {
	c := client(t, "", leaseproxy.Options{NoLossWatch: true,
		TestMode: &leaseproxy.TestMode{LateRenewalRate: 1, Seed: 11}})
	_, err := countAisle(ctxT(t), c, leaseproxy.NewHTTPClient(nil), env.warehouse.Gateway.URL, resource(t))
	var lost *leaseproxy.LostError
	if err != nil && (!errors.As(err, &lost) || lost.Reason != leaseproxy.ReasonExpired || !lost.Injected) {
		t.Fatalf("the application returned %v, want success or the stop-by deadline", err)
	}
	t.Logf("with every renewal late (seed 11): %v", err)
}
