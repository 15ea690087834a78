package database_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/tests/testdb"
)

// testOptions are the options the service's defaults (app.Config) give.
var testOptions = database.Options{MaxConns: 20, StatementTimeout: 5 * time.Second, LockTimeout: 3 * time.Second,
	ConnMaxLifetime: database.DefaultConnMaxLifetime}

var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "database"))
}

func TestTransientErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"25006 a write on a read-only server (a replica)": {&pgconn.PgError{Code: "25006"}, true},
		"57P01 admin shutdown (a switchover)":             {&pgconn.PgError{Code: "57P01", Severity: "FATAL"}, true},
		"57P03 cannot connect now (starting up)":          {&pgconn.PgError{Code: "57P03"}, true},
		"08006 connection failure":                        {&pgconn.PgError{Code: "08006"}, true},
		"no read-write host (target_session_attrs)":       {fmt.Errorf("connect: %w", pgconn.ErrReadOnlyConnection), true},
		"a replica found by the readiness check":          {database.ErrReadOnly, true},
		"23505 unique violation":                          {&pgconn.PgError{Code: "23505"}, false},
		"28P01 bad password":                              {&pgconn.PgError{Code: "28P01"}, false},
		"a plain error":                                   {errors.New("boom"), false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := database.IsUnavailable(tc.err); got != tc.want {
				t.Errorf("IsUnavailable = %v, want %v", got, tc.want)
			}
		})
	}
}

// withParams returns dbURL with its hosts replaced and query parameters added.
func withParams(t *testing.T, hosts string, params url.Values) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = hosts
	q := u.Query()
	for k, vs := range params {
		q[k] = vs
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func open(t *testing.T, url string, opts database.Options) *gorm.DB {
	t.Helper()
	db, err := database.Open(context.Background(), url, opts)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	t.Cleanup(func() { database.Close(db) })
	return db
}

func backendPID(t *testing.T, db *gorm.DB) int {
	t.Helper()
	var pid int
	if err := db.Raw("SELECT pg_backend_pid()").Row().Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestMultiHostURL(t *testing.T) {
	u, _ := url.Parse(dbURL)
	hosts := deadAddr(t) + "," + u.Host // the first host is down, as a failed primary is
	rw := url.Values{"target_session_attrs": {"read-write"}}

	t.Run("the pool connects to the host that accepts writes", func(t *testing.T) {
		db := open(t, withParams(t, hosts, rw), testOptions)
		if err := database.CheckWritable(context.Background(), db); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a missing database is created and migrated through the multi-host URL", func(t *testing.T) {
		suffix := make([]byte, 4)
		_, _ = rand.Read(suffix)
		name := "test_database_multihost_" + hex.EncodeToString(suffix)
		mu, _ := url.Parse(withParams(t, hosts, rw))
		mu.Path = "/" + name
		t.Cleanup(func() { dropDatabase(t, name) })

		db := open(t, mu.String(), testOptions)
		v, err := database.Migrate(mu.String())
		if err != nil {
			t.Fatalf("migrate: %v", err)
		}
		latest, _ := database.LatestVersion()
		got, dirty, err := database.SchemaVersion(context.Background(), db)
		if err != nil || dirty || got != latest || v != latest {
			t.Fatalf("schema at %d (dirty %v, err %v), migrate said %d, want %d", got, dirty, err, v, latest)
		}
	})
}

func dropDatabase(t *testing.T, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testdb.ServerURL())
	if err != nil {
		t.Errorf("drop %s: %v", name, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		t.Errorf("drop %s: %v", name, err)
	}
}

func TestReadOnlyServer(t *testing.T) {
	u, _ := url.Parse(dbURL)
	// A server that refuses every write, as a replica does.
	readOnly := url.Values{"options": {"-cdefault_transaction_read_only=on"}}

	t.Run("target_session_attrs=read-write does not use it: unavailable, nothing sent", func(t *testing.T) {
		params := url.Values{"target_session_attrs": {"read-write"}}
		for k, v := range readOnly {
			params[k] = v
		}
		_, err := database.Open(context.Background(), withParams(t, u.Host, params), testOptions)
		if err == nil || !database.IsUnavailable(err) {
			t.Fatalf("open = %v, want an unavailable error", err)
		}
	})

	t.Run("a write there is transient and its connection is discarded", func(t *testing.T) {
		db := open(t, withParams(t, u.Host, readOnly), database.Options{MaxConns: 1, StatementTimeout: 5 * time.Second, LockTimeout: time.Second})
		if err := database.CheckWritable(context.Background(), db); !errors.Is(err, database.ErrReadOnly) {
			t.Fatalf("CheckWritable = %v, want ErrReadOnly", err)
		}
		before := backendPID(t, db)
		err := db.Exec("CREATE TABLE never_created (id int)").Error
		if database.SQLState(err) != "25006" || !database.IsUnavailable(err) {
			t.Fatalf("write = %v (SQLSTATE %q), want a transient 25006", err, database.SQLState(err))
		}
		if after := backendPID(t, db); after == before {
			t.Errorf("the pool kept the connection (backend %d) that answered 25006", before)
		}
	})
}

func TestAdminShutdownIsTransientAndItsConnectionDiscarded(t *testing.T) {
	db := open(t, dbURL, database.Options{MaxConns: 1, StatementTimeout: 5 * time.Second, LockTimeout: time.Second})
	before := backendPID(t, db)
	other := open(t, dbURL, database.Options{MaxConns: 1, StatementTimeout: 5 * time.Second, LockTimeout: time.Second})
	if err := other.Exec("SELECT pg_terminate_backend(?)", before).Error; err != nil {
		t.Fatal(err)
	}
	// As a switchover's fast shutdown does to every session of the old primary.
	var n int
	err := db.Raw("SELECT 1").Row().Scan(&n)
	if err == nil {
		// The pool's health check on reuse found the dead connection first.
		t.Log("the terminated connection was discarded before use")
	} else if !database.IsUnavailable(err) {
		t.Fatalf("query on a terminated connection = %v (SQLSTATE %q), want transient", err, database.SQLState(err))
	} else {
		t.Logf("query on a terminated connection: %v (SQLSTATE %q): transient", err, database.SQLState(err))
	}
	if after := backendPID(t, db); after == before {
		t.Errorf("the pool still uses terminated backend %d", before)
	}
}

func TestCheckURL(t *testing.T) {
	for _, ok := range []string{
		"postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write",
		"postgres://u:p@127.0.0.1:5432/db?sslmode=disable",
	} {
		if err := database.CheckURL(ok); err != nil {
			t.Errorf("CheckURL(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{
		"postgres://u@h1:notaport/db",
		"postgres://u@h1:5432,h2:5432/db?target_session_attrs=sometimes",
	} {
		if err := database.CheckURL(bad); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("CheckURL(%q) = %v, want a one-line error", bad, err)
		}
	}
}

// TestATransactionWhoseCallerLeftSaysSo: when the caller's context ends
// while a transaction is open, database/sql rolls it back, and the commit
// that follows fails with sql.ErrTxDone, which says nothing of why. The
// caller must learn that its context ended (a 503 "cancelled, retry with
// the same key"), not that the service broke (a 500), and nothing of the
// transaction may be committed.
func TestATransactionWhoseCallerLeftSaysSo(t *testing.T) {
	db := open(t, dbURL, testOptions)
	if err := db.Exec(`CREATE TABLE cancelled_writes (n int)`).Error; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec(`DROP TABLE cancelled_writes`) })
	for name, tc := range map[string]struct {
		// deadline, when not zero, ends the context; otherwise the
		// transaction cancels it once it has written.
		deadline time.Duration
		want     error
	}{
		"cancelled": {0, context.Canceled},
		// Long enough for the insert to be done first on a loaded machine.
		"past its deadline": {500 * time.Millisecond, context.DeadlineExceeded},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.deadline > 0 {
				var stop context.CancelFunc
				ctx, stop = context.WithTimeout(ctx, tc.deadline)
				defer stop()
			}
			err := database.Transact(ctx, db, func(tx *gorm.DB) error {
				var pid int
				if err := tx.Raw(`INSERT INTO cancelled_writes VALUES (1) RETURNING pg_backend_pid()`).Scan(&pid).Error; err != nil {
					return err
				}
				if tc.deadline == 0 {
					cancel()
				}
				<-ctx.Done()
				waitIdle(t, db, pid) // database/sql has rolled the transaction back
				return nil
			})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Transact = %v, want an error that is %v", err, tc.want)
			}
			var n int64
			if err := db.Raw(`SELECT count(*) FROM cancelled_writes`).Scan(&n).Error; err != nil || n != 0 {
				t.Fatalf("rows committed = %d (%v), want 0", n, err)
			}
		})
	}
}

// waitIdle waits until backend pid is no longer in a transaction: idle, or
// gone with the connection database/sql discarded.
func waitIdle(t *testing.T, db *gorm.DB, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var state string
		if err := db.Raw(`SELECT state FROM pg_stat_activity WHERE pid = ?`, pid).Scan(&state).Error; err != nil {
			t.Fatal(err)
		}
		if state != "idle in transaction" && state != "active" {
			return
		}
	}
	t.Fatalf("backend %d still in its transaction after 10s", pid)
}

func TestADatabaseFromAnotherMigrationHistoryIsRefusedWithTheWayOut(t *testing.T) {
	url, drop, err := testdb.Create("database-history")
	if err != nil {
		t.Fatal(err)
	}
	defer drop()
	latest, err := database.LatestVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v, err := database.Migrate(url); err != nil || v != latest {
		t.Fatalf("migrating an up-to-date database again: version %d, %v; want %d, nil", v, err, latest)
	}
	db, err := database.Open(context.Background(), url, testOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = database.Close(db) }()
	// Version 11 is where the development history stood before the
	// migrations were made one baseline.
	if err := db.Exec("UPDATE schema_migrations SET version = 11").Error; err != nil {
		t.Fatal(err)
	}
	_, err = database.Migrate(url)
	if err == nil || !strings.Contains(err.Error(), "migration 11") || !strings.Contains(err.Error(), "recreate") {
		t.Fatalf("Migrate = %v, want a refusal naming version 11 and saying to recreate the database", err)
	}
}
