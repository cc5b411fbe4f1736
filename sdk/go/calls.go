package leaseproxy

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"time"
)

const (
	// idempotentAttempts is how often an acquire with an Idempotency-Key is sent at most when
	// it fails transiently, with idempotentBackoff (doubled) between attempts.
	idempotentAttempts = 4
	idempotentBackoff  = 100 * time.Millisecond
)

// NewIdempotencyKey is a random key for AcquireOptions.IdempotencyKey (128 bits, base64url).
func NewIdempotencyKey() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		// crypto/rand does not fail on supported platforms; a time-based key still works,
		// only guessably.
		return "t" + time.Now().Format("20060102T150405.000000000")
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// acquireRequest is what an acquire sends, with or without a session.
type acquireRequest struct {
	holder   string
	ttl      time.Duration
	wait     time.Duration
	key      string
	metadata map[string]any
	// session and secret name the session and prove it.
	session, secret string
}

func (r acquireRequest) body() map[string]any {
	b := map[string]any{"holder": r.holder}
	if r.session == "" {
		b["ttl_seconds"] = wholeSeconds(r.ttl)
	} else {
		b["session"] = r.session
	}
	if r.wait > 0 {
		b["wait_ms"] = r.wait.Milliseconds()
	}
	if r.metadata != nil {
		b["metadata"] = r.metadata
	}
	return b
}

// wholeSeconds is d in whole seconds, rounded up.
func wholeSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// Grant acquires resource once and returns the grant without keeping it (the caller renews
// and releases it; Acquire returns a Lease that does).
func (c *Client) Grant(ctx context.Context, resource string, opts *AcquireOptions) (*Grant, error) {
	o := c.acquireDefaults(opts)
	g, _, err := c.grant(ctx, resource, acquireRequest{
		holder: o.Holder, ttl: o.TTL, wait: o.Wait, key: o.IdempotencyKey, metadata: o.Metadata})
	return g, err
}

// grant is POST /v1/leases/{resource}, retried with its idempotency key when it has one, and
// the instant read just before sending the attempt that succeeded.
func (c *Client) grant(ctx context.Context, resource string, r acquireRequest) (*Grant, time.Time, error) {
	header := http.Header{}
	if r.key != "" {
		header.Set("Idempotency-Key", r.key)
	}
	if r.secret != "" {
		header.Set(headerSecret, r.secret)
	}
	cl := call{method: http.MethodPost, path: leasePath(resource), header: header, body: r.body(),
		timeout: c.opts.Timeout + r.wait}
	backoff := idempotentBackoff
	for attempt := 1; ; attempt++ {
		sent := time.Now()
		a, err := c.do(ctx, cl)
		if err == nil {
			if a.status != http.StatusCreated {
				return nil, sent, protocolErr(a.status, "an acquire answered %d, not 201", a.status)
			}
			g, err := parseGrant(a.status, a.body, resource)
			return g, sent, err
		}
		if r.key == "" || attempt >= idempotentAttempts || !IsTransient(err) || ctx.Err() != nil {
			return nil, sent, err
		}
		if !sleepCtx(ctx, backoff) {
			return nil, sent, err
		}
		backoff *= 2
	}
}

// Renew renews the grant of resource proven by secret once. ErrLost when it has ended.
func (c *Client) Renew(ctx context.Context, resource, secret string) (*Renewal, error) {
	a, err := c.do(ctx, call{method: http.MethodPost, path: leasePath(resource) + "/renew",
		header: secretHeader(secret)})
	if err != nil {
		return nil, err
	}
	return parseRenewal(a.status, a.body)
}

// Release releases the grant of resource proven by secret. Idempotent: releasing a grant
// that has ended succeeds.
func (c *Client) Release(ctx context.Context, resource, secret string) error {
	_, err := c.do(ctx, call{method: http.MethodDelete, path: leasePath(resource),
		header: secretHeader(secret)})
	return err
}

// Get is who holds resource; ErrNotFound when it is free.
func (c *Client) Get(ctx context.Context, resource string) (*Holding, error) {
	a, err := c.do(ctx, call{method: http.MethodGet, path: leasePath(resource)})
	if err != nil {
		return nil, err
	}
	return parseHolding(a.status, a.body)
}

// List is every held resource whose name starts with prefix, in name order (all pages).
func (c *Client) List(ctx context.Context, prefix string) ([]Holding, error) {
	var all []Holding
	cursor := ""
	for {
		q := url.Values{"prefix": {prefix}, "limit": {"1000"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		a, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/leases", query: q})
		if err != nil {
			return nil, err
		}
		var page struct {
			Leases     []json.RawMessage `json:"leases"`
			NextCursor *string           `json:"next_cursor"`
		}
		if err := json.Unmarshal(a.body, &page); err != nil || page.Leases == nil {
			return nil, protocolErr(a.status, "not a page of leases: %s", excerpt(a.body))
		}
		for _, raw := range page.Leases {
			h, err := parseHolding(a.status, raw)
			if err != nil {
				return nil, err
			}
			all = append(all, *h)
		}
		if page.NextCursor == nil || *page.NextCursor == "" {
			return all, nil
		}
		if *page.NextCursor == cursor {
			return nil, protocolErr(a.status, "the next cursor is the cursor asked for")
		}
		cursor = *page.NextCursor
	}
}

// sleepCtx waits d; false when ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// errInjected is the cause of every fault the test mode injects.
var errInjected = errors.New("injected by the test mode")
