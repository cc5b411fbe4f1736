package leaseproxy_test

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
	"lease-proxy.dev/leaseproxy/internal/stack"
)

func TestTLSBearerTokensAndClientCertificates(t *testing.T) {
	devPKI, err := stack.Binary("DEV_PKI_BIN", "dev-pki")
	if err != nil {
		t.Fatal(err)
	}
	pki := filepath.Join(env.dir, "pki")
	out, err := exec.Command(devPKI, pki).Output()
	if err != nil {
		t.Fatal(err)
	}
	ca := strings.TrimSpace(string(out))
	raw := make([]byte, 24)
	_, _ = rand.Read(raw)
	token := hex.EncodeToString(raw)
	sum := sha256.Sum256([]byte(token))
	tokens := filepath.Join(env.dir, "tokens")
	file := "robots " + hex.EncodeToString(sum[:]) + " acquire:go-,read:*\noperator cert acquire:*,read:*\n"
	if err := os.WriteFile(tokens, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(ca)
	pool.AppendCertsFromPEM(pem)
	probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	proxy, err := stack.StartProxy(env.dir, "secure-proxy", env.etcd.URL, "/lease-proxy-go-secure/", env.keyFile, "https",
		func(url string) bool {
			resp, err := probe.Get(url + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		},
		"--tls-cert", filepath.Join(pki, "proxy.pem"), "--tls-key", filepath.Join(pki, "proxy.key"),
		"--tls-client-ca", ca, "--auth-tokens", tokens)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Kill()

	robots := client(t, proxy.URL, leaseproxy.Options{CAFile: ca, BearerToken: token})
	r := resource(t)
	l, err := robots.Acquire(ctxT(t), r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := robots.Get(ctxT(t), r); err != nil || h.Token != l.Token() {
		t.Fatalf("get: %+v %v", h, err)
	}
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	var pe *leaseproxy.ProblemError
	if _, err := robots.Acquire(ctxT(t), "other-"+r, nil); !errors.As(err, &pe) || pe.Status != 403 || pe.Slug() != "forbidden" {
		t.Fatalf("outside its prefix: %v", err)
	}
	anonymous := client(t, proxy.URL, leaseproxy.Options{CAFile: ca})
	if _, err := anonymous.Acquire(ctxT(t), r, nil); !errors.As(err, &pe) || pe.Status != 401 || pe.Slug() != "unauthenticated" {
		t.Fatalf("without a token: %v", err)
	}
	untrusting := client(t, proxy.URL, leaseproxy.Options{BearerToken: token}) // system roots only
	var te *leaseproxy.TransportError
	if _, err := untrusting.Get(ctxT(t), r); !errors.As(err, &te) {
		t.Fatalf("an unknown CA: %v", err)
	}
	operator := client(t, proxy.URL, leaseproxy.Options{CAFile: ca,
		CertFile: filepath.Join(pki, "operator.pem"), KeyFile: filepath.Join(pki, "operator.key")})
	l, err = operator.Acquire(ctxT(t), "any-"+r, &leaseproxy.AcquireOptions{Holder: "operator"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}
