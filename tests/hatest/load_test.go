//go:build ha

package hatest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/orderservice/orderservice/client"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
)

// attempt is one HTTP request the Go client sent.
type attempt struct {
	start, end time.Time
	path       string
	status     int // 0: no answer (transport error)
	retryAfter string
	err        error
}

// ok reports whether the attempt was answered 2xx.
func (a attempt) ok() bool { return a.status >= 200 && a.status < 300 }

// attemptLog records every attempt through an http.RoundTripper, so the
// figures (unavailability window, errors retried) come from the wire.
type attemptLog struct {
	next http.RoundTripper
	mu   sync.Mutex
	all  []attempt
}

func (l *attemptLog) RoundTrip(req *http.Request) (*http.Response, error) {
	a := attempt{start: time.Now(), path: req.URL.Path}
	res, err := l.next.RoundTrip(req)
	a.end, a.err = time.Now(), err
	if res != nil {
		a.status, a.retryAfter = res.StatusCode, res.Header.Get("Retry-After")
	}
	if req.Method == http.MethodPost {
		l.mu.Lock()
		l.all = append(l.all, a)
		l.mu.Unlock()
	}
	return res, err
}

func (l *attemptLog) attempts() []attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all)
}

// newClient is the Go client of one instance for one tenant, patient
// enough to ride out a failover (its retries are what the test measures).
func newClient(baseURL, apiKey string, log *attemptLog) *client.Client {
	return newClientWith(baseURL, apiKey, log, client.RetryPolicy{MaxAttempts: 200, BaseDelay: 50 * time.Millisecond, MaxDelay: time.Second})
}

func newClientWith(baseURL, apiKey string, log *attemptLog, policy client.RetryPolicy) *client.Client {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 64
	log.next = transport
	return client.New(baseURL, apiKey, client.WithHTTPClient(&http.Client{Transport: log}), client.WithRetry(policy))
}

// intent is one create or pay the load made, and how it ended.
type intent struct {
	op         string // "create" or "pay"
	key        string
	n          int // the create's body is createRequest(n)
	orderID    string
	amount     int64
	start, end time.Time
	attempts   int
	replayed   bool
	err        error // the call gave up (the intent is converged later)
	converged  bool  // it took a second call under the same key
}

// load drives create-then-pay intents through the instances' clients.
type load struct {
	clients []*client.Client
	log     *attemptLog
	mu      sync.Mutex
	intents []*intent
}

func (l *load) add(in *intent) {
	l.mu.Lock()
	l.intents = append(l.intents, in)
	l.mu.Unlock()
}

func (l *load) all() []*intent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.intents)
}

func createRequest(i int) client.CreateOrderRequest {
	return client.CreateOrderRequest{CustomerID: fmt.Sprintf("cust-%d", i%17), Currency: "EUR",
		Items: []client.ItemRequest{{SKU: "SKU-1", Quantity: 1 + i%3, UnitPrice: 1000 + int64(i%7)}}}
}

// run makes workers loop create → pay (the pay through the other
// instance) until ctx ends; every call retries under its own key.
func (l *load) run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				n := w*100000 + i
				c := l.clients[n%len(l.clients)]
				created := l.create(c, n, client.NewKey())
				if created.err != nil || ctx.Err() != nil {
					continue
				}
				l.pay(l.clients[(n+1)%len(l.clients)], created.orderID, created.amount, client.NewKey())
			}
		}()
	}
	wg.Wait()
}

func (l *load) create(c *client.Client, n int, key string) *intent {
	req := createRequest(n)
	in := &intent{op: "create", key: key, n: n, amount: req.Items[0].UnitPrice * int64(req.Items[0].Quantity), start: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := c.CreateOrder(ctx, req, client.WithKey(key))
	in.end, in.err, in.attempts, in.replayed, in.orderID = time.Now(), err, res.Attempts, res.Replayed, res.Value.ID
	l.add(in)
	return in
}

func (l *load) pay(c *client.Client, orderID string, amount int64, key string) *intent {
	in := &intent{op: "pay", key: key, orderID: orderID, amount: amount, start: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := c.Pay(ctx, orderID, client.PayRequest{PaymentMethod: "pm_ok"}, client.WithKey(key))
	in.end, in.err, in.attempts, in.replayed = time.Now(), err, res.Attempts, res.Replayed
	l.add(in)
	return in
}

// converge resends every intent whose call gave up, under its own key,
// until it succeeds: once the cluster is back, every intent must end.
func (l *load) converge(t *testing.T) int {
	t.Helper()
	resent := 0
	for _, in := range l.all() {
		if in.err == nil {
			continue
		}
		resent++
		c := l.clients[0]
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if in.op == "create" {
			res, err := c.CreateOrder(ctx, createRequest(in.n), client.WithKey(in.key))
			in.err, in.orderID, in.replayed = err, res.Value.ID, res.Replayed
		} else {
			res, err := c.Pay(ctx, in.orderID, client.PayRequest{PaymentMethod: "pm_ok"}, client.WithKey(in.key))
			in.err, in.replayed = err, res.Replayed
		}
		cancel()
		in.converged = true
		if in.err != nil {
			t.Errorf("%s %s under key %s never converged: %v", in.op, in.orderID, in.key, in.err)
		}
	}
	return resent
}

// tally is what one scenario's load saw.
type tally struct {
	creates, pays        int
	failedAttempts       int            // attempts answered with an error (or none)
	failedByKind         map[string]int // "503", "409", "transport", …
	unretryable          []attempt      // errors a retry would not fix (must be none)
	unknownResolved      map[string]int // by op: intents whose failed attempt had in fact taken effect (the retry got it replayed)
	retriedExecuted      map[string]int // by op: intents with a failed attempt that a retry executed afresh
	firstOKAfter         time.Time      // the first 2xx attempt sent after `since`
	lastFailure          time.Time      // the end of the last failed attempt
	p50, p99, max        time.Duration  // call latency (retries included) of intents in the window
	windowCalls          int
	resentAfterGivingUp  int
	orders, charges      int
	missingAcknowledged  int
	extraOrders          int
	doubleCharges        int
	unpaidAcknowledgedOK int
}

func (l *load) tally(since, windowStart, windowEnd time.Time) tally {
	tl := tally{failedByKind: map[string]int{}, unknownResolved: map[string]int{}, retriedExecuted: map[string]int{}}
	for _, a := range l.log.attempts() {
		if a.ok() {
			if a.start.After(since) && (tl.firstOKAfter.IsZero() || a.end.Before(tl.firstOKAfter)) {
				tl.firstOKAfter = a.end
			}
			continue
		}
		tl.failedAttempts++
		kind := fmt.Sprint(a.status)
		if a.err != nil {
			kind = "transport"
		}
		tl.failedByKind[kind]++
		if a.end.After(tl.lastFailure) {
			tl.lastFailure = a.end
		}
		retryable := a.err != nil || (a.status == http.StatusServiceUnavailable && a.retryAfter != "") || a.status == http.StatusConflict
		if !retryable {
			tl.unretryable = append(tl.unretryable, a)
		}
	}
	var lat []time.Duration
	for _, in := range l.all() {
		if in.op == "create" {
			tl.creates++
		} else {
			tl.pays++
		}
		if in.attempts > 1 || in.converged {
			if in.replayed {
				tl.unknownResolved[in.op]++
			} else {
				tl.retriedExecuted[in.op]++
			}
		}
		if !in.start.Before(windowStart) && !in.start.After(windowEnd) && in.err == nil && !in.converged {
			lat = append(lat, in.end.Sub(in.start))
		}
	}
	tl.windowCalls = len(lat)
	if len(lat) > 0 {
		slices.Sort(lat)
		tl.p50, tl.p99, tl.max = lat[len(lat)/2], lat[(len(lat)*99)/100], lat[len(lat)-1]
	}
	return tl
}

// verify checks the outcome against the database (the new primary) and
// the channel: every acknowledged order and charge exists, no key made a
// second order, no order was charged twice.
func verify(t *testing.T, dbURL, tenant string, l *load, ch *mockchannel.Server, tl *tally) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect to the primary to verify: %v", err)
	}
	defer conn.Close(ctx)

	statusOf := map[string]string{}
	rows, err := conn.Query(ctx, "SELECT id::text, status FROM orders WHERE tenant_id = $1", tenant)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			t.Fatal(err)
		}
		statusOf[id] = status
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	orderOfKey := map[string]string{}
	rows, err = conn.Query(ctx, "SELECT idempotency_key, coalesce(resource_id, ''), state FROM idempotency_records WHERE tenant_id = $1 AND operation = 'order.create'", tenant)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var key, res, state string
		if err := rows.Scan(&key, &res, &state); err != nil {
			t.Fatal(err)
		}
		if state != "SUCCEEDED" {
			t.Errorf("create record %s is %s after convergence", key, state)
		}
		orderOfKey[key] = res
	}
	var processing int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM idempotency_records WHERE tenant_id = $1 AND state <> 'SUCCEEDED'", tenant).Scan(&processing); err != nil {
		t.Fatal(err)
	}
	if processing != 0 {
		t.Errorf("%d records of %s are not SUCCEEDED after every intent converged", processing, tenant)
	}

	chargesOf := map[string]int{}
	for _, c := range ch.Charges() {
		if _, ours := statusOf[c.Reference]; ours {
			chargesOf[c.Reference]++
		}
	}
	tl.orders = len(statusOf)
	creates := 0
	for _, in := range l.all() {
		switch in.op {
		case "create":
			creates++
			if _, ok := statusOf[in.orderID]; !ok {
				tl.missingAcknowledged++
				t.Errorf("acknowledged order %s (key %s) is missing after the failover", in.orderID, in.key)
			}
			if orderOfKey[in.key] != in.orderID {
				t.Errorf("key %s: record names order %q, the client got %q", in.key, orderOfKey[in.key], in.orderID)
			}
		case "pay":
			tl.charges++
			if statusOf[in.orderID] != "PAID" {
				tl.unpaidAcknowledgedOK++
				t.Errorf("acknowledged payment of %s: order is %s", in.orderID, statusOf[in.orderID])
			}
			if chargesOf[in.orderID] != 1 {
				t.Errorf("order %s has %d charges at the channel, want 1", in.orderID, chargesOf[in.orderID])
			}
		}
	}
	tl.extraOrders = len(statusOf) - creates
	if tl.extraOrders != 0 {
		t.Errorf("%d orders for %d create keys: %d beyond one per key", len(statusOf), creates, tl.extraOrders)
	}
	total := 0
	for id, n := range chargesOf {
		total += n
		if n > 1 {
			tl.doubleCharges += n - 1
			t.Errorf("order %s charged %d times", id, n)
		}
	}
	if total != tl.charges {
		t.Errorf("the channel holds %d charges for %d pay intents", total, tl.charges)
	}
	for _, a := range tl.unretryable {
		t.Errorf("an error a retry does not fix reached the client: %s %d (Retry-After %q) %v", a.path, a.status, a.retryAfter, a.err)
	}
}

func (tl tally) String() string {
	kinds := make([]string, 0, len(tl.failedByKind))
	for k, n := range tl.failedByKind {
		kinds = append(kinds, fmt.Sprintf("%s×%d", k, n))
	}
	slices.Sort(kinds)
	return fmt.Sprintf("%d creates, %d pays; %d failed attempts (%s), all retried; answered with an error although done (the retry got it replayed): %d creates, %d pays; retried and executed afresh: %d creates, %d pays; %d resent after giving up; orders %d, charges %d, missing %d, extra orders %d, double charges %d",
		tl.creates, tl.pays, tl.failedAttempts, strings.Join(kinds, ", "), tl.unknownResolved["create"], tl.unknownResolved["pay"],
		tl.retriedExecuted["create"], tl.retriedExecuted["pay"],
		tl.resentAfterGivingUp, tl.orders, tl.charges, tl.missingAcknowledged, tl.extraOrders, tl.doubleCharges)
}

// resolveInDoubt says, for the COMMITs whose answer was lost, which intents
// they belonged to and how those ended: the retry got the stored outcome
// replayed (the commit had survived), or the retry ran the intent itself (a
// create whose commit was lost, created once; a pay resumed through its
// record and the channel's key, charged once). It returns a summary by
// outcome and the keys behind it.
func (l *load) resolveInDoubt(doubts [][]string) (summary string, keys []string) {
	byKey := map[string]*intent{}
	for _, in := range l.all() {
		byKey[in.key] = in
	}
	counts := map[string]int{}
	for _, ks := range doubts {
		var in *intent
		for _, k := range ks {
			if in = byKey[k]; in != nil {
				break
			}
		}
		var outcome string
		switch {
		case in == nil:
			outcome = "a background transaction (no intent of the load)"
		case in.replayed:
			outcome = in.op + " survived, replayed to the retry"
		case in.op == "create":
			outcome = "create lost, created once by the retry"
		default:
			outcome = "pay resumed by the retry, charged once"
		}
		counts[outcome]++
		if in != nil {
			keys = append(keys, in.op+" "+in.key+": "+outcome)
		}
	}
	parts := make([]string, 0, len(counts))
	for o, n := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", n, o))
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return "none", nil
	}
	return strings.Join(parts, ", "), keys
}
