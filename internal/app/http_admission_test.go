package app_test

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/tests/apptest"
)

// TestARequestRefusedByTheAdmissionLimitRecordsNothing holds the only slot
// with a create stopped inside its transaction, sends a second create, and
// checks that it is shed with 503 and Retry-After, that nothing of it was
// stored, and that its retry with the same key, once the slot is free, is a
// fresh first execution.
func TestARequestRefusedByTheAdmissionLimitRecordsNothing(t *testing.T) {
	// A tenant of its own: the package's database is shared, and the
	// isolation test counts every order of acme and globex.
	const key = "test-key-shed-0123"
	m := apptest.Start(t, dbURL, map[string]string{"HTTP_MAX_IN_FLIGHT": "1", "HTTP_MAX_QUEUE": "0", "API_KEYS": "shed=" + key})
	c := apptest.NewClient(m, key)
	inside, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	m.Orders.Hooks.AfterOrderInsert = func() error {
		once.Do(func() { close(inside); <-release })
		return nil
	}
	// Keys of this run's own: with -count=2 the second run must not find
	// the first's records.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	holderKey, shedKey := "shed-holder-"+run, "shed-arrival-"+run
	body := map[string]any{"customer_id": "cus_shed", "currency": "EUR",
		"items": []map[string]any{{"sku": "SKU-1", "quantity": 1, "unit_price": 100}}}

	holder := make(chan apptest.Response, 1)
	go func() {
		r, err := c.Send(http.MethodPost, "/v1/orders", holderKey, body, nil)
		if err != nil {
			t.Error(err)
		}
		holder <- r
	}()
	<-inside // the one slot is taken until release

	shed := c.Do(t, http.MethodPost, "/v1/orders", shedKey, body)
	if shed.Status != http.StatusServiceUnavailable || !strings.Contains(string(shed.Body), `"code":"service_unavailable"`) {
		t.Fatalf("second create while the slot is held = %d %s, want 503 service_unavailable", shed.Status, shed.Body)
	}
	if got := shed.Header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want \"1\"", got)
	}
	sqlDB, err := m.DB.DB()
	if err != nil {
		t.Fatal(err)
	}
	var records, orders int
	if err := sqlDB.QueryRow(`SELECT count(*) FROM idempotency_records WHERE idempotency_key = $1`, shedKey).Scan(&records); err != nil {
		t.Fatal(err)
	}
	if err := sqlDB.QueryRow(`SELECT count(*) FROM order_events WHERE idempotency_key = $1`, shedKey).Scan(&orders); err != nil {
		t.Fatal(err)
	}
	if records != 0 || orders != 0 {
		t.Errorf("the shed request left %d records and %d orders, want none", records, orders)
	}

	close(release)
	if r := <-holder; r.Status != http.StatusCreated {
		t.Fatalf("the holder = %d %s", r.Status, r.Body)
	}
	retry := c.Do(t, http.MethodPost, "/v1/orders", shedKey, body)
	if retry.Status != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the retry = %d (Idempotent-Replayed %q) %s, want a fresh 201", retry.Status, retry.Header.Get("Idempotent-Replayed"), retry.Body)
	}
	var attempts int
	if err := sqlDB.QueryRow(`SELECT attempts FROM idempotency_records WHERE idempotency_key = $1 AND state = 'SUCCEEDED'`, shedKey).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 {
		t.Errorf("the retry's record has attempts = %d, want 1 (its first execution)", attempts)
	}
}
