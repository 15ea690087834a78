package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderservice/orderservice/client"
	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
)

var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "client"))
}

// fastRetry keeps the backoff of end-to-end tests short; Retry-After still wins.
var fastRetry = client.WithRetry(client.RetryPolicy{BaseDelay: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond})

var customerSeq atomic.Int64

// newCustomer returns a customer id no other test uses, so that order
// counts are exact although all tests share one database.
func newCustomer(t *testing.T) string {
	return fmt.Sprintf("cus_%d_%d", time.Now().UnixNano(), customerSeq.Add(1))
}

func purchase(customer string) client.CreateOrderRequest {
	return client.CreateOrderRequest{CustomerID: customer, Currency: "EUR",
		Items: []client.ItemRequest{{SKU: "SKU-1", Quantity: 2, UnitPrice: 1250}}}
}

func countOrders(t *testing.T, m *app.Main, customer string) int64 {
	t.Helper()
	var n int64
	if err := m.DB.Raw("SELECT count(*) FROM orders WHERE customer_id = ?", customer).Scan(&n).Error; err != nil {
		t.Fatalf("count orders: %v", err)
	}
	return n
}

// each runs fn(i) for i in [0, n) on a few goroutines.
func each(n, workers int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// checkOneKeyPerIntent asserts that each call sent all its attempts, and
// nothing else, under its own key, and that its first answer was lost.
func checkOneKeyPerIntent(t *testing.T, p *faultProxy, what string, results []client.Result[client.Order]) {
	t.Helper()
	keys := map[string]bool{}
	attempts := 0
	for i, res := range results {
		if keys[res.Key] {
			t.Errorf("%s %d reused key %q of another intent", what, i, res.Key)
		}
		keys[res.Key] = true
		attempts += res.Attempts
		if res.Attempts < 2 {
			t.Errorf("%s %d: %d attempts, want >= 2 (its first answer was lost)", what, i, res.Attempts)
		}
		if got := p.Requests(res.Key); got != res.Attempts {
			t.Errorf("%s %d: the proxy saw %d requests under its key %q, the client counted %d attempts", what, i, got, res.Key, res.Attempts)
		}
		if !res.Replayed {
			t.Errorf("%s %d: answer not marked Idempotent-Replayed, yet the service had answered the same key before", what, i)
		}
	}
	// Every request the proxy saw belongs to one of the calls' keys: no
	// attempt went out under a key of its own.
	for _, k := range p.Keys() {
		if !keys[k] {
			t.Errorf("the proxy saw a %s request under key %q that no call reported", what, k)
		}
	}
	if seen := len(p.Keys()); seen != attempts {
		t.Errorf("the proxy saw %d %s requests, the calls counted %d attempts", seen, what, attempts)
	}
}

func TestLostAnswersAreRetriedUnderTheSameKey(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	customer := newCustomer(t)
	const n = 100

	creates := make([]client.Result[client.Order], n)
	t.Run("100 creates whose first answers are lost make exactly 100 orders", func(t *testing.T) {
		p := startFaultProxy(t, m.URL(), 0)
		c := client.New(p.URL(), apptest.KeyAcme, fastRetry)
		each(n, 10, func(i int) {
			res, err := c.CreateOrder(ctx, purchase(customer))
			if err != nil {
				t.Errorf("create %d: %v", i, err)
			}
			creates[i] = res
		})
		if t.Failed() {
			t.FailNow()
		}
		if got := countOrders(t, m, customer); got != n {
			t.Errorf("%d orders in the database, want %d", got, n)
		}
		if p.Dropped() != n {
			t.Errorf("the proxy lost %d answers, want %d", p.Dropped(), n)
		}
		ids := map[string]bool{}
		for i, res := range creates {
			if res.Status != http.StatusCreated || res.Value.Status != client.StatusCreated || res.Value.TotalAmount != 2500 {
				t.Errorf("create %d: status %d, order %+v", i, res.Status, res.Value)
			}
			ids[res.Value.ID] = true
		}
		if len(ids) != n {
			t.Errorf("%d distinct order ids, want %d", len(ids), n)
		}
		checkOneKeyPerIntent(t, p, "create", creates)
	})

	t.Run("100 pays whose first answers are lost make exactly 100 charges", func(t *testing.T) {
		p := startFaultProxy(t, m.URL(), 0)
		c := client.New(p.URL(), apptest.KeyAcme, fastRetry)
		pays := make([]client.Result[client.Order], n)
		each(n, 10, func(i int) {
			res, err := c.Pay(ctx, creates[i].Value.ID, client.PayRequest{PaymentMethod: "pm_ok"})
			if err != nil {
				t.Errorf("pay %d: %v", i, err)
			}
			pays[i] = res
		})
		if t.Failed() {
			t.FailNow()
		}
		for i, res := range pays {
			if res.Status != http.StatusOK || res.Value.Status != client.StatusPaid || res.Value.Payment == nil ||
				res.Value.Payment.Status != "succeeded" || res.Value.Payment.Amount != 2500 {
				t.Errorf("pay %d: status %d, order %+v", i, res.Status, res.Value)
			}
		}
		checkOneKeyPerIntent(t, p, "pay", pays)

		stats := m.Channel.Stats()
		if stats.Charges != n || stats.AmountCharged != n*2500 {
			t.Errorf("channel made %d charges of %d in all, want %d of %d", stats.Charges, stats.AmountCharged, n, n*2500)
		}
		charges := m.Channel.Charges()
		if len(charges) != n {
			t.Errorf("channel holds %d charges, want %d", len(charges), n)
		}
		for _, ch := range charges {
			if ch.Requests != 1 {
				t.Errorf("charge %s was requested %d times, want once: the service replays lost answers itself", ch.ID, ch.Requests)
			}
		}

		// The history names the very keys the client made for each intent.
		direct := client.New(m.URL(), apptest.KeyAcme)
		for i := range n {
			ev, err := direct.Events(ctx, creates[i].Value.ID)
			if err != nil {
				t.Fatalf("events of order %d: %v", i, err)
			}
			keyOf := map[string]string{}
			for _, e := range ev.Value {
				keyOf[e.Operation] = e.IdempotencyKey
			}
			if keyOf["order.create"] != creates[i].Key || keyOf["order.pay"] != pays[i].Key {
				t.Errorf("order %d history keys %v, want create %q and pay %q", i, keyOf, creates[i].Key, pays[i].Key)
			}
		}
	})
}

// createWithNewKeyPerRetry is the bug this package exists to prevent: it
// retries a lost answer, but under a new key each time, so every retry is a
// new intent to the service.
func createWithNewKeyPerRetry(ctx context.Context, c *client.Client, req client.CreateOrderRequest) (attempts int, err error) {
	for attempts = 1; attempts <= 5; attempts++ {
		_, err = c.CreateOrder(ctx, req, client.WithKey(client.NewKey())) // WRONG: a key per attempt
		if err == nil {
			return attempts, nil
		}
	}
	return attempts - 1, err
}

func TestOneLostAnswer(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("wrong client: a new key per retry creates two orders for one intent", func(t *testing.T) {
		customer := newCustomer(t)
		p := startFaultProxy(t, m.URL(), 1)
		once := client.New(p.URL(), apptest.KeyAcme, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
		attempts, err := createWithNewKeyPerRetry(ctx, once, purchase(customer))
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if attempts != 2 {
			t.Errorf("%d attempts, want 2 (one lost answer, one retry)", attempts)
		}
		if got := countOrders(t, m, customer); got != 2 {
			t.Errorf("%d orders for one intent, want the duplicate (2) this test exists to show", got)
		}
	})

	t.Run("right client: one key per intent creates one order", func(t *testing.T) {
		customer := newCustomer(t)
		p := startFaultProxy(t, m.URL(), 1)
		c := client.New(p.URL(), apptest.KeyAcme, fastRetry)
		res, err := c.CreateOrder(ctx, purchase(customer))
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if res.Attempts != 2 || !res.Replayed || p.Requests(res.Key) != 2 {
			t.Errorf("%d attempts (proxy saw %d under %q), replayed %v: want 2 under one key, replayed",
				res.Attempts, p.Requests(res.Key), res.Key, res.Replayed)
		}
		if got := countOrders(t, m, customer); got != 1 {
			t.Errorf("%d orders for one intent, want 1", got)
		}
	})
}

// statusRecorder remembers the status of every answer to a POST that
// reaches the client.
type statusRecorder struct {
	mu       sync.Mutex
	statuses []int
}

func (r *statusRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && req.Method == http.MethodPost {
		r.mu.Lock()
		r.statuses = append(r.statuses, resp.StatusCode)
		r.mu.Unlock()
	}
	return resp, err
}

func (r *statusRecorder) seen() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.statuses...)
}

func TestByDefaultADuplicateWaitsForTheFirstOutcomeInOneAttempt(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := &statusRecorder{}
	c := client.New(m.URL(), apptest.KeyAcme, client.WithHTTPClient(&http.Client{Transport: rec}))
	created, err := c.CreateOrder(ctx, purchase(newCustomer(t)))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	orderID, key := created.Value.ID, client.NewKey()
	first := make(chan apptest.Response, 1)
	go func() {
		resp, err := apptest.NewClient(m, apptest.KeyAcme).Send(http.MethodPost, "/v1/orders/"+orderID+"/pay", key, `{"payment_method":"pm_slow"}`, nil)
		if err != nil {
			t.Errorf("first pay: %v", err)
		}
		first <- resp
	}()
	waitForState(t, ctx, c, key, "PROCESSING")
	res, err := c.Pay(ctx, orderID, client.PayRequest{PaymentMethod: "pm_slow"}, client.WithKey(key))
	if err != nil {
		t.Fatalf("pay: %v", err)
	}
	if got := rec.seen()[1:]; len(got) != 1 || got[0] != http.StatusOK || res.Attempts != 1 || !res.Replayed {
		t.Errorf("statuses %v, %d attempts, replayed %v: want one attempt answered with the first's 200 replayed", got, res.Attempts, res.Replayed)
	}
	if r := <-first; r.Status != http.StatusOK {
		t.Errorf("first pay answered %d: %s", r.Status, r.Body)
	}
	if s := m.Channel.Stats(); s.Charges != 1 {
		t.Errorf("channel made %d charges, want 1", s.Charges)
	}
}

func TestInProgressIsWaitedOutAndEndsInTheReplay(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := &statusRecorder{}
	// Without Prefer: wait, the 409 and its Retry-After are the protocol.
	c := client.New(m.URL(), apptest.KeyAcme, client.WithHTTPClient(&http.Client{Transport: rec}), client.WithWait(0))
	created, err := c.CreateOrder(ctx, purchase(newCustomer(t)))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	orderID, key := created.Value.ID, client.NewKey()

	// A first request under key R2 is charging slowly (pm_slow, 300ms)...
	first := make(chan apptest.Response, 1)
	go func() {
		raw := apptest.NewClient(m, apptest.KeyAcme)
		resp, err := raw.Send(http.MethodPost, "/v1/orders/"+orderID+"/pay", key, `{"payment_method":"pm_slow"}`, nil)
		if err != nil {
			t.Errorf("first pay: %v", err)
		}
		first <- resp
	}()
	waitForState(t, ctx, c, key, "PROCESSING")

	// ...when the client sends the same intent under the same key.
	start := time.Now()
	res, err := c.Pay(ctx, orderID, client.PayRequest{PaymentMethod: "pm_slow"}, client.WithKey(key))
	if err != nil {
		t.Fatalf("pay: %v", err)
	}
	elapsed := time.Since(start)
	got := rec.seen()[1:] // after the create
	if len(got) < 2 || got[0] != http.StatusConflict || got[len(got)-1] != http.StatusOK {
		t.Errorf("the client saw statuses %v, want 409 request_in_progress first and 200 last", got)
	}
	if res.Attempts != len(got) || res.Attempts < 2 || !res.Replayed || res.Value.Status != client.StatusPaid || res.Key != key {
		t.Errorf("result: %d attempts, replayed %v, status %s, key %q: want >= 2 attempts ending in the replayed PAID order under %q",
			res.Attempts, res.Replayed, res.Value.Status, res.Key, key)
	}
	if elapsed < time.Second {
		t.Errorf("the client retried after %v, before the 409's Retry-After (>= 1s)", elapsed)
	}
	if r := <-first; r.Status != http.StatusOK {
		t.Errorf("first pay answered %d: %s", r.Status, r.Body)
	}
	if s := m.Channel.Stats(); s.Charges != 1 {
		t.Errorf("channel made %d charges, want 1", s.Charges)
	}
}

// waitForState polls the service until key's record is in state.
func waitForState(t *testing.T, ctx context.Context, c *client.Client, key, state string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		recs, err := c.IdempotencyRecords(ctx, key)
		if err != nil {
			t.Fatalf("records of %q: %v", key, err)
		}
		for _, r := range recs.Value {
			if r.State == state {
				return
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("the record of %q never reached %s", key, state)
}

func TestFinalAnswersAreReturnedAfterOneAttempt(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := client.New(m.URL(), apptest.KeyAcme, fastRetry)
	customer := newCustomer(t)
	r1 := client.NewKey()
	created, err := c.CreateOrder(ctx, purchase(customer), client.WithKey(r1))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	orderID := created.Value.ID

	for _, tc := range []struct {
		name   string
		call   func() (client.Result[client.Order], error)
		status int
		code   string
		is     func(error) bool
	}{
		{"422 idempotency_key_reused: the same key for another purchase", func() (client.Result[client.Order], error) {
			other := purchase(customer)
			other.Items[0].Quantity = 3
			return c.CreateOrder(ctx, other, client.WithKey(r1))
		}, 422, client.CodeKeyReused, client.IsKeyReused},
		{"404 order_not_found: paying an order that does not exist", func() (client.Result[client.Order], error) {
			return c.Pay(ctx, "0193a5c2-7d1e-7f3a-9c1b-2f4e5d6a7b8c", client.PayRequest{PaymentMethod: "pm_ok"})
		}, 404, client.CodeOrderNotFound, client.IsNotFound},
		{"409 invalid_transition: shipping an unpaid order", func() (client.Result[client.Order], error) {
			return c.Ship(ctx, orderID, client.ShipRequest{Carrier: "DHL", TrackingNumber: "JD0001"})
		}, 409, client.CodeInvalidTransition, client.IsInvalidTransition},
		{"402 payment_declined", func() (client.Result[client.Order], error) {
			return c.Pay(ctx, orderID, client.PayRequest{PaymentMethod: "pm_declined"})
		}, 402, client.CodePaymentDeclined, client.IsDeclined},
		{"400 invalid_request: an order without items", func() (client.Result[client.Order], error) {
			return c.CreateOrder(ctx, client.CreateOrderRequest{CustomerID: customer, Currency: "EUR"})
		}, 400, "invalid_request", nil},
		{"401 unauthenticated: an unknown API key", func() (client.Result[client.Order], error) {
			return client.New(m.URL(), "no-such-key", fastRetry).CreateOrder(ctx, purchase(customer))
		}, 401, "unauthenticated", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := tc.call()
			var pe *client.ProblemError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v, want a *client.ProblemError", err)
			}
			if pe.Status != tc.status || pe.Code != tc.code || res.Status != tc.status {
				t.Errorf("answer %d %q (result status %d), want %d %q", pe.Status, pe.Code, res.Status, tc.status, tc.code)
			}
			if res.Attempts != 1 || pe.Attempts != 1 {
				t.Errorf("%d attempts (problem says %d), want exactly 1: a final answer is not retried", res.Attempts, pe.Attempts)
			}
			if tc.is != nil && !tc.is(err) {
				t.Errorf("the helper for %q says false for %v", tc.code, err)
			}
			if pe.Detail == "" || len(pe.Raw) == 0 || pe.Type == "" {
				t.Errorf("problem %+v lacks its detail, type or raw body", pe)
			}
		})
	}
	if got := countOrders(t, m, customer); got != 1 {
		t.Errorf("%d orders, want the one created", got)
	}
}

func TestContextDeadlineBoundsTheRetryLoop(t *testing.T) {
	unavailable := func(retryAfter string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"type":"urn:orderservice:problem:service_unavailable","title":"Service temporarily unavailable","status":503,"detail":"try later","code":"service_unavailable"}`)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	check := func(t *testing.T, err error, elapsed time.Duration, wantProblem bool) {
		t.Helper()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
		}
		var pe *client.ProblemError
		if wantProblem && (!errors.As(err, &pe) || pe.Status != 503) {
			t.Errorf("error %v does not carry the last 503", err)
		}
		// Each case is built so that a call that ignored its 300ms deadline
		// would run for many seconds (a 60s Retry-After; 1000 attempts, about
		// 20s of backoff alone): a bound far from both ends holds on a loaded
		// machine and still tells the two apart.
		if elapsed > 5*time.Second {
			t.Errorf("returned after %v: the 300ms deadline did not end the call", elapsed)
		}
	}

	t.Run("a Retry-After beyond the deadline ends the call at once", func(t *testing.T) {
		c := client.New(unavailable("60").URL, apptest.KeyAcme)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		res, err := c.CreateOrder(ctx, purchase("cus_deadline"))
		check(t, err, time.Since(start), true)
		if res.Attempts != 1 {
			t.Errorf("%d attempts, want 1: waiting 60s cannot fit in 300ms", res.Attempts)
		}
	})

	t.Run("backoff retries stop at the deadline, not at MaxAttempts", func(t *testing.T) {
		c := client.New(unavailable("").URL, apptest.KeyAcme, client.WithRetry(client.RetryPolicy{
			MaxAttempts: 1000, BaseDelay: 10 * time.Millisecond, MaxDelay: 40 * time.Millisecond}))
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		res, err := c.CreateOrder(ctx, purchase("cus_deadline"))
		check(t, err, time.Since(start), true)
		if res.Attempts < 3 || res.Attempts >= 1000 {
			t.Errorf("%d attempts, want several, bounded by the deadline", res.Attempts)
		}
	})

	t.Run("attempts that time out are retried until the deadline", func(t *testing.T) {
		var requests atomic.Int64
		keys := sync.Map{}
		hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			keys.Store(r.Header.Get("Idempotency-Key"), true)
			_, _ = io.Copy(io.Discard, r.Body) // lets the server notice the client hanging up
			select {                           // never answers
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}))
		t.Cleanup(hang.Close)
		c := client.New(hang.URL, apptest.KeyAcme, client.WithAttemptTimeout(80*time.Millisecond), client.WithRetry(client.RetryPolicy{
			MaxAttempts: 1000, BaseDelay: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond}))
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		res, err := c.Pay(ctx, "o1", client.PayRequest{PaymentMethod: "pm_ok"})
		check(t, err, time.Since(start), false)
		n := 0
		keys.Range(func(k, _ any) bool { n++; return k == res.Key })
		// The deadline may cut the last attempt before it reaches the server.
		if seen := int(requests.Load()); res.Attempts < 2 || seen > res.Attempts || seen < res.Attempts-1 || n != 1 {
			t.Errorf("%d attempts, server saw %d requests under %d keys: want >= 2 attempts under one key", res.Attempts, requests.Load(), n)
		}
	})
}

func TestLifecycleThroughTheClient(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := client.New(m.URL(), apptest.KeyAcme, fastRetry)
	customer := newCustomer(t)
	must := func(res client.Result[client.Order], err error) client.Order {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return res.Value
	}

	t.Run("create, pay, ship, deliver, each under its own key", func(t *testing.T) {
		req := purchase(customer)
		req.Metadata = map[string]string{"gift": "yes"}
		o := must(c.CreateOrder(ctx, req))
		must(c.Pay(ctx, o.ID, client.PayRequest{PaymentMethod: "pm_ok"}))
		must(c.Ship(ctx, o.ID, client.ShipRequest{Carrier: "DHL", TrackingNumber: "JD0001"}))
		done := must(c.Deliver(ctx, o.ID))
		if done.Status != client.StatusDelivered || done.Shipment == nil || done.Shipment.TrackingNumber != "JD0001" ||
			done.Payment == nil || done.Payment.Status != "succeeded" || done.Metadata["gift"] != "yes" || len(done.Items) != 1 ||
			done.Items[0].LineTotal != 2500 {
			t.Errorf("delivered order %+v", done)
		}
		got := must(c.GetOrder(ctx, o.ID))
		if got.Status != client.StatusDelivered || got.Version != done.Version {
			t.Errorf("read back %s v%d, want DELIVERED v%d", got.Status, got.Version, done.Version)
		}
		ev, err := c.Events(ctx, o.ID)
		if err != nil {
			t.Fatal(err)
		}
		var path []string
		keyOf := map[string]string{} // operation -> key
		opOf := map[string]string{}  // key -> operation
		for _, e := range ev.Value {
			path = append(path, string(e.ToStatus))
			if k, ok := keyOf[e.Operation]; ok && k != e.IdempotencyKey {
				t.Errorf("%s appears under two keys, %q and %q", e.Operation, k, e.IdempotencyKey)
			}
			if op, ok := opOf[e.IdempotencyKey]; ok && op != e.Operation {
				t.Errorf("key %q used for %s and %s", e.IdempotencyKey, op, e.Operation)
			}
			keyOf[e.Operation], opOf[e.IdempotencyKey] = e.IdempotencyKey, e.Operation
		}
		if fmt.Sprint(path) != "[CREATED PAYMENT_PENDING PAID SHIPPED DELIVERED]" || len(keyOf) != 4 {
			t.Errorf("history %v over operations %v, want create, pay (pending, paid), ship, deliver", path, keyOf)
		}
	})

	t.Run("cancelling a paid order refunds it", func(t *testing.T) {
		o := must(c.CreateOrder(ctx, purchase(customer)))
		must(c.Pay(ctx, o.ID, client.PayRequest{PaymentMethod: "pm_ok"}))
		res, err := c.Cancel(ctx, o.ID, client.CancelRequest{Reason: "changed my mind"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Value.Status != client.StatusCancelled || res.Value.Payment == nil || res.Value.Payment.Status != "refunded" ||
			res.Value.Payment.RefundID == "" {
			t.Errorf("cancelled order %+v, payment %+v", res.Value, res.Value.Payment)
		}
		recs, err := c.IdempotencyRecords(ctx, res.Key)
		if err != nil || len(recs.Value) != 1 || recs.Value[0].Operation != "order.cancel" ||
			recs.Value[0].State != "SUCCEEDED" || recs.Value[0].ResourceID != o.ID {
			t.Errorf("records of the cancel key: %+v, %v", recs.Value, err)
		}
	})

	t.Run("the listing pages through the customer's orders, newest first", func(t *testing.T) {
		var seen []client.Order
		opts := client.ListOptions{CustomerID: customer, Limit: 1}
		for {
			page, err := c.ListOrders(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			seen = append(seen, page.Value.Orders...)
			if page.Value.NextCursor == "" {
				break
			}
			opts.Cursor = page.Value.NextCursor
		}
		if len(seen) != 2 || !seen[0].CreatedAt.After(seen[1].CreatedAt) {
			t.Errorf("listed %d orders, want 2 newest first", len(seen))
		}
		page, err := c.ListOrders(ctx, client.ListOptions{CustomerID: customer, Status: client.StatusCancelled})
		if err != nil || len(page.Value.Orders) != 1 {
			t.Errorf("CANCELLED filter: %d orders, %v; want 1", len(page.Value.Orders), err)
		}
	})
}
