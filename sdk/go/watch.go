package leaseproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// watchIdle: a stream silent this long is dead (the proxy sends a comment every 15 s).
	watchIdle         = 45 * time.Second
	watchFirstBackoff = 100 * time.Millisecond
	watchMaxBackoff   = 5 * time.Second
)

// Event is one ownership event of GET /v1/watch.
type Event struct {
	// ID is the message id: the resume point after this event.
	ID string
	// Type is "acquired", "released" (by its holder, or its session closed) or "expired".
	Type     string
	Resource string
	Holder   string
	// Token is the grant's (for an end, the grant that ended).
	Token uint64
	// Revision is the event's etcd revision.
	Revision uint64
	LeaseID  string
	Session  string
}

func parseEvent(id, data string) (Event, error) {
	f, err := decodeObject(0, []byte(data), "type", "resource", "holder", "token", "revision", "lease_id")
	if err != nil {
		return Event{}, err
	}
	e := Event{ID: id}
	for name, dst := range map[string]*string{"type": &e.Type, "resource": &e.Resource,
		"holder": &e.Holder, "lease_id": &e.LeaseID, "session": &e.Session} {
		if *dst, err = f.str(0, name); err != nil {
			return Event{}, err
		}
	}
	if e.Type != "acquired" && e.Type != "released" && e.Type != "expired" {
		return Event{}, protocolErr(0, "an event of type %q", e.Type)
	}
	if e.Token, err = f.decimal(0, "token"); err != nil {
		return Event{}, err
	}
	e.Revision, err = f.count(0, "revision")
	return e, err
}

// EventStream is GET /v1/watch: it reconnects by itself after transport failures, any 5xx, a
// 429 and a stream silent for 45 s (backing off from 100 ms to 5 s, reset once a connection
// delivered an event), resuming after the last id seen, so nothing is lost or repeated.
// Id-only messages (the start, a quiet stream's progress) move LastEventID on and are never
// returned. It connects as soon as it is made, and reads ahead of Next by a few events.
type EventStream struct {
	c      *Client
	ctx    context.Context
	cancel context.CancelFunc
	prefix string
	items  chan item
	ended  error

	mu     sync.Mutex
	lastID string

	// Owned by the reading goroutine: readID is the resume point of what it has read.
	readID  string
	readPos position
	body    io.ReadCloser
	idle    *time.Timer
	parser  *sseParser
	backoff time.Duration
	pause   bool
}

// item is what the reading goroutine hands to Next: an event, an error, or (progress) only
// an id that moves LastEventID on.
type item struct {
	ev       Event
	err      error
	progress string
}

// Watch opens the event stream of resources under prefix ("" for all the caller may read),
// resuming after lastEventID when it is not "". It connects at once (in the background).
func (c *Client) Watch(ctx context.Context, prefix, lastEventID string) *EventStream {
	ctx, cancel := context.WithCancel(ctx)
	s := &EventStream{c: c, ctx: ctx, cancel: cancel, prefix: prefix, lastID: lastEventID,
		backoff: watchFirstBackoff, items: make(chan item, 16), readID: lastEventID}
	s.readPos, _ = parsePosition(lastEventID)
	go s.run()
	return s
}

// LastEventID is the resume point: the id of the last message of any kind that Next has
// returned or passed over (a quiet stream's progress included).
func (s *EventStream) LastEventID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastID
}

// Close ends the stream; a Next blocked in it returns.
func (s *EventStream) Close() {
	s.cancel()
}

// Next is the next event. A *ProtocolError (a malformed event, an event older than one
// already seen, an oversized line) is returned as it comes and the stream goes on; an error
// retrying cannot fix (ErrCompacted, a 401 or 403 *ProblemError) or the context ending ends
// it: every later Next returns the same error.
func (s *EventStream) Next() (Event, error) {
	for s.ended == nil {
		it, ok := <-s.items
		if !ok {
			s.ended = s.ctx.Err()
			break
		}
		if it.err != nil && !errors.Is(it.err, ErrProtocol) {
			s.ended = it.err
		}
		if id := it.progress + it.ev.ID; id != "" {
			s.mu.Lock()
			s.lastID = id
			s.mu.Unlock()
		}
		if it.progress == "" {
			return it.ev, it.err
		}
	}
	return Event{}, s.ended
}

// run connects, reads and reconnects until the context ends or an error ends the stream.
func (s *EventStream) run() {
	defer close(s.items)
	defer s.drop()
	for s.ctx.Err() == nil {
		if s.body == nil {
			if err := s.connect(); err != nil {
				s.push(item{err: err})
				return
			}
			continue
		}
		s.read()
	}
}

// push hands it to Next; false when the stream was closed first.
func (s *EventStream) push(it item) bool {
	select {
	case s.items <- it:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// connect opens a connection (after the backoff, when one is due); an error is one that
// ends the stream.
func (s *EventStream) connect() error {
	if s.pause {
		s.pause = false
		s.sleep()
	}
	body, err := s.open()
	var pe *ProblemError
	switch {
	case err == nil:
		s.body, s.parser = body, &sseParser{}
	case s.ctx.Err() != nil:
	case errors.As(err, &pe) && pe.Status != 429 && pe.Status < 500:
		return err
	default:
		s.c.logf("leaseproxy: watch: %v (reconnecting)", err)
		s.sleep()
	}
	return nil
}

// open is GET /v1/watch, resuming after the last id; the answer's body, read with an idle
// deadline (each read pushes it on).
func (s *EventStream) open() (io.ReadCloser, error) {
	cctx, cancel := context.WithCancel(s.ctx)
	q := url.Values{}
	if s.prefix != "" {
		q.Set("prefix", s.prefix)
	}
	h := http.Header{"Accept": {"text/event-stream"}}
	if id := s.readID; id != "" {
		h.Set("Last-Event-ID", id)
	}
	req, err := s.c.newRequest(cctx, call{method: http.MethodGet, path: "/v1/watch", query: q, header: h})
	if err != nil {
		cancel()
		return nil, err
	}
	connect := time.AfterFunc(s.c.opts.Timeout, cancel)
	resp, err := s.c.http.Do(req)
	connect.Stop()
	if err != nil {
		cancel()
		return nil, &TransportError{Method: "GET", Path: "/v1/watch", Err: unwrapURLError(err)}
	}
	if resp.StatusCode != http.StatusOK {
		body, rerr := readLimited(resp, call{method: "GET", path: "/v1/watch"})
		resp.Body.Close()
		cancel()
		if rerr != nil {
			return nil, rerr
		}
		return nil, problemFrom(resp.StatusCode, resp.Header, body)
	}
	s.idle = time.AfterFunc(watchIdle, cancel)
	return &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}, nil
}

// read takes one chunk of the connection; a failure, the end or an overflow drops it.
func (s *EventStream) read() {
	buf := make([]byte, 32<<10)
	n, err := s.body.Read(buf)
	if n > 0 {
		s.idle.Reset(watchIdle)
		for _, m := range s.parser.feed(buf[:n]) {
			s.receive(m)
		}
		if s.parser.overflowed {
			s.drop()
			s.push(item{err: protocolErr(0, "watch: an event-stream line or message over %d bytes", maxLine)})
			s.pause = true
			return
		}
	}
	if err != nil {
		s.drop()
		if s.ctx.Err() == nil {
			s.sleep()
		}
	}
}

func (s *EventStream) drop() {
	if s.body != nil {
		s.idle.Stop()
		s.body.Close()
		s.body, s.parser = nil, nil
	}
}

// receive takes in one message: its id is the resume point, its data an event. The resume
// point of the connection (readID) moves at once; LastEventID when Next gets there.
func (s *EventStream) receive(m sseMessage) {
	if !m.hasID {
		return // the proxy ids every message: anything else is not one of its events
	}
	pos, ok := parsePosition(m.id)
	if ok && s.readID != "" && !s.readPos.before(pos) {
		if m.hasData {
			s.push(item{err: protocolErr(0, "watch: message %q after %q: out of order", m.id, s.readID)})
		}
		return
	}
	s.readID, s.readPos = m.id, pos
	if !m.hasData {
		s.push(item{progress: m.id})
		return
	}
	s.backoff = watchFirstBackoff // an event (even a malformed one): this connection works
	ev, err := parseEvent(m.id, m.data)
	if err != nil {
		err = fmt.Errorf("watch: message %q: %w", m.id, err)
	}
	s.push(item{ev: ev, err: err})
}

func (s *EventStream) sleep() {
	sleepCtx(s.ctx, s.backoff)
	if s.backoff *= 2; s.backoff > watchMaxBackoff {
		s.backoff = watchMaxBackoff
	}
}

// position orders message ids: "R.N" is the Nth event of revision R, "R" is past all of
// revision R (the stream's start, a quiet stream's progress).
type position struct{ rev, seq uint64 }

func parsePosition(id string) (position, bool) {
	revText, seqText, hasSeq := strings.Cut(id, ".")
	rev, err := strconv.ParseUint(revText, 10, 64)
	if err != nil {
		return position{}, false
	}
	p := position{rev: rev, seq: ^uint64(0)}
	if hasSeq {
		if p.seq, err = strconv.ParseUint(seqText, 10, 64); err != nil || p.seq == ^uint64(0) {
			return position{}, false
		}
	}
	return p, true
}

func (p position) before(q position) bool {
	return p.rev < q.rev || (p.rev == q.rev && p.seq < q.seq)
}

// cancelOnClose cancels the request's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}
