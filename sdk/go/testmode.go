package leaseproxy

import (
	"bytes"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"sync"
	"time"
)

// Fault is a kind of fault the test mode injects.
type Fault string

const (
	// FaultLoss: at a renewal due, the lease (or session) is declared lost as if the proxy had
	// refused it (ReasonRevoked, Injected) and is released on the server.
	FaultLoss Fault = "loss"
	// FaultLateRenewal: a renewal due is sent late, after a pause of up to the whole lifetime
	// granted (so it may cross the stop-by deadline: ReasonExpired).
	FaultLateRenewal Fault = "late-renewal"
	// FaultFailedRenewal: a renewal attempt fails as if the proxy were unreachable, without
	// being sent (and is retried as any transient failure).
	FaultFailedRenewal Fault = "failed-renewal"
	// FaultTokenRefusal: a write through Transport is answered with fence-gateway's 409
	// stale-fencing-token without being sent, and Admit fails with ErrStaleToken.
	FaultTokenRefusal Fault = "token-refusal"
)

// TestMode makes a client inject faults into its own leases, so an application's tests run
// their on-lost paths (FoundationDB's client buggify, for leases). Each rate (0 to 1) is the
// probability that one chance fires: a renewal due (loss, late), a renewal attempt (failed), a
// write through Transport or an Admit (token refusal). An injected loss reaches the
// application exactly as a real one does (the context cancelled, Err a *LostError), marked
// Injected. Never set it in production.
type TestMode struct {
	LossRate          float64
	LateRenewalRate   float64
	FailedRenewalRate float64
	TokenRefusalRate  float64
	// Seed makes the faults repeatable: the same seed gives the same faults in order
	// (0: seeded from the clock).
	Seed int64
	// OnFault, when set, is called (from the goroutine that injects it) for every fault.
	OnFault func(f Fault, resource string)
}

// chaos is a client's test mode at run time; a nil *chaos never fires.
type chaos struct {
	mode TestMode
	mu   sync.Mutex
	rng  *rand.Rand
}

func newChaos(mode *TestMode) *chaos {
	if mode == nil {
		return nil
	}
	m := *mode
	if m.Seed == 0 {
		m.Seed = time.Now().UnixNano()
	}
	return &chaos{mode: m, rng: rand.New(rand.NewSource(m.Seed))}
}

func (c *chaos) rate(f Fault) float64 {
	switch f {
	case FaultLoss:
		return c.mode.LossRate
	case FaultLateRenewal:
		return c.mode.LateRenewalRate
	case FaultFailedRenewal:
		return c.mode.FailedRenewalRate
	case FaultTokenRefusal:
		return c.mode.TokenRefusalRate
	}
	return 0
}

// fire reports whether fault f is injected at this chance (for resource).
func (c *chaos) fire(f Fault, resource string) bool {
	if c == nil {
		return false
	}
	rate := c.rate(f)
	if rate <= 0 {
		return false
	}
	c.mu.Lock()
	hit := c.rng.Float64() < rate
	c.mu.Unlock()
	if hit && c.mode.OnFault != nil {
		c.mode.OnFault(f, resource)
	}
	return hit
}

// float is a uniform number in [0, 1).
func (c *chaos) float() float64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rng.Float64()
}

// injectedRefusal is what fence-gateway answers a write whose token is below the mark.
func injectedRefusal(req *http.Request, resource string) *http.Response {
	body := fmt.Sprintf(`{"type":"%sstale-fencing-token","title":"Conflict","status":409,`+
		`"detail":"fencing token refused for %q (injected by the test mode)"}`, ProblemBase, resource)
	return &http.Response{
		Status:     "409 Conflict",
		StatusCode: http.StatusConflict,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/problem+json"},
			"Fencing-Rejection": {"stale-fencing-token"}},
		Body:          io.NopCloser(bytes.NewReader([]byte(body))),
		ContentLength: int64(len(body)),
		Request:       req,
	}
}
