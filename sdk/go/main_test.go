package leaseproxy_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
	"lease-proxy.dev/leaseproxy/internal/stack"
)

// env is the stack every integration test shares: one etcd, the warehouse inventory behind
// fence-gateway, and a lease-proxy forwarding to and pre-fencing that gateway.
var env struct {
	dir       string
	keyFile   string
	etcd      *stack.Etcd
	warehouse *stack.Warehouse
	proxy     *stack.Process
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "leaseproxy-go-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := start(dir); err != nil {
		fmt.Fprintln(os.Stderr, "starting the stack:", err)
		stopAll()
		return 1
	}
	defer stopAll()
	return m.Run()
}

func start(dir string) error {
	env.dir = dir
	var err error
	if env.keyFile, err = stack.KeyFile(dir); err != nil {
		return err
	}
	if env.etcd, err = stack.StartEtcd(dir); err != nil {
		return err
	}
	if env.warehouse, err = stack.StartWarehouse(dir, env.keyFile); err != nil {
		return err
	}
	gw := env.warehouse.Gateway.URL
	env.proxy, err = stack.StartProxy(dir, "proxy", env.etcd.URL, "/lease-proxy-go/", env.keyFile, "http", nil,
		"--upstream", gw, "--prefence-url", gw)
	return err
}

func stopAll() {
	if env.proxy != nil {
		env.proxy.Kill()
	}
	if env.warehouse != nil {
		env.warehouse.Kill()
	}
	if env.etcd != nil {
		env.etcd.Kill()
	}
}

// resource is a resource name no other test uses.
func resource(t *testing.T) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	return "go-" + strings.ToLower(name) + "-" + hex.EncodeToString(b)
}

// client is a client of url (default: the shared proxy), closed after the test.
func client(t *testing.T, url string, opts leaseproxy.Options) *leaseproxy.Client {
	t.Helper()
	if url == "" {
		url = env.proxy.URL
	}
	if opts.Holder == "" {
		opts.Holder = "go-test"
	}
	c, err := leaseproxy.New(url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// within fails the test unless ch is closed within d; returns how long it took.
func within(t *testing.T, ch <-chan struct{}, d time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-ch:
		return time.Since(start)
	case <-time.After(d):
		t.Fatalf("%s: not within %s", what, d)
		return 0
	}
}

// eventually polls check every 20 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, check func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !check() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
