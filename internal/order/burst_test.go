//go:build bursts

package order_test

import (
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/apptest"
)

// A burst is not overload. On an idle instance with the default admission
// settings (so this runs alone, as `make test-bursts`, without the race
// detector: whether a burst drains in time is the machine's speed, and
// under -race and three other test packages it does not), the storms of the seed's lessons are queued and served: 200
// identical creates make one order and every client hears the first result
// or 409, one key sent with two bodies gets 201, 409 or 422, 50 pays of one
// order with 50 keys charge once, and 200 duplicates that asked to wait
// (Prefer: wait) all get the replay. None is refused with 503.
func TestBurstsAreServedNotShed(t *testing.T) {
	defaults, err := app.LoadConfig(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	// The whole program, booted as apptest does for internal/app's tests:
	// this is the one whole-program test left in this package, for
	// `make test-bursts` runs it here.
	m := apptest.Start(t, dbURL, map[string]string{"HTTP_QUEUE_TIMEOUT": defaults.HTTPQueueTimeout.String(),
		"HTTP_MAX_IN_FLIGHT": fmt.Sprint(defaults.HTTPMaxInFlight), "HTTP_MAX_QUEUE": fmt.Sprint(defaults.HTTPMaxQueue)})
	c := apptest.NewClient(m, apptest.KeyAcme)
	c.HTTP = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0}}

	burst := func(t *testing.T, n int, send func(i int) (apptest.Response, error)) map[int]int {
		t.Helper()
		statuses := map[int]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		startGun := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-startGun
				r, err := send(i)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					statuses[-1]++
					return
				}
				statuses[r.Status]++
			}()
		}
		close(startGun)
		wg.Wait()
		keys := make([]int, 0, len(statuses))
		for s := range statuses {
			keys = append(keys, s)
		}
		sort.Ints(keys)
		t.Logf("statuses: %v", statuses)
		return statuses
	}
	only := func(t *testing.T, got map[int]int, allowed ...int) {
		t.Helper()
		for s, n := range got {
			ok := false
			for _, a := range allowed {
				ok = ok || s == a
			}
			if !ok {
				t.Errorf("%d answers of %d, want only %v", n, s, allowed)
			}
		}
	}
	body := func(customer string) map[string]any {
		return map[string]any{"customer_id": customer, "currency": "EUR",
			"items": []map[string]any{{"sku": "SKU-1", "quantity": 2, "unit_price": 1250}}}
	}

	t.Run("200 identical creates: one order, 201 or 409 for everyone", func(t *testing.T) {
		key := "burst-" + uuid.NewString()[:8]
		got := burst(t, 200, func(int) (apptest.Response, error) {
			return c.Send(http.MethodPost, "/v1/orders", key, body("cus_"+key), nil)
		})
		only(t, got, http.StatusCreated, http.StatusConflict)
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", "cus_"+key); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})
	t.Run("100 creates of one key with two bodies: one order, 201, 409 or 422", func(t *testing.T) {
		key := "burst2-" + uuid.NewString()[:8]
		got := burst(t, 100, func(i int) (apptest.Response, error) {
			return c.Send(http.MethodPost, "/v1/orders", key, body(fmt.Sprintf("cus_%s_%d", key, i%2)), nil)
		})
		only(t, got, http.StatusCreated, http.StatusConflict, http.StatusUnprocessableEntity)
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id LIKE ?", "cus_"+key+"%"); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})
	t.Run("50 pays of one order, each with its own key: one 200, 409 for the rest, one charge", func(t *testing.T) {
		order := c.Do(t, http.MethodPost, "/v1/orders", "burst-pay-order-"+uuid.NewString()[:8], body("cus_burst_pay"))
		if order.Status != http.StatusCreated {
			t.Fatalf("create: status %d: %s", order.Status, order.Body)
		}
		id := order.JSON(t)["id"].(string)
		run := uuid.NewString()[:8]
		got := burst(t, 50, func(i int) (apptest.Response, error) {
			return c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", fmt.Sprintf("burst-pay-%s-%d", run, i), map[string]any{"payment_method": "pm_ok"}, nil)
		})
		only(t, got, http.StatusOK, http.StatusConflict)
		if got[http.StatusOK] != 1 {
			t.Errorf("%d pays succeeded, want 1", got[http.StatusOK])
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM payments WHERE order_id = ? AND status = 'succeeded'", id); n != 1 {
			t.Errorf("succeeded charges = %d, want 1", n)
		}
	})
	t.Run("200 identical creates that ask to wait: all get the first result", func(t *testing.T) {
		key := "burst-wait-" + uuid.NewString()[:8]
		wait := http.Header{"Prefer": {"wait=5"}}
		got := burst(t, 200, func(int) (apptest.Response, error) {
			return c.Send(http.MethodPost, "/v1/orders", key, body("cus_"+key), wait)
		})
		only(t, got, http.StatusCreated)
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", "cus_"+key); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})
}
