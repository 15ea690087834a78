package app_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/webhook"
	"github.com/orderservice/orderservice/tests/apptest"
)

// Whole-program tests of payments that finish later: the real mock channel
// takes a charge on, settles it after PAYMENT_ASYNC_DELAY and tells the
// service by a signed webhook, over HTTP.

// asyncPay creates an order and pays it with token, which the channel takes
// on as pending: the pay answers 202 with the order PAYMENT_PENDING.
func asyncPay(t *testing.T, c *apptest.Client, token string) (orderID string) {
	t.Helper()
	run := uuid.NewString()[:8]
	r := c.Do(t, http.MethodPost, "/v1/orders", "wh-create-"+run, map[string]any{"customer_id": "cus_wh", "currency": "EUR",
		"items": []map[string]any{{"sku": "S", "quantity": 1, "unit_price": 1500}}})
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	orderID = r.JSON(t)["id"].(string)
	pay := c.Do(t, http.MethodPost, "/v1/orders/"+orderID+"/pay", "wh-pay-"+run, map[string]any{"payment_method": token})
	if pay.Status != http.StatusAccepted || pay.JSON(t)["status"] != "PAYMENT_PENDING" {
		t.Fatalf("pay with %s: %d %s; want 202 with the order PAYMENT_PENDING", token, pay.Status, pay.Body)
	}
	again := c.Do(t, http.MethodPost, "/v1/orders/"+orderID+"/pay", "wh-pay-"+run, map[string]any{"payment_method": token})
	apptest.WantReplay(t, pay, again)
	return orderID
}

// waitForStatus polls the order until it has status, or fails after 10s.
func waitForStatus(t *testing.T, c *apptest.Client, orderID, status string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := c.Do(t, http.MethodGet, "/v1/orders/"+orderID, "", nil)
		if got := r.JSON(t)["status"]; got == status {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("order %s is %v after 10s, want %s", orderID, got, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// webhookCount reads orderservice_webhooks_received_total{outcome} from m.
func webhookCount(t *testing.T, m *app.Main, outcome string) int {
	t.Helper()
	res, err := http.Get(m.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	want := `orderservice_webhooks_received_total{outcome="` + outcome + `"} `
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), want); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int(n)
		}
	}
	t.Fatalf("/metrics has no %s", want)
	return 0
}

func TestAPaymentTheChannelTakesOnFinishesByItsWebhook(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"PAYMENT_ASYNC_DELAY": "300ms"})
	c := apptest.NewClient(m, apptest.KeyAcme)
	for token, want := range map[string]string{payment.MethodAsyncOK: "PAID", payment.MethodAsyncDeclined: "PAYMENT_FAILED"} {
		t.Run(token, func(t *testing.T) {
			applied := webhookCount(t, m, "applied")
			id := asyncPay(t, c, token)
			waitForStatus(t, c, id, want)
			if n := apptest.Count(t, m.DB, "SELECT count(*) FROM order_events WHERE order_id = ? AND from_status = 'PAYMENT_PENDING'", id); n != 1 {
				t.Errorf("%d transitions out of PAYMENT_PENDING, want 1", n)
			}
			if n := apptest.Count(t, m.DB, "SELECT count(*) FROM order_outbox WHERE order_id = ? AND convert_from(payload, 'UTF8')::jsonb ->> 'to_status' = ?", id, want); n != 1 {
				t.Errorf("%d outbox events to %s, want 1", n, want)
			}
			if got := webhookCount(t, m, "applied"); got != applied+1 {
				t.Errorf("webhooks applied: %d → %d, want one more", applied, got)
			}
		})
	}
}

// signedDelivery is one delivery of the event id about the charge as the
// channel would send it, signed with the dev secret at stamp.
func signedDelivery(t *testing.T, id string, eventType string, charge payment.Charge, stamp time.Time) ([]byte, http.Header) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"type": eventType, "timestamp": stamp.UTC().Format(time.RFC3339), "data": charge})
	if err != nil {
		t.Fatal(err)
	}
	sig, err := webhook.Sign(devSecret, id, stamp, body)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(webhook.HeaderID, id)
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(stamp.Unix(), 10))
	h.Set(webhook.HeaderSignature, sig)
	h.Set("Content-Type", "application/json")
	return body, h
}

// dropChannelWebhooks makes m's embedded channel drop its own webhook
// deliveries, so that a test delivers them itself, and returns the
// channel's admin client.
func dropChannelWebhooks(t *testing.T, m *app.Main) *apptest.Client {
	t.Helper()
	admin := &apptest.Client{BaseURL: "http://" + m.ChannelAddr, HTTP: http.DefaultClient}
	if r := admin.Do(t, http.MethodPost, "/admin/faults", "", map[string]any{"webhook_drop_rate": 1}); r.Status != http.StatusOK {
		t.Fatalf("faults: %d %s", r.Status, r.Body)
	}
	return admin
}

// settledButNotTold starts a service whose embedded channel drops its own
// webhooks, pays an order with a charge the channel settles later, and
// waits until it has: the order waits in PAYMENT_PENDING for a delivery
// the test makes itself. The sweeper does not ask meanwhile.
func settledButNotTold(t *testing.T) (m *app.Main, c *apptest.Client, orderID string, charge payment.Charge) {
	t.Helper()
	m = apptest.Start(t, dbURL, map[string]string{"PAYMENT_ASYNC_DELAY": "200ms", "PAYMENT_PENDING_CHECK_EVERY": "1h"})
	dropChannelWebhooks(t, m)
	c = apptest.NewClient(m, apptest.KeyAcme)
	orderID = asyncPay(t, c, payment.MethodAsyncOK)
	return m, c, orderID, settledCharge(t, m, orderID)
}

// deliver posts one webhook delivery to m, as the channel would.
func deliver(m *app.Main, body []byte, h http.Header) (apptest.Response, error) {
	return (&apptest.Client{BaseURL: m.URL(), HTTP: http.DefaultClient}).Send(http.MethodPost, "/webhooks/payment-channel", "", body, h)
}

// devSecret is PAYMENT_WEBHOOK_SECRET's default, which the tests' services use.
const devSecret = "whsec_b3JkZXJzZXJ2aWNlLWRldi13ZWJob29rLXNlY3JldCE="

// settledCharge waits until the channel has settled the charge the order's
// payment asked for, and returns it as the channel shows it.
func settledCharge(t *testing.T, m *app.Main, orderID string) payment.Charge {
	t.Helper()
	var key string
	if err := m.DB.Raw("SELECT channel_key FROM payments WHERE order_id = ?", orderID).Scan(&key).Error; err != nil || key == "" {
		t.Fatalf("no payment for order %s: %v", orderID, err)
	}
	admin := &apptest.Client{BaseURL: "http://" + m.ChannelAddr, HTTP: http.DefaultClient}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := admin.Do(t, http.MethodGet, "/v1/charges?idempotency_key="+key, "", nil)
		var ch payment.Charge
		if r.Status == http.StatusOK && json.Unmarshal(r.Body, &ch) == nil && ch.Status != payment.StatusPending {
			return ch
		}
		if time.Now().After(deadline) {
			t.Fatalf("the channel did not settle charge %s: %d %s", key, r.Status, r.Body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The channel's own deliveries are dropped here, so that the test delivers
// the event itself: the same webhook 20 times at once, to two instances.
func TestTheSameWebhookTwentyTimesAtOnceOnTwoInstancesMovesTheOrderOnce(t *testing.T) {
	one := apptest.Start(t, dbURL, map[string]string{"PAYMENT_ASYNC_DELAY": "200ms", "PAYMENT_PENDING_CHECK_EVERY": "1h"})
	two := apptest.Start(t, dbURL, map[string]string{"PAYMENT_CHANNEL_URL": "http://" + one.ChannelAddr, "PAYMENT_PENDING_CHECK_EVERY": "1h"})
	dropChannelWebhooks(t, one)
	c := apptest.NewClient(one, apptest.KeyAcme)
	id := asyncPay(t, c, payment.MethodAsyncOK)
	charge := settledCharge(t, one, id)
	body, header := signedDelivery(t, "msg_"+uuid.NewString(), payment.EventChargeSucceeded, charge, time.Now())

	const n = 20
	outcomes := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			target := []*app.Main{one, two}[i%2]
			r, err := deliver(target, body, header)
			if err != nil || r.Status != http.StatusOK {
				t.Errorf("delivery %d: %v %d %s", i, err, r.Status, r.Body)
				return
			}
			var a struct{ Outcome string }
			_ = json.Unmarshal(r.Body, &a)
			outcomes[i] = a.Outcome
		}()
	}
	wg.Wait()
	count := map[string]int{}
	for _, o := range outcomes {
		count[o]++
	}
	if count["applied"] != 1 || count["duplicate"] != n-1 {
		t.Errorf("outcomes %v, want one applied and %d duplicates", count, n-1)
	}
	if n := apptest.Count(t, one.DB, "SELECT count(*) FROM order_events WHERE order_id = ? AND to_status = 'PAID'", id); n != 1 {
		t.Errorf("%d transitions to PAID, want 1", n)
	}
	if n := apptest.Count(t, one.DB, "SELECT count(*) FROM webhook_inbox WHERE webhook_id = ?", header.Get(webhook.HeaderID)); n != 1 {
		t.Errorf("%d inbox rows for the delivery, want 1", n)
	}
}

// A forged signature, a stale timestamp, a body changed after signing:
// each is 401, changes nothing, and is counted; an unknown event type is
// answered 200 and ignored.
func TestAWebhookThatDoesNotVerifyChangesNothing(t *testing.T) {
	m, _, id, charge := settledButNotTold(t)
	post := func(body []byte, h http.Header) apptest.Response {
		r, err := deliver(m, body, h)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	refused := webhookCount(t, m, "refused")
	for name, deliver := range map[string]func() apptest.Response{
		"a forged signature": func() apptest.Response {
			body, h := signedDelivery(t, "msg_forged", payment.EventChargeSucceeded, charge, time.Now())
			h.Set(webhook.HeaderSignature, "v1,"+strings.Repeat("A", 43)+"=")
			return post(body, h)
		},
		"a stale timestamp": func() apptest.Response {
			body, h := signedDelivery(t, "msg_stale", payment.EventChargeSucceeded, charge, time.Now().Add(-6*time.Minute))
			return post(body, h)
		},
		"a body changed after signing": func() apptest.Response {
			body, h := signedDelivery(t, "msg_changed", payment.EventChargeSucceeded, charge, time.Now())
			return post([]byte(strings.Replace(string(body), "charge.succeeded", "charge.declined", 1)), h)
		},
		"no signature": func() apptest.Response {
			body, h := signedDelivery(t, "msg_unsigned", payment.EventChargeSucceeded, charge, time.Now())
			h.Del(webhook.HeaderSignature)
			return post(body, h)
		},
	} {
		if r := deliver(); r.Status != http.StatusUnauthorized || apptest.ProblemCode(r.Body) != "unauthenticated" {
			t.Errorf("%s: %d %s, want 401 unauthenticated", name, r.Status, r.Body)
		}
	}
	if got := webhookCount(t, m, "refused"); got < refused+4 {
		t.Errorf("webhooks refused: %d → %d, want 4 more at least", refused, got)
	}
	var status string
	m.DB.Raw("SELECT status FROM orders WHERE id = ?", id).Scan(&status)
	if status != "PAYMENT_PENDING" {
		t.Errorf("after refused deliveries the order is %s, want PAYMENT_PENDING", status)
	}
	if n := apptest.Count(t, m.DB, "SELECT count(*) FROM webhook_inbox WHERE webhook_id IN ('msg_forged', 'msg_stale', 'msg_changed', 'msg_unsigned')"); n != 0 {
		t.Errorf("%d refused deliveries in the inbox, want none", n)
	}

	body, h := signedDelivery(t, "msg_unknown_"+uuid.NewString(), "charge.disputed", charge, time.Now())
	r := post(body, h)
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"ignored"`) {
		t.Errorf("an unknown event type: %d %s, want 200 ignored", r.Status, r.Body)
	}
	m.DB.Raw("SELECT status FROM orders WHERE id = ?", id).Scan(&status)
	if status != "PAYMENT_PENDING" {
		t.Errorf("after an unknown event the order is %s, want PAYMENT_PENDING", status)
	}
}

// No webhook arrives (every delivery is dropped): the sweeper asks the
// channel and settles the order; the webhook, delivered late by a resend,
// then changes nothing.
func TestAPaymentWhoseWebhookNeverComesIsFinishedByTheSweeper(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"PAYMENT_ASYNC_DELAY": "200ms", "PAYMENT_PENDING_CHECK_EVERY": "300ms"})
	admin := dropChannelWebhooks(t, m)
	c := apptest.NewClient(m, apptest.KeyAcme)
	id := asyncPay(t, c, payment.MethodAsyncOK)
	applied := webhookCount(t, m, "applied")
	waitForStatus(t, c, id, "PAID")
	if got := webhookCount(t, m, "applied"); got != applied {
		t.Errorf("a webhook was applied (%d → %d) while every delivery was dropped", applied, got)
	}

	if r := admin.Do(t, http.MethodPost, "/admin/faults", "", map[string]any{}); r.Status != http.StatusOK {
		t.Fatalf("faults: %d %s", r.Status, r.Body)
	}
	charge := settledCharge(t, m, id)
	var list struct {
		Webhooks []struct {
			ID       string `json:"id"`
			ObjectID string `json:"object_id"`
		} `json:"webhooks"`
	}
	r := admin.Do(t, http.MethodGet, "/admin/webhooks", "", nil)
	if err := json.Unmarshal(r.Body, &list); err != nil {
		t.Fatalf("admin webhooks: %v %s", err, r.Body)
	}
	ignored := webhookCount(t, m, "ignored")
	resent := 0
	for _, w := range list.Webhooks {
		if w.ObjectID != charge.ID {
			continue
		}
		if r := admin.Do(t, http.MethodPost, "/admin/webhooks/"+w.ID+"/resend", "", nil); r.Status != http.StatusOK {
			t.Fatalf("resend %s: %d %s", w.ID, r.Status, r.Body)
		}
		resent++
	}
	if resent != 1 {
		t.Fatalf("resent %d webhooks of charge %s, want its one event", resent, charge.ID)
	}
	if got := webhookCount(t, m, "ignored"); got != ignored+1 {
		t.Errorf("webhooks ignored: %d → %d, want the late one ignored", ignored, got)
	}
	if n := apptest.Count(t, m.DB, "SELECT count(*) FROM order_events WHERE order_id = ? AND to_status = 'PAID'", id); n != 1 {
		t.Errorf("%d transitions to PAID, want 1", n)
	}
}

// An event is a hint: a charge.declined delivered for a charge that
// succeeded (out of order, or simply wrong) moves the order to what the
// channel says when asked, PAID.
func TestAWebhookIsAHintAndTheChannelIsAsked(t *testing.T) {
	m, c, id, charge := settledButNotTold(t)
	wrong := charge
	wrong.Status = payment.StatusDeclined
	body, h := signedDelivery(t, "msg_"+uuid.NewString(), payment.EventChargeDeclined, wrong, time.Now())
	r, err := deliver(m, body, h)
	if err != nil || r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"applied"`) {
		t.Fatalf("the out-of-order event: %v %d %s; want 200 applied", err, r.Status, r.Body)
	}
	waitForStatus(t, c, id, "PAID")
}

// A delivery signed by the channel whose id, type or key PostgreSQL cannot
// store as text (NUL, invalid UTF-8) is refused with 400 and changes
// nothing: a 500 would be retried by the channel for days.
func TestASignedWebhookWithWordsPostgreSQLCannotStoreIsRefused(t *testing.T) {
	m, _, id, charge := settledButNotTold(t)
	inbox := apptest.Count(t, m.DB, "SELECT count(*) FROM webhook_inbox")
	withKey := func(key string) payment.Charge { ch := charge; ch.IdempotencyKey = key; return ch }
	for name, d := range map[string]struct {
		id, eventType string
		charge        payment.Charge
		field         string
	}{
		"an id with invalid UTF-8": {"msg_\xff\xfe", payment.EventChargeSucceeded, charge, webhook.HeaderID},
		"a type with NUL":          {"msg_nul_type", payment.EventChargeSucceeded + "\x00", charge, "type"},
		"a key with NUL":           {"msg_nul_key", payment.EventChargeSucceeded, withKey(charge.IdempotencyKey + "\x00"), "data.idempotency_key"},
	} {
		body, h := signedDelivery(t, d.id, d.eventType, d.charge, time.Now())
		r, err := deliver(m, body, h)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), d.field) {
			t.Errorf("%s: %d %s, want 400 naming %s", name, r.Status, r.Body, d.field)
		}
	}
	if n := apptest.Count(t, m.DB, "SELECT count(*) FROM webhook_inbox"); n != inbox {
		t.Errorf("the inbox went from %d to %d rows, want unchanged", inbox, n)
	}
	var status string
	m.DB.Raw("SELECT status FROM orders WHERE id = ?", id).Scan(&status)
	if status != "PAYMENT_PENDING" {
		t.Errorf("after refused deliveries the order is %s, want PAYMENT_PENDING", status)
	}
}
