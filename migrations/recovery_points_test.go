package migrations_test

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/migrations"
	"github.com/orderservice/orderservice/tests/testdb"
)

// upTo is the service's migrations numbered last or lower: a database as
// an older build left it.
func upTo(t *testing.T, last int) fs.FS {
	t.Helper()
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	older := fstest.MapFS{}
	for _, n := range names {
		var v int
		if _, err := fmt.Sscanf(n, "%d_", &v); err != nil || v > last {
			continue
		}
		b, err := fs.ReadFile(migrations.FS, n)
		if err != nil {
			t.Fatal(err)
		}
		older[n] = &fstest.MapFile{Data: b}
	}
	return older
}

// The records written before recovery points were stored get the point the
// code used to infer: a definitive record is finished; an unfinished one
// (PROCESSING, or FAILED_RETRYABLE waiting for a retry) is at
// payment_created when its payment exists, whatever that payment's status
// now, and at started when it has none.
func TestRecoveryPointsAreDerivedForTheRecordsBeforeThem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := testdb.Fresh(t, "migrations-recovery")
	server, err := pgx.Connect(ctx, testdb.ServerURL())
	if err != nil {
		t.Fatalf("tests need PostgreSQL at TEST_DATABASE_URL or 127.0.0.1:5432: %v", err)
	}
	name := url[strings.LastIndex(url, "/")+1:]
	if i := strings.Index(name, "?"); i >= 0 {
		name = name[:i]
	}
	if _, err := server.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	server.Close(ctx)

	const before = 8 // the last migration without recovery points
	if v, err := database.MigrateSet(url, database.MigrationSet{FS: upTo(t, before), Dir: "."}); err != nil || v != before {
		t.Fatalf("migrate to %d: version %d, %v", before, v, err)
	}
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	// One order, and a record of each kind; payments under some of the keys.
	_, err = db.Exec(ctx, `
		INSERT INTO orders (id, tenant_id, customer_id, status, currency, total_amount)
		VALUES ('00000000-0000-7000-8000-000000000001', 'acme', 'cus', 'PAYMENT_PENDING', 'EUR', 900);

		INSERT INTO idempotency_records (tenant_id, operation, idempotency_key, fingerprint, state,
			outcome, result_code, result_body, lease_expires_at, completed_at, expires_at)
		VALUES
			('acme', 'order.pay',    'succeeded',             repeat('a', 64), 'SUCCEEDED',        'done',   NULL,       '{}', NULL,                        now(), now() + interval '1 day'),
			('acme', 'order.pay',    'failed-final',          repeat('a', 64), 'FAILED_FINAL',     'failed', 'declined', '{}', NULL,                        now(), now() + interval '1 day'),
			('acme', 'order.pay',    'in-flight-paid',        repeat('a', 64), 'PROCESSING',       NULL,     NULL,       NULL, now() + interval '1 minute', NULL,  now() + interval '1 day'),
			('acme', 'order.cancel', 'retryable-refunding',   repeat('a', 64), 'FAILED_RETRYABLE', NULL,     NULL,       NULL, now() + interval '1 minute', NULL,  now() + interval '1 day'),
			('acme', 'order.pay',    'in-flight-settled',     repeat('a', 64), 'PROCESSING',       NULL,     NULL,       NULL, now() + interval '1 minute', NULL,  now() + interval '1 day'),
			('acme', 'order.pay',    'in-flight-no-payment',  repeat('a', 64), 'PROCESSING',       NULL,     NULL,       NULL, now() + interval '1 minute', NULL,  now() + interval '1 day'),
			('acme', 'order.pay',    'retryable-no-payment',  repeat('a', 64), 'FAILED_RETRYABLE', NULL,     NULL,       NULL, now() + interval '1 minute', NULL,  now() + interval '1 day'),
			('acme', 'order.pay',    'other-tenant-payment',  repeat('a', 64), 'PROCESSING',       NULL,     NULL,       NULL, now() + interval '1 minute', NULL,  now() + interval '1 day');

		INSERT INTO payments (id, order_id, tenant_id, kind, status, amount, currency, channel_key, refund_of, operation, idempotency_key)
		VALUES
			('00000000-0000-7000-8000-0000000000a1', '00000000-0000-7000-8000-000000000001', 'acme',  'charge', 'failed',    900, 'EUR', 'k1', NULL,   'order.pay',    'succeeded'),
			('00000000-0000-7000-8000-0000000000a2', '00000000-0000-7000-8000-000000000001', 'acme',  'charge', 'pending',   900, 'EUR', 'k2', NULL,   'order.pay',    'in-flight-paid'),
			('00000000-0000-7000-8000-0000000000a3', '00000000-0000-7000-8000-000000000001', 'acme',  'refund', 'pending',   900, 'EUR', 'k3', 'ch_1', 'order.cancel', 'retryable-refunding'),
			('00000000-0000-7000-8000-0000000000a4', '00000000-0000-7000-8000-000000000001', 'acme',  'charge', 'failed',    900, 'EUR', 'k4', NULL,   'order.pay',    'in-flight-settled'),
			('00000000-0000-7000-8000-0000000000a5', '00000000-0000-7000-8000-000000000001', 'other', 'charge', 'failed',    900, 'EUR', 'k5', NULL,   'order.pay',    'other-tenant-payment');`)
	if err != nil {
		t.Fatalf("rows as version %d holds them: %v", before, err)
	}

	latest, err := database.LatestVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v, err := database.Migrate(url); err != nil || v != latest {
		t.Fatalf("migrate on to the latest: version %d, %v; want %d", v, err, latest)
	}
	want := map[string]string{
		"succeeded":            "finished",
		"failed-final":         "finished",
		"in-flight-paid":       "payment_created",
		"retryable-refunding":  "payment_created",
		"in-flight-settled":    "payment_created", // a webhook settled the payment; the intent must still store it
		"in-flight-no-payment": "started",
		"retryable-no-payment": "started",
		"other-tenant-payment": "started", // the payment under the key is another tenant's
	}
	rows, err := db.Query(ctx, "SELECT idempotency_key, recovery_point FROM idempotency_records")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var key, point string
		if err := rows.Scan(&key, &point); err != nil {
			t.Fatal(err)
		}
		got[key] = point
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for key, point := range want {
		if got[key] != point {
			t.Errorf("record %q is at %q, want %q", key, got[key], point)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d records after the migration, want %d", len(got), len(want))
	}

	// Only a definitive record is finished, and only the known points are stored.
	for _, bad := range []string{
		"UPDATE idempotency_records SET recovery_point = 'finished' WHERE idempotency_key = 'in-flight-paid'",
		"UPDATE idempotency_records SET recovery_point = 'halfway' WHERE idempotency_key = 'in-flight-no-payment'",
	} {
		if _, err := db.Exec(ctx, bad); err == nil || !strings.Contains(err.Error(), "check constraint") {
			t.Errorf("%s: %v, want a check constraint's refusal", bad, err)
		}
	}
}
