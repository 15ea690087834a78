package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/orderservice/orderservice/tests/apptest"
)

// A page served from another origin calls the API from headless Chromium:
// the browser's preflight is answered for the allowed origin, the page
// creates an order and reads its replay (Idempotent-Replayed, Location);
// a page from an origin not on the list is refused by the browser before
// its request is sent, and nothing is created.
func TestAPageOnAnotherOriginCallsTheAPI(t *testing.T) {
	page := func() *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, "<!doctype html><title>shop</title><p>a shop's checkout page</p>")
		}))
		t.Cleanup(s.Close)
		return s
	}
	shop, stranger := page(), page()
	m := apptest.Start(t, dbURL, map[string]string{"CORS_ALLOWED_ORIGINS": shop.URL})
	api := m.URL()
	orders := func() (n int64) {
		m.DB.Raw("SELECT count(*) FROM orders").Scan(&n)
		return n
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	browser := apptest.Browser(ctx, t, 1280, 720)

	// createTwice is the page's script: the same create sent twice, as a
	// checkout button pressed twice would, each answer as the page sees it.
	createTwice := func(key string) string {
		return fmt.Sprintf(`(async () => {
  const send = () => fetch(%q + "/v1/orders", {method: "POST", headers: {
      "Authorization": "Bearer " + %q, "Content-Type": "application/json",
      "Idempotency-Key": %q, "Prefer": "wait=5"},
    body: JSON.stringify({customer_id: "acme-cus-browser", currency: "EUR",
      items: [{sku: "MUG", quantity: 1, unit_price: 1200}]})});
  try {
    const out = [];
    for (const r of [await send(), await send()]) {
      out.push({status: r.status, replayed: r.headers.get("Idempotent-Replayed"),
        location: r.headers.get("Location"), id: (await r.json()).id});
    }
    return JSON.stringify(out);
  } catch (e) { return JSON.stringify({refused: String(e)}); }
})()`, api, apptest.KeyAcme, key)
	}
	run := func(t *testing.T, origin, script string) string {
		t.Helper()
		if _, err := chromedp.Run(browser, chromedp.Navigate(origin)); err != nil {
			t.Fatalf("open the page on %s: %v", origin, err)
		}
		out, err := chromedp.Run(browser, chromedp.Evaluate[string](script, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("the page on %s: %v", origin, err)
		}
		return out
	}

	t.Run("the allowed origin creates an order and reads its replay", func(t *testing.T) {
		before := orders()
		var got []struct {
			Status   int
			Replayed *string
			Location *string
			ID       string
		}
		out := run(t, shop.URL, createTwice("browser-"+uuid.NewString()))
		if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 2 {
			t.Fatalf("the page saw %s", out)
		}
		first, replay := got[0], got[1]
		if first.Status != 201 || first.Replayed != nil || first.Location == nil {
			t.Errorf("first create as the page saw it = %s, want 201, a Location, no Idempotent-Replayed", out)
		}
		if replay.Status != 201 || replay.Replayed == nil || *replay.Replayed != "true" || replay.ID != first.ID {
			t.Errorf("replay as the page saw it = %s, want 201, Idempotent-Replayed true, the same order", out)
		}
		if first.Location != nil && *first.Location != "/v1/orders/"+first.ID {
			t.Errorf("Location = %q, want /v1/orders/%s", *first.Location, first.ID)
		}
		if n := orders() - before; n != 1 {
			t.Errorf("%d orders created, want 1", n)
		}
	})

	t.Run("another origin is refused by the browser and creates nothing", func(t *testing.T) {
		before := orders()
		out := run(t, stranger.URL, createTwice("stranger-"+uuid.NewString()))
		if !strings.Contains(out, "refused") {
			t.Errorf("the page on a refused origin saw %s, want the fetch refused", out)
		}
		if n := orders() - before; n != 0 {
			t.Errorf("%d orders created from a refused origin, want 0", n)
		}
	})
}
