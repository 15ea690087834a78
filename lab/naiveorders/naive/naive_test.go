package naive_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/lab/naiveorders/naive"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
)

// dbURL is this package's own database, created fresh by TestMain; db is a
// pool to it, where the naive services keep their schemas.
var (
	dbURL string
	db    *gorm.DB
)

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int {
		dbURL = url
		var err error
		db, err = database.Open(context.Background(), url, database.Options{MaxConns: 20,
			StatementTimeout: 10 * time.Second, LockTimeout: 10 * time.Second, ApplicationName: "naiveorders-test"})
		if err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
		defer database.Close(db)
		return m.Run()
	}, "naiveorders"))
}

// target is one side of a comparison: the naive service with a set of
// mistakes, or the real service.
type target struct {
	api *apptest.Client
	svc *naive.Service // nil for the real service
	run string         // makes the keys and customers of one arm its own
}

func (tg target) key(name string) string { return tg.run + "-" + name }
func (tg target) customer() string       { return "cus_" + tg.run }

func (tg target) create(t *testing.T, key string) apptest.Response {
	t.Helper()
	return tg.api.Do(t, http.MethodPost, "/v1/orders", key, map[string]any{"customer_id": tg.customer(), "currency": "EUR",
		"items": []map[string]any{{"sku": "SKU-1", "quantity": 2, "unit_price": 1250}}})
}

func (tg target) pay(t *testing.T, orderID, key, method string) apptest.Response {
	t.Helper()
	return tg.api.Do(t, http.MethodPost, "/v1/orders/"+orderID+"/pay", key, map[string]string{"payment_method": method})
}

// orders lists the customer's orders, as {id, status}.
func (tg target) orders(t *testing.T) []naive.Order {
	t.Helper()
	r := tg.api.Do(t, http.MethodGet, "/v1/orders?customer_id="+tg.customer(), "", nil)
	var page struct{ Orders []naive.Order }
	if err := json.Unmarshal(r.Body, &page); err != nil || r.Status != http.StatusOK {
		t.Fatalf("list orders: %d %s", r.Status, r.Body)
	}
	return page.Orders
}

func id(t *testing.T, r apptest.Response) string {
	t.Helper()
	s, _ := r.JSON(t)["id"].(string)
	return s
}

func random() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// arms are the three sides every mistake is measured on: the naive service
// with the mistake (the harm), without it (the same code minus the wrong
// line: no harm, so the line is the cause), and the real service.
func arms(t *testing.T, m *app.Main, mistake string) (wrong, right, service target) {
	t.Helper()
	on, err := naive.Parse(mistake)
	if err != nil {
		t.Fatal(err)
	}
	start := func(ms naive.Mistakes) target {
		svc, err := naive.New(context.Background(), naive.Config{DB: db, ChannelURL: "http://" + m.ChannelAddr, Mistakes: ms})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(svc.Handler())
		t.Cleanup(srv.Close)
		return target{api: &apptest.Client{BaseURL: srv.URL, HTTP: srv.Client()}, svc: svc, run: "naive_" + random()}
	}
	return start(on), start(naive.Mistakes{}), target{api: apptest.NewClient(m, apptest.KeyAcme), run: "svc_" + random()}
}

// TestEachMistakeDoesHarmTheServiceDoesNot runs each mistake's story three
// times: against the naive service making it, against the naive service
// without it, and against the real service; the harm is counted, in orders
// or in the channel's own ledger, and is absent from the other two.
func TestEachMistakeDoesHarmTheServiceDoesNot(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	// chargesOf reads the channel's ledger: the charges it made for an order.
	chargesOf := func(orderID string) (charges, requests int, keys map[string]bool) {
		keys = map[string]bool{}
		for _, c := range m.Channel.Charges() {
			if c.Reference == orderID && c.Status == "succeeded" {
				charges++
				requests += c.Requests
				keys[c.IdempotencyKey] = true
			}
		}
		return charges, requests, keys
	}

	t.Run("dedup-on-customer-product", func(t *testing.T) {
		story := func(tg target) (orders int, same bool) {
			a, b := tg.create(t, tg.key("R1")), tg.create(t, tg.key("R2")) // two real purchases, two keys
			return len(tg.orders(t)), id(t, a) == id(t, b)
		}
		wrong, right, service := arms(t, m, "dedup-on-customer-product")
		if n, same := story(wrong); n != 1 || !same {
			t.Errorf("naive with the mistake: %d orders (the second purchase answered with the first: %v), want 1, swallowed", n, same)
		}
		for name, tg := range map[string]target{"naive without it": right, "service": service} {
			if n, same := story(tg); n != 2 || same {
				t.Errorf("%s: %d orders, want 2", name, n)
			}
		}
	})

	t.Run("success-on-any-duplicate", func(t *testing.T) {
		story := func(tg target) (first, retry apptest.Response, status string, charges int) {
			o := id(t, tg.create(t, tg.key("R1")))
			first = tg.pay(t, o, tg.key("R2"), "pm_declined")
			retry = tg.pay(t, o, tg.key("R2"), "pm_declined") // the first answer was lost: the client retries
			charges, _, _ = chargesOf(o)
			return first, retry, tg.orders(t)[0].Status, charges
		}
		wrong, right, service := arms(t, m, "success-on-any-duplicate")
		first, retry, status, charges := story(wrong)
		if first.Status != http.StatusPaymentRequired || retry.Status != http.StatusOK || status == "PAID" || charges != 0 {
			t.Errorf("naive with the mistake: %d then %d, order %s, %d charges; want 402, then 200 for a payment that failed (no charge)",
				first.Status, retry.Status, status, charges)
		}
		for name, tg := range map[string]target{"naive without it": right, "service": service} {
			first, retry, status, charges := story(tg)
			if first.Status != http.StatusPaymentRequired || retry.Status != http.StatusPaymentRequired ||
				retry.Header.Get("Idempotent-Replayed") != "true" || string(retry.Body) != string(first.Body) || status != "PAYMENT_FAILED" || charges != 0 {
				t.Errorf("%s: %d then %d (replayed %q), order %s, %d charges; want 402 replayed byte for byte, PAYMENT_FAILED",
					name, first.Status, retry.Status, retry.Header.Get("Idempotent-Replayed"), status, charges)
			}
		}
	})

	t.Run("expiring-cache", func(t *testing.T) {
		story := func(tg target) (orders int) {
			first := tg.create(t, tg.key("R1"))
			if again := tg.create(t, tg.key("R1")); id(t, again) != id(t, first) {
				t.Errorf("a retry at once got another order: the cache did not even hold while it lived")
			}
			if tg.svc != nil {
				tg.svc.Clock().Advance(naive.DefaultCacheTTL + time.Minute) // the TTL passes
			}
			tg.create(t, tg.key("R1")) // the late retry
			return len(tg.orders(t))
		}
		wrong, right, service := arms(t, m, "expiring-cache")
		if n := story(wrong); n != 2 {
			t.Errorf("naive with the mistake: %d orders after a retry past the TTL, want 2", n)
		}
		for name, tg := range map[string]target{"naive without it": right, "service": service} {
			if n := story(tg); n != 1 {
				t.Errorf("%s: %d orders, want 1", name, n)
			}
		}
	})

	t.Run("check-then-insert", func(t *testing.T) {
		const n = 8
		story := func(tg target) (orders int, statuses map[int]int) {
			if tg.svc != nil {
				tg.svc.HoldWindowOpen(n, 10*time.Second)
			}
			var mu sync.Mutex
			statuses = map[int]int{}
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					r, err := tg.api.Send(http.MethodPost, "/v1/orders", tg.key("R1"), map[string]any{"customer_id": tg.customer(),
						"currency": "EUR", "items": []map[string]any{{"sku": "SKU-1", "quantity": 1, "unit_price": 1250}}}, nil)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						t.Errorf("a concurrent create: %v", err)
						return
					}
					statuses[r.Status]++
				})
			}
			wg.Wait()
			return len(tg.orders(t)), statuses
		}
		wrong, right, service := arms(t, m, "check-then-insert")
		if got, st := story(wrong); got != n {
			t.Errorf("naive with the mistake: %d concurrent creates under one key made %d orders (answers %v), want %d", n, got, st, n)
		}
		for name, tg := range map[string]target{"naive without it": right, "service": service} {
			if got, st := story(tg); got != 1 || st[http.StatusCreated] == 0 || st[http.StatusCreated]+st[http.StatusConflict] != n {
				t.Errorf("%s: %d orders, answers %v; want exactly 1 order, every answer 201 or 409", name, got, st)
			}
		}
	})

	t.Run("new-channel-key-per-retry", func(t *testing.T) {
		story := func(tg target) (first, last int, charges, requests, keys int) {
			o := id(t, tg.create(t, tg.key("R1")))
			first = tg.pay(t, o, tg.key("R2"), "pm_lost_response").Status // charged, the answer lost
			retry := tg.pay(t, o, tg.key("R2"), "pm_lost_response")
			for deadline := time.Now().Add(15 * time.Second); retry.Status == http.StatusConflict && time.Now().Before(deadline); {
				time.Sleep(200 * time.Millisecond) // the service holds the intent until its Retry-After; a 409 calls no channel
				retry = tg.pay(t, o, tg.key("R2"), "pm_lost_response")
			}
			c, r, k := chargesOf(o)
			return first, retry.Status, c, r, len(k)
		}
		wrong, right, service := arms(t, m, "new-channel-key-per-retry")
		if first, last, c, r, k := story(wrong); first != http.StatusServiceUnavailable || c != 2 || k != 2 || r != 2 {
			t.Errorf("naive with the mistake: %d then %d, %d charges under %d keys (%d requests); want 503 and 2 charges under 2 keys",
				first, last, c, k, r)
		}
		for name, tg := range map[string]target{"naive without it": right, "service": service} {
			if first, last, c, r, k := story(tg); first != http.StatusServiceUnavailable || last != http.StatusOK || c != 1 || k != 1 || r != 2 {
				t.Errorf("%s: %d then %d, %d charges under %d keys (%d requests); want 503 then 200, 1 charge reached twice under 1 key",
					name, first, last, c, k, r)
			}
		}
	})

	t.Run("short-retention", func(t *testing.T) {
		story := func(tg target) (orders int, deleted int64) {
			tg.create(t, tg.key("R1"))
			if tg.svc != nil {
				tg.svc.Clock().Advance(48 * time.Hour) // a redelivery, two days later
				var err error
				if deleted, err = tg.svc.Cleanup(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			tg.create(t, tg.key("R1"))
			return len(tg.orders(t)), deleted
		}
		wrong, right, service := arms(t, m, "short-retention")
		if n, deleted := story(wrong); n != 2 || deleted < 1 {
			t.Errorf("naive with the mistake: %d orders, %d records deleted; want the record deleted and 2 orders", n, deleted)
		}
		for name, tg := range map[string]target{"naive without it": right, "service": service} {
			if n, _ := story(tg); n != 1 {
				t.Errorf("%s: %d orders, want 1", name, n)
			}
		}
		// The service keeps what the late retry needs: its create records
		// outlive the two days (it cannot be made to live them here).
		var p struct {
			Operations []struct{ Operation, Retention string }
		}
		if err := json.Unmarshal(service.api.Do(t, http.MethodGet, "/v1/idempotency-policy", "", nil).Body, &p); err != nil {
			t.Fatal(err)
		}
		for _, op := range p.Operations {
			if d, err := time.ParseDuration(op.Retention); op.Operation == "order.create" && (err != nil || d <= 48*time.Hour) {
				t.Errorf("the service keeps order.create records for %s, not past two days", op.Retention)
			}
		}
	})
}

func TestParseNamesEveryMistake(t *testing.T) {
	all, err := naive.Parse(strings.Join(naive.Names(), ","))
	if err != nil || all.String() != strings.Join(naive.Names(), ",") {
		t.Errorf("Parse(every name) = %v, %v", all, err)
	}
	if none, err := naive.Parse(""); err != nil || none != (naive.Mistakes{}) || none.String() != "none" {
		t.Errorf("Parse(\"\") = %v, %v; want none", none, err)
	}
	if _, err := naive.Parse("check-then-update"); err == nil || !strings.Contains(err.Error(), "check-then-insert") {
		t.Errorf("an unknown name: %v, want an error listing the names", err)
	}
}
