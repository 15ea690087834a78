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
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/httpapi"
	"github.com/orderservice/orderservice/tests/apptest"
)

// A burst is not overload. On an idle instance with the default admission
// settings (so this runs alone, as `make test-bursts`, without the race
// detector: whether a burst drains in time is the machine's speed, and
// under -race and three other test packages it does not), the storms of the seed's lessons are queued and served: 200
// identical creates make one order and every client hears the first result
// or 409, one key sent with two bodies gets 201, 409 or 422, 50 pays of one
// order with 50 keys charge once, and 200 duplicates that asked to wait
// (Prefer: wait) all get the replay. None is shed with 503.
func TestBurstsAreServedNotShed(t *testing.T) {
	defaults, err := app.LoadConfig(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	// The whole program, booted as apptest does for internal/app's tests:
	// this is the one whole-program test left in this package, for
	// `make test-bursts` runs it here.
	m := apptest.Start(t, dbURL, map[string]string{"HTTP_QUEUE_TIMEOUT": defaults.HTTP.QueueTimeout.String(),
		"HTTP_MAX_IN_FLIGHT": fmt.Sprint(defaults.HTTP.MaxInFlight), "HTTP_MAX_QUEUE": fmt.Sprint(defaults.HTTP.MaxQueue)})
	c := apptest.NewClient(m, apptest.KeyAcme)
	c.HTTP = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0}}
	databaseIsIdle(t, m.DB)

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
		if statuses[http.StatusServiceUnavailable] > 0 {
			// A request shed congests the instance for CongestedFor: the next
			// burst starts on an idle instance again, so that its verdict
			// is its own.
			time.Sleep(httpapi.CongestedFor)
		}
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

// databaseIsIdle waits until no other session of the PostgreSQL server is
// running a statement, then takes a checkpoint, so that the bursts do not
// share the database with whatever ran before them (in CI, `make test`'s
// packages dropping their databases, each DROP DATABASE a checkpoint). A
// database busy writing makes the first holds of a burst slow, and the
// admission limit, which bounds its queue by how fast slots come free,
// then rightly sheds part of it (a concurrent 3-million-row INSERT here:
// 149 of 200 identical creates served, 51 shed with 503): the burst is
// not the one the issue describes, on an idle instance.
func databaseIsIdle(t *testing.T, db *gorm.DB) {
	t.Helper()
	start := time.Now()
	var busy []string
	for quiet := 0; quiet < 5; time.Sleep(100 * time.Millisecond) {
		busy = nil
		if err := db.Raw(`SELECT left(datname || ': ' || query, 120) FROM pg_stat_activity
			WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&busy).Error; err != nil {
			t.Fatal(err)
		}
		quiet++
		if len(busy) > 0 {
			quiet = 0
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("PostgreSQL was not idle for a minute; the bursts need an idle database. Still running: %v", busy)
		}
	}
	if err := db.Exec("CHECKPOINT").Error; err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL idle and checkpointed after %s", time.Since(start).Round(time.Millisecond))
}
