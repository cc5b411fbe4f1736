package leaseproxy

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Header names of the fencing token and its resource (DESIGN §3).
const (
	HeaderFencingToken    = "Fencing-Token"
	HeaderFencingResource = "Fencing-Resource"
)

// Transport is an http.RoundTripper that adds the Fencing-Token and Fencing-Resource of the
// lease in each request's context (Lease.Context, Bind, WithLease, ContextWithLease), so every
// write the application makes to a fenced store carries the token without code of its own.
// A request whose context carries a lost lease is not sent: RoundTrip returns the lease's
// *LostError. A request without a lease passes unchanged.
type Transport struct {
	// Base sends the requests (nil: http.DefaultTransport).
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	l := LeaseFromContext(req.Context())
	if l == nil {
		return base.RoundTrip(req)
	}
	if err := l.Err(); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	if l.c.chaos.fire(FaultTokenRefusal, l.Resource()) {
		if req.Body != nil {
			req.Body.Close()
		}
		return injectedRefusal(req, l.Resource()), nil
	}
	out := req.Clone(req.Context())
	out.Header.Del("X-Fencing-Token") // two token headers are refused: ours is the one
	out.Header.Set(HeaderFencingToken, l.FencingToken())
	out.Header.Set(HeaderFencingResource, l.Resource())
	return base.RoundTrip(out)
}

// NewHTTPClient is an *http.Client whose requests carry the fencing token of the lease in
// their context (see Transport), sent by base (nil: http.DefaultTransport).
func NewHTTPClient(base http.RoundTripper) *http.Client {
	return &http.Client{Transport: &Transport{Base: base}}
}

// Forward sends a request through the proxy's forward route to its upstream, which receives
// it with this grant's Fencing-Token and Fencing-Resource (set by the proxy). It refuses with
// the *LostError, without sending, once the lease is lost. The answer is the upstream's,
// whatever its status — but the proxy's own 410 lease-lost (or 403 not-holder) also loses the
// lease (ReasonRevoked). The caller closes the answer's body.
func (l *Lease) Forward(ctx context.Context, method, path string, body io.Reader, header http.Header) (*http.Response, error) {
	if err := l.Err(); err != nil {
		return nil, err
	}
	h := secretHeader(l.grant.Secret)
	for k, v := range header {
		h[k] = v
	}
	cl := call{method: method, path: leasePath(l.grant.Resource) + "/forward/" + strings.TrimPrefix(path, "/"),
		header: h, raw: body}
	req, err := l.c.newRequest(ctx, cl)
	if err != nil {
		return nil, err
	}
	resp, err := l.c.http.Do(req)
	if err != nil {
		return nil, &TransportError{Method: method, Path: cl.path, Err: unwrapURLError(err)}
	}
	l.noticeRefusal(resp)
	return resp, nil
}

// noticeRefusal loses the lease when resp is the proxy's own refusal to forward for it
// (problem+json lease-lost or not-holder); the body stays readable.
func (l *Lease) noticeRefusal(resp *http.Response) {
	if (resp.StatusCode != http.StatusGone && resp.StatusCode != http.StatusForbidden) ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") ||
		resp.Header.Get("Fencing-Rejection") != "" {
		return
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	var pe *ProblemError
	if errors.As(problemFrom(resp.StatusCode, resp.Header, body), &pe) &&
		(pe.Slug() == "lease-lost" || pe.Slug() == "not-holder") {
		l.live.lose(&LostError{Reason: ReasonRevoked, Err: pe})
	}
}

// AdmitSQL is the statement Admit runs: the in-database package's admit (docs/POSTGRES.md).
const AdmitSQL = "SELECT fencing.admit($1, $2)"

// Admit runs SELECT fencing.admit(resource, fencing token) inside the caller's transaction,
// for lease (nil: the lease in ctx): the database refuses a stale, forged or misdirected token
// and holds the lock that orders this transaction against a newer holder's until tx ends, so
// the caller's statements in tx commit only if the token was admitted. It returns the mark
// ("era:revision"). A lost lease is refused without asking the database; a refusal the driver
// reports with SQLSTATE 23F01 matches ErrStaleToken.
func Admit(ctx context.Context, tx *sql.Tx, lease *Lease) (string, error) {
	if lease == nil {
		lease = LeaseFromContext(ctx)
	}
	if lease == nil {
		return "", errors.New("leaseproxy: Admit: no lease given and none in the context")
	}
	if err := lease.Err(); err != nil {
		return "", err
	}
	if lease.c.chaos.fire(FaultTokenRefusal, lease.Resource()) {
		return "", &AdmitError{SQLState: "23F01", Err: errInjected}
	}
	var mark string
	if err := tx.QueryRowContext(ctx, AdmitSQL, lease.Resource(), lease.FencingToken()).Scan(&mark); err != nil {
		return "", &AdmitError{SQLState: sqlState(err), Err: err}
	}
	return mark, nil
}

// AdmitError is a refused or failed Admit: SQLSTATE 23F01 (stale, matches ErrStaleToken),
// 28F0x (forged, misdirected, unknown key), or whatever else the driver reported.
type AdmitError struct {
	// SQLState is the driver's SQLSTATE, when it exposes one (a SQLState() string method).
	SQLState string
	Err      error
}

func (e *AdmitError) Error() string {
	if e.SQLState != "" {
		return fmt.Sprintf("leaseproxy: fencing.admit refused (SQLSTATE %s): %v", e.SQLState, e.Err)
	}
	return fmt.Sprintf("leaseproxy: fencing.admit: %v", e.Err)
}

// Is matches ErrStaleToken for SQLSTATE 23F01.
func (e *AdmitError) Is(target error) bool { return target == ErrStaleToken && e.SQLState == "23F01" }

func (e *AdmitError) Unwrap() error { return e.Err }

// sqlState is the SQLSTATE of a driver's error, for drivers whose errors have a SQLState()
// method (pgx, lib/pq).
func sqlState(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}
