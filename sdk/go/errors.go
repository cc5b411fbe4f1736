package leaseproxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ProblemBase starts every problem type URI of lease-proxy and fence-gateway.
const ProblemBase = "https://lease-proxy.dev/problems/"

// Sentinel errors, for errors.Is. The values returned are richer (*ProblemError, *LostError,
// *ProtocolError) and match these.
var (
	// ErrHeld: the resource is held by someone else (409 lease-held).
	ErrHeld = errors.New("leaseproxy: held by another holder")
	// ErrLost: the lease is gone (410 lease-lost or session-lost, or the client saw it end:
	// every *LostError matches it).
	ErrLost = errors.New("leaseproxy: lease lost")
	// ErrSessionLost: the session ended (410 session-lost, or a lease lost with its session).
	ErrSessionLost = errors.New("leaseproxy: session lost")
	// ErrNotFound: the resource is free (404 not-found), the session is gone (404 no-session),
	// or there is no such fleet or member (404 no-fleet, no-member).
	ErrNotFound = errors.New("leaseproxy: not found")
	// ErrCompacted: a watch's resume point left etcd's history (410 events-compacted): list
	// again and watch without a last event id.
	ErrCompacted = errors.New("leaseproxy: watch resume point compacted")
	// ErrStaleToken: the enforcer refused the fencing token as below its mark (409
	// stale-fencing-token at fence-gateway, SQLSTATE 23F01 in PostgreSQL).
	ErrStaleToken = errors.New("leaseproxy: stale fencing token")
	// ErrProtocol: the server answered something that is not lease-proxy's API.
	ErrProtocol = errors.New("leaseproxy: protocol error")
)

// ProblemError is an error answer of the proxy (application/problem+json, RFC 9457). It
// matches ErrHeld, ErrLost, ErrSessionLost, ErrNotFound, ErrCompacted and ErrStaleToken by
// its type.
type ProblemError struct {
	Status int
	// Type is the problem type URI (ProblemBase + slug).
	Type   string
	Title  string
	Detail string
	// Holder, HolderToken and ExpiresIn are the current holder's, for 409 lease-held.
	Holder      string
	HolderToken uint64
	ExpiresIn   time.Duration
	// RetryAfter is the Retry-After header's wait (0 when absent).
	RetryAfter time.Duration
	// Body is the answer's body as received (at most 1 MiB).
	Body []byte
}

// Slug is the last segment of the problem type ("lease-held", "forbidden", …).
func (e *ProblemError) Slug() string {
	return strings.TrimPrefix(e.Type, ProblemBase)
}

func (e *ProblemError) Error() string {
	msg := fmt.Sprintf("leaseproxy: %d %s", e.Status, e.Slug())
	if e.Slug() == "lease-held" {
		msg += fmt.Sprintf(" by %q (token %d) for up to %s more", e.Holder, e.HolderToken, e.ExpiresIn)
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// Is matches the sentinels by the problem's type.
func (e *ProblemError) Is(target error) bool {
	switch e.Slug() {
	case "lease-held":
		return target == ErrHeld
	case "lease-lost":
		return target == ErrLost
	case "session-lost":
		return target == ErrLost || target == ErrSessionLost
	case "not-found", "no-session", "no-fleet", "no-member":
		return target == ErrNotFound
	case "events-compacted":
		return target == ErrCompacted
	case "stale-fencing-token":
		return target == ErrStaleToken
	}
	return false
}

// transient reports whether retrying the same request may succeed: the proxy, or etcd or the
// upstream behind it, was briefly unavailable.
func (e *ProblemError) transient() bool {
	return e.Status == http.StatusBadGateway || e.Status == http.StatusServiceUnavailable ||
		e.Status == http.StatusGatewayTimeout
}

// ProtocolError: the server answered something that is not lease-proxy's API (a body that is
// not JSON, a field missing or of the wrong type, a grant for another resource, an answer over
// 1 MiB, a malformed event). It matches ErrProtocol.
type ProtocolError struct {
	// Status of the answer (0 when there was none, as in an event stream).
	Status int
	Msg    string
}

func (e *ProtocolError) Error() string {
	if e.Status == 0 {
		return "leaseproxy: protocol: " + e.Msg
	}
	return fmt.Sprintf("leaseproxy: protocol: %d answer: %s", e.Status, e.Msg)
}

// Is matches ErrProtocol.
func (e *ProtocolError) Is(target error) bool { return target == ErrProtocol }

func protocolErr(status int, format string, args ...any) error {
	return &ProtocolError{Status: status, Msg: fmt.Sprintf(format, args...)}
}

// TransportError: the request could not be sent or its answer read (connection refused or
// reset, TLS, a timeout). Unwrap gives the cause (context.DeadlineExceeded for a timeout).
type TransportError struct {
	Method, Path string
	Err          error
}

func (e *TransportError) Error() string {
	return fmt.Sprintf("leaseproxy: %s %s: %v", e.Method, e.Path, e.Err)
}

func (e *TransportError) Unwrap() error { return e.Err }

// IsTransient reports whether retrying the same request may succeed: a transport error or a
// 502–504 answer. An acquire with an IdempotencyKey retries these by itself.
func IsTransient(err error) bool {
	var te *TransportError
	var pe *ProblemError
	return errors.As(err, &te) || (errors.As(err, &pe) && pe.transient())
}

// problemBody is what a problem+json answer may carry that the client reads.
type problemBody struct {
	Type        string          `json:"type"`
	Title       string          `json:"title"`
	Detail      string          `json:"detail"`
	Holder      *string         `json:"holder"`
	Token       *string         `json:"token"`
	ExpiresInMS json.RawMessage `json:"expires_in_ms"`
}

// problemFrom is the error for a non-2xx answer: a *ProblemError, or a *ProtocolError for a
// lease-held answer whose holder and token do not parse (a 409 that cannot be told apart from
// a bug must not look like an ordinary conflict).
func problemFrom(status int, header http.Header, body []byte) error {
	var p problemBody
	if err := json.Unmarshal(body, &p); err != nil || p.Type == "" {
		return &ProblemError{Status: status, Title: http.StatusText(status), Detail: excerpt(body),
			RetryAfter: retryAfter(header), Body: body}
	}
	e := &ProblemError{Status: status, Type: p.Type, Title: p.Title, Detail: p.Detail,
		RetryAfter: retryAfter(header), Body: body}
	if e.Slug() != "lease-held" {
		return e
	}
	if p.Holder == nil || p.Token == nil {
		return protocolErr(status, "lease-held without a holder and a token: %s", excerpt(body))
	}
	token, err := strconv.ParseUint(*p.Token, 10, 64)
	if err != nil {
		return protocolErr(status, "lease-held with token %q", *p.Token)
	}
	e.Holder, e.HolderToken = *p.Holder, token
	if ms, err := strconv.ParseUint(string(p.ExpiresInMS), 10, 63); err == nil {
		e.ExpiresIn = capDuration(ms)
	}
	return e
}

// retryAfter reads a Retry-After of whole seconds (0 when absent or not a small number).
func retryAfter(h http.Header) time.Duration {
	s, err := strconv.ParseUint(strings.TrimSpace(h.Get("Retry-After")), 10, 32)
	if err != nil || s > 3600 {
		return 0
	}
	return time.Duration(s) * time.Second
}

// excerpt is the first 500 bytes of body, for a message.
func excerpt(body []byte) string {
	if len(body) > 500 {
		body = body[:500]
	}
	return strings.ToValidUTF8(string(body), "?")
}
