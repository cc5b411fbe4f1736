// Command robot is a warehouse robot on the Go SDK, doing the job of the Rust and Python
// robots: lease an aisle, count it, write each count to the inventory through fence-gateway
// with the lease's fencing token (added by leaseproxy.Transport: no token handling here),
// stop the moment the lease is lost, release, repeat. With --fleet it joins that fleet
// instead and counts whatever aisles the service assigns it, each until it is handed off.
//
// It writes nothing once its lease's context is cancelled, and fence-gateway refuses whatever
// slips through. One line per outcome:
//
//	event acquired AISLE TOKEN | event write-ok AISLE | event stale-enforcer AISLE
//	event lost AISLE REASON | event released AISLE | event write-error STATUS
//	event error acquire MESSAGE | event joined FLEET | event left FLEET
//
//	robot --proxy http://127.0.0.1:7070 --gateway http://127.0.0.1:7071 --aisles aisle-1,aisle-2 --name go-robot
//	robot --proxy http://127.0.0.1:7070 --gateway http://127.0.0.1:7071 --fleet aisles --name go-robot
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"lease-proxy.dev/leaseproxy"
)

type config struct {
	proxy, gateway, name, ca string
	fleet                    string
	aisles                   []string
	ttl                      time.Duration
	rounds, updates          int
	countTime                time.Duration
}

func parse(args []string) (config, error) {
	var c config
	var aisles string
	fs := flag.NewFlagSet("robot", flag.ContinueOnError)
	fs.StringVar(&c.proxy, "proxy", "http://127.0.0.1:7070", "lease-proxy's base URL")
	fs.StringVar(&c.gateway, "gateway", "http://127.0.0.1:7071", "fence-gateway's base URL (the inventory behind it)")
	fs.StringVar(&aisles, "aisles", "aisle-1,aisle-2,aisle-3", "aisles to choose from, comma-separated")
	fs.StringVar(&c.name, "name", "go-robot", "robot name (the lease holder)")
	fs.StringVar(&c.ca, "ca", os.Getenv("WAREHOUSE_CA"), "CA bundle for https:// URLs")
	fs.StringVar(&c.fleet, "fleet", "", "join this fleet and count what it assigns (instead of --aisles)")
	fs.DurationVar(&c.ttl, "ttl", 3*time.Second, "lease TTL")
	fs.IntVar(&c.rounds, "rounds", 0, "leases to take before exiting (0: until interrupted)")
	fs.IntVar(&c.updates, "updates", 0, "counts sent per lease (0: 3 to 8 at random)")
	fs.DurationVar(&c.countTime, "count-time", 250*time.Millisecond, "mean time counting takes")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	for _, a := range strings.Split(aisles, ",") {
		if a != "" {
			c.aisles = append(c.aisles, a)
		}
	}
	if len(c.aisles) == 0 && c.fleet == "" {
		return c, errors.New("--aisles names no aisle")
	}
	return c, nil
}

func say(format string, args ...any) {
	fmt.Printf("event "+format+"\n", args...)
}

func main() {
	cfg, err := parse(os.Args[1:])
	if err != nil {
		os.Exit(64)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "robot:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	c, err := leaseproxy.New(cfg.proxy, leaseproxy.Options{Holder: cfg.name, CAFile: cfg.ca,
		BearerToken: os.Getenv("WAREHOUSE_TOKEN"), TTL: cfg.ttl})
	if err != nil {
		return err
	}
	defer c.Close()
	store := leaseproxy.NewHTTPClient(nil) // adds the lease's Fencing-Token to every write
	if cfg.fleet != "" {
		return member(ctx, c, store, cfg)
	}
	for done := 0; (cfg.rounds == 0 || done < cfg.rounds) && ctx.Err() == nil; done++ {
		aisle := cfg.aisles[rand.Intn(len(cfg.aisles))]
		workOne(ctx, c, store, cfg, aisle)
	}
	return nil
}

// workOne counts aisle under a lease until done, lost or refused.
func workOne(ctx context.Context, c *leaseproxy.Client, store *http.Client, cfg config, aisle string) {
	lease, err := c.Acquire(ctx, aisle, &leaseproxy.AcquireOptions{Wait: 5 * time.Second})
	if errors.Is(err, leaseproxy.ErrHeld) {
		return
	}
	if err != nil {
		say("error acquire %v", err)
		time.Sleep(500 * time.Millisecond)
		return
	}
	say("acquired %s %d", aisle, lease.Token())
	defer func() {
		lost := lease.Err() != nil
		_ = lease.Release(context.Background())
		if !lost {
			say("released %s", aisle)
		}
	}()
	work, cancel := lease.Bind(ctx) // cancelled the moment the lease is lost
	defer cancel()
	updates := cfg.updates
	if updates == 0 {
		updates = 3 + rand.Intn(6)
	}
	for i := 0; i < updates; i++ {
		pause := time.Duration(float64(cfg.countTime) * (0.4 + 1.2*rand.Float64()))
		select {
		case <-work.Done(): // lost, or interrupted
			lostOrStopped(lease, aisle)
			return
		case <-time.After(pause): // counting takes a while
		}
		if work.Err() != nil { // reads the clock: a robot resumed after a pause sees it here
			lostOrStopped(lease, aisle)
			return
		}
		if !write(work, store, cfg, lease, aisle) {
			return
		}
	}
}

// member joins the fleet and counts each aisle it is assigned until it is handed off or lost;
// on the way out it drains (its aisles go to the other members) and leaves.
func member(ctx context.Context, c *leaseproxy.Client, store *http.Client, cfg config) error {
	m, err := c.JoinFleet(ctx, cfg.fleet, nil)
	if err != nil {
		return err
	}
	say("joined %s", cfg.fleet)
	err = m.Serve(ctx, func(work context.Context, lease *leaseproxy.Lease) error {
		aisle := lease.Resource()
		say("acquired %s %d", aisle, lease.Token())
		for {
			select {
			case <-work.Done():
				lostOrStopped(lease, aisle)
				return work.Err()
			case <-time.After(time.Duration(float64(cfg.countTime) * (0.4 + 1.2*rand.Float64()))):
			}
			if work.Err() != nil || !write(work, store, cfg, lease, aisle) {
				lostOrStopped(lease, aisle)
				return nil
			}
		}
	})
	bye, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = m.Drain(bye)
	_ = m.Leave(bye)
	say("left %s", cfg.fleet)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// write sends one count; false when the lease is lost or the token refused.
func write(ctx context.Context, store *http.Client, cfg config, lease *leaseproxy.Lease, aisle string) bool {
	body, _ := json.Marshal(map[string]any{"robot": cfg.name, "count": rand.Intn(500)})
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, cfg.gateway+"/aisles/"+aisle+"/count", bytes.NewReader(body))
	if err != nil {
		say("write-error %v", err)
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := store.Do(req)
	switch {
	case errors.Is(err, leaseproxy.ErrLost) || (err != nil && ctx.Err() != nil):
		lostOrStopped(lease, aisle)
		return false
	case err != nil:
		say("write-error %v", err)
		return true
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		say("write-ok %s", aisle)
		return true
	case http.StatusConflict:
		say("stale-enforcer %s", aisle) // fence-gateway saw a newer token
		return false
	default:
		say("write-error %d", resp.StatusCode)
		return true
	}
}

func lostOrStopped(lease *leaseproxy.Lease, aisle string) {
	var lost *leaseproxy.LostError
	if errors.As(lease.Err(), &lost) {
		say("lost %s %s", aisle, lost.Reason)
	}
}
