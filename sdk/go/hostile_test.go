package leaseproxy_test

// The client against a hostile or broken server: malformed, slow, truncated and reordered
// answers are each a clear error, and never a lease the client wrongly believes it holds.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
)

// fake is an httptest server whose answers a test writes; it records what it was asked.
type fake struct {
	*httptest.Server
	mu   sync.Mutex
	seen []string
}

func newFake(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) *fake {
	f := &fake{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.seen = append(f.seen, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fake) asked(method, suffix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.seen {
		if strings.HasPrefix(s, method+" ") && strings.HasSuffix(s, suffix) {
			n++
		}
	}
	return n
}

const fakeToken = "v1.k1.0.%d.nonce.mac"

func grantJSON(resource string, token, ttl, expiresMS uint64) string {
	return fmt.Sprintf(`{"resource":%q,"holder":"h","lease_id":"77","secret":"s3cret","token":"%d",`+
		`"fencing_token":"`+fakeToken+`","ttl_seconds":%d,"expires_in_ms":%d}`, resource, token, token, ttl, expiresMS)
}

func write(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

// acquireFrom acquires "r" from a fake answering acquires with status and body.
func acquireFrom(t *testing.T, status int, body string) (*leaseproxy.Lease, error, *fake) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/leases/r" {
			write(w, status, body)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	c := client(t, f.URL, leaseproxy.Options{NoLossWatch: true, Timeout: time.Second})
	l, err := c.Acquire(ctxT(t), "r", &leaseproxy.AcquireOptions{TTL: 2 * time.Second})
	return l, err, f
}

func TestHostileAcquireAnswersAreProtocolErrors(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		status int
		body   string
	}{
		"not JSON":                             {201, `<html>ok</html>`},
		"JSON but not an object":               {201, `[1,2]`},
		"two JSON values":                      {201, grantJSON("r", 5, 2, 2000) + `{}`},
		"no secret":                            {201, strings.Replace(grantJSON("r", 5, 2, 2000), `"secret":"s3cret",`, "", 1)},
		"a null secret":                        {201, strings.Replace(grantJSON("r", 5, 2, 2000), `"s3cret"`, "null", 1)},
		"a token that is no text":              {201, strings.Replace(grantJSON("r", 5, 2, 2000), `"token":"5"`, `"token":5`, 1)},
		"a negative token":                     {201, strings.Replace(grantJSON("r", 5, 2, 2000), `"token":"5"`, `"token":"-5"`, 1)},
		"a fractional TTL":                     {201, strings.Replace(grantJSON("r", 5, 2, 2000), `"ttl_seconds":2`, `"ttl_seconds":2.5`, 1)},
		"a TTL as text":                        {201, strings.Replace(grantJSON("r", 5, 2, 2000), `"ttl_seconds":2`, `"ttl_seconds":"2"`, 1)},
		"another resource's grant (reordered)": {201, grantJSON("q", 5, 2, 2000)},
		"a fencing token of another revision":  {201, strings.Replace(grantJSON("r", 5, 2, 2000), "v1.k1.0.5.", "v1.k1.0.4.", 1)},
		"token 0":                              {201, grantJSON("r", 0, 2, 2000)},
		"200 instead of 201":                   {200, grantJSON("r", 5, 2, 2000)},
		"a 409 lease-held without a holder":    {409, `{"type":"https://lease-proxy.dev/problems/lease-held","title":"t","status":409}`},
		"a 409 lease-held with a bad token":    {409, `{"type":"https://lease-proxy.dev/problems/lease-held","holder":"x","token":"x1"}`},
	}
	for name, tc := range cases {
		tc := tc
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l, err, _ := acquireFrom(t, tc.status, tc.body)
			var pe *leaseproxy.ProtocolError
			if l != nil || !errors.As(err, &pe) || !errors.Is(err, leaseproxy.ErrProtocol) || errors.Is(err, leaseproxy.ErrHeld) {
				t.Fatalf("got lease %v, error %v; want a protocol error", l, err)
			}
		})
	}
}

func TestHostileAGrantOfNoTimeIsNeverHeld(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"TTL 0":                          grantJSON("r", 5, 0, 2000),
		"negative expires_in_ms":         strings.Replace(grantJSON("r", 5, 2, 2000), `"expires_in_ms":2000`, `"expires_in_ms":-1`, 1),
		"expires_in_ms below the margin": grantJSON("r", 5, 2, 50),
	} {
		body := body
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l, err, f := acquireFrom(t, 201, body)
			var lost *leaseproxy.LostError
			if l != nil || !errors.As(err, &lost) || lost.Reason != leaseproxy.ReasonExpired {
				t.Fatalf("got lease %v, error %v; want it lost on arrival", l, err)
			}
			eventually(t, 2*time.Second, "the grant released", func() bool { return f.asked("DELETE", "/v1/leases/r") == 1 })
		})
	}
}

func TestHostileAnAbsurdLifetimeIsCappedByTheTTL(t *testing.T) {
	t.Parallel()
	start := time.Now()
	l, err, _ := acquireFrom(t, 201, grantJSON("r", 5, 2, 1<<62))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if l.StopBy().After(start.Add(2 * time.Second)) {
		t.Fatalf("stop-by %s away: more than the TTL", time.Until(l.StopBy()))
	}
}

func TestHostileSlowAndTruncatedAnswersAreTransportErrors(t *testing.T) {
	t.Parallel()
	cases := map[string]func(w http.ResponseWriter){
		"no answer within the timeout": func(w http.ResponseWriter) { time.Sleep(1500 * time.Millisecond) },
		"an answer dripped past the timeout": func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", "400")
			w.WriteHeader(201)
			for i := 0; i < 30; i++ {
				_, _ = w.Write([]byte("          "))
				w.(http.Flusher).Flush()
				time.Sleep(100 * time.Millisecond)
			}
		},
		"a body cut short": func(w http.ResponseWriter) {
			conn, buf, _ := w.(http.Hijacker).Hijack()
			body := grantJSON("r", 5, 2, 2000)
			fmt.Fprintf(buf, "HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:len(body)/2])
			buf.Flush()
			conn.Close()
		},
		"the connection closed before an answer": func(w http.ResponseWriter) {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		},
	}
	for name, answer := range cases {
		answer := answer
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, func(w http.ResponseWriter, r *http.Request) { answer(w) })
			c := client(t, f.URL, leaseproxy.Options{NoLossWatch: true, Timeout: time.Second})
			start := time.Now()
			l, err := c.Acquire(ctxT(t), "r", &leaseproxy.AcquireOptions{TTL: 2 * time.Second})
			var te *leaseproxy.TransportError
			if l != nil || !errors.As(err, &te) || !leaseproxy.IsTransient(err) {
				t.Fatalf("got lease %v, error %v; want a transport error", l, err)
			}
			if took := time.Since(start); took > 1300*time.Millisecond {
				t.Fatalf("took %s with a 1 s timeout", took)
			}
		})
	}
}

func TestHostileAnOversizedAnswerIsRefused(t *testing.T) {
	t.Parallel()
	l, err, _ := acquireFrom(t, 201, `{"resource":"r","pad":"`+strings.Repeat("x", 1<<20)+`"}`)
	if l != nil || !errors.Is(err, leaseproxy.ErrProtocol) {
		t.Fatalf("got lease %v, error %v", l, err)
	}
}

func TestHostileAnAcquireAnsweredAfterItsLifetimeIsLost(t *testing.T) {
	t.Parallel()
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			time.Sleep(2100 * time.Millisecond) // the 2 s grant was over before it arrived
			write(w, 201, grantJSON("r", 5, 2, 2000))
			return
		}
		w.WriteHeader(204)
	})
	c := client(t, f.URL, leaseproxy.Options{NoLossWatch: true, Timeout: 5 * time.Second})
	l, err := c.Acquire(ctxT(t), "r", &leaseproxy.AcquireOptions{TTL: 2 * time.Second})
	if l != nil || !errors.Is(err, leaseproxy.ErrLost) {
		t.Fatalf("got lease %v, error %v; want it lost on arrival", l, err)
	}
}

func TestHostileARedirectIsNeverFollowed(t *testing.T) {
	t.Parallel()
	elsewhere := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		write(w, 201, grantJSON("r", 5, 2, 2000))
	})
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusTemporaryRedirect)
	})
	c := client(t, f.URL, leaseproxy.Options{NoLossWatch: true, Timeout: time.Second})
	l, err := c.Acquire(ctxT(t), "r", nil)
	var pe *leaseproxy.ProblemError
	if l != nil || !errors.As(err, &pe) || pe.Status != 307 {
		t.Fatalf("got lease %v, error %v; want the 307 as an error", l, err)
	}
	if _, err := c.Renew(ctxT(t), "r", "s3cret"); err == nil || len(elsewhere.seen) != 0 {
		t.Fatalf("renew: %v; the redirect's target saw %v", err, elsewhere.seen)
	}
}
