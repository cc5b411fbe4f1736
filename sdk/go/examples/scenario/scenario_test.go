package main

// The scenario against a stack of its own, compared with the table in docs/SDKS.md: this SDK
// observes what the table says every SDK observes.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
	"lease-proxy.dev/leaseproxy/internal/stack"
)

func TestTheScenarioObservesWhatDocsSDKsSays(t *testing.T) {
	dir := t.TempDir()
	keys, err := stack.KeyFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	etcd, err := stack.StartEtcd(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Kill()
	warehouse, err := stack.StartWarehouse(dir, keys)
	if err != nil {
		t.Fatal(err)
	}
	defer warehouse.Kill()
	gw := warehouse.Gateway.URL
	proxy, err := stack.StartProxy(dir, "proxy", etcd.URL, "/lease-proxy-go-scenario/", keys, "http", nil,
		"--upstream", gw, "--prefence-url", gw)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Kill()

	var got bytes.Buffer
	out = &got
	r := &run{proxy: proxy.URL, gateway: gw, etcd: etcd.URL, prefix: "go-", store: leaseproxy.NewHTTPClient(nil)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = r.leases(ctx)
	if err == nil {
		err = r.fleet(ctx)
	}
	if err != nil {
		t.Fatalf("%v after:\n%s", err, got.String())
	}
	want, err := documented()
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != want {
		t.Fatalf("observed:\n%s\ndocs/SDKS.md says every SDK observes:\n%s\n(if the change is meant for every SDK, scripts/sdk-scenario.sh rewrites the table)", got.String(), want)
	}
}

// documented is the table's observed column as the runner prints it: KEY<TAB>OBSERVED lines.
func documented() (string, error) {
	root, err := stack.Root()
	if err != nil {
		return "", err
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "SDKS.md"))
	if err != nil {
		return "", err
	}
	const begin, end = "<!-- scenario-table:", "<!-- /scenario-table -->"
	text := string(doc)
	if i := strings.Index(text, begin); i >= 0 {
		text = text[i:]
	}
	if i := strings.Index(text, end); i >= 0 {
		text = text[:i]
	}
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "\x00"), " | ")
		if len(cells) < 3 {
			continue
		}
		fmt.Fprintf(&b, "%s\t%s\n", strings.Trim(cells[0], "| `"), strings.ReplaceAll(cells[2], "\x00", "|"))
	}
	if b.Len() == 0 {
		return "", fmt.Errorf("no scenario table in %s", filepath.Join(root, "docs", "SDKS.md"))
	}
	return b.String(), nil
}
