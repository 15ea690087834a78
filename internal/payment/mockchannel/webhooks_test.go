package mockchannel_test

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/internal/webhook"
	"github.com/orderservice/orderservice/tests/testdb"
)

// testSecret signs the webhooks of these tests.
const testSecret = "whsec_Y2hhbm5lbC10ZXN0cy13ZWJob29rLXNlY3JldC0zMmI="

// received is one webhook request as the receiver saw it.
type received struct {
	at     time.Time
	id     string
	body   []byte
	verify error // webhook.Verify with testSecret
	event  struct {
		Type      string          `json:"type"`
		Timestamp time.Time       `json:"timestamp"`
		Data      json.RawMessage `json:"data"`
	}
	key string // the idempotency key of the event's charge or refund
}

// answerFunc answers the nth request (from 1) to a receiver: it may set
// headers, and returns the status.
type answerFunc func(n int, w http.ResponseWriter, r *http.Request) int

// receiver is a webhook endpoint that verifies and records every request.
type receiver struct {
	url    string
	answer answerFunc // nil: 200
	mu     sync.Mutex
	got    []received
}

func newReceiver(t *testing.T, answer answerFunc) *receiver {
	t.Helper()
	rc := &receiver{answer: answer}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := received{at: time.Now(), id: r.Header.Get(webhook.HeaderID)}
		got.body, _ = io.ReadAll(r.Body)
		got.verify = webhook.Verify([]string{testSecret}, r.Header, got.body, time.Now(), time.Minute)
		_ = json.Unmarshal(got.body, &got.event)
		var obj struct {
			IdempotencyKey string `json:"idempotency_key"`
		}
		_ = json.Unmarshal(got.event.Data, &obj)
		got.key = obj.IdempotencyKey
		rc.mu.Lock()
		rc.got = append(rc.got, got)
		n := len(rc.got)
		rc.mu.Unlock()
		status := http.StatusOK
		if rc.answer != nil {
			status = rc.answer(n, w, r)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(ts.Close)
	rc.url = ts.URL
	return rc
}

func (rc *receiver) deliveries() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.got)
}

// waitFor waits until the receiver has had n requests and returns them.
func (rc *receiver) waitFor(t *testing.T, n int) []received {
	t.Helper()
	eventually(t, fmt.Sprintf("%d webhook requests", n), func() bool { return len(rc.deliveries()) >= n })
	return rc.deliveries()
}

// failFirst answers 500 to the first n requests, then 200.
func failFirst(n int) answerFunc {
	return func(i int, _ http.ResponseWriter, _ *http.Request) int {
		if i <= n {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	}
}

// webhookHarness serves a channel on a database of its own, so that no
// event of another test reaches rc, delivering to rc with short retries.
func webhookHarness(t *testing.T, rc *receiver, opts mockchannel.Options) *harness {
	t.Helper()
	opts.WebhookURL, opts.WebhookSecret = rc.url, testSecret
	if opts.WebhookFirstRetry == 0 {
		opts.WebhookFirstRetry = 50 * time.Millisecond
	}
	if opts.WebhookTimeout == 0 {
		opts.WebhookTimeout = 2 * time.Second
	}
	return openHarness(t, testdb.Fresh(t, "channel_webhooks"), opts)
}

// webhook is the outbox's delivery of the event id.
func (h *harness) webhook(id string) mockchannel.Delivery {
	h.t.Helper()
	for _, d := range h.srv.Webhooks() {
		if d.ID == id {
			return d
		}
	}
	h.t.Fatalf("no webhook %s in the outbox", id)
	return mockchannel.Delivery{}
}

// delivered waits until the outbox has delivered the event id.
func (h *harness) delivered(id string) mockchannel.Delivery {
	h.t.Helper()
	eventually(h.t, id+" recorded as delivered", func() bool { return h.webhook(id).DeliveredAt != nil })
	return h.webhook(id)
}

func (h *harness) setFaults(f mockchannel.Faults) {
	h.t.Helper()
	expectStatus(h.t, h.must(http.MethodPost, "/admin/faults", "", f), http.StatusOK, "")
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}

func TestWebhooks(t *testing.T) {
	t.Run("tells every outcome once, signed, with the object as GET shows it", func(t *testing.T) {
		rc := newReceiver(t, nil)
		h := webhookHarness(t, rc, mockchannel.Options{AsyncDelay: 300 * time.Millisecond})
		h.charge("k-ok", ok(100))
		h.charge("k-declined", withMethod(ok(100), payment.MethodDeclined))
		h.charge("k-async-ok", withMethod(ok(100), payment.MethodAsyncOK))
		h.charge("k-async-declined", withMethod(ok(100), payment.MethodAsyncDeclined))
		for _, d := range h.srv.Webhooks() {
			if strings.HasPrefix(d.IdempotencyKey, "k-async") {
				t.Errorf("pending charge %s told of before it settled: %+v", d.IdempotencyKey, d)
			}
		}
		refused := decode[payment.Charge](t, h.charge("k-refund-refused", withMethod(ok(100), payment.MethodRefundRefused)))
		charged := decode[payment.Charge](t, h.lookup("charges", "k-ok"))
		expectStatus(t, h.must(http.MethodPost, "/v1/refunds", "r-ok", payment.RefundRequest{ChargeID: charged.ID, Amount: 40}),
			http.StatusCreated, "")
		refusal := payment.RefundRequest{ChargeID: refused.ID, Amount: 60}
		for range 2 { // a refusal sent again is the same refusal
			expectStatus(t, h.must(http.MethodPost, "/v1/refunds", "r-refused", refusal), http.StatusUnprocessableEntity, "refund_refused")
		}

		want := map[string]string{ // idempotency key → event type
			"k-ok": payment.EventChargeSucceeded, "k-declined": payment.EventChargeDeclined,
			"k-async-ok": payment.EventChargeSucceeded, "k-async-declined": payment.EventChargeDeclined,
			"k-refund-refused": payment.EventChargeSucceeded, "r-ok": payment.EventRefundSucceeded,
			"r-refused": payment.EventRefundFailed,
		}
		rc.waitFor(t, len(want))
		time.Sleep(200 * time.Millisecond) // time for an extra request to show
		got := rc.deliveries()
		if len(got) != len(want) {
			t.Errorf("%d requests, want one per outcome (%d)", len(got), len(want))
		}
		for _, r := range got {
			if r.verify != nil {
				t.Errorf("%s does not verify: %v", r.id, r.verify)
			}
			if want[r.key] != r.event.Type || r.event.Timestamp.IsZero() {
				t.Errorf("event %s, want type %q for its key", r.body, want[r.key])
			}
			if d := h.delivered(r.id); d.Type != r.event.Type || d.IdempotencyKey != r.key ||
				d.Attempts != 1 || d.LastStatus != http.StatusOK || d.NextAttemptAt != nil {
				t.Errorf("outbox has %+v for the delivery of %s", d, r.body)
			}
			if r.key == "r-refused" {
				// The channel keeps no refund it refused: the event is the request, marked failed.
				expectStatus(t, h.lookup("refunds", r.key), http.StatusNotFound, "refund_not_found")
				rf := decode[payment.Refund](t, reply{body: r.event.Data})
				if rf.Status != payment.StatusFailed || rf.ChargeID != refused.ID || rf.Amount != 60 || rf.ID == "" {
					t.Errorf("refusal event %s", r.body)
				}
				continue
			}
			kind := map[bool]string{true: "refunds", false: "charges"}[strings.HasPrefix(r.key, "r-")]
			if found := h.lookup(kind, r.key); !jsonEqual(t, found.body, r.event.Data) {
				t.Errorf("event data %s, GET shows %s", r.event.Data, found.body)
			}
		}
	})

	t.Run("retries a failed delivery with the same webhook-id, backing off, until it is taken", func(t *testing.T) {
		rc := newReceiver(t, failFirst(3))
		h := webhookHarness(t, rc, mockchannel.Options{WebhookFirstRetry: 100 * time.Millisecond})
		h.charge("k1", ok(100))
		got := rc.waitFor(t, 4)
		for i, r := range got {
			if r.id != got[0].id || r.verify != nil {
				t.Errorf("request %d: id %s (first %s), verify %v", i+1, r.id, got[0].id, r.verify)
			}
		}
		// The waits double (100, 200, 400ms), each jittered to between half and all of it.
		for i, least := range []time.Duration{50, 100, 200} {
			if gap := got[i+1].at.Sub(got[i].at); gap < least*time.Millisecond {
				t.Errorf("retry %d after %v, want %dms at least", i+1, gap, least)
			}
		}
		if d := h.delivered(got[0].id); d.Attempts != 4 || d.LastStatus != http.StatusOK || d.NextAttemptAt != nil || d.LastError != "" {
			t.Errorf("outbox = %+v, want delivered at the fourth attempt", d)
		}
	})

	t.Run("records why an attempt failed, and waits the receiver's Retry-After", func(t *testing.T) {
		rc := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) int {
			if n == 1 {
				w.Header().Set("Retry-After", "1")
				return http.StatusServiceUnavailable
			}
			return http.StatusOK
		})
		h := webhookHarness(t, rc, mockchannel.Options{})
		h.charge("k1", ok(100))
		first := rc.waitFor(t, 1)[0]
		eventually(t, "the failure recorded", func() bool { return h.webhook(first.id).Attempts == 1 })
		if d := h.webhook(first.id); d.LastStatus != http.StatusServiceUnavailable || d.LastError != "HTTP 503" || d.NextAttemptAt == nil {
			t.Errorf("outbox after the 503 = %+v", d)
		}
		if gap := rc.waitFor(t, 2)[1].at.Sub(first.at); gap < time.Second {
			t.Errorf("retried after %v, before the receiver's Retry-After of 1s", gap)
		}
	})

	t.Run("gives up when the retry window ends, and says so", func(t *testing.T) {
		rc := newReceiver(t, failFirst(1<<30))
		h := webhookHarness(t, rc, mockchannel.Options{WebhookRetryWindow: 400 * time.Millisecond})
		h.charge("k1", ok(100))
		id := rc.waitFor(t, 1)[0].id
		eventually(t, "giving up", func() bool { return h.webhook(id).GivenUpAt != nil })
		d := h.webhook(id)
		if d.Attempts < 2 || d.NextAttemptAt != nil || d.DeliveredAt != nil || d.LastStatus != http.StatusInternalServerError {
			t.Errorf("outbox = %+v, want given up after retries", d)
		}
		tried := len(rc.deliveries())
		time.Sleep(500 * time.Millisecond)
		if n := len(rc.deliveries()); n != tried || n != d.Attempts {
			t.Errorf("%d requests after giving up %d attempts, want no more", n, d.Attempts)
		}
	})

	t.Run("resends an event on request, with the same webhook-id", func(t *testing.T) {
		rc := newReceiver(t, nil)
		h := webhookHarness(t, rc, mockchannel.Options{})
		h.charge("k1", ok(100))
		first := rc.waitFor(t, 1)[0]
		h.delivered(first.id)
		resent := h.must(http.MethodPost, "/admin/webhooks/"+first.id+"/resend", "", nil)
		expectStatus(t, resent, http.StatusOK, "")
		if d := decode[mockchannel.Delivery](t, resent); d.ID != first.id || d.Attempts != 2 || d.LastStatus != http.StatusOK {
			t.Errorf("resend answered %s", resent.body)
		}
		again := rc.waitFor(t, 2)[1]
		if again.id != first.id || again.verify != nil || string(again.body) != string(first.body) {
			t.Errorf("resent %s %s (verify %v), want %s %s", again.id, again.body, again.verify, first.id, first.body)
		}
		expectStatus(t, h.must(http.MethodPost, "/admin/webhooks/msg_nope/resend", "", nil), http.StatusNotFound, "webhook_not_found")
		list := decode[struct {
			Webhooks []mockchannel.Delivery `json:"webhooks"`
		}](t, h.must(http.MethodGet, "/admin/webhooks", "", nil))
		if len(list.Webhooks) != 1 || list.Webhooks[0].ID != first.id || list.Webhooks[0].ObjectID == "" || list.Webhooks[0].Attempts != 2 {
			t.Errorf("GET /admin/webhooks = %+v", list.Webhooks)
		}
	})

	t.Run("makes a delivery cut short by a restart again", func(t *testing.T) {
		// The first request hangs until the channel gives up on it by
		// stopping; the event stays claimed in the outbox.
		rc := newReceiver(t, func(n int, _ http.ResponseWriter, r *http.Request) int {
			if n == 1 {
				<-r.Context().Done()
			}
			return http.StatusOK
		})
		h := webhookHarness(t, rc, mockchannel.Options{WebhookTimeout: 500 * time.Millisecond})
		h.charge("k1", ok(100))
		first := rc.waitFor(t, 1)[0]
		h.restart()
		again := rc.waitFor(t, 2)[1]
		if again.id != first.id || again.verify != nil {
			t.Errorf("after the restart %s (verify %v), want %s", again.id, again.verify, first.id)
		}
		h.delivered(first.id)
	})

	t.Run("records events without a URL, and a channel given one delivers them", func(t *testing.T) {
		rc := newReceiver(t, nil)
		h := freshHarness(t, mockchannel.Options{})
		h.charge("k1", ok(100))
		expectStatus(t, h.must(http.MethodPost, "/admin/webhooks/any/resend", "", nil), http.StatusConflict, "webhooks_off")
		time.Sleep(300 * time.Millisecond)
		ds := h.srv.Webhooks()
		if len(ds) != 1 || ds[0].Attempts != 0 || ds[0].DeliveredAt != nil || len(rc.deliveries()) != 0 {
			t.Fatalf("outbox = %+v, receiver had %d requests; want one event, not sent", ds, len(rc.deliveries()))
		}
		withURL := openHarness(t, h.dbURL, mockchannel.Options{WebhookURL: rc.url, WebhookSecret: testSecret})
		if got := rc.waitFor(t, 1)[0]; got.id != ds[0].ID || got.verify != nil {
			t.Errorf("delivered %s (verify %v), want %s", got.id, got.verify, ds[0].ID)
		}
		withURL.delivered(ds[0].ID)
	})
}

func TestWebhookFaults(t *testing.T) {
	t.Run("refuses settings out of range and reports them", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		for _, f := range []mockchannel.Faults{{WebhookDuplicateRate: 1.1}, {WebhookDropRate: -0.5}, {WebhookDelayMS: -1}, {WebhookReorderMS: 60_001}} {
			expectStatus(t, h.must(http.MethodPost, "/admin/faults", "", f), http.StatusBadRequest, "invalid_request")
		}
		want := mockchannel.Faults{WebhookDuplicateRate: 0.5, WebhookDropRate: 0.25, WebhookDelayMS: 10, WebhookReorderMS: 20}
		h.setFaults(want)
		if got := decode[mockchannel.Faults](t, h.must(http.MethodGet, "/admin/faults", "", nil)); got != want {
			t.Errorf("GET /admin/faults = %+v, want %+v", got, want)
		}
	})

	t.Run("webhook_duplicate_rate 1 sends every delivery twice, same webhook-id", func(t *testing.T) {
		rc := newReceiver(t, nil)
		h := webhookHarness(t, rc, mockchannel.Options{})
		h.setFaults(mockchannel.Faults{WebhookDuplicateRate: 1})
		h.charge("k1", ok(100))
		h.charge("k2", ok(100))
		got := rc.waitFor(t, 4)
		perID := map[string]int{}
		for _, r := range got {
			if r.verify != nil {
				t.Errorf("%s does not verify: %v", r.id, r.verify)
			}
			perID[r.id]++
		}
		if len(perID) != 2 || slices.ContainsFunc(slices.Collect(maps.Values(perID)), func(n int) bool { return n != 2 }) {
			t.Errorf("requests per webhook-id = %v, want 2 events twice each", perID)
		}
		for id := range perID {
			if d := h.delivered(id); d.Attempts != 2 {
				t.Errorf("outbox = %+v, want 2 attempts", d)
			}
		}
	})

	t.Run("webhook_drop_rate 1 loses every attempt; the retries deliver once it is cleared", func(t *testing.T) {
		rc := newReceiver(t, nil)
		h := webhookHarness(t, rc, mockchannel.Options{WebhookFirstRetry: 20 * time.Millisecond})
		h.setFaults(mockchannel.Faults{WebhookDropRate: 1})
		h.charge("k1", ok(100))
		var id string
		eventually(t, "two dropped attempts", func() bool {
			ds := h.srv.Webhooks()
			if len(ds) == 1 {
				id = ds[0].ID
			}
			return len(ds) == 1 && ds[0].Attempts >= 2
		})
		if d := h.webhook(id); len(rc.deliveries()) != 0 || d.LastError != "dropped on the way (injected fault)" || d.LastStatus != 0 {
			t.Errorf("outbox = %+v, receiver had %d requests; want every attempt dropped", d, len(rc.deliveries()))
		}
		h.setFaults(mockchannel.Faults{})
		if got := rc.waitFor(t, 1)[0]; got.id != id {
			t.Errorf("delivered %s, want %s", got.id, id)
		}
		h.delivered(id)
	})

	t.Run("webhook_delay_ms holds each event back that long", func(t *testing.T) {
		rc := newReceiver(t, nil)
		h := webhookHarness(t, rc, mockchannel.Options{})
		h.setFaults(mockchannel.Faults{WebhookDelayMS: 400})
		start := time.Now()
		h.charge("k1", ok(100))
		if gap := rc.waitFor(t, 1)[0].at.Sub(start); gap < 400*time.Millisecond {
			t.Errorf("delivered after %v, want 400ms at least", gap)
		}
	})

	t.Run("webhook_reorder_ms lets later events overtake earlier ones", func(t *testing.T) {
		rc := newReceiver(t, nil)
		h := webhookHarness(t, rc, mockchannel.Options{Rand: rand.NewPCG(7, 11)})
		h.setFaults(mockchannel.Faults{WebhookReorderMS: 800})
		var keys []string
		for i := range 8 {
			keys = append(keys, fmt.Sprintf("k%d", i))
			h.charge(keys[i], ok(100))
		}
		var order []string
		for _, r := range rc.waitFor(t, len(keys)) {
			order = append(order, r.key)
		}
		if slices.Equal(order, keys) {
			t.Errorf("delivered in the order of the outcomes %v, want another", order)
		}
		slices.Sort(order)
		if !slices.Equal(order, keys) {
			t.Errorf("delivered %v, want each of %v once", order, keys)
		}
	})
}
