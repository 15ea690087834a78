package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/orderservice/orderservice/tests/testdb"
)

func TestAnEventDeliveredTwiceIsAppliedOnce(t *testing.T) {
	dbURL, drop, err := testdb.Create("inboxconsumer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	ctx := context.Background()
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(ctx, schema); err != nil {
		t.Fatal(err)
	}
	paid := func(id string) []byte {
		return []byte(fmt.Sprintf(`{"event_id":%q,"event":"paid","order":{"customer_id":"cus_1"}}`, id))
	}
	// The first copy, the relay's republish after the duplicate window, and
	// a redelivery after a lost ack: one event, three deliveries.
	for range 3 {
		if err := apply(ctx, db, paid("0191a5e2-0000-7000-8000-000000000001")); err != nil {
			t.Fatal(err)
		}
	}
	if err := apply(ctx, db, paid("0191a5e2-0000-7000-8000-000000000002")); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := db.QueryRow(ctx, "SELECT paid FROM example_paid_orders WHERE customer_id = 'cus_1'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("paid = %d, want 2 (two events, one of them delivered three times)", n)
	}
}
