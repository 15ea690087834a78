// Package testdb gives each test package a fresh, migrated PostgreSQL
// database. It never skips: a test run that cannot reach PostgreSQL fails
// and says why.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
)

// ServerURL is the server tests use: TEST_DATABASE_URL, or the local
// PostgreSQL that `make test` expects.
func ServerURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// Create makes a new database named after prefix, applies the migrations,
// and returns its URL and a function that drops it.
func Create(prefix string) (dbURL string, drop func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	server := ServerURL()
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return "", nil, fmt.Errorf("tests need PostgreSQL at %s (set TEST_DATABASE_URL): %w", redact(server), err)
	}
	defer conn.Close(ctx)

	dbURL, drop = NewURL(prefix)
	name := strings.TrimPrefix(mustParse(dbURL).Path, "/")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("create test database: %w", err)
	}
	if _, err := database.Migrate(dbURL); err != nil {
		drop()
		return "", nil, err
	}
	return dbURL, drop, nil
}

// NewURL names a database on the test server that does not exist yet, for
// code that creates and migrates its own database (the payment channel's),
// and returns a function that drops it if it was created.
func NewURL(prefix string) (dbURL string, drop func()) {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := "test_" + strings.ReplaceAll(prefix, "-", "_") + "_" + hex.EncodeToString(suffix)
	server := ServerURL()
	u := mustParse(server)
	u.Path = "/" + name
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, server); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			c.Close(ctx)
		}
	}
	return u.String(), drop
}

// Fresh is NewURL for one test: the database is dropped when t ends.
func Fresh(t testing.TB, prefix string) string {
	t.Helper()
	dbURL, drop := NewURL(prefix)
	t.Cleanup(drop)
	return dbURL
}

func mustParse(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		return &url.URL{Scheme: "postgres", Host: "invalid-TEST_DATABASE_URL"} // fails at connect, with the reason
	}
	return u
}

// Main is the body of a TestMain: it creates the package's database, runs
// the tests with its URL, and drops it.
func Main(run func(dbURL string) int, prefix string) int {
	dbURL, drop, err := Create(prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer drop()
	return run(dbURL)
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// WaitForLockWaiter returns once a session of db's database waits for a
// lock, as a duplicate's insert does on a key another transaction has not
// committed yet; after 10 seconds it fails the test, naming what was to wait.
func WaitForLockWaiter(t testing.TB, db *gorm.DB, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var n int64
		if err := db.Raw(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n).Error; err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
	}
	t.Fatalf("%s did not wait for a lock within 10s", what)
}
