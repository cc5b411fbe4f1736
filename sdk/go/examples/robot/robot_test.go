package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"lease-proxy.dev/leaseproxy"
	"lease-proxy.dev/leaseproxy/internal/stack"
)

// The robot runs as a child process: this test binary, told by ROBOT_MAIN to be the robot.
func TestMain(m *testing.M) {
	if os.Getenv("ROBOT_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(runTests(m))
}

var env struct {
	etcd      *stack.Etcd
	warehouse *stack.Warehouse
	proxy     *stack.Process
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "leaseproxy-go-robot-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	defer func() {
		for _, p := range []*stack.Process{env.proxy} {
			if p != nil {
				p.Kill()
			}
		}
		if env.warehouse != nil {
			env.warehouse.Kill()
		}
		if env.etcd != nil {
			env.etcd.Kill()
		}
	}()
	keys, err := stack.KeyFile(dir)
	if err == nil {
		env.etcd, err = stack.StartEtcd(dir)
	}
	if err == nil {
		env.warehouse, err = stack.StartWarehouse(dir, keys)
	}
	if err == nil {
		gw := env.warehouse.Gateway.URL
		env.proxy, err = stack.StartProxy(dir, "proxy", env.etcd.URL, "/lease-proxy-go-robot/", keys, "http", nil,
			"--upstream", gw, "--prefence-url", gw)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the stack:", err)
		return 1
	}
	return m.Run()
}

// robot is the example as a child process; its event lines arrive on lines.
type robot struct {
	cmd   *exec.Cmd
	lines chan string
	seen  []string
}

func startRobot(t *testing.T, args ...string) *robot {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, append([]string{"--proxy", env.proxy.URL, "--gateway", env.warehouse.Gateway.URL}, args...)...)
	cmd.Env = append(os.Environ(), "ROBOT_MAIN=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &robot{cmd: cmd, lines: make(chan string, 1000)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return r
}

func (r *robot) expect(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case line, ok := <-r.lines:
			if !ok {
				t.Fatalf("no %q before the robot ended; saw %q", prefix, r.seen)
			}
			r.seen = append(r.seen, line)
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-deadline:
			t.Fatalf("no %q within %s; saw %q", prefix, within, r.seen)
		}
	}
}

func (r *robot) finish(t *testing.T) []string {
	t.Helper()
	for line := range r.lines {
		r.seen = append(r.seen, line)
	}
	if err := r.cmd.Wait(); err != nil {
		t.Fatalf("robot: %v; saw %q", err, r.seen)
	}
	return r.seen
}

func writesBy(t *testing.T, robotName string) []stack.Applied {
	log, err := env.warehouse.Log()
	if err != nil {
		t.Fatal(err)
	}
	var out []stack.Applied
	for _, w := range log {
		if w.Robot == robotName {
			out = append(out, w)
		}
	}
	return out
}

func name(t *testing.T) string {
	return fmt.Sprintf("go-robot-%d", time.Now().UnixNano())
}

func TestTheRobotCountsAislesWithItsToken(t *testing.T) {
	n := name(t)
	r := startRobot(t, "--aisles", n+"-a,"+n+"-b", "--name", n, "--ttl", "2s", "--rounds", "3",
		"--updates", "2", "--count-time", "100ms")
	seen := r.finish(t)
	var acquired [][]string
	writes, released := 0, 0
	for _, line := range seen {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "event acquired"):
			acquired = append(acquired, f)
		case strings.HasPrefix(line, "event write-ok"):
			writes++
		case strings.HasPrefix(line, "event released"):
			released++
		}
	}
	if len(acquired) != 3 || writes != 6 || released != 3 {
		t.Fatalf("saw %q", seen)
	}
	var want, got []string
	for _, a := range acquired {
		want = append(want, a[2]+"@"+a[3], a[2]+"@"+a[3])
	}
	for _, w := range writesBy(t, n) {
		got = append(got, fmt.Sprintf("%s@%d", w.Aisle, w.Revision))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("the inventory has %v, want %v (each write with its lease's token)", got, want)
	}
}

func TestARobotPausedPastItsTTLStopsWithoutWriting(t *testing.T) {
	n := name(t)
	r := startRobot(t, "--aisles", n, "--name", n, "--ttl", "2s", "--rounds", "1", "--updates", "40",
		"--count-time", "200ms")
	token, _ := strconv.ParseUint(strings.Fields(r.expect(t, "event acquired", 20*time.Second))[3], 10, 64)
	r.expect(t, "event write-ok", 10*time.Second)
	if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a write in flight when it stopped lands now
	before := len(writesBy(t, n))
	c, err := leaseproxy.New(env.proxy.URL, leaseproxy.Options{Holder: "usurper"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := c.Acquire(ctx, n, &leaseproxy.AcquireOptions{TTL: 10 * time.Second, Wait: 10 * time.Second})
	if err != nil || l.Token() <= token {
		t.Fatalf("take-over: %v (token %v after %d)", err, l, token)
	}
	defer l.Release(ctx)
	if err := r.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	line := r.expect(t, "event lost", 10*time.Second)
	if f := strings.Fields(line); f[2] != n || (f[3] != "expired" && f[3] != "revoked") {
		t.Fatalf("lost as %q", line)
	}
	lostAt := len(r.seen)
	seen := r.finish(t)
	for _, s := range seen[lostAt:] {
		if strings.HasPrefix(s, "event write-ok") || strings.HasPrefix(s, "event released") {
			t.Fatalf("after the loss: %q", seen)
		}
	}
	if after := len(writesBy(t, n)); after != before {
		t.Fatalf("%d writes after the pause", after-before)
	}
	t.Logf("resumed past its deadline: %s", line)
}

func TestRobotsInAFleetShareItsAislesAndHandThemOver(t *testing.T) {
	n := name(t)
	fleet := n + "-fleet"
	c, err := leaseproxy.New(env.proxy.URL, leaseproxy.Options{Holder: "operator"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A long drain deadline: the hand-offs below are the robots' own releases.
	if err := c.PutFleet(ctx, fleet, leaseproxy.FleetSpec{Resources: []string{fleet + "-1", fleet + "-2"}, Drain: 20 * time.Second}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.DeleteFleet(context.Background(), fleet) }()
	args := func(robot string) []string {
		return []string{"--fleet", fleet, "--name", robot, "--ttl", "5s", "--count-time", "50ms"}
	}
	first := startRobot(t, args(n+"-1")...)
	first.expect(t, "event joined", 10*time.Second)
	// Both aisles written by the first robot before the second joins (either may be moved).
	var aisles []string
	for i := 0; i < 2; i++ {
		aisles = append(aisles, strings.Fields(first.expect(t, "event acquired", 10*time.Second))[2])
	}
	for _, aisle := range aisles {
		first.expect(t, "event write-ok "+aisle, 10*time.Second)
	}

	second := startRobot(t, args(n+"-2")...)
	moved := strings.Fields(first.expect(t, "event lost", 10*time.Second))
	if moved[3] != "handed-off" {
		t.Fatalf("the first robot lost %v", moved)
	}
	if got := strings.Fields(second.expect(t, "event acquired", 10*time.Second)); got[2] != moved[2] {
		t.Fatalf("the second robot got %v, the first handed off %v", got, moved)
	}
	second.expect(t, "event write-ok "+moved[2], 10*time.Second)

	// Interrupted, the first robot drains and leaves: its other aisle goes to the second.
	if err := first.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	first.expect(t, "event left", 10*time.Second)
	first.finish(t)
	rest := strings.Fields(second.expect(t, "event acquired", 10*time.Second))[2]
	second.expect(t, "event write-ok "+rest, 10*time.Second)
	if err := second.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	second.finish(t)

	// Each aisle's writes: the first robot's, then the second's, under ever larger tokens.
	for _, aisle := range []string{fleet + "-1", fleet + "-2"} {
		var order []string
		last := int64(0)
		for _, w := range append(writesBy(t, n+"-1"), writesBy(t, n+"-2")...) {
			if w.Aisle == aisle {
				order = append(order, fmt.Sprintf("%s@%d", strings.TrimPrefix(w.Robot, n), w.Revision))
			}
		}
		log, err := env.warehouse.Log()
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range log {
			if w.Aisle != aisle {
				continue
			}
			if w.Revision < last {
				t.Fatalf("%s: a write under token %d after one under %d: %v", aisle, w.Revision, last, order)
			}
			last = w.Revision
		}
		if len(order) < 2 || !strings.HasPrefix(order[0], "-1@") || !strings.HasPrefix(order[len(order)-1], "-2@") {
			t.Fatalf("%s: writes %v, want the first robot's then the second's", aisle, order)
		}
	}
}
