// Command scenario runs, with the Go SDK, the scripted scenario every SDK runs (docs/SDKS.md)
// against a running stack — lease-proxy, the warehouse inventory behind fence-gateway, etcd —
// and prints what the SDK let it observe, one line per step: KEY, a tab, the observation.
// scripts/sdk-scenario.sh runs it beside the other SDKs' runners and compares the lines.
//
//	scenario --proxy URL --gateway URL --etcd URL --prefix NAME-
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"lease-proxy.dev/leaseproxy"
)

// within bounds each wait of the scenario.
const within = 5 * time.Second

// drain is the fleet's drain deadline: a hand-off done in a quarter of it was the member's
// release, not the service's revocation.
const drain = 20 * time.Second

type run struct {
	proxy, gateway, etcd, prefix string
	store                        *http.Client
}

func main() {
	var r run
	fs := flag.NewFlagSet("scenario", flag.ExitOnError)
	fs.StringVar(&r.proxy, "proxy", "", "lease-proxy's base URL")
	fs.StringVar(&r.gateway, "gateway", "", "fence-gateway's base URL (the warehouse inventory behind it)")
	fs.StringVar(&r.etcd, "etcd", "", "etcd's client URL (to revoke a lease, as a lost lease looks)")
	fs.StringVar(&r.prefix, "prefix", "go-", "prefix of every resource and fleet name")
	_ = fs.Parse(os.Args[1:])
	r.store = leaseproxy.NewHTTPClient(nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.leases(ctx); err != nil {
		fail(err)
	}
	if err := r.fleet(ctx); err != nil {
		fail(err)
	}
}

// out receives the observations (the test reads them).
var out io.Writer = os.Stdout

func say(key, observed string, args ...any) {
	fmt.Fprintf(out, "%s\t%s\n", key, fmt.Sprintf(observed, args...))
}

func fail(err error) {
	say("failed", "%v", err)
	os.Exit(1)
}

// leases: acquire, renew, write through the gateway, a takeover after a forced loss, the old
// holder's write refused, release.
func (r *run) leases(ctx context.Context) error {
	a, err := leaseproxy.New(r.proxy, leaseproxy.Options{Holder: "a"})
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := leaseproxy.New(r.proxy, leaseproxy.Options{Holder: "b"})
	if err != nil {
		return err
	}
	defer b.Close()
	aisle := r.prefix + "aisle"
	old, err := a.Acquire(ctx, aisle, &leaseproxy.AcquireOptions{TTL: 3 * time.Second})
	if err != nil {
		return err
	}
	say("lease.acquire", "acquired by %s", old.Holder())
	first := old.StopBy()
	if !eventually(func() bool { return old.StopBy().After(first) }) {
		return errors.New("no renewal moved the stop-by deadline on")
	}
	say("lease.renew", "renewed in the background: stop-by later, %s", held(old.Err()))
	say("lease.write", r.write(old.Context(), aisle, "a", 1))
	if err := r.revoke(old.LeaseID()); err != nil {
		return err
	}
	select {
	case <-old.Lost():
	case <-time.After(within):
		return errors.New("the revoked lease was not reported lost")
	}
	say("lease.revoke", "a told: lost (%s)", reason(old.Err()))
	newer, err := b.Acquire(ctx, aisle, &leaseproxy.AcquireOptions{TTL: 3 * time.Second, Wait: within})
	if err != nil {
		return err
	}
	say("lease.takeover", "acquired by %s, token %s a's", newer.Holder(), compare(newer.Token(), old.Token()))
	say("lease.new-write", r.write(newer.Context(), aisle, "b", 2))
	say("lease.old-write", r.write(old.Context(), aisle, "a", 3))
	say("lease.old-token", r.presented(old, "a", 4))
	if err := newer.Release(ctx); err != nil {
		return err
	}
	_, err = b.Get(ctx, aisle)
	say("lease.release", "released by %s: %s", newer.Holder(), free(err))
	return nil
}

// fleet: a member receives, writes and hands off when a second one joins, drains; a member
// whose session ends is told.
func (r *run) fleet(ctx context.Context) error {
	c, err := leaseproxy.New(r.proxy, leaseproxy.Options{Holder: "scenario"})
	if err != nil {
		return err
	}
	defer c.Close()
	fleet := r.prefix + "fleet"
	if err := c.PutFleet(ctx, fleet, leaseproxy.FleetSpec{Resources: []string{fleet + "-1", fleet + "-2"}, Drain: drain}); err != nil {
		return err
	}
	defer func() { _ = c.DeleteFleet(context.Background(), fleet) }()
	m1, err := c.JoinFleet(ctx, fleet, &leaseproxy.JoinOptions{Member: "m1", TTL: 10 * time.Second, Poll: 2 * time.Second})
	if err != nil {
		return err
	}
	defer func() { _ = m1.Leave(context.Background()) }()
	w1 := serve(ctx, m1)
	got, err := w1.started.take(2)
	if err != nil {
		return err
	}
	say("fleet.join", "m1 assigned %d resources", len(got))
	say("fleet.write", "%s; %s", r.write(got[0].Context(), got[0].Resource(), "m1", 1), r.write(got[1].Context(), got[1].Resource(), "m1", 1))

	m2, err := c.JoinFleet(ctx, fleet, &leaseproxy.JoinOptions{Member: "m2", TTL: 10 * time.Second, Poll: 2 * time.Second})
	if err != nil {
		return err
	}
	joined := time.Now()
	w2 := serve(ctx, m2)
	moved, err := w1.ended.take(1)
	if err != nil {
		return err
	}
	say("fleet.second-join", "m1's work on %d resource ended: %s", len(moved), reason(moved[0].Err()))
	taken, err := w2.started.take(1)
	if err != nil {
		return err
	}
	say("fleet.hand-off", "m2 assigned the same resource, token %s m1's, %s", compare(taken[0].Token(), moved[0].Token()),
		inTime(taken[0].Resource() == moved[0].Resource(), time.Since(joined)))
	say("fleet.new-write", r.write(taken[0].Context(), taken[0].Resource(), "m2", 2))
	say("fleet.old-write", r.write(moved[0].Context(), moved[0].Resource(), "m1", 3))
	say("fleet.old-token", r.presented(moved[0], "m1", 4))

	if err := m1.Drain(ctx); err != nil {
		return err
	}
	drained, err := w1.ended.take(1)
	if err != nil {
		return err
	}
	rest, err := w2.started.take(1)
	if err != nil {
		return err
	}
	say("fleet.drain", "m1's work on %d resource ended: %s; m2 assigned it: %v", len(drained), reason(drained[0].Err()),
		rest[0].Resource() == drained[0].Resource())

	if err := r.revoke(m2.Session().ID()); err != nil {
		return err
	}
	ended, err := w2.ended.take(2)
	if err != nil {
		return err
	}
	lost := 0
	for _, l := range ended {
		if errors.Is(l.Err(), leaseproxy.ErrLost) {
			lost++
		}
	}
	select {
	case err = <-w2.done:
	case <-time.After(within):
		return errors.New("m2's Serve did not return after its session ended")
	}
	say("fleet.session-end", "m2's work on %d resources ended: lost; the member ended: %s", lost, memberEnded(err))
	return nil
}

// write PUTs a count for aisle through fence-gateway with the Transport, which adds the token
// of the lease ctx carries: the status, the gateway's refusal, or the SDK's refusal to send.
func (r *run) write(ctx context.Context, aisle, robot string, count int) string {
	body, _ := json.Marshal(map[string]any{"robot": robot, "count": count})
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, r.gateway+"/aisles/"+aisle+"/count", bytes.NewReader(body))
	if err != nil {
		return err.Error()
	}
	return outcome(r.store.Do(req))
}

// presented PUTs a count with l's fencing token set by hand, as a holder that has not learnt of
// its loss would send it.
func (r *run) presented(l *leaseproxy.Lease, robot string, count int) string {
	body, _ := json.Marshal(map[string]any{"robot": robot, "count": count})
	req, err := http.NewRequest(http.MethodPut, r.gateway+"/aisles/"+l.Resource()+"/count", bytes.NewReader(body))
	if err != nil {
		return err.Error()
	}
	req.Header.Set(leaseproxy.HeaderFencingToken, l.FencingToken())
	req.Header.Set(leaseproxy.HeaderFencingResource, l.Resource())
	return "token sent anyway: " + outcome(http.DefaultClient.Do(req))
}

func outcome(resp *http.Response, err error) string {
	if err != nil {
		var lost *leaseproxy.LostError
		if errors.As(err, &lost) {
			return fmt.Sprintf("refused by the SDK, nothing sent: lost (%s)", lost.Reason)
		}
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if rejection := resp.Header.Get("Fencing-Rejection"); rejection != "" {
		return fmt.Sprintf("%d %s", resp.StatusCode, rejection)
	}
	return fmt.Sprint(resp.StatusCode)
}

// revoke revokes an etcd lease through etcd's JSON gateway: a lease lost to etcd.
func (r *run) revoke(leaseID string) error {
	body, _ := json.Marshal(map[string]string{"ID": leaseID})
	resp, err := http.Post(r.etcd+"/v3/lease/revoke", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("revoke %s: %s", leaseID, resp.Status)
	}
	return nil
}

func reason(err error) string {
	var lost *leaseproxy.LostError
	if errors.As(err, &lost) {
		return string(lost.Reason)
	}
	return fmt.Sprintf("not lost (%v)", err)
}

func held(err error) string {
	if err == nil {
		return "held"
	}
	return "lost (" + reason(err) + ")"
}

func free(err error) string {
	if errors.Is(err, leaseproxy.ErrNotFound) {
		return "the resource is free"
	}
	return fmt.Sprintf("the resource is not free (%v)", err)
}

func memberEnded(err error) string {
	if errors.Is(err, leaseproxy.ErrSessionLost) {
		return "session lost"
	}
	return fmt.Sprintf("%v", err)
}

func compare(a, b uint64) string {
	switch {
	case a > b:
		return "above"
	case a == b:
		return "equal to"
	default:
		return "below"
	}
}

func inTime(same bool, took time.Duration) string {
	if !same {
		return "but another resource"
	}
	if took < drain/4 {
		return "well within the drain deadline"
	}
	return fmt.Sprintf("after %s (the service's revocation, not the member's release)", took)
}

func eventually(cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// worker is a member's Serve whose work reports each lease it starts and ends, in order.
type worker struct {
	started, ended mailbox
	done           chan error
}

func serve(ctx context.Context, m *leaseproxy.Member) *worker {
	w := &worker{started: make(mailbox, 8), ended: make(mailbox, 8), done: make(chan error, 1)}
	go func() {
		w.done <- m.Serve(ctx, func(ctx context.Context, l *leaseproxy.Lease) error {
			w.started <- l
			<-ctx.Done()
			w.ended <- l
			return nil
		})
	}()
	return w
}

type mailbox chan *leaseproxy.Lease

// take reads n leases within the scenario's bound, sorted by resource.
func (m mailbox) take(n int) ([]*leaseproxy.Lease, error) {
	var got []*leaseproxy.Lease
	deadline := time.After(within)
	for len(got) < n {
		select {
		case l := <-m:
			got = append(got, l)
		case <-deadline:
			return nil, fmt.Errorf("%d of %d leases within %s", len(got), n, within)
		}
	}
	for i := 1; i < len(got); i++ {
		for j := i; j > 0 && strings.Compare(got[j].Resource(), got[j-1].Resource()) < 0; j-- {
			got[j], got[j-1] = got[j-1], got[j]
		}
	}
	return got, nil
}
