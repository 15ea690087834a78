package order_test

// Every intent converges (issue 11): each test is named by the behaviour it
// proves, and each was a reproduced hole before.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/apptest"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
)

// fakeChannel is a payment channel that refuses what its refuse functions
// say, and otherwise charges and refunds like an acquirer that honours its
// idempotency keys (a POST repeated under a key gets the first answer).
type fakeChannel struct {
	refuseCharge func() bool
	refuseRefund func() bool

	mu      sync.Mutex
	answers map[string]fakeAnswer // by method+key
	charges atomic.Int64          // charge POSTs received
	refunds atomic.Int64          // refund POSTs received
}

type fakeAnswer struct {
	status int
	body   []byte
}

func startFakeChannel(t *testing.T, f *fakeChannel) string {
	t.Helper()
	f.answers = map[string]fakeAnswer{}
	ts := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(ts.Close)
	return ts.URL
}

func (f *fakeChannel) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet { // lookups: nothing is ever lost here
		f.mu.Lock()
		a, ok := f.answers["POST "+r.URL.Path+" "+r.URL.Query().Get("idempotency_key")]
		f.mu.Unlock()
		if !ok || a.status >= 400 {
			a = fakeAnswer{http.StatusNotFound, []byte(`{"code":"charge_not_found","detail":"no such key"}`)}
		}
		w.WriteHeader(a.status)
		_, _ = w.Write(a.body)
		return
	}
	var req map[string]any
	_ = json.NewDecoder(r.Body).Decode(&req)
	key := r.Method + " " + r.URL.Path + " " + r.Header.Get("Idempotency-Key")
	f.mu.Lock()
	defer f.mu.Unlock()
	a, replay := f.answers[key]
	if !replay {
		switch r.URL.Path {
		case "/v1/charges":
			f.charges.Add(1)
			a = fakeAnswer{http.StatusCreated, fmt.Appendf(nil, `{"id":"ch_%d","status":"succeeded","amount":%v,"currency":%q}`,
				f.charges.Load(), req["amount"], req["currency"])}
			if f.refuseCharge != nil && f.refuseCharge() {
				a = fakeAnswer{http.StatusUnprocessableEntity, []byte(`{"code":"currency_not_supported","detail":"this acquirer does not take the currency"}`)}
			}
		case "/v1/refunds":
			f.refunds.Add(1)
			a = fakeAnswer{http.StatusCreated, fmt.Appendf(nil, `{"id":"re_%d","status":"succeeded","charge_id":%q,"amount":%v}`,
				f.refunds.Load(), req["charge_id"], req["amount"])}
			if f.refuseRefund != nil && f.refuseRefund() {
				a = fakeAnswer{http.StatusUnprocessableEntity, []byte(`{"code":"refund_refused","detail":"refunds of this charge are refused"}`)}
			}
		}
		f.answers[key] = a
	}
	w.Header().Set("Content-Type", "application/json")
	if replay {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

func TestARefusedChargeEndsTheIntentAndLeavesTheOrderPayable(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	ch := &fakeChannel{refuseCharge: refuse.Load}
	m, c := startMoney(t, map[string]string{"PAYMENT_CHANNEL_URL": startFakeChannel(t, ch)})
	id := createOrder(t, c, moneyKey("create"))
	key := moneyKey("R2-refused")

	first := moneyPay(t, c, id, key, "pm_ok")
	t.Run("the refusal is 402 payment_refused, not 503", func(t *testing.T) {
		moneyWantAnswer(t, "refused pay", first, http.StatusPaymentRequired, "payment_refused")
		if !strings.Contains(string(first.Body), "currency_not_supported") || !strings.Contains(string(first.Body), id) {
			t.Errorf("the problem names neither the channel's reason nor the order: %s", first.Body)
		}
	})
	t.Run("the intent is FAILED_FINAL and the order PAYMENT_FAILED", func(t *testing.T) {
		if rec := moneyRecord(t, m, order.OpPay, key); rec.State != idempotency.FailedFinal || rec.Attempts != 1 {
			t.Errorf("record = %s after %d attempts, want FAILED_FINAL after 1", rec.State, rec.Attempts)
		}
		if got, want := moneyEventNames(moneyEvents(t, c, id)), "create,pay,payment_failed"; got != want {
			t.Errorf("history = %s, want %s", got, want)
		}
	})
	t.Run("the sweeper leaves it alone and the same key replays the refusal", func(t *testing.T) {
		time.Sleep(3 * 200 * time.Millisecond) // three sweep intervals of the test config
		apptest.WantReplay(t, first, moneyPay(t, c, id, key, "pm_ok"))
		if rec := moneyRecord(t, m, order.OpPay, key); rec.Attempts != 1 {
			t.Errorf("attempts = %d, want 1: something kept retrying a refusal", rec.Attempts)
		}
		if n := ch.charges.Load(); n != 1 {
			t.Errorf("the channel was asked to charge %d times, want 1", n)
		}
	})
	t.Run("a new key pays the order once the channel accepts", func(t *testing.T) {
		refuse.Store(false)
		r := moneyPay(t, c, id, moneyKey("R3"), "pm_ok")
		if r.Status != http.StatusOK || moneyDecodeOrder(t, r.Body).Status != "PAID" {
			t.Fatalf("pay with a new key = %d %s", r.Status, r.Body)
		}
	})
}

func TestAnUnknownPaymentMethodIsRefusedBeforeAnythingIsRecorded(t *testing.T) {
	m, c := startMoney(t, nil)
	id := createOrder(t, c, moneyKey("create"))
	key := moneyKey("R2-bogus")

	r := moneyPay(t, c, id, key, "pm_bogus")
	moneyWantAnswer(t, "pay with pm_bogus", r, http.StatusBadRequest, "invalid_request")
	if n := apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records WHERE idempotency_key = ?", key); n != 0 {
		t.Errorf("%d records written for a refused body", n)
	}
	if got := moneyReadOrder(t, c, id).Status; got != "CREATED" {
		t.Errorf("order = %s, want CREATED", got)
	}
	moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 0, declined: 0, refunds: 0, requests: 0, lookups: 0, duplicates: 0})
	if r := moneyPay(t, c, id, key, "pm_ok"); r.Status != http.StatusOK {
		t.Errorf("the same key with a real token = %d %s, want 200", r.Status, r.Body)
	}
}

func TestARefusedRefundPutsTheOrderBackToPaid(t *testing.T) {
	ch := &fakeChannel{refuseRefund: func() bool { return true }}
	m, c := startMoney(t, map[string]string{"PAYMENT_CHANNEL_URL": startFakeChannel(t, ch)})
	id := createOrder(t, c, moneyKey("create"))
	if r := moneyPay(t, c, id, moneyKey("R2"), "pm_ok"); r.Status != http.StatusOK {
		t.Fatalf("pay = %d %s", r.Status, r.Body)
	}
	key := moneyKey("R3-cancel")

	first := moneyCancel(t, c, id, key)
	moneyWantAnswer(t, "cancel whose refund is refused", first, http.StatusConflict, "refund_refused")
	if rec := moneyRecord(t, m, order.OpCancel, key); rec.State != idempotency.FailedFinal {
		t.Errorf("record = %s, want FAILED_FINAL", rec.State)
	}
	o := moneyReadOrder(t, c, id)
	if o.Status != "PAID" || o.Payment == nil || o.Payment.Status != "succeeded" {
		t.Errorf("order = %+v, want PAID with its charge succeeded", o)
	}
	if got, want := moneyEventNames(moneyEvents(t, c, id)), "create,pay,payment_succeeded,refund,refund_failed"; got != want {
		t.Errorf("history = %s, want %s", got, want)
	}
	apptest.WantReplay(t, first, moneyCancel(t, c, id, key))
	if n := ch.refunds.Load(); n != 1 {
		t.Errorf("refund POSTs = %d, want 1", n)
	}
	r := c.Do(t, http.MethodPost, "/v1/orders/"+id+"/ship", moneyKey("ship"), map[string]any{"carrier": "DHL", "tracking_number": "T1"})
	if r.Status != http.StatusOK {
		t.Errorf("the PAID order could not ship after the refused refund: %d %s", r.Status, r.Body)
	}
}

// cutPhase3 makes the database drop phase 3's connection before it commits,
// as a failover or a restart would, for as long as cut holds.
func cutPhase3(t *testing.T, m *app.Main, cut *atomic.Bool) {
	m.Orders.Hooks.BeforeReplyCommit = func() error {
		if cut.Load() {
			if err := moneyDB(t).Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND state = 'idle in transaction' AND application_name = 'orderservice'`).Error; err != nil {
				t.Errorf("terminate phase 3's backend: %v", err)
			}
		}
		return nil
	}
}

func TestADatabaseBlipAfterTheChannelAnsweredIsRidenOutByPhase3(t *testing.T) {
	m, c := startMoney(t, map[string]string{"SWEEP_INTERVAL": "1h", "IDEMPOTENCY_LEASE": "30s"})
	id := createOrder(t, c, moneyKey("create"))
	var cut atomic.Bool
	cut.Store(true)
	cutPhase3(t, m, &cut)
	m.Orders.Hooks.AfterChannelCall = func() error { return nil }
	var attempts atomic.Int32
	m.Orders.Hooks.BeforeReplyCommit = func(next func() error) func() error {
		return func() error {
			if attempts.Add(1) > 1 {
				cut.Store(false) // the new primary is up: the next try commits
			}
			return next()
		}
	}(m.Orders.Hooks.BeforeReplyCommit)

	r := moneyPay(t, c, id, moneyKey("R2-blip"), "pm_ok")
	if r.Status != http.StatusOK || moneyDecodeOrder(t, r.Body).Status != "PAID" {
		t.Fatalf("pay through a dropped phase-3 connection = %d %s, want 200 PAID without a client retry", r.Status, r.Body)
	}
	if n := attempts.Load(); n < 2 {
		t.Errorf("phase 3 ran %d times, want a second try after the dropped connection", n)
	}
	moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 0, duplicates: 0})
}

func TestADatabaseFailureAfterTheChannelAnsweredLeavesTheIntentRetryableAtOnce(t *testing.T) {
	m, c := startMoney(t, map[string]string{"SWEEP_INTERVAL": "1h", "IDEMPOTENCY_LEASE": "30s"})
	id := createOrder(t, c, moneyKey("create"))
	key := moneyKey("R2-phase3")
	var cut atomic.Bool
	cut.Store(true) // for longer than phase 3's patience (a channel timeout)
	cutPhase3(t, m, &cut)

	first := moneyPay(t, c, id, key, "pm_ok")
	moneyWantAnswer(t, "pay whose phase 3 kept losing its connection", first, http.StatusServiceUnavailable, "service_unavailable")
	if first.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	if rec := moneyRecord(t, m, order.OpPay, key); rec.State != idempotency.FailedRetryable {
		t.Fatalf("record = %s, want FAILED_RETRYABLE (not PROCESSING under a 30s lease)", rec.State)
	}
	cut.Store(false)
	again := moneyPay(t, c, id, key, "pm_ok")
	if again.Status != http.StatusOK || moneyDecodeOrder(t, again.Body).Status != "PAID" {
		t.Fatalf("the retry = %d %s, want 200 PAID at once", again.Status, again.Body)
	}
	moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 1, declined: 0, refunds: 0, requests: 2, lookups: 0, duplicates: 1})
}

func TestRetryAfterIsAlwaysAWholeSecondAtLeastOne(t *testing.T) {
	_, c := startMoney(t, map[string]string{"PAYMENT_RETRY_AFTER": "500ms", "SWEEP_INTERVAL": "1h"})
	id := createOrder(t, c, moneyKey("create"))
	key := moneyKey("R2-unavailable")
	r := moneyPay(t, c, id, key, "pm_unavailable_once")
	moneyWantAnswer(t, "pay answered 503 by the channel", r, http.StatusServiceUnavailable, "service_unavailable")
	if got := r.Header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q with PAYMENT_RETRY_AFTER=500ms, want \"1\"", got)
	}
	if r := moneyPay(t, c, id, key, "pm_unavailable_once"); r.Status != http.StatusOK {
		t.Errorf("retry = %d %s", r.Status, r.Body)
	}
}

func TestAPayKeyWhoseRecordWasArchivedGetsAStableAnswer(t *testing.T) {
	m, c := startMoney(t, nil)
	id := createOrder(t, c, moneyKey("create"))
	key := moneyKey("R2-archived")
	moneyWantAnswer(t, "declined pay", moneyPay(t, c, id, key, "pm_declined"), http.StatusPaymentRequired, "payment_declined")

	// Its retention passes: the cleanup archives and removes the record.
	if err := m.DB.Exec("UPDATE idempotency_records SET expires_at = now() - interval '1 second' WHERE idempotency_key = ?", key).Error; err != nil {
		t.Fatal(err)
	}
	cleaner := &idempotency.Cleaner{DB: m.DB, Store: m.Orders.Records, Batch: 100}
	if res, err := cleaner.Pass(context.Background()); err != nil || res.Archived < 1 {
		t.Fatalf("cleanup = %+v, %v", res, err)
	}

	for i := range 2 {
		r := moneyPay(t, c, id, key, "pm_declined")
		moneyWantAnswer(t, fmt.Sprintf("the archived key sent again (%d)", i+1), r, http.StatusUnprocessableEntity, "idempotency_key_reused")
	}
	if got := moneyReadOrder(t, c, id).Status; got != "PAYMENT_FAILED" {
		t.Errorf("order = %s, want PAYMENT_FAILED", got)
	}
	moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 0, declined: 1, refunds: 0, requests: 1, lookups: 0, duplicates: 0})
}

// A money key whose record was archived and removed, sent again on another
// order of the tenant, is a definitive 422: the payments' unique scope
// (tenant, operation, key) would refuse a second payment under it, and that
// refusal must not surface as a 500, over and over. Pay and cancel (refund)
// alike; the other order is unchanged and the channel is asked nothing.
func TestAMoneyKeyWhoseRecordWasRemovedIsRefusedOnAnotherOrder(t *testing.T) {
	m, c := startMoney(t, nil)
	a := createOrder(t, c, moneyKey("create-a"))
	b := createOrder(t, c, moneyKey("create-b"))
	payKey, cancelKey := moneyKey("R2-pay"), moneyKey("R2-cancel")
	if r := moneyPay(t, c, a, payKey, payment.MethodOK); r.Status != http.StatusOK {
		t.Fatalf("pay A = %d %s", r.Status, r.Body)
	}
	if r := moneyCancel(t, c, a, cancelKey); r.Status != http.StatusOK {
		t.Fatalf("cancel A = %d %s", r.Status, r.Body)
	}
	if err := m.DB.Exec("UPDATE idempotency_records SET expires_at = now() - interval '1 second' WHERE idempotency_key IN (?, ?)", payKey, cancelKey).Error; err != nil {
		t.Fatal(err)
	}
	cleaner := &idempotency.Cleaner{DB: m.DB, Store: m.Orders.Records, Batch: 100}
	if res, err := cleaner.Pass(context.Background()); err != nil || res.Archived < 2 {
		t.Fatalf("cleanup = %+v, %v", res, err)
	}

	for i := range 2 {
		r := moneyPay(t, c, b, payKey, payment.MethodOK)
		moneyWantAnswer(t, fmt.Sprintf("A's removed pay key on B (%d)", i+1), r, http.StatusUnprocessableEntity, "idempotency_key_reused")
	}
	if got := moneyReadOrder(t, c, b).Status; got != "CREATED" {
		t.Fatalf("B = %s after the refused pay, want CREATED", got)
	}
	if r := moneyPay(t, c, b, moneyKey("pay-b"), payment.MethodOK); r.Status != http.StatusOK {
		t.Fatalf("pay B with a new key = %d %s", r.Status, r.Body)
	}
	for i := range 2 {
		r := moneyCancel(t, c, b, cancelKey)
		moneyWantAnswer(t, fmt.Sprintf("A's removed cancel key on B (%d)", i+1), r, http.StatusUnprocessableEntity, "idempotency_key_reused")
	}
	if got := moneyReadOrder(t, c, b).Status; got != "PAID" {
		t.Errorf("B = %s after the refused cancel, want PAID", got)
	}
	moneyCheckStats(t, m.Channel.Stats(), moneyStats{charges: 2, declined: 0, refunds: 1, requests: 3, lookups: 0, duplicates: 0})
}

func TestAnIdempotencyKeySentTwiceIsRefused(t *testing.T) {
	m, _ := startMoney(t, nil)
	req, _ := http.NewRequest(http.MethodPost, m.URL()+"/v1/orders", strings.NewReader(`{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1}]}`))
	req.Header.Set("Authorization", "Bearer "+apptest.KeyAcme)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Add("Idempotency-Key", "first-of-two")
	req.Header.Add("Idempotency-Key", "second-of-two")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var p struct{ Code string }
	_ = json.NewDecoder(res.Body).Decode(&p)
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || p.Code != "idempotency_key_invalid" {
		t.Errorf("two Idempotency-Key lines = %d %s, want 400 idempotency_key_invalid", res.StatusCode, p.Code)
	}
	if n := apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records WHERE idempotency_key LIKE '%-of-two'"); n != 0 {
		t.Errorf("%d records written", n)
	}
}

func TestOrderEventsArePaginated(t *testing.T) {
	_, c := startMoney(t, nil)
	id := createOrder(t, c, moneyKey("create"))
	for _, step := range []string{"pay", "ship", "deliver"} {
		body := map[string]any{}
		switch step {
		case "pay":
			body = moneyPayBody("pm_ok")
		case "ship":
			body = map[string]any{"carrier": "DHL", "tracking_number": "T1"}
		}
		if r := c.Do(t, http.MethodPost, "/v1/orders/"+id+"/"+step, moneyKey(step), body); r.Status != http.StatusOK {
			t.Fatalf("%s = %d %s", step, r.Status, r.Body)
		}
	}
	var names []string
	cursor, pages := "", 0
	for {
		r := c.Do(t, http.MethodGet, "/v1/orders/"+id+"/events?limit=2&cursor="+cursor, "", nil)
		if r.Status != http.StatusOK {
			t.Fatalf("events page = %d %s", r.Status, r.Body)
		}
		var page struct {
			Events     []moneyEvent `json:"events"`
			NextCursor string       `json:"next_cursor"`
		}
		if err := json.Unmarshal(r.Body, &page); err != nil {
			t.Fatal(err)
		}
		if len(page.Events) > 2 {
			t.Fatalf("a page of limit 2 has %d events", len(page.Events))
		}
		pages++
		for _, e := range page.Events {
			names = append(names, e.Event)
		}
		if cursor = page.NextCursor; cursor == "" || pages > 5 {
			break
		}
	}
	if got, want := strings.Join(names, ","), "create,pay,payment_succeeded,ship,deliver"; got != want || pages != 3 {
		t.Errorf("paged history = %s over %d pages, want %s over 3", got, pages, want)
	}
	for _, q := range []string{"limit=0", "limit=101", "cursor=not-a-cursor"} {
		moneyWantAnswer(t, "events?"+q, c.Do(t, http.MethodGet, "/v1/orders/"+id+"/events?"+q, "", nil), http.StatusBadRequest, "invalid_request")
	}
}

func TestLabelledMetricsAreExportedAtZeroFromTheStart(t *testing.T) {
	_, c := startMoney(t, nil)
	r := c.Do(t, http.MethodGet, "/metrics", "", nil)
	for _, series := range []string{
		`orderservice_payment_channel_duplicates_absorbed_total{kind="charge"} 0`,
		`orderservice_payment_channel_duplicates_absorbed_total{kind="refund"} 0`,
		`orderservice_payment_channel_call_duration_seconds_count{kind="charge",outcome="rejected"} 0`,
		`orderservice_idempotency_key_conflicts_total{operation="order.create"} 0`,
		`orderservice_idempotency_takeovers_total{by="sweeper",operation="order.pay"} 0`,
		`orderservice_idempotent_requests_total{operation="order.cancel",outcome="replayed"} 0`,
		`orderservice_idempotency_records_cleaned_total{action="archived"} 0`,
		`orderservice_idempotency_waits_total{ended="looked"} 0`,
	} {
		if !strings.Contains(string(r.Body), series) {
			t.Errorf("/metrics lacks %s", series)
		}
	}
}
