package leaseproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// Options configure a Client. The zero value talks plain HTTP with a 10 s timeout.
type Options struct {
	// Holder is the default holder name of acquires and sessions (default: host name and pid).
	Holder string
	// BearerToken is sent as Authorization: Bearer (the proxy's --auth-tokens).
	BearerToken string
	// CAFile is a PEM bundle trusted in addition to the system's roots.
	CAFile string
	// CertFile and KeyFile are a client certificate and its key (PEM), for mTLS.
	CertFile, KeyFile string
	// TLSConfig, when set, is used as it is instead of CAFile, CertFile and KeyFile.
	TLSConfig *tls.Config
	// HTTPClient, when set, sends every request (its Transport carries TLS; its Timeout should
	// be 0: the client bounds each request itself, and an event stream stays open).
	HTTPClient *http.Client
	// Timeout bounds one request (default 10 s); an acquire adds its Wait.
	Timeout time.Duration
	// TTL is the default lease and session TTL (default 10 s).
	TTL time.Duration
	// SafetyMargin is how long before the server's earliest possible expiry the stop-by
	// deadline falls (default: a tenth of the lifetime granted, at least 100 ms): time for the
	// work to notice the cancellation and stop.
	SafetyMargin time.Duration
	// WatchPrefix is the prefix of the client's one shared /v1/watch stream, which reports a
	// lease's loss as soon as the server sees it (default "": every resource it may read).
	WatchPrefix string
	// NoLossWatch turns that stream off: loss is then learnt from renewals and the deadline.
	NoLossWatch bool
	// TestMode injects faults (see TestMode). Never set it in production.
	TestMode *TestMode
	// UserAgent is the User-Agent header (default "leaseproxy-go/" + Version).
	UserAgent string
	// Logger receives what background work could not report otherwise (nil: silent).
	Logger *log.Logger
}

// Version of this client.
const Version = "0.1.0"

const (
	defaultTimeout = 10 * time.Second
	defaultTTL     = 10 * time.Second
	// maxBody bounds the body of an answer of the API (not a forwarded request's).
	maxBody = 1 << 20
	// headerSecret carries a grant's or a session's secret.
	headerSecret = "Lease-Secret"
)

// Client talks to one lease-proxy (or a load balancer in front of replicas). Safe for
// concurrent use; Close stops its background work.
type Client struct {
	base  *url.URL
	http  *http.Client
	opts  Options
	feed  *lossFeed
	chaos *chaos

	mu     sync.Mutex
	closed bool
}

// New makes a client of the proxy at baseURL (http:// or https://).
func New(baseURL string, opts Options) (*Client, error) {
	base, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("leaseproxy: base URL %q: want http(s)://host[:port]", baseURL)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = defaultTimeout
	}
	if opts.TTL <= 0 {
		opts.TTL = defaultTTL
	}
	if opts.Holder == "" {
		host, _ := os.Hostname()
		opts.Holder = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if opts.UserAgent == "" {
		opts.UserAgent = "leaseproxy-go/" + Version
	}
	var hc *http.Client
	if opts.HTTPClient != nil {
		copied := *opts.HTTPClient
		hc = &copied
	} else if hc, err = httpClient(opts); err != nil {
		return nil, err
	}
	// A redirect is answered, never followed: following one would send Lease-Secret (and a
	// request the proxy must see) wherever a server points.
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c := &Client{base: base, http: hc, opts: opts, chaos: newChaos(opts.TestMode)}
	c.feed = newLossFeed(c)
	return c, nil
}

// httpClient is a client with the TLS settings of opts and no overall timeout.
func httpClient(opts Options) (*http.Client, error) {
	cfg := opts.TLSConfig
	if cfg == nil && (opts.CAFile != "" || opts.CertFile != "" || opts.KeyFile != "") {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		if opts.CAFile != "" {
			pool, err := x509.SystemCertPool()
			if err != nil {
				pool = x509.NewCertPool()
			}
			pem, err := os.ReadFile(opts.CAFile)
			if err != nil {
				return nil, fmt.Errorf("leaseproxy: CA file: %w", err)
			}
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("leaseproxy: CA file %s: no certificate in it", opts.CAFile)
			}
			cfg.RootCAs = pool
		}
		if opts.CertFile != "" || opts.KeyFile != "" {
			pair, err := tls.LoadX509KeyPair(opts.CertFile, opts.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("leaseproxy: client certificate: %w", err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	tr.MaxIdleConnsPerHost = 16
	return &http.Client{Transport: tr}, nil
}

// Close stops the client's background work (its event stream, the renewals of leases and
// sessions it still has: they then end at their deadlines) and closes idle connections.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.feed.close()
	c.http.CloseIdleConnections()
	return nil
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *Client) logf(format string, args ...any) {
	if c.opts.Logger != nil {
		c.opts.Logger.Printf(format, args...)
	}
}

// call is one request of the API.
type call struct {
	method, path string
	query        url.Values
	header       http.Header
	// body is marshalled as JSON when not nil; raw is sent as it is.
	body    any
	raw     io.Reader
	timeout time.Duration
}

// answer is a 2xx answer, its body read in full (at most maxBody).
type answer struct {
	status int
	header http.Header
	body   []byte
}

// newRequest is the request of cl with the client's headers, bound to ctx.
func (c *Client) newRequest(ctx context.Context, cl call) (*http.Request, error) {
	target := c.base.String() + cl.path
	if cl.query != nil {
		target += "?" + cl.query.Encode()
	}
	body := cl.raw
	if cl.body != nil {
		b, err := json.Marshal(cl.body)
		if err != nil {
			return nil, fmt.Errorf("leaseproxy: %s %s: %w", cl.method, cl.path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, target, body)
	if err != nil {
		return nil, fmt.Errorf("leaseproxy: %s %s: %w", cl.method, cl.path, err)
	}
	for k, v := range cl.header {
		req.Header[k] = v
	}
	if cl.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c.authorize(req)
	return req, nil
}

func (c *Client) authorize(req *http.Request) {
	req.Header.Set("User-Agent", c.opts.UserAgent)
	if c.opts.BearerToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.BearerToken)
	}
}

// do sends cl and reads its answer: a non-2xx answer becomes its error (*ProblemError or
// *ProtocolError), a failure to send or read a *TransportError, a body over maxBody a
// *ProtocolError.
func (c *Client) do(ctx context.Context, cl call) (*answer, error) {
	timeout := cl.timeout
	if timeout <= 0 {
		timeout = c.opts.Timeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := c.newRequest(ctx, cl)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, &TransportError{Method: cl.method, Path: cl.path, Err: unwrapURLError(err)}
	}
	defer resp.Body.Close()
	body, err := readLimited(resp, cl)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, problemFrom(resp.StatusCode, resp.Header, body)
	}
	return &answer{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

// readLimited reads resp's body, refusing it past maxBody without reading the rest; a body
// cut short (the connection ended before Content-Length) is a *TransportError.
func readLimited(resp *http.Response, cl call) ([]byte, error) {
	if resp.ContentLength > maxBody {
		return nil, protocolErr(resp.StatusCode, "body of %d bytes, over %d", resp.ContentLength, maxBody)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, &TransportError{Method: cl.method, Path: cl.path, Err: fmt.Errorf("reading the %d answer: %w", resp.StatusCode, err)}
	}
	if len(body) > maxBody {
		return nil, protocolErr(resp.StatusCode, "body over %d bytes", maxBody)
	}
	return body, nil
}

// unwrapURLError drops net/http's *url.Error wrapper (its message repeats the URL).
func unwrapURLError(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// segment is value as one URL path segment: letters, digits and ._:- as they are, every
// other byte %XX, so the proxy sees the name as given (x/../victim stays one segment). The
// names a URL cannot carry as a segment ("", ".", "..") are sent as "...", which the proxy
// refuses as it refuses them.
func segment(value string) string {
	if value == "" || value == "." || value == ".." {
		return "..."
	}
	var b strings.Builder
	for i := 0; i < len(value); i++ {
		ch := value[i]
		if ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' ||
			ch == '.' || ch == '_' || ch == ':' || ch == '-' {
			b.WriteByte(ch)
		} else {
			fmt.Fprintf(&b, "%%%02X", ch)
		}
	}
	return b.String()
}

func leasePath(resource string) string { return "/v1/leases/" + segment(resource) }

func sessionPath(id string) string { return "/v1/sessions/" + segment(id) }

func secretHeader(secret string) http.Header {
	return http.Header{headerSecret: {secret}}
}
