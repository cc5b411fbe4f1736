package leaseproxy

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"sync"
	"testing"
	"time"
)

// fakeDB is a database/sql driver that records what it is asked and answers fencing.admit:
// a token whose resource's mark is higher is refused with SQLSTATE 23F01, as PostgreSQL's
// in-database package does.
type fakeDB struct {
	mu    sync.Mutex
	log   []string
	marks map[string]string
}

type fakeConn struct{ db *fakeDB }
type fakeTx struct{ c *fakeConn }
type fakeRows struct{ value string }

type pgError struct{ code, msg string }

func (e *pgError) Error() string    { return e.msg }
func (e *pgError) SQLState() string { return e.code }

func (d *fakeDB) Open(string) (driver.Conn, error) { return &fakeConn{db: d}, nil }

// fakeConnector opens fakeDB connections (sql.OpenDB: no global registration).
type fakeConnector struct{ db *fakeDB }

func (c fakeConnector) Connect(context.Context) (driver.Conn, error) { return &fakeConn{db: c.db}, nil }
func (c fakeConnector) Driver() driver.Driver                        { return c.db }

func (c *fakeConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("not prepared") }
func (c *fakeConn) Close() error                        { return nil }
func (c *fakeConn) Begin() (driver.Tx, error) {
	c.db.record("BEGIN")
	return &fakeTx{c: c}, nil
}
func (t *fakeTx) Commit() error   { t.c.db.record("COMMIT"); return nil }
func (t *fakeTx) Rollback() error { t.c.db.record("ROLLBACK"); return nil }

func (c *fakeConn) QueryContext(_ context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.db.record(query)
	if query != AdmitSQL || len(args) != 2 {
		return nil, errors.New("unexpected query")
	}
	resource, token := args[0].Value.(string), args[1].Value.(string)
	c.db.mu.Lock()
	defer c.db.mu.Unlock()
	if mark, ok := c.db.marks[resource]; ok && mark > token {
		return nil, &pgError{"23F01", "fencing token for resource " + resource + " is below its mark"}
	}
	c.db.marks[resource] = token
	return &fakeRows{value: "0:" + token}, nil
}

func (d *fakeDB) record(s string) {
	d.mu.Lock()
	d.log = append(d.log, s)
	d.mu.Unlock()
}

func (r *fakeRows) Columns() []string { return []string{"admit"} }
func (r *fakeRows) Close() error      { return nil }
func (r *fakeRows) Next(dest []driver.Value) error {
	if r.value == "" {
		return io.EOF
	}
	dest[0], r.value = r.value, ""
	return nil
}

func fakeLease(c *Client, resource, token string) *Lease {
	return &Lease{c: c, grant: Grant{Resource: resource, FencingToken: token},
		live: newLiveness(time.Now().Add(time.Hour), resource, 1)}
}

func TestAdmitRunsInTheCallersTransactionAndMapsTheRefusal(t *testing.T) {
	db := &fakeDB{marks: map[string]string{}}
	conn := sql.OpenDB(fakeConnector{db})
	defer conn.Close()
	c := &Client{}
	newer, older := fakeLease(c, "aisle-1", "t7"), fakeLease(c, "aisle-1", "t5")
	ctx := context.Background()

	tx, _ := conn.BeginTx(ctx, nil)
	mark, err := Admit(ContextWithLease(ctx, newer), tx, nil) // the lease from the context
	if err != nil || mark != "0:t7" {
		t.Fatalf("admit: %q %v", mark, err)
	}
	_ = tx.Commit()

	tx, _ = conn.BeginTx(ctx, nil)
	_, err = Admit(ctx, tx, older)
	var ae *AdmitError
	if !errors.Is(err, ErrStaleToken) || !errors.As(err, &ae) || ae.SQLState != "23F01" {
		t.Fatalf("a stale token: %v", err)
	}
	_ = tx.Rollback()

	newer.live.lose(&LostError{Reason: ReasonRevoked})
	tx, _ = conn.BeginTx(ctx, nil)
	if _, err := Admit(ctx, tx, newer); !errors.Is(err, ErrLost) {
		t.Fatalf("a lost lease: %v", err)
	}
	_ = tx.Rollback()
	if _, err := Admit(ctx, tx, nil); err == nil {
		t.Fatal("no lease: admitted")
	}

	injecting := &Client{chaos: newChaos(&TestMode{TokenRefusalRate: 1})}
	tx, _ = conn.BeginTx(ctx, nil)
	if _, err := Admit(ctx, tx, fakeLease(injecting, "aisle-2", "t9")); !errors.Is(err, ErrStaleToken) {
		t.Fatalf("an injected refusal: %v", err)
	}
	_ = tx.Rollback()

	want := []string{"BEGIN", AdmitSQL, "COMMIT", "BEGIN", AdmitSQL, "ROLLBACK", "BEGIN", "ROLLBACK", "BEGIN", "ROLLBACK"}
	if got := db.log; len(got) != len(want) {
		t.Fatalf("the database saw %q, want %q", got, want)
	}
	for i := range want {
		if db.log[i] != want[i] {
			t.Fatalf("the database saw %q, want %q", db.log, want)
		}
	}
}
