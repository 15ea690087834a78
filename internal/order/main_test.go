package order_test

import (
	"net/http"
	"os"
	"sync"
	"testing"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/apptest"
	"github.com/orderservice/orderservice/internal/testdb"
)

// dbURL is this package's own database, created fresh by TestMain.
var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "order"))
}

// start boots the real service against this package's database.
func start(t *testing.T, env map[string]string) (*app.Main, *apptest.Client) {
	t.Helper()
	m := apptest.Start(t, dbURL, env)
	return m, apptest.NewClient(m, apptest.KeyAcme)
}

// createBody is a valid create request for customer.
func createBody(customer string) map[string]any {
	return map[string]any{
		"customer_id": customer,
		"currency":    "EUR",
		"items":       []map[string]any{{"sku": "SKU-1", "quantity": 2, "unit_price": 1250}},
	}
}

// createOrder creates an order and returns its id.
func createOrder(t *testing.T, c *apptest.Client, key string) string {
	t.Helper()
	r := c.Do(t, http.MethodPost, "/v1/orders", key, createBody("cus_"+key))
	if r.Status != http.StatusCreated {
		t.Fatalf("create: status %d: %s", r.Status, r.Body)
	}
	return r.JSON(t)["id"].(string)
}

// setStatus moves an order to status directly in the store, for tests that
// need an order in a given state.
func setStatus(t *testing.T, m *app.Main, id, status string) {
	t.Helper()
	if err := m.DB.Exec("UPDATE orders SET status = ? WHERE id = ?", status, id).Error; err != nil {
		t.Fatalf("set status: %v", err)
	}
}

// atOnce runs send for 0..n-1, every call released at the same moment, and
// returns the answers in that order; a request that got no answer fails the
// test.
func atOnce(t *testing.T, n int, send func(i int) (apptest.Response, error)) []apptest.Response {
	t.Helper()
	responses := make([]apptest.Response, n)
	errs := make([]error, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			responses[i], errs[i] = send(i)
		}()
	}
	close(gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return responses
}
