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
type Fault uint

const (
	// FaultLoss: at a renewal, the lease (or session) is declared lost as if the proxy had
	// refused it (ReasonRevoked, Injected), and released on the server.
	FaultLoss Fault = 1 << iota
	// FaultLateRenewal: a renewal is sent late, by up to 1.2 times the time left before the
	// stop-by deadline (so about one in six crosses it: ReasonExpired).
	FaultLateRenewal
	// FaultFailedRenewal: a renewal attempt fails without being sent (retried as any
	// transient failure).
	FaultFailedRenewal
	// FaultTokenRefusal: Transport answers a write with fence-gateway's 409
	// stale-fencing-token without sending it, and Admit fails with ErrStaleToken.
	FaultTokenRefusal

	// AllFaults is every fault.
	AllFaults = FaultLoss | FaultLateRenewal | FaultFailedRenewal | FaultTokenRefusal
)

func (f Fault) String() string {
	switch f {
	case FaultLoss:
		return "loss"
	case FaultLateRenewal:
		return "late-renewal"
	case FaultFailedRenewal:
		return "failed-renewal"
	case FaultTokenRefusal:
		return "token-refusal"
	}
	return fmt.Sprintf("faults(%#x)", uint(f))
}

// TestMode makes a client inject faults into its own leases so an application's tests
// exercise their on-lost paths (FoundationDB's client buggify, for leases): each chance to
// inject a fault — a renewal, a write through Transport, an Admit — fires with probability
// Rate. A loss it injects reaches the application exactly as a real one does (the context
// cancelled, Err a *LostError), marked Injected.
type TestMode struct {
	// Rate is the probability (0 to 1) that one chance fires.
	Rate float64
	// Faults are the kinds injected (0: AllFaults).
	Faults Fault
	// Seed makes the faults repeatable (0: seeded from the clock).
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
	if mode == nil || mode.Rate <= 0 {
		return nil
	}
	m := *mode
	if m.Faults == 0 {
		m.Faults = AllFaults
	}
	if m.Seed == 0 {
		m.Seed = time.Now().UnixNano()
	}
	return &chaos{mode: m, rng: rand.New(rand.NewSource(m.Seed))}
}

// fire reports whether fault f is injected at this chance (for resource).
func (c *chaos) fire(f Fault, resource string) bool {
	if c == nil || c.mode.Faults&f == 0 {
		return false
	}
	c.mu.Lock()
	hit := c.rng.Float64() < c.mode.Rate
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
