package leaseproxy

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"
)

const (
	// feedLinger: the shared stream stays open this long after the client's last lease ended,
	// so a loop of acquires and releases does not reconnect every time.
	feedLinger = 5 * time.Second
	// feedRecent is how many recent events the feed keeps, to judge a lease registered after
	// its end event went by.
	feedRecent = 1024
)

// lossFeed is the client's one shared /v1/watch stream: it reports a lease lost
// (ReasonRevoked) when an event says its grant ended — released or expired with its resource
// and token — or that its resource was acquired under a newer token. It only ever reports
// losses: a missed or malformed event leaves the renewals and the stop-by deadline to find
// the loss, and nothing it reads can make a lease look held.
type lossFeed struct {
	c *Client

	mu       sync.Mutex
	leases   map[string]map[*Lease]struct{}
	count    int
	cancel   context.CancelFunc
	linger   *time.Timer
	recent   []Event
	disabled bool
}

func newLossFeed(c *Client) *lossFeed {
	return &lossFeed{c: c, leases: map[string]map[*Lease]struct{}{}}
}

// register watches l; starts the stream (after l's grant revision) when it is not running.
func (f *lossFeed) register(l *Lease) {
	if f.c.opts.NoLossWatch {
		return
	}
	f.mu.Lock()
	if f.disabled || f.c.isClosed() {
		f.mu.Unlock()
		return
	}
	set := f.leases[l.grant.Resource]
	if set == nil {
		set = map[*Lease]struct{}{}
		f.leases[l.grant.Resource] = set
	}
	set[l] = struct{}{}
	f.count++
	if f.linger != nil {
		f.linger.Stop()
		f.linger = nil
	}
	if f.cancel == nil {
		ctx, cancel := context.WithCancel(context.Background())
		f.cancel = cancel
		go f.run(ctx, strconv.FormatUint(l.grant.Token, 10))
	}
	var seen *Event
	for i := range f.recent {
		if ends(&f.recent[i], l) {
			seen = &f.recent[i]
		}
	}
	f.mu.Unlock()
	if seen != nil {
		ev := *seen
		l.live.lose(&LostError{Reason: ReasonRevoked, Event: &ev})
	}
}

// unregister stops watching l; the stream ends feedLinger after the last lease.
func (f *lossFeed) unregister(l *Lease) {
	f.mu.Lock()
	defer f.mu.Unlock()
	set := f.leases[l.grant.Resource]
	if _, ok := set[l]; !ok {
		return
	}
	delete(set, l)
	if len(set) == 0 {
		delete(f.leases, l.grant.Resource)
	}
	if f.count--; f.count == 0 && f.cancel != nil {
		f.linger = time.AfterFunc(feedLinger, f.idle)
	}
}

func (f *lossFeed) idle() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.count == 0 && f.cancel != nil {
		f.cancel()
		f.cancel = nil
	}
}

func (f *lossFeed) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.disabled = true
	if f.cancel != nil {
		f.cancel()
		f.cancel = nil
	}
}

// run reads the stream from after revision `after` until ctx ends. A compacted resume point
// starts again from now; a refusal (no read permission, say) turns the feed off.
func (f *lossFeed) run(ctx context.Context, after string) {
	for ctx.Err() == nil {
		s := f.c.Watch(ctx, f.c.opts.WatchPrefix, after)
		err := f.read(s)
		s.Close()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrCompacted) {
			after = ""
			continue
		}
		f.c.logf("leaseproxy: the loss watch stopped (renewals still detect losses): %v", err)
		f.mu.Lock()
		f.disabled = true
		f.cancel = nil
		f.mu.Unlock()
		return
	}
}

// read applies the stream's events until it ends for good.
func (f *lossFeed) read(s *EventStream) error {
	for {
		ev, err := s.Next()
		if err != nil {
			if errors.Is(err, ErrProtocol) {
				f.c.logf("leaseproxy: loss watch: %v", err)
				continue
			}
			return err
		}
		f.apply(ev)
	}
}

// apply loses every registered lease ev says has ended, and remembers ev.
func (f *lossFeed) apply(ev Event) {
	f.mu.Lock()
	if len(f.recent) >= feedRecent {
		f.recent = append(f.recent[:0], f.recent[feedRecent/2:]...)
	}
	f.recent = append(f.recent, ev)
	var hit []*Lease
	for l := range f.leases[ev.Resource] {
		if ends(&ev, l) {
			hit = append(hit, l)
		}
	}
	f.mu.Unlock()
	for _, l := range hit {
		e := ev
		l.live.lose(&LostError{Reason: ReasonRevoked, Event: &e})
	}
}

// ends reports whether ev says l's grant has ended: its end (same resource and token), or a
// newer grant of its resource.
func ends(ev *Event, l *Lease) bool {
	if ev.Resource != l.grant.Resource {
		return false
	}
	if ev.Type == "acquired" {
		return ev.Token > l.grant.Token
	}
	return ev.Token == l.grant.Token
}
