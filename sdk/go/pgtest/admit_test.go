// Package pgtest runs the SDK's database/sql helper against a real PostgreSQL with the
// in-database fencing package, through lib/pq (a module of its own, so that the SDK itself
// needs nothing but the standard library).
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	_ "github.com/lib/pq"

	"lease-proxy.dev/leaseproxy"
	"lease-proxy.dev/leaseproxy/internal/stack"
)

const defaultAdminURL = "postgres://lease_proxy:lease_proxy@127.0.0.1:5432/lease_proxy_test"

var env struct {
	dir     string
	keyFile string
	etcd    *stack.Etcd
	proxy   *stack.Process
	db      *sql.DB
	url     string
}

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "leaseproxy-go-pg-")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(dir)
	env.dir = dir
	if env.keyFile, err = stack.KeyFile(dir); err != nil {
		return 1, err
	}
	if env.etcd, err = stack.StartEtcd(dir); err != nil {
		return 1, err
	}
	defer env.etcd.Kill()
	env.proxy, err = stack.StartProxy(dir, "proxy", env.etcd.URL, "/lease-proxy-go-pg/", env.keyFile, "http", nil)
	if err != nil {
		return 1, err
	}
	defer env.proxy.Kill()
	drop, err := scratchDatabase()
	if err != nil {
		return 1, err
	}
	defer drop()
	return m.Run(), nil
}

// scratchDatabase makes a database with the package installed by the real `fence-gateway pg
// install`, the proxy's keys synced into it and a ledger table; returns how to drop it.
func scratchDatabase() (func(), error) {
	admin := os.Getenv("FENCING_TEST_POSTGRES")
	if admin == "" {
		admin = defaultAdminURL
	}
	adb, err := sql.Open("postgres", admin)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("go_admit_%d", time.Now().UnixNano())
	if _, err := adb.Exec("CREATE DATABASE " + name); err != nil {
		adb.Close()
		return nil, fmt.Errorf("PostgreSQL at %s (scripts/deps.sh ensure_postgres starts it): %w", admin, err)
	}
	drop := func() {
		_, _ = adb.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)")
		adb.Close()
	}
	u, _ := url.Parse(admin)
	u.Path = "/" + name
	env.url = u.String() + "?sslmode=disable"
	gw, err := stack.Binary("FENCE_GATEWAY_BIN", "fence-gateway")
	if err != nil {
		drop()
		return nil, err
	}
	for _, args := range [][]string{{"pg", "install", "--database-url", env.url},
		{"pg", "sync-keys", "--database-url", env.url, "--key-file", env.keyFile}} {
		if out, err := exec.Command(gw, args...).CombinedOutput(); err != nil {
			drop()
			return nil, fmt.Errorf("fence-gateway %s: %v\n%s", strings.Join(args[:2], " "), err, out)
		}
	}
	if env.db, err = sql.Open("postgres", env.url); err != nil {
		drop()
		return nil, err
	}
	if _, err := env.db.Exec("CREATE TABLE ledger (resource text, holder text)"); err != nil {
		drop()
		return nil, err
	}
	return func() { env.db.Close(); drop() }, nil
}

// record writes holder's line for l's resource in one transaction, admitted by l's token.
func record(ctx context.Context, l *leaseproxy.Lease, holder string) error {
	tx, err := env.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := leaseproxy.Admit(ctx, tx, l); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO ledger VALUES ($1, $2)", l.Resource(), holder); err != nil {
		return err
	}
	return tx.Commit()
}

func TestAnOldHoldersTransactionIsRefusedInsidePostgreSQL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, err := leaseproxy.New(env.proxy.URL, leaseproxy.Options{NoLossWatch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	resource := fmt.Sprintf("pg-%d", time.Now().UnixNano())
	a, err := old.Acquire(ctx, resource, &leaseproxy.AcquireOptions{Holder: "old", TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := record(ctx, a, "old"); err != nil {
		t.Fatal(err)
	}
	if err := env.etcd.Revoke(a.LeaseID()); err != nil {
		t.Fatal(err)
	}
	newer, err := leaseproxy.New(env.proxy.URL, leaseproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Close()
	err = newer.WithLease(ctx, resource, &leaseproxy.AcquireOptions{Holder: "new"},
		func(ctx context.Context, b *leaseproxy.Lease) error { return record(ctx, b, "new") })
	if err != nil {
		t.Fatal(err)
	}
	err = record(ctx, a, "old-late")
	var ae *leaseproxy.AdmitError
	if !errors.Is(err, leaseproxy.ErrStaleToken) || !errors.As(err, &ae) || ae.SQLState != "23F01" {
		t.Fatalf("the old holder's late transaction: %v, want SQLSTATE 23F01", err)
	}
	rows, err := env.db.QueryContext(ctx, "SELECT holder FROM ledger WHERE resource = $1", resource)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var h string
		_ = rows.Scan(&h)
		got = append(got, h)
	}
	if strings.Join(got, ",") != "old,new" {
		t.Fatalf("ledger: %v", got)
	}
}
