package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/tests/testdb"
)

// TestACreateInOneTripIsAllOrNothing checks the floor path of §2 against a
// migrated database: one batch writes the record and every order row, and a
// second batch with the same key aborts whole, for its read stops nothing
// and its insert meets the key: no second order, item, event or outbox
// row. It needs PostgreSQL and fails, never skips, without it.
func TestACreateInOneTripIsAllOrNothing(t *testing.T) {
	dbURL, drop, err := testdb.Create("bench_onetrip")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	with, err := newDirectCreate(ctx, dbURL, oneTripWithRecord, 2, time.Minute, time.Hour, 5*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer with.Close()
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	counts := func() (n [5]int64) {
		t.Helper()
		for i, table := range []string{"idempotency_records", "orders", "order_items", "order_events", "order_outbox"} {
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n[i]); err != nil {
				t.Fatal(err)
			}
		}
		return n
	}
	send := func(d *directCreate) (*http.Response, error) {
		body, _ := json.Marshal(newCreate(7))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://direct.invalid/v1/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", "one-trip-key")
		return d.RoundTrip(req)
	}

	if _, err := send(with); err != nil {
		t.Fatalf("the first create: %v", err)
	}
	if got, want := counts(), [5]int64{1, 1, 2, 1, 1}; got != want {
		t.Fatalf("after one create: records, orders, items, events, outbox = %v, want %v", got, want)
	}

	if _, err := send(with); err == nil {
		t.Fatal("a create in one trip with a key already taken succeeded")
	}
	if got, want := counts(), [5]int64{1, 1, 2, 1, 1}; got != want {
		t.Errorf("after a create whose key was taken: records, orders, items, events, outbox = %v, want %v (nothing more)", got, want)
	}
}

// TestASessionSettingIsCheckedWhereItIsOpened checks the pool §7's third
// cleanup run works on: its sessions have the setting asked for, and a
// setting the server reads otherwise than it was written is an error, not
// a run at some other setting.
func TestASessionSettingIsCheckedWhereItIsOpened(t *testing.T) {
	dbURL := testdb.ServerURL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := database.Options{MaxConns: 1, StatementTimeout: 5 * time.Second, LockTimeout: time.Second}
	db, err := openWithSetting(ctx, dbURL, opts, "wal_compression", "lz4")
	if err != nil {
		t.Fatalf("wal_compression=lz4: %v", err)
	}
	database.Close(db)
	// PostgreSQL reads DateStyle=iso as "ISO, MDY".
	if db, err := openWithSetting(ctx, dbURL, opts, "DateStyle", "iso"); err == nil {
		database.Close(db)
		t.Error("a session whose setting reads otherwise than asked was accepted")
	}
}

// TestAPollStopsWhenItsCountComesOrItsTimeRunsOut checks waitFor, which the
// outbox drain before each §2 slice and the waiting scenario rely on: done
// at once when the count is there, an error naming the count when it never
// comes, and the context's error when the run ends first.
func TestAPollStopsWhenItsCountComesOrItsTimeRunsOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, testdb.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	b := &bench{admin: admin}
	two := func(n int64) bool { return n == 2 }

	if err := b.waitFor(ctx, time.Minute, two, "SELECT $1::bigint", 2); err != nil {
		t.Errorf("a count already there: %v", err)
	}
	err = b.waitFor(ctx, 50*time.Millisecond, two, "SELECT $1::bigint", 1)
	if err == nil || !strings.Contains(err.Error(), "still counts 1") {
		t.Errorf("a count that never comes = %v, want an error naming the count left", err)
	}
	ended, end := context.WithCancel(ctx)
	end()
	if err := b.waitFor(ended, time.Minute, two, "SELECT $1::bigint", 1); !errors.Is(err, context.Canceled) {
		t.Errorf("a poll whose run ended = %v, want context.Canceled", err)
	}
}
