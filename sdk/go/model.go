package leaseproxy

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// maxLifetime bounds what one answer may grant (2^31 s): beyond any real TTL, keeps every
// timer finite whatever a server says.
const maxLifetime = time.Duration(1<<31) * time.Second

// Grant is a successful acquire (201): the only answer that carries the secret.
type Grant struct {
	Resource string
	Holder   string
	// LeaseID is the etcd lease id (decimal); the session id under a session.
	LeaseID string
	// Secret proves holding: renew, release and forward with it (header Lease-Secret).
	Secret string
	// Token is the ownership key's etcd create revision: larger for every later grant.
	Token uint64
	// FencingToken is Token signed for Resource, for the Fencing-Token header.
	FencingToken string
	TTLSeconds   uint64
	// ExpiresIn is how long the grant lasts at least, from when the request reached the proxy.
	ExpiresIn time.Duration
	// Session is the session the grant lives on ("" for none).
	Session  string
	Metadata json.RawMessage
}

// Renewal is a successful renewal (200).
type Renewal struct {
	TTLSeconds uint64
	ExpiresIn  time.Duration
	Token      uint64
}

// Holding is a held resource as GET /v1/leases shows it (never a secret).
type Holding struct {
	Resource   string
	Holder     string
	Token      uint64
	LeaseID    string
	TTLSeconds uint64
	// ExpiresIn is the remaining lifetime: etcd's for one resource; in a list, the grant's TTL.
	ExpiresIn time.Duration
	// AcquiredAt is the wall-clock grant time (for display only).
	AcquiredAt time.Time
	Session    string
	Metadata   json.RawMessage
}

// fields reads a JSON object answer strictly: every field named in want must be present and
// not null, numbers are kept as text.
type fields map[string]json.RawMessage

func decodeObject(status int, body []byte, want ...string) (fields, error) {
	var f fields
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&f); err != nil || f == nil {
		return nil, protocolErr(status, "not a JSON object: %s", excerpt(body))
	}
	if dec.More() {
		return nil, protocolErr(status, "more than one JSON value")
	}
	for _, name := range want {
		if v, ok := f[name]; !ok || string(v) == "null" {
			return nil, protocolErr(status, "no %q in %s", name, excerpt(body))
		}
	}
	return f, nil
}

func (f fields) str(status int, name string) (string, error) {
	v, ok := f[name]
	if !ok || string(v) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", protocolErr(status, "%q is not a string: %s", name, excerpt(v))
	}
	return s, nil
}

// decimal reads a 64-bit number the API writes as a decimal string.
func (f fields) decimal(status int, name string) (uint64, error) {
	s, err := f.str(status, name)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, protocolErr(status, "%q is not a decimal: %q", name, s)
	}
	return n, nil
}

// count reads a JSON integer; a negative one is 0 (grants no time), a fraction or another
// type is a protocol error, one too large for 63 bits is the largest.
func (f fields) count(status int, name string) (uint64, error) {
	raw := strings.TrimSpace(string(f[name]))
	if strings.HasPrefix(raw, "-") {
		if _, err := strconv.ParseInt(raw, 10, 64); err == nil || isRange(err) {
			return 0, nil
		}
	}
	n, err := strconv.ParseUint(raw, 10, 63)
	if isRange(err) {
		return 1<<63 - 1, nil
	}
	if err != nil {
		return 0, protocolErr(status, "%q is not a whole number: %s", name, excerpt(f[name]))
	}
	return n, nil
}

func isRange(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

// capDuration is ms milliseconds, at most maxLifetime.
func capDuration(ms uint64) time.Duration {
	if ms >= uint64(maxLifetime/time.Millisecond) {
		return maxLifetime
	}
	return time.Duration(ms) * time.Millisecond
}

// parseGrant reads a 201 answer to an acquire of resource, refusing one that is not a grant of
// it: a reordered or misdirected answer must never become a lease.
func parseGrant(status int, body []byte, resource string) (*Grant, error) {
	f, err := decodeObject(status, body, "resource", "holder", "lease_id", "secret", "token",
		"fencing_token", "ttl_seconds", "expires_in_ms")
	if err != nil {
		return nil, err
	}
	g := &Grant{Metadata: f["metadata"]}
	for name, dst := range map[string]*string{"resource": &g.Resource, "holder": &g.Holder,
		"lease_id": &g.LeaseID, "secret": &g.Secret, "fencing_token": &g.FencingToken, "session": &g.Session} {
		if *dst, err = f.str(status, name); err != nil {
			return nil, err
		}
	}
	if g.Token, err = f.decimal(status, "token"); err != nil {
		return nil, err
	}
	if g.TTLSeconds, err = f.count(status, "ttl_seconds"); err != nil {
		return nil, err
	}
	ms, err := f.count(status, "expires_in_ms")
	if err != nil {
		return nil, err
	}
	g.ExpiresIn = capDuration(ms)
	return g, checkGrant(status, g, resource)
}

// checkGrant refuses a grant that cannot be the answer to an acquire of resource.
func checkGrant(status int, g *Grant, resource string) error {
	switch {
	case g.Resource != resource:
		return protocolErr(status, "a grant of %q answered an acquire of %q", g.Resource, resource)
	case g.Secret == "" || g.LeaseID == "" || g.FencingToken == "":
		return protocolErr(status, "a grant without a secret, lease id or fencing token")
	case g.Token == 0:
		return protocolErr(status, "a grant with token 0")
	}
	// The v1 wire form starts v1.KID.ERA.REVISION.: its revision is the token.
	if parts := strings.Split(g.FencingToken, "."); parts[0] == "v1" {
		if len(parts) < 5 || parts[3] != strconv.FormatUint(g.Token, 10) {
			return protocolErr(status, "fencing token %q does not carry token %d", g.FencingToken, g.Token)
		}
	}
	return nil
}

// parseRenewal reads a 200 answer to a renewal.
func parseRenewal(status int, body []byte) (*Renewal, error) {
	f, err := decodeObject(status, body, "ttl_seconds", "expires_in_ms", "token")
	if err != nil {
		return nil, err
	}
	r := &Renewal{}
	if r.TTLSeconds, err = f.count(status, "ttl_seconds"); err != nil {
		return nil, err
	}
	ms, err := f.count(status, "expires_in_ms")
	if err != nil {
		return nil, err
	}
	r.ExpiresIn = capDuration(ms)
	r.Token, err = f.decimal(status, "token")
	return r, err
}

// parseHolding reads one held resource of GET /v1/leases[/{resource}].
func parseHolding(status int, body []byte) (*Holding, error) {
	f, err := decodeObject(status, body, "resource", "holder", "token", "lease_id", "ttl_seconds",
		"expires_in_ms")
	if err != nil {
		return nil, err
	}
	h := &Holding{Metadata: f["metadata"]}
	for name, dst := range map[string]*string{"resource": &h.Resource, "holder": &h.Holder,
		"lease_id": &h.LeaseID, "session": &h.Session} {
		if *dst, err = f.str(status, name); err != nil {
			return nil, err
		}
	}
	if h.Token, err = f.decimal(status, "token"); err != nil {
		return nil, err
	}
	if h.TTLSeconds, err = f.count(status, "ttl_seconds"); err != nil {
		return nil, err
	}
	ms, err := f.count(status, "expires_in_ms")
	if err != nil {
		return nil, err
	}
	h.ExpiresIn = capDuration(ms)
	if _, ok := f["acquired_at"]; ok {
		at, err := f.count(status, "acquired_at")
		if err != nil {
			return nil, err
		}
		h.AcquiredAt = time.UnixMilli(int64(at))
	}
	return h, nil
}

// timing is what a session's open or keepalive answer grants.
type timing struct {
	ttlSeconds uint64
	expiresIn  time.Duration
}

func parseTiming(status int, f fields) (timing, error) {
	var t timing
	var err error
	if t.ttlSeconds, err = f.count(status, "ttl_seconds"); err != nil {
		return t, err
	}
	ms, err := f.count(status, "expires_in_ms")
	t.expiresIn = capDuration(ms)
	return t, err
}

// lifetime is how long an answer grants from the instant its request was sent: its
// expires_in_ms, but never more than its ttl_seconds plus slack (the wait allowance of a
// queued acquire: the proxy counts the TTL from the grant), nor maxLifetime. Zero when
// ttl_seconds is 0: the answer grants nothing.
func lifetime(ttlSeconds uint64, expiresIn, slack time.Duration) time.Duration {
	if ttlSeconds == 0 {
		return 0
	}
	most := maxLifetime
	if ttlSeconds < uint64(maxLifetime/time.Second) {
		most = time.Duration(ttlSeconds)*time.Second + slack
	}
	if expiresIn < most {
		most = expiresIn
	}
	if most > maxLifetime {
		most = maxLifetime
	}
	return most
}
