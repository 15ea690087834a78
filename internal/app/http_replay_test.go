package app_test

// What HTTP adds to a use case's answer: the status, Location, Retry-After
// and Idempotent-Replayed headers, and the problem documents. What the use
// cases do (one order per key, one charge per intent, refusals, takeovers)
// is proved in internal/order's use-case tests; here each test proves how
// it is written on the wire.

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/tests/apptest"
)

// purchase is a valid create body for customer: 2 × 1250.
func purchase(customer string) map[string]any {
	return map[string]any{"customer_id": customer, "currency": "EUR",
		"items": []map[string]any{{"sku": "SKU-1", "quantity": 2, "unit_price": 1250}}}
}

// placeOrder creates an order as c's tenant and returns its id.
func placeAnOrder(t *testing.T, c *apptest.Client) string {
	t.Helper()
	r := c.Do(t, http.MethodPost, "/v1/orders", "create-"+uuid.NewString(), purchase("cus_"+uuid.NewString()[:8]))
	if r.Status != http.StatusCreated {
		t.Fatalf("create: status %d: %s", r.Status, r.Body)
	}
	return r.JSON(t)["id"].(string)
}

func TestCreateIsIdempotentOverHTTP(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"API_KEYS": "replayer=replayer-key-1"})
	c := apptest.NewClient(m, "replayer-key-1")
	customer, key := "cus_replayed_"+uuid.NewString()[:8], "R1-"+uuid.NewString()[:8]
	first := c.Do(t, http.MethodPost, "/v1/orders", key, purchase(customer))
	if first.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", first.Status, first.Body)
	}
	id := first.JSON(t)["id"].(string)

	t.Run("sends 201 with Location and no replay header the first time", func(t *testing.T) {
		if got, want := first.Header.Get("Location"), "/v1/orders/"+id; got != want {
			t.Errorf("Location = %q, want %q", got, want)
		}
		apptest.WantExecuted(t, first)
	})

	t.Run("a retry gets the same bytes, the same Location and Idempotent-Replayed: true", func(t *testing.T) {
		apptest.WantReplay(t, first, c.Do(t, http.MethodPost, "/v1/orders", key, purchase(customer)))
	})

	t.Run("field order, whitespace, case and trace data do not change the fingerprint", func(t *testing.T) {
		raw := `{ "items" : [ {"unit_price":1250, "quantity":2, "sku":" SKU-1 "} ],
		          "currency":"eur", "customer_id":"` + customer + `", "client_trace_id":"trace-123" }`
		h := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "X-Request-Id": {"abc"}}
		again, err := c.Send(http.MethodPost, "/v1/orders", key, raw, h)
		if err != nil {
			t.Fatal(err)
		}
		apptest.WantReplay(t, first, again)
	})

	t.Run("the quoted structured-field form names the same key", func(t *testing.T) {
		apptest.WantReplay(t, first, c.Do(t, http.MethodPost, "/v1/orders", `"`+key+`"`, purchase(customer)))
	})

	t.Run("the same key with other items is 422 idempotency_key_reused", func(t *testing.T) {
		other := purchase(customer)
		other["items"] = []map[string]any{{"sku": "SKU-1", "quantity": 3, "unit_price": 1250}}
		apptest.WantProblem(t, c.Do(t, http.MethodPost, "/v1/orders", key, other), http.StatusUnprocessableEntity, "idempotency_key_reused")
	})

	t.Run("the record shows the intent", func(t *testing.T) {
		r := c.Do(t, http.MethodGet, "/v1/idempotency-records?key="+key, "", nil)
		recs, _ := r.JSON(t)["records"].([]any)
		if r.Status != http.StatusOK || len(recs) != 1 {
			t.Fatalf("records = %d %s", r.Status, r.Body)
		}
		rec := recs[0].(map[string]any)
		if rec["state"] != string(idempotency.Succeeded) || rec["operation"] != "order.create" || rec["resource_id"] != id ||
			rec["response_status"] != float64(201) || len(rec["fingerprint"].(string)) != 64 || rec["expires_at"] == nil {
			t.Errorf("record = %v", rec)
		}
	})
}

func TestRetryAfterIsAlwaysAWholeSecondAtLeastOne(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"API_KEYS": "waiter=waiter-key-1", "PAYMENT_RETRY_AFTER": "500ms", "SWEEP_INTERVAL": "1h"})
	c := apptest.NewClient(m, "waiter-key-1")
	id, key := placeAnOrder(t, c), "R2-unavailable-"+uuid.NewString()[:8]
	pay := map[string]any{"payment_method": "pm_unavailable_once"}
	r := c.Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", key, pay)
	apptest.WantProblem(t, r, http.StatusServiceUnavailable, "service_unavailable")
	if got := r.Header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q with PAYMENT_RETRY_AFTER=500ms, want \"1\"", got)
	}
	if r := c.Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", key, pay); r.Status != http.StatusOK {
		t.Errorf("retry = %d %s", r.Status, r.Body)
	}
}

// An error or a panic inside a use case (a crash, as the use cases' Hooks
// inject it) is answered 500 internal, a problem that shows nothing of the
// insides, not a dropped connection; and the service goes on serving.
func TestACrashInsideAUseCaseIs500AndTheServiceLivesOn(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"API_KEYS": "crasher=crasher-key-1", "SWEEP_INTERVAL": "1h"})
	c := apptest.NewClient(m, "crasher-key-1")
	for _, panics := range []bool{false, true} {
		crash := func() error {
			if panics {
				panic("injected crash")
			}
			return errors.New("injected crash")
		}
		name := map[bool]string{false: "an error", true: "a panic"}[panics]

		t.Run(name+" inside a create", func(t *testing.T) {
			m.Orders.Hooks.AfterOrderInsert = crash
			r, err := c.Send(http.MethodPost, "/v1/orders", "crash-"+uuid.NewString(), purchase("cus_crash"), nil)
			m.Orders.Hooks.AfterOrderInsert = nil
			if err != nil {
				t.Fatalf("the crashed request got no HTTP answer (%v)", err)
			}
			apptest.WantProblem(t, r, http.StatusInternalServerError, "internal")
		})

		t.Run(name+" inside a pay, after the channel answered", func(t *testing.T) {
			id, key := placeAnOrder(t, c), "crash-pay-"+uuid.NewString()
			m.Orders.Hooks.AfterChannelCall = crash
			r, err := c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, map[string]any{"payment_method": "pm_ok"}, nil)
			m.Orders.Hooks.AfterChannelCall = nil
			if err != nil {
				t.Fatalf("the crashed request got no HTTP answer (%v)", err)
			}
			apptest.WantProblem(t, r, http.StatusInternalServerError, "internal")
			// The dead owner's lease runs out; its retry finishes the pay.
			if err := m.DB.Exec(`UPDATE idempotency_records SET lease_expires_at = now() - interval '1s'
				WHERE tenant_id = 'crasher' AND idempotency_key = ?`, key).Error; err != nil {
				t.Fatal(err)
			}
			if r := c.Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", key, map[string]any{"payment_method": "pm_ok"}); r.Status != http.StatusOK {
				t.Errorf("the retry after the lease = %d %s", r.Status, r.Body)
			}
		})

		if r := c.Do(t, http.MethodGet, "/healthz", "", nil); r.Status != http.StatusOK {
			t.Fatalf("the service is not alive after %s: %d", name, r.Status)
		}
	}
	if r := c.Do(t, http.MethodPost, "/v1/orders", "after-the-crashes-"+uuid.NewString(), purchase("cus_crash")); r.Status != http.StatusCreated {
		t.Errorf("a create after the crashes = %d %s", r.Status, r.Body)
	}
}

func TestAnIdempotencyKeySentTwiceIsRefused(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"API_KEYS": "twice=twice-key-1"})
	req, _ := http.NewRequest(http.MethodPost, m.URL()+"/v1/orders", strings.NewReader(`{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1}]}`))
	req.Header.Set("Authorization", "Bearer twice-key-1")
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
