package leaseproxy_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
)

func sse(id string, typ string, token, revision int) string {
	return fmt.Sprintf("id: %s\nevent: %s\ndata: {\"type\":%q,\"resource\":\"r\",\"holder\":\"h\",\"token\":\"%d\",\"revision\":%d,\"lease_id\":\"77\"}\n\n",
		id, typ, typ, token, revision)
}

// stream answers each watch connection with the n-th of bodies (the last one again after),
// then holds it open a while.
func stream(t *testing.T, bodies ...string) (*fake, *[]string) {
	var n int32
	var ids []string
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		i := int(atomic.AddInt32(&n, 1)) - 1
		ids = append(ids, r.Header.Get("Last-Event-ID"))
		if i >= len(bodies) {
			i = len(bodies) - 1
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		_, _ = w.Write([]byte(bodies[i]))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(300 * time.Millisecond):
		}
	})
	return f, &ids
}

func nextN(t *testing.T, s *leaseproxy.EventStream, n int) []string {
	t.Helper()
	var got []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(got) < n {
			ev, err := s.Next()
			switch {
			case errors.Is(err, leaseproxy.ErrProtocol):
				got = append(got, "protocol")
			case err != nil:
				got = append(got, "end: "+err.Error())
				return
			default:
				got = append(got, ev.ID)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.Close()
		<-done
	}
	return got
}

func TestHostileEventStreams(t *testing.T) {
	t.Parallel()
	t.Run("a malformed and an out-of-order event are errors, the stream goes on", func(t *testing.T) {
		t.Parallel()
		f, _ := stream(t, "id: 10\n\n"+sse("11.0", "acquired", 11, 11)+"id: 12.0\ndata: {\"type\":\"stolen\"}\n\n"+
			sse("9.0", "released", 8, 9)+sse("13.0", "released", 11, 13))
		s := client(t, f.URL, leaseproxy.Options{}).Watch(ctxT(t), "", "")
		defer s.Close()
		if got := strings.Join(nextN(t, s, 4), " "); got != "11.0 protocol protocol 13.0" {
			t.Fatalf("got %s", got)
		}
	})
	t.Run("a message cut by a disconnect is dropped and the stream resumes before it", func(t *testing.T) {
		t.Parallel()
		cut := sse("11.0", "acquired", 11, 11)
		f, ids := stream(t, "id: 10\n\n"+cut[:len(cut)-3], "id: 10\n\n"+cut+sse("12.0", "released", 11, 12))
		s := client(t, f.URL, leaseproxy.Options{}).Watch(ctxT(t), "", "")
		defer s.Close()
		if got := strings.Join(nextN(t, s, 2), " "); got != "11.0 12.0" || (*ids)[1] != "10" {
			t.Fatalf("got %s, resumed after %q", got, (*ids)[1])
		}
	})
	t.Run("a line over 1 MiB is an error, then the stream resumes", func(t *testing.T) {
		t.Parallel()
		f, ids := stream(t, "id: 10\n\n"+"data: "+strings.Repeat("x", 1<<20+10)+"\n\n", sse("11.0", "acquired", 11, 11))
		s := client(t, f.URL, leaseproxy.Options{}).Watch(ctxT(t), "", "")
		defer s.Close()
		if got := strings.Join(nextN(t, s, 2), " "); got != "protocol 11.0" || (*ids)[1] != "10" {
			t.Fatalf("got %s, resumed after %v", got, *ids)
		}
	})
	t.Run("a refusal ends the stream", func(t *testing.T) {
		t.Parallel()
		f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
			write(w, 410, `{"type":"https://lease-proxy.dev/problems/events-compacted","title":"t","status":410}`)
		})
		s := client(t, f.URL, leaseproxy.Options{}).Watch(ctxT(t), "", "5")
		if _, err := s.Next(); !errors.Is(err, leaseproxy.ErrCompacted) {
			t.Fatalf("got %v", err)
		}
		if _, err := s.Next(); !errors.Is(err, leaseproxy.ErrCompacted) {
			t.Fatalf("then %v", err)
		}
	})
}

func TestHostileTheLossStreamOnlyEverLosesLeases(t *testing.T) {
	t.Parallel()
	var watch int32
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/watch":
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			if atomic.AddInt32(&watch, 1) == 1 {
				// an older grant's end, a grant of another resource, garbage: nothing for us
				_, _ = w.Write([]byte("id: 5\n\n" + sse("6.0", "released", 4, 6) +
					strings.Replace(sse("7.0", "acquired", 9, 7), `"resource":"r"`, `"resource":"q"`, 1) +
					"id: 8.0\ndata: not json\n\n"))
				w.(http.Flusher).Flush()
				time.Sleep(600 * time.Millisecond)
				_, _ = w.Write([]byte(sse("9.0", "acquired", 6, 9))) // a newer grant of r
				w.(http.Flusher).Flush()
			}
			<-r.Context().Done()
		case r.Method == http.MethodPost && r.URL.Path == "/v1/leases/r":
			write(w, 201, grantJSON("r", 5, 20, 20000))
		default:
			w.WriteHeader(204)
		}
	})
	c := client(t, f.URL, leaseproxy.Options{Timeout: time.Second})
	l, err := c.Acquire(ctxT(t), "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if l.Err() != nil {
		t.Fatalf("lost by events that are not its own: %v", l.Err())
	}
	lost := lostFor(t, l, 2*time.Second)
	if lost.Reason != leaseproxy.ReasonRevoked || lost.Event == nil || lost.Event.Token != 6 {
		t.Fatalf("lost %v", lost)
	}
}
