package stack

import (
	"io"
	"net"
	"sync"
)

// Relay is a TCP relay in front of a server. With DropFirstAnswer, the first connection is
// closed when the server's first answer on it arrives, which is not passed on: the server
// acted on the request and its answer is lost.
type Relay struct {
	URL string

	l      net.Listener
	target string
	mu     sync.Mutex
	drop   bool
	conns  []net.Conn
}

// NewRelay listens on a free loopback port and relays to target (host:port).
func NewRelay(target string, dropFirstAnswer bool) (*Relay, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{URL: "http://" + l.Addr().String(), l: l, target: target, drop: dropFirstAnswer}
	go r.accept()
	return r, nil
}

func (r *Relay) accept() {
	for {
		down, err := r.l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			down.Close()
			continue
		}
		r.mu.Lock()
		drop := r.drop
		r.drop = false
		r.conns = append(r.conns, down, up)
		r.mu.Unlock()
		go pipe(up, down, false)
		go pipe(down, up, drop)
	}
}

// pipe copies src to dst; with drop, the first bytes from src end both connections instead.
func pipe(dst, src net.Conn, drop bool) {
	if drop {
		buf := make([]byte, 1)
		_, _ = src.Read(buf)
	} else {
		_, _ = io.Copy(dst, src)
	}
	dst.Close()
	src.Close()
}

// Close stops the relay and its connections.
func (r *Relay) Close() {
	r.l.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
}
