package order_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/apptest"
	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment/channel"
)

// moneyTenant is the tenant apptest.KeyAcme belongs to.
const moneyTenant = "acme"

// moneyTotal is what createBody's order costs: 2 × 1250.
const moneyTotal = 2500

// moneyKey returns a key no other test uses: every test package shares one
// database, and a key reused on another order would be a 422.
func moneyKey(label string) string { return label + "-" + uuid.NewString()[:8] }

// startMoney boots the service for a money test, isolated by moneyIsolate.
func startMoney(t *testing.T, env map[string]string) (*app.Main, *apptest.Client) {
	t.Helper()
	moneyIsolate(t)
	return start(t, env)
}

// moneyIsolate fails at once if an earlier test left unfinished money
// intents behind: this test's sweeper would resume them against this test's
// channel and spoil its exact counts. When the test ends (after its service
// closed) it fails if the test left any itself, and removes them so that
// later tests are not spoiled in turn.
func moneyIsolate(t *testing.T) {
	t.Helper()
	if n := moneyUnfinished(t, false); n != 0 {
		t.Fatalf("test isolation: %d unfinished order.pay/order.cancel intents were left in the shared database by an earlier test; "+
			"this test's sweeper would resume them against its own channel", n)
	}
	t.Cleanup(func() {
		if n := moneyUnfinished(t, true); n != 0 {
			t.Errorf("the test left %d unfinished money intents behind (now removed)", n)
		}
	})
}

var moneyPool struct {
	once sync.Once
	db   *gorm.DB
	err  error
}

// moneyDB is a pool on the package's database of its own, usable before a
// service starts and after it closed. TestMain drops the database at the end.
func moneyDB(t *testing.T) *gorm.DB {
	t.Helper()
	moneyPool.once.Do(func() {
		moneyPool.db, moneyPool.err = database.Open(context.Background(), dbURL,
			database.Options{MaxConns: 2, StatementTimeout: 5 * time.Second, LockTimeout: time.Second})
	})
	if moneyPool.err != nil {
		t.Fatalf("open test database: %v", moneyPool.err)
	}
	return moneyPool.db
}

// moneyUnfinished counts the unfinished money intents in the shared
// database, and with remove deletes them.
func moneyUnfinished(t *testing.T, remove bool) int64 {
	t.Helper()
	db := moneyDB(t)
	const unfinished = `state IN ('PROCESSING', 'FAILED_RETRYABLE') AND operation IN ('order.pay', 'order.cancel')`
	var n int64
	if err := db.Raw(`SELECT count(*) FROM idempotency_records WHERE ` + unfinished).Scan(&n).Error; err != nil {
		t.Fatalf("count unfinished intents: %v", err)
	}
	if remove && n > 0 {
		if err := db.Exec(`DELETE FROM idempotency_records WHERE ` + unfinished).Error; err != nil {
			t.Errorf("remove unfinished intents: %v", err)
		}
	}
	return n
}

func moneyPayBody(method string) map[string]any { return map[string]any{"payment_method": method} }

// moneyPay sends POST /v1/orders/{id}/pay.
func moneyPay(t *testing.T, c *apptest.Client, id, key, method string) apptest.Response {
	t.Helper()
	return c.Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", key, moneyPayBody(method))
}

// moneyCancel sends POST /v1/orders/{id}/cancel.
func moneyCancel(t *testing.T, c *apptest.Client, id, key string) apptest.Response {
	t.Helper()
	return c.Do(t, http.MethodPost, "/v1/orders/"+id+"/cancel", key, map[string]any{})
}

// moneyOrder is the part of an order the money tests look at.
type moneyOrder struct {
	Status      string `json:"status"`
	TotalAmount int64  `json:"total_amount"`
	Payment     *struct {
		Status   string `json:"status"`
		Amount   int64  `json:"amount"`
		ChargeID string `json:"charge_id"`
		RefundID string `json:"refund_id"`
	} `json:"payment"`
}

func moneyReadOrder(t *testing.T, c *apptest.Client, id string) moneyOrder {
	t.Helper()
	r := c.Do(t, http.MethodGet, "/v1/orders/"+id, "", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET order: %d %s", r.Status, r.Body)
	}
	return moneyDecodeOrder(t, r.Body)
}

func moneyDecodeOrder(t *testing.T, body []byte) moneyOrder {
	t.Helper()
	var o moneyOrder
	if err := json.Unmarshal(body, &o); err != nil {
		t.Fatalf("order body: %v: %s", err, body)
	}
	return o
}

// moneyEvent is one entry of GET /v1/orders/{id}/events.
type moneyEvent struct {
	Event          string `json:"event"`
	Operation      string `json:"operation"`
	IdempotencyKey string `json:"idempotency_key"`
	FromStatus     string `json:"from_status"`
	ToStatus       string `json:"to_status"`
}

func moneyEvents(t *testing.T, c *apptest.Client, id string) []moneyEvent {
	t.Helper()
	r := c.Do(t, http.MethodGet, "/v1/orders/"+id+"/events", "", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET events: %d %s", r.Status, r.Body)
	}
	var body struct {
		Events []moneyEvent `json:"events"`
	}
	if err := json.Unmarshal(r.Body, &body); err != nil {
		t.Fatalf("events body: %v: %s", err, r.Body)
	}
	return body.Events
}

// moneyEventNames lists the events in order, e.g. "create,pay,payment_succeeded".
func moneyEventNames(events []moneyEvent) string {
	names := make([]string, len(events))
	for i, e := range events {
		names[i] = e.Event
	}
	return strings.Join(names, ",")
}

// moneyCode is the code of a problem+json body, or "".
func moneyCode(body []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Code
}

// moneyWantAnswer asserts the status and, for problems, the code.
func moneyWantAnswer(t *testing.T, what string, r apptest.Response, status int, code string) {
	t.Helper()
	if r.Status != status || moneyCode(r.Body) != code {
		t.Fatalf("%s = %d %s, want %d %q", what, r.Status, r.Body, status, code)
	}
}

// moneyWantFresh asserts that r executed rather than replayed.
func moneyWantFresh(t *testing.T, r apptest.Response) {
	t.Helper()
	if got := r.Header.Get("Idempotent-Replayed"); got != "" {
		t.Errorf("a response that executed has Idempotent-Replayed %q", got)
	}
}

// moneyRecord reads the acme tenant's record of (op, key).
func moneyRecord(t *testing.T, m *app.Main, op, key string) idempotency.Record {
	t.Helper()
	rec, err := m.Orders.Records.Get(m.DB, idempotency.Scope{TenantID: moneyTenant, Operation: op, Key: key})
	if err != nil {
		t.Fatalf("record %s %s: %v", op, key, err)
	}
	return rec
}

// moneyStats compares the counters a test cares about; -1 means "any".
type moneyStats struct {
	charges, declined, refunds, requests, lookups, duplicates int64
}

func moneyCheckStats(t *testing.T, got channel.Stats, want moneyStats) {
	t.Helper()
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"charges", got.Charges, want.charges},
		{"declined", got.Declined, want.declined},
		{"refunds", got.Refunds, want.refunds},
		{"requests (POSTs)", got.Requests, want.requests},
		{"lookups", got.Lookups, want.lookups},
		{"duplicates absorbed", got.DuplicatesAbsorbed, want.duplicates},
	} {
		if c.want >= 0 && c.got != c.want {
			t.Errorf("channel %s = %d, want %d (stats %+v)", c.name, c.got, c.want, got)
		}
	}
}

// moneyEventually polls cond every 100ms until it holds or timeout passes.
func moneyEventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, still not %s; last seen: %s", timeout, what, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// moneyTransient reports whether an answer asks the client to retry the same key.
func moneyTransient(r apptest.Response) bool {
	return r.Status == http.StatusServiceUnavailable ||
		(r.Status == http.StatusConflict && moneyCode(r.Body) == "request_in_progress")
}

// moneyAttempt is the story of one intent sent until it got a definitive answer.
type moneyAttempt struct {
	key      string
	seen     []int // every status, in order
	final    apptest.Response
	retried  int // transient answers retried with the same key
	err      error
	unwanted []string // answers outside 200, 409, 503
}

// moneySend sends one intent, and again with the same key while
// the answer is 503 or 409 request_in_progress (bounded). Safe in goroutines.
func moneySend(c *apptest.Client, path, key string, body any) moneyAttempt {
	a := moneyAttempt{key: key}
	for i := 0; i < 150; i++ {
		r, err := c.Send(http.MethodPost, path, key, body, nil)
		if err != nil {
			a.err = err
			return a
		}
		a.seen = append(a.seen, r.Status)
		switch r.Status {
		case http.StatusOK, http.StatusConflict, http.StatusServiceUnavailable:
		default:
			a.unwanted = append(a.unwanted, fmt.Sprintf("%d %s", r.Status, r.Body))
		}
		if (r.Status == http.StatusServiceUnavailable || moneyCode(r.Body) == "request_in_progress") && r.Header.Get("Retry-After") == "" {
			a.unwanted = append(a.unwanted, fmt.Sprintf("%d without Retry-After", r.Status))
		}
		if !moneyTransient(r) {
			a.final = r
			return a
		}
		a.retried++
		time.Sleep(100 * time.Millisecond)
	}
	a.err = fmt.Errorf("no definitive answer after 150 attempts: %v", a.seen)
	return a
}

// moneyCheckAttempts fails on transport errors, unwanted statuses and intents
// that never got a definitive answer.
func moneyCheckAttempts(t *testing.T, as []moneyAttempt) {
	t.Helper()
	for _, a := range as {
		if a.err != nil {
			t.Errorf("key %s: %v (statuses %v)", a.key, a.err, a.seen)
		}
		for _, u := range a.unwanted {
			t.Errorf("key %s: unwanted answer %s", a.key, u)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

func TestPayingTwiceChargesOnce(t *testing.T) {
	m, c := startMoney(t, map[string]string{"SWEEP_INTERVAL": "1h"})
	id := createOrder(t, c, moneyKey("create"))
	r2 := moneyKey("R2")

	first := moneyPay(t, c, id, r2, "pm_ok")
	t.Run("the first pay charges the total and answers 200 PAID", func(t *testing.T) {
		if first.Status != http.StatusOK {
			t.Fatalf("pay = %d %s", first.Status, first.Body)
		}
		moneyWantFresh(t, first)
		o := moneyDecodeOrder(t, first.Body)
		if o.Status != "PAID" || o.Payment == nil || o.Payment.Status != "succeeded" || o.Payment.Amount != moneyTotal || o.Payment.ChargeID == "" {
			t.Errorf("paid order = %s", first.Body)
		}
		moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 0, duplicates: 0})
		if got := m.Channel.Stats().AmountCharged; got != moneyTotal {
			t.Errorf("amount charged = %d, want %d", got, moneyTotal)
		}
	})

	t.Run("the same key replays the same bytes and never reaches the channel", func(t *testing.T) {
		before := m.Channel.Stats()
		again := moneyPay(t, c, id, r2, "pm_ok")
		apptest.WantReplay(t, first, again)
		after := m.Channel.Stats()
		if after.Requests != before.Requests || after.Lookups != before.Lookups {
			t.Errorf("the replay reached the channel: requests %d -> %d, lookups %d -> %d",
				before.Requests, after.Requests, before.Lookups, after.Lookups)
		}
	})

	t.Run("a new key on the PAID order is 409 invalid_transition and charges nothing", func(t *testing.T) {
		r2b := moneyKey("R2-prime")
		refused := moneyPay(t, c, id, r2b, "pm_ok")
		moneyWantAnswer(t, "pay with a new key", refused, http.StatusConflict, "invalid_transition")
		apptest.WantReplay(t, refused, moneyPay(t, c, id, r2b, "pm_ok"))
		if rec := moneyRecord(t, m, order.OpPay, r2b); rec.State != idempotency.FailedFinal {
			t.Errorf("record of the refused pay is %s, want FAILED_FINAL", rec.State)
		}
		moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 0, duplicates: 0})
		if got := moneyReadOrder(t, c, id).Status; got != "PAID" {
			t.Errorf("order = %s, want PAID", got)
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM payments WHERE order_id = ?", id); n != 1 {
			t.Errorf("payment rows = %d, want 1", n)
		}
	})
}

func TestDeclinedPaymentMayBePaidAgainWithANewKey(t *testing.T) {
	m, c := startMoney(t, map[string]string{"SWEEP_INTERVAL": "1h"})
	id := createOrder(t, c, moneyKey("create"))
	declinedKey := moneyKey("R2-declined")

	declined := moneyPay(t, c, id, declinedKey, "pm_declined")
	t.Run("a declined charge is 402 payment_declined and the order PAYMENT_FAILED", func(t *testing.T) {
		moneyWantAnswer(t, "declined pay", declined, http.StatusPaymentRequired, "payment_declined")
		o := moneyReadOrder(t, c, id)
		if o.Status != "PAYMENT_FAILED" || o.Payment == nil || o.Payment.Status != "declined" {
			t.Errorf("order after decline: status %s payment %+v", o.Status, o.Payment)
		}
		if rec := moneyRecord(t, m, order.OpPay, declinedKey); rec.State != idempotency.FailedFinal {
			t.Errorf("record = %s, want FAILED_FINAL", rec.State)
		}
	})

	t.Run("the same key replays the decline without asking the channel again", func(t *testing.T) {
		before := m.Channel.Stats()
		apptest.WantReplay(t, declined, moneyPay(t, c, id, declinedKey, "pm_declined"))
		if after := m.Channel.Stats(); after.Requests != before.Requests || after.Lookups != before.Lookups {
			t.Errorf("the replay reached the channel: %+v -> %+v", before, after)
		}
	})

	t.Run("a new key with pm_ok moves PAYMENT_FAILED to PAID", func(t *testing.T) {
		r := moneyPay(t, c, id, moneyKey("R2-ok"), "pm_ok")
		if r.Status != http.StatusOK || moneyDecodeOrder(t, r.Body).Status != "PAID" {
			t.Fatalf("second pay = %d %s", r.Status, r.Body)
		}
		moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, declined: 1, refunds: 0, requests: 2, lookups: 0, duplicates: 0})
		if got := m.Channel.Stats().AmountCharged; got != moneyTotal {
			t.Errorf("amount charged = %d, want %d", got, moneyTotal)
		}
		if got, want := moneyEventNames(moneyEvents(t, c, id)), "create,pay,payment_failed,pay,payment_succeeded"; got != want {
			t.Errorf("history = %s, want %s", got, want)
		}
	})
}

func TestUnknownChannelOutcomeIsRetriedUnderTheSameKey(t *testing.T) {
	t.Run("a retry after a lost response charges once under the same channel key", func(t *testing.T) {
		m, c := startMoney(t, map[string]string{"SWEEP_INTERVAL": "1h"})
		id := createOrder(t, c, moneyKey("create"))
		key := moneyKey("R2-lost")

		lost := moneyPay(t, c, id, key, "pm_lost_response")
		moneyWantAnswer(t, "pay whose channel response was lost", lost, http.StatusServiceUnavailable, "service_unavailable")
		if got := lost.Header.Get("Retry-After"); got != "1" {
			t.Errorf("Retry-After = %q, want 1", got)
		}
		if rec := moneyRecord(t, m, order.OpPay, key); rec.State != idempotency.FailedRetryable {
			t.Errorf("record after the lost response = %s, want FAILED_RETRYABLE", rec.State)
		}
		if got := moneyReadOrder(t, c, id).Status; got != "PAYMENT_PENDING" {
			t.Errorf("order after the lost response = %s, want PAYMENT_PENDING", got)
		}

		retry := moneyPay(t, c, id, key, "pm_lost_response")
		if retry.Status != http.StatusOK || moneyDecodeOrder(t, retry.Body).Status != "PAID" {
			t.Fatalf("retry = %d %s", retry.Status, retry.Body)
		}
		moneyWantFresh(t, retry)
		moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, declined: 0, refunds: 0, requests: 2, lookups: 0, duplicates: 1})
		charges := m.Channel.Charges()
		if len(charges) != 1 {
			t.Fatalf("channel charges = %d, want 1", len(charges))
		}
		if charges[0].Requests != 2 {
			t.Errorf("POSTs under the charge's key = %d, want 2 (both attempts used one key)", charges[0].Requests)
		}
		var channelKey string
		if err := m.DB.Raw("SELECT channel_key FROM payments WHERE order_id = ? AND kind = 'charge'", id).Scan(&channelKey).Error; err != nil {
			t.Fatal(err)
		}
		if channelKey == "" || channelKey != charges[0].IdempotencyKey {
			t.Errorf("stored channel_key %q, channel saw %q", channelKey, charges[0].IdempotencyKey)
		}
		if channelKey == key {
			t.Errorf("the client's key was sent downstream as it is; want a key derived from tenant, order and key")
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM payments WHERE order_id = ?", id); n != 1 {
			t.Errorf("payment rows = %d, want 1", n)
		}
		apptest.WantReplay(t, retry, moneyPay(t, c, id, key, "pm_lost_response"))
	})

	t.Run("a retry after a channel 503 charges once", func(t *testing.T) {
		m, c := startMoney(t, map[string]string{"SWEEP_INTERVAL": "1h"})
		id := createOrder(t, c, moneyKey("create"))
		key := moneyKey("R2-unavailable")

		first := moneyPay(t, c, id, key, "pm_unavailable_once")
		moneyWantAnswer(t, "pay while the channel is unavailable", first, http.StatusServiceUnavailable, "service_unavailable")
		if first.Header.Get("Retry-After") == "" {
			t.Error("503 without Retry-After")
		}
		retry := moneyPay(t, c, id, key, "pm_unavailable_once")
		if retry.Status != http.StatusOK || moneyDecodeOrder(t, retry.Body).Status != "PAID" {
			t.Fatalf("retry = %d %s", retry.Status, retry.Body)
		}
		moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, declined: 0, refunds: 0, requests: 2, lookups: 0, duplicates: 0})
		if got := m.Channel.Stats().UnavailableResponses; got != 1 {
			t.Errorf("503s given by the channel = %d, want 1", got)
		}
		if charges := m.Channel.Charges(); len(charges) != 1 || charges[0].Requests != 2 {
			t.Errorf("charges = %+v, want one charge reached by 2 POSTs", charges)
		}
	})
}

func TestConcurrentPaysChargeOnce(t *testing.T) {
	const n = 100

	t.Run("100 concurrent requests with one key make one charge and one answer", func(t *testing.T) {
		m, c := startMoney(t, nil)
		id := createOrder(t, c, moneyKey("create"))
		key := moneyKey("R2-shared")
		as := make([]moneyAttempt, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { as[i] = moneySend(c, "/v1/orders/"+id+"/pay", key, moneyPayBody("pm_ok")) })
		}
		wg.Wait()
		moneyCheckAttempts(t, as)

		executed, retried := 0, 0
		for _, a := range as {
			retried += a.retried
			if a.final.Status != http.StatusOK || !bytes.Equal(a.final.Body, as[0].final.Body) {
				t.Errorf("final answer = %d %s, want the one 200", a.final.Status, a.final.Body)
			}
			if a.final.Header.Get("Idempotent-Replayed") == "" {
				executed++
			}
		}
		t.Logf("%d transient answers retried with the same key", retried)
		if executed != 1 {
			t.Errorf("%d requests executed, want 1 (the rest replayed)", executed)
		}
		moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: -1, duplicates: 0})
		if got := moneyReadOrder(t, c, id).Status; got != "PAID" {
			t.Errorf("order = %s, want PAID", got)
		}
	})

	t.Run("100 concurrent pays with different keys make one charge", func(t *testing.T) {
		m, c := startMoney(t, nil)
		id := createOrder(t, c, moneyKey("create"))
		as := make([]moneyAttempt, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				as[i] = moneySend(c, "/v1/orders/"+id+"/pay", moneyKey(fmt.Sprintf("R2-%03d", i)), moneyPayBody("pm_ok"))
			})
		}
		wg.Wait()
		moneyCheckAttempts(t, as)

		paid, refused, retried := 0, 0, 0
		for _, a := range as {
			retried += a.retried
			switch {
			case a.final.Status == http.StatusOK:
				paid++
			case a.final.Status == http.StatusConflict && moneyCode(a.final.Body) == "invalid_transition":
				refused++
			default:
				t.Errorf("key %s: final answer %d %s", a.key, a.final.Status, a.final.Body)
			}
		}
		t.Logf("%d transient answers retried with the same key", retried)
		if paid != 1 || refused != n-1 {
			t.Errorf("paid %d, refused %d; want 1 and %d", paid, refused, n-1)
		}
		moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: -1, duplicates: 0})
		if got := moneyReadOrder(t, c, id).Status; got != "PAID" {
			t.Errorf("order = %s, want PAID", got)
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM payments WHERE order_id = ?", id); n != 1 {
			t.Errorf("payment rows = %d, want 1", n)
		}
	})
}

func TestCancellingAPaidOrderRefundsOnce(t *testing.T) {
	// payLost pays an order with pm_lost_response (503, then the retry's 200),
	// so that its refund's first response is lost too.
	payLost := func(t *testing.T, m *app.Main, c *apptest.Client) string {
		t.Helper()
		id := createOrder(t, c, moneyKey("create"))
		key := moneyKey("R2-lost")
		moneyWantAnswer(t, "first pay", moneyPay(t, c, id, key, "pm_lost_response"), http.StatusServiceUnavailable, "service_unavailable")
		if r := moneyPay(t, c, id, key, "pm_lost_response"); r.Status != http.StatusOK {
			t.Fatalf("retried pay = %d %s", r.Status, r.Body)
		}
		return id
	}

	t.Run("retries of a cancel whose refund response was lost refund once", func(t *testing.T) {
		m, c := startMoney(t, map[string]string{"SWEEP_INTERVAL": "1h"})
		id := payLost(t, m, c)
		key := moneyKey("R3-cancel")

		lost := moneyCancel(t, c, id, key)
		moneyWantAnswer(t, "cancel whose refund response was lost", lost, http.StatusServiceUnavailable, "service_unavailable")
		if got := moneyReadOrder(t, c, id).Status; got != "REFUND_PENDING" {
			t.Errorf("order after the lost refund response = %s, want REFUND_PENDING", got)
		}

		// Ten clients retry at once: one takes the intent over, the others
		// wait behind it and then replay its answer.
		as := make([]moneyAttempt, 10)
		var wg sync.WaitGroup
		for i := range as {
			wg.Go(func() { as[i] = moneySend(c, "/v1/orders/"+id+"/cancel", key, map[string]any{}) })
		}
		wg.Wait()
		moneyCheckAttempts(t, as)
		for _, a := range as {
			if a.final.Status != http.StatusOK || !bytes.Equal(a.final.Body, as[0].final.Body) {
				t.Errorf("retried cancel = %d %s", a.final.Status, a.final.Body)
			}
		}
		o := moneyDecodeOrder(t, as[0].final.Body)
		if o.Status != "CANCELLED" || o.Payment == nil || o.Payment.Status != "refunded" || o.Payment.RefundID == "" {
			t.Errorf("cancelled order = %s", as[0].final.Body)
		}
		stats := m.Channel.Stats()
		moneyCheckStats(t, stats, moneyStats{charges: 1, declined: 0, refunds: 1, requests: 4, lookups: 0, duplicates: 2})
		if stats.AmountCharged != moneyTotal || stats.AmountRefunded != moneyTotal {
			t.Errorf("charged %d, refunded %d; want %d both", stats.AmountCharged, stats.AmountRefunded, moneyTotal)
		}
		if got, want := moneyEventNames(moneyEvents(t, c, id)), "create,pay,payment_succeeded,refund,refund_succeeded"; got != want {
			t.Errorf("history = %s, want %s", got, want)
		}

		apptest.WantReplay(t, as[0].final, moneyCancel(t, c, id, key))
		moneyWantAnswer(t, "cancel of the CANCELLED order with a new key", moneyCancel(t, c, id, moneyKey("R3-again")), http.StatusConflict, "invalid_transition")
		if got := m.Channel.Stats().Refunds; got != 1 {
			t.Errorf("refunds = %d, want 1", got)
		}
	})

	t.Run("the sweeper finishes a cancel whose refund response was lost", func(t *testing.T) {
		m, c := startMoney(t, nil)
		id := payLost(t, m, c)
		key := moneyKey("R3-cancel")

		moneyWantAnswer(t, "cancel", moneyCancel(t, c, id, key), http.StatusServiceUnavailable, "service_unavailable")
		moneyEventually(t, 10*time.Second, "CANCELLED by the sweeper", func() (bool, string) {
			o := moneyReadOrder(t, c, id)
			return o.Status == "CANCELLED", o.Status
		})
		rec := moneyRecord(t, m, order.OpCancel, key)
		if rec.State != idempotency.Succeeded {
			t.Errorf("cancel record = %s, want SUCCEEDED", rec.State)
		}
		stats := m.Channel.Stats()
		moneyCheckStats(t, stats, moneyStats{charges: 1, declined: 0, refunds: 1, requests: 3, lookups: 1, duplicates: 1})
		again := moneyCancel(t, c, id, key)
		if again.Status != http.StatusOK || again.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("client retry after the sweep = %d %s", again.Status, again.Body)
		}
		if o := moneyDecodeOrder(t, again.Body); o.Status != "CANCELLED" || o.Payment == nil || o.Payment.Status != "refunded" {
			t.Errorf("replayed cancel = %s", again.Body)
		}
	})
}

func TestPaysRacingCancelsKeepTheMoneyConsistent(t *testing.T) {
	const rounds, each = 3, 50
	m, c := startMoney(t, nil)
	for round := range rounds {
		m.Channel.Reset()
		id := createOrder(t, c, moneyKey("create"))
		as := make([]moneyAttempt, 2*each)
		var wg sync.WaitGroup
		for i := range each {
			wg.Go(func() {
				as[i] = moneySend(c, "/v1/orders/"+id+"/pay", moneyKey(fmt.Sprintf("pay-%02d", i)), moneyPayBody("pm_ok"))
			})
			wg.Go(func() {
				as[each+i] = moneySend(c, "/v1/orders/"+id+"/cancel", moneyKey(fmt.Sprintf("cancel-%02d", i)), map[string]any{})
			})
		}
		wg.Wait()
		moneyCheckAttempts(t, as)

		paid, cancelled := 0, 0
		for i, a := range as {
			switch {
			case a.final.Status == http.StatusOK && i < each:
				paid++
			case a.final.Status == http.StatusOK:
				cancelled++
			case a.final.Status == http.StatusConflict && moneyCode(a.final.Body) == "invalid_transition":
			default:
				t.Errorf("key %s: final answer %d %s", a.key, a.final.Status, a.final.Body)
			}
		}
		o := moneyReadOrder(t, c, id)
		history := moneyEventNames(moneyEvents(t, c, id))
		stats := m.Channel.Stats()
		t.Logf("round %d: %s after %s; %d pays and %d cancels succeeded; channel %+v", round, o.Status, history, paid, cancelled, stats)

		switch history {
		case "create,cancel":
			if o.Status != "CANCELLED" || paid != 0 || cancelled != 1 || stats.Charges != 0 || stats.Refunds != 0 {
				t.Errorf("cancelled before payment, yet status %s, %d pays, %d cancels, %d charges, %d refunds",
					o.Status, paid, cancelled, stats.Charges, stats.Refunds)
			}
		case "create,pay,payment_succeeded,refund,refund_succeeded":
			if o.Status != "CANCELLED" || paid != 1 || cancelled != 1 || stats.Charges != 1 || stats.Refunds != 1 {
				t.Errorf("paid then cancelled, yet status %s, %d pays, %d cancels, %d charges, %d refunds",
					o.Status, paid, cancelled, stats.Charges, stats.Refunds)
			}
		case "create,pay,payment_succeeded":
			if o.Status != "PAID" || paid != 1 || cancelled != 0 || stats.Charges != 1 || stats.Refunds != 0 {
				t.Errorf("paid while every cancel lost, yet status %s, %d pays, %d cancels, %d charges, %d refunds",
					o.Status, paid, cancelled, stats.Charges, stats.Refunds)
			}
		default:
			t.Errorf("unexpected history %s (status %s)", history, o.Status)
		}
		held := int64(0)
		if o.Status == "PAID" {
			held = o.TotalAmount
		}
		if got := stats.AmountCharged - stats.AmountRefunded; got != held {
			t.Errorf("channel charged %d and refunded %d (net %d), but the %s order holds %d",
				stats.AmountCharged, stats.AmountRefunded, got, o.Status, held)
		}
	}
}
