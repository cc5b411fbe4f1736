// Package stack starts the real dependencies of the SDK's tests on free loopback ports: an
// etcd member, lease-proxy, fence-gateway and the warehouse inventory. Binaries come from the
// environment (ETCD_BIN or etcd on PATH; LEASE_PROXY_BIN, FENCE_GATEWAY_BIN, WAREHOUSE_BIN,
// DEV_PKI_BIN), defaulting to the workspace's target/debug.
package stack

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// ReadyWithin bounds how long a process may take to become ready.
const ReadyWithin = 30 * time.Second

// Root is the workspace root: the nearest directory above the working directory whose
// Cargo.toml has a [workspace].
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "Cargo.toml"))
		if err == nil && bytes.Contains(b, []byte("[workspace]")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no workspace Cargo.toml above the working directory")
		}
		dir = parent
	}
}

// Binary is the path of a binary: $env, else target/debug/name under the workspace root
// (CARGO_TARGET_DIR's when set).
func Binary(env, name string) (string, error) {
	path := os.Getenv(env)
	if path == "" {
		target := os.Getenv("CARGO_TARGET_DIR")
		if target == "" {
			root, err := Root()
			if err != nil {
				return "", err
			}
			target = filepath.Join(root, "target")
		}
		path = filepath.Join(target, "debug", name)
	}
	if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("no %s at %s: build it (cargo build) or set %s", name, path, env)
	}
	return path, nil
}

// FreePort is a loopback port nobody listens on right now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Process is a started binary, its log in a file.
type Process struct {
	Name string
	URL  string
	Log  string
	cmd  *exec.Cmd
	once sync.Once
	done chan struct{}
}

// Start runs path with args, its output in dir/name.log.
func Start(dir, name, url, path string, args ...string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, URL: url, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Ready waits until ok() holds, the process exits, or ReadyWithin passes.
func (p *Process) Ready(ok func() bool) error {
	deadline := time.Now().Add(ReadyWithin)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready:\n%s", p.Name, p.Tail())
		default:
		}
		if ok() {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.Kill()
	return fmt.Errorf("%s not ready within %s:\n%s", p.Name, ReadyWithin, p.Tail())
}

// Tail is the end of the process's log.
func (p *Process) Tail() string {
	b, _ := os.ReadFile(p.Log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Kill kills the process (SIGKILL: no graceful anything) and waits for it.
func (p *Process) Kill() {
	p.once.Do(func() {
		if p.cmd.Process != nil {
			_ = p.cmd.Process.Kill()
		}
		<-p.done
	})
}

// Status is the status of GET url (0 when it cannot be had).
func Status(url string) int {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// KeyFile writes a fencing key file (one fresh key, id k1) to dir.
func KeyFile(dir string) (string, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "fencing.key")
	line := "k1 " + base64.RawURLEncoding.EncodeToString(secret) + "\n"
	return path, os.WriteFile(path, []byte(line), 0o600)
}

// Etcd is a one-member etcd.
type Etcd struct{ *Process }

// StartEtcd starts etcd with its data in dir.
func StartEtcd(dir string) (*Etcd, error) {
	path := os.Getenv("ETCD_BIN")
	if path == "" {
		var err error
		if path, err = exec.LookPath("etcd"); err != nil {
			return nil, errors.New("etcd not on PATH (scripts/deps.sh installs etcd-server)")
		}
	}
	client, err := FreePort()
	if err != nil {
		return nil, err
	}
	peer, err := FreePort()
	if err != nil {
		return nil, err
	}
	cu, pu := fmt.Sprintf("http://127.0.0.1:%d", client), fmt.Sprintf("http://127.0.0.1:%d", peer)
	p, err := Start(dir, "etcd", cu, path, "--name", "m0", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", cu, "--advertise-client-urls", cu, "--listen-peer-urls", pu,
		"--initial-advertise-peer-urls", pu, "--initial-cluster", "m0="+pu,
		"--initial-cluster-state", "new", "--logger", "zap", "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	return &Etcd{p}, p.Ready(func() bool { return Status(cu+"/health") == 200 })
}

// Revoke revokes an etcd lease (the proxy's lease ids are etcd's, in decimal) through etcd's
// JSON gateway: what a lease lost to etcd looks like to the proxy.
func (e *Etcd) Revoke(leaseID string) error {
	body, _ := json.Marshal(map[string]string{"ID": leaseID})
	resp, err := http.Post(e.URL+"/v3/lease/revoke", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("revoke %s: %s", leaseID, resp.Status)
	}
	return nil
}

// StartProxy starts lease-proxy on etcd under prefix with extra flags; scheme is "http" or
// "https" (the URL's).
func StartProxy(dir, name, etcdURL, prefix, keyFile, scheme string, ready func(url string) bool, extra ...string) (*Process, error) {
	path, err := Binary("LEASE_PROXY_BIN", "lease-proxy")
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("%s://127.0.0.1:%d", scheme, port)
	args := append([]string{"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--etcd-endpoints", etcdURL,
		"--etcd-prefix", prefix, "--key-file", keyFile, "--data-dir", filepath.Join(dir, name)}, extra...)
	p, err := Start(dir, name, url, path, args...)
	if err != nil {
		return nil, err
	}
	if ready == nil {
		ready = func(url string) bool { return Status(url+"/readyz") == 200 }
	}
	return p, p.Ready(func() bool { return ready(url) })
}

// Warehouse is the inventory behind fence-gateway (path mode, /aisles/{resource}).
type Warehouse struct {
	Inventory, Gateway *Process
}

// StartWarehouse starts the inventory (SQLite in dir) and fence-gateway in front of it.
func StartWarehouse(dir, keyFile string) (*Warehouse, error) {
	wh, err := Binary("WAREHOUSE_BIN", "warehouse")
	if err != nil {
		return nil, err
	}
	fg, err := Binary("FENCE_GATEWAY_BIN", "fence-gateway")
	if err != nil {
		return nil, err
	}
	ip, err := FreePort()
	if err != nil {
		return nil, err
	}
	gp, err := FreePort()
	if err != nil {
		return nil, err
	}
	iu, gu := fmt.Sprintf("http://127.0.0.1:%d", ip), fmt.Sprintf("http://127.0.0.1:%d", gp)
	inv, err := Start(dir, "inventory", iu, wh, "inventory", "--listen", strings.TrimPrefix(iu, "http://"),
		"--db", "sqlite:"+filepath.Join(dir, "inventory.db"))
	if err != nil {
		return nil, err
	}
	if err := inv.Ready(func() bool { return Status(iu+"/log") == 200 }); err != nil {
		return nil, err
	}
	gw, err := Start(dir, "gateway", gu, fg, "--listen", strings.TrimPrefix(gu, "http://"), "--upstream", iu,
		"--store", "sqlite:"+filepath.Join(dir, "marks.db"), "--key-file", keyFile,
		"--resource-path", "/aisles/{resource}", "--write-grace", "2s")
	if err != nil {
		inv.Kill()
		return nil, err
	}
	if err := gw.Ready(func() bool { return Status(gu+"/readyz") == 200 }); err != nil {
		inv.Kill()
		return nil, err
	}
	return &Warehouse{Inventory: inv, Gateway: gw}, nil
}

// Applied is one write the inventory recorded.
type Applied struct {
	Seq      int64  `json:"seq"`
	Aisle    string `json:"aisle"`
	Robot    string `json:"robot"`
	Revision int64  `json:"revision"`
	Count    int64  `json:"count"`
}

// Log is what the inventory recorded, in order.
func (w *Warehouse) Log() ([]Applied, error) {
	resp, err := http.Get(w.Inventory.URL + "/log")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out []Applied
	return out, json.NewDecoder(resp.Body).Decode(&out)
}

// Kill stops both.
func (w *Warehouse) Kill() {
	w.Gateway.Kill()
	w.Inventory.Kill()
}
