package leaseproxy

import (
	"context"
	"errors"
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
// returned.
type EventStream struct {
	c      *Client
	ctx    context.Context
	cancel context.CancelFunc
	prefix string

	mu      sync.Mutex
	lastID  string
	lastPos position
	body    io.ReadCloser
	idle    *time.Timer
	parser  *sseParser
	ready   []item
	backoff time.Duration
	pause   bool
	ended   error
}

type item struct {
	ev  Event
	err error
}

// Watch opens the event stream of resources under prefix ("" for all the caller may read),
// resuming after lastEventID when it is not "". Nothing is sent before the first Next.
func (c *Client) Watch(ctx context.Context, prefix, lastEventID string) *EventStream {
	ctx, cancel := context.WithCancel(ctx)
	s := &EventStream{c: c, ctx: ctx, cancel: cancel, prefix: prefix, lastID: lastEventID,
		backoff: watchFirstBackoff}
	s.lastPos, _ = parsePosition(lastEventID)
	return s
}

// LastEventID is the resume point: the id of the last complete message of any kind.
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
	for {
		if len(s.ready) > 0 {
			it := s.ready[0]
			s.ready = s.ready[1:]
			return it.ev, it.err
		}
		if s.ended != nil {
			return Event{}, s.ended
		}
		if err := s.ctx.Err(); err != nil {
			s.drop()
			s.ended = err
			continue
		}
		if s.body == nil {
			s.connect()
			continue
		}
		s.read()
	}
}

// connect opens a connection (after the backoff, when one is due).
func (s *EventStream) connect() {
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
		s.ended = err
	default:
		s.c.logf("leaseproxy: watch: %v (reconnecting)", err)
		s.sleep()
	}
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
	if id := s.LastEventID(); id != "" {
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
			s.ready = append(s.ready, item{err: protocolErr(0, "watch: an event-stream line or message over %d bytes", maxLine)})
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

// receive takes in one message: its id is the resume point, its data an event.
func (s *EventStream) receive(m sseMessage) {
	if !m.hasID {
		return // the proxy ids every message: anything else is not one of its events
	}
	pos, ok := parsePosition(m.id)
	if ok && !s.lastPos.before(pos) && s.lastID != "" {
		if m.hasData {
			s.ready = append(s.ready, item{err: protocolErr(0, "watch: message %q after %q: out of order", m.id, s.lastID)})
		}
		return
	}
	s.mu.Lock()
	s.lastID, s.lastPos = m.id, pos
	s.mu.Unlock()
	if !m.hasData {
		return
	}
	s.backoff = watchFirstBackoff // an event (even a malformed one): this connection works
	ev, err := parseEvent(m.id, m.data)
	s.ready = append(s.ready, item{ev: ev, err: err})
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
