package app_test

// The whole-program tests: what needs the service as it runs, booted by
// apptest.Start (HTTP, NATS, the embedded channel, the sweeper, the waiter)
// or as its real binaries: a process killed and restarted, waits across
// two instances, a shutdown under a wait, the admission limit, the metrics
// a running program exports. The use cases' own behaviour (refusals, lost
// answers, takeovers, fencing, exact counts) is proved against
// order.Service in internal/order; how HTTP writes it, in internal/httpapi.
// This file holds what the program_*_test.go files share.

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/tests/apptest"
)

// isolateMoney fails at once if an earlier test left unfinished money
// intents in the package's database: this test's sweeper would resume
// them against its own channel and spoil its exact counts. When the test
// ends (after its services closed) it fails if the test left any itself,
// and removes them so that later tests are not spoiled in turn.
func isolateMoney(t *testing.T) {
	t.Helper()
	db, err := database.Open(context.Background(), dbURL, database.Options{MaxConns: 2, StatementTimeout: 5 * time.Second, LockTimeout: time.Second})
	if err != nil {
		t.Fatalf("open the test database: %v", err)
	}
	if n := unfinishedMoney(t, db, false); n != 0 {
		t.Fatalf("test isolation: %d unfinished order.pay/order.cancel intents were left by an earlier test; "+
			"this test's sweeper would resume them against its own channel", n)
	}
	t.Cleanup(func() {
		if n := unfinishedMoney(t, db, true); n != 0 {
			t.Errorf("the test left %d unfinished money intents behind (now removed)", n)
		}
		_ = database.Close(db)
	})
}

// unfinishedMoney counts the unfinished money intents, and with remove
// deletes them.
func unfinishedMoney(t *testing.T, db *gorm.DB, remove bool) int64 {
	t.Helper()
	const unfinished = `state IN ('PROCESSING', 'FAILED_RETRYABLE') AND operation IN ('order.pay', 'order.cancel')`
	n := apptest.Count(t, db, `SELECT count(*) FROM idempotency_records WHERE `+unfinished)
	if remove && n > 0 {
		if err := db.Exec(`DELETE FROM idempotency_records WHERE ` + unfinished).Error; err != nil {
			t.Errorf("remove unfinished intents: %v", err)
		}
	}
	return n
}

// newKey returns an Idempotency-Key no other test uses.
func newKey(label string) string { return label + "-" + uuid.NewString()[:8] }

// placeOrder creates an order (2 × 1250) as c's tenant and returns its id.
func placeOrder(t *testing.T, c *apptest.Client) string {
	t.Helper()
	r := c.Do(t, http.MethodPost, "/v1/orders", newKey("create"), map[string]any{"customer_id": "cus_program", "currency": "EUR",
		"items": []map[string]any{{"sku": "SKU-1", "quantity": 2, "unit_price": 1250}}})
	if r.Status != http.StatusCreated {
		t.Fatalf("create: status %d: %s", r.Status, r.Body)
	}
	return r.JSON(t)["id"].(string)
}

// payWith is the body of a pay with the channel's test token method.
func payWith(method string) map[string]any { return map[string]any{"payment_method": method} }

// pay sends POST /v1/orders/{id}/pay.
func pay(t *testing.T, c *apptest.Client, id, key, method string) apptest.Response {
	t.Helper()
	return c.Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", key, payWith(method))
}

// statusOf is the order's status as GET shows it.
func statusOf(t *testing.T, c *apptest.Client, id string) string {
	t.Helper()
	r := c.Do(t, http.MethodGet, "/v1/orders/"+id, "", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET order: %d %s", r.Status, r.Body)
	}
	return r.JSON(t)["status"].(string)
}

// historyOf lists the order's events in order, e.g. "create,pay,payment_succeeded".
func historyOf(t *testing.T, c *apptest.Client, id string) string {
	t.Helper()
	r := c.Do(t, http.MethodGet, "/v1/orders/"+id+"/events", "", nil)
	var page struct {
		Events []struct {
			Event string `json:"event"`
		} `json:"events"`
	}
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &page) != nil {
		t.Fatalf("GET events: %d %s", r.Status, r.Body)
	}
	names := make([]string, len(page.Events))
	for i, e := range page.Events {
		names[i] = e.Event
	}
	return strings.Join(names, ",")
}
