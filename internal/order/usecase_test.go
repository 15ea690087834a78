package order_test

// The use-case tests' kit. They drive order.Service directly, against the
// package's real PostgreSQL and a payment channel made of functions: no
// HTTP, no broker, no process, so a failure points at the use case, and a
// lease runs out when a test says so rather than after seconds. What a use
// case answers is an idempotency.Result or an error with a problem code;
// how HTTP renders either is internal/httpapi's business, and its tests'.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/order/steps"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// funcChannel is an order.Channel whose every method is a function field.
type funcChannel struct {
	charge       func(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error)
	lookupCharge func(ctx context.Context, key string) (payment.Charge, error)
	refund       func(ctx context.Context, key string, req payment.RefundRequest) (payment.Result[payment.Refund], error)
	lookupRefund func(ctx context.Context, key string) (payment.Refund, error)
}

func (f *funcChannel) Charge(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
	return f.charge(ctx, key, req)
}

func (f *funcChannel) LookupCharge(ctx context.Context, key string) (payment.Charge, error) {
	return f.lookupCharge(ctx, key)
}

func (f *funcChannel) Refund(ctx context.Context, key string, req payment.RefundRequest) (payment.Result[payment.Refund], error) {
	return f.refund(ctx, key, req)
}

func (f *funcChannel) LookupRefund(ctx context.Context, key string) (payment.Refund, error) {
	return f.lookupRefund(ctx, key)
}

// acquirer is a payment channel in memory that honours its idempotency keys
// as a real acquirer does (a POST repeated under a key gets the first
// answer, marked replayed) and plays the mock channel's test tokens
// (payment.Methods): pm_declined is declined, pm_lost_response loses the
// answer of the one request that acted, pm_unavailable_once is unavailable
// on the first attempt of each key before it acts, pm_refund_refused
// charges but refuses every refund; a refund plays its charge's token. A
// call whose context has ended never reaches it, as over HTTP. It
// counts what it did, as the mock channel's Stats do, so that a test can
// assert exact numbers. channel() is the acquirer as an order.Channel: a
// test wraps one of its functions to inject what no token plays.
type acquirer struct {
	mu      sync.Mutex
	charges map[string]payment.Charge // by idempotency key, kept for ever
	refunds map[string]payment.Refund
	methods map[string]string // the token of each charge, by charge id
	posts   map[string]int    // POSTs under each key
	failed  map[string]bool   // the keys pm_unavailable_once has failed
	stats   ledger
}

// ledger is what an acquirer counts.
type ledger struct {
	charges, declined, refunds    int64 // money movements made (declined: charges the acquirer declined)
	requests, lookups, duplicates int64 // POSTs, lookups by key, POSTs answered from the key's first answer
	unavailable                   int64 // POSTs answered 503 by pm_unavailable_once, before any effect
	charged, refunded             int64 // the amounts of the charges and refunds made
}

func newAcquirer() *acquirer {
	return &acquirer{charges: map[string]payment.Charge{}, refunds: map[string]payment.Refund{},
		methods: map[string]string{}, posts: map[string]int{}, failed: map[string]bool{}}
}

func (a *acquirer) channel() *funcChannel {
	return &funcChannel{charge: a.charge, lookupCharge: a.lookupCharge, refund: a.refund, lookupRefund: a.lookupRefund}
}

// errLost is an answer that never came back: the verdict is unknown.
var errLost = fmt.Errorf("%w: the connection was lost before the answer", payment.ErrUnavailable)

// unsent is the error of a call whose deadline passed before it left, as
// the HTTP client gives it: it reaches nobody.
func unsent(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", payment.ErrUnavailable, err)
	}
	return nil
}

func (a *acquirer) charge(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
	if err := unsent(ctx); err != nil {
		return payment.Result[payment.Charge]{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.requests++
	a.posts[key]++
	if c, ok := a.charges[key]; ok {
		a.stats.duplicates++
		atTheChannel(ctx, steps.Channel{Call: "charge", Key: key, Status: c.Status, Replayed: true})
		return payment.Result[payment.Charge]{Value: c, Replayed: true}, nil
	}
	if req.PaymentMethod == payment.MethodUnavailableOnce && !a.failed[key] {
		a.failed[key] = true
		a.stats.unavailable++
		atTheChannel(ctx, steps.Channel{Call: "charge", Key: key, Failed: true})
		return payment.Result[payment.Charge]{}, fmt.Errorf("%w: 503 on the first attempt of this key", payment.ErrUnavailable)
	}
	c := payment.Charge{ID: "ch_" + uuid.NewString(), Status: payment.StatusSucceeded, Amount: req.Amount, Currency: req.Currency,
		Reference: req.Reference, PaymentMethod: req.PaymentMethod, IdempotencyKey: key}
	if req.PaymentMethod == payment.MethodDeclined {
		c.Status = payment.StatusDeclined
		a.stats.declined++
	} else {
		a.stats.charges++
		a.stats.charged += c.Amount
	}
	a.charges[key], a.methods[c.ID] = c, req.PaymentMethod
	atTheChannel(ctx, steps.Channel{Call: "charge", Key: key, Status: c.Status, Lost: req.PaymentMethod == payment.MethodLostResponse})
	if req.PaymentMethod == payment.MethodLostResponse {
		return payment.Result[payment.Charge]{}, errLost
	}
	return payment.Result[payment.Charge]{Value: c}, nil
}

func (a *acquirer) lookupCharge(ctx context.Context, key string) (payment.Charge, error) {
	if err := unsent(ctx); err != nil {
		return payment.Charge{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.lookups++
	if c, ok := a.charges[key]; ok {
		atTheChannel(ctx, steps.Channel{Call: "lookup_charge", Key: key, Status: c.Status})
		return c, nil
	}
	atTheChannel(ctx, steps.Channel{Call: "lookup_charge", Key: key})
	return payment.Charge{}, payment.ErrNotFound
}

func (a *acquirer) refund(ctx context.Context, key string, req payment.RefundRequest) (payment.Result[payment.Refund], error) {
	if err := unsent(ctx); err != nil {
		return payment.Result[payment.Refund]{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.requests++
	a.posts[key]++
	if r, ok := a.refunds[key]; ok {
		a.stats.duplicates++
		return payment.Result[payment.Refund]{Value: r, Replayed: true}, nil
	}
	method, ok := a.methods[req.ChargeID]
	switch {
	case !ok:
		return payment.Result[payment.Refund]{}, &payment.StatusError{StatusCode: 404, Code: "charge_not_found"}
	case method == payment.MethodUnavailableOnce && !a.failed[key]:
		a.failed[key] = true
		a.stats.unavailable++
		return payment.Result[payment.Refund]{}, fmt.Errorf("%w: 503 on the first attempt of this key", payment.ErrUnavailable)
	case method == payment.MethodRefundRefused:
		return payment.Result[payment.Refund]{}, &payment.StatusError{StatusCode: 422, Code: "refund_refused"}
	}
	r := payment.Refund{ID: "re_" + uuid.NewString(), ChargeID: req.ChargeID, Status: payment.StatusSucceeded, Amount: req.Amount, IdempotencyKey: key}
	a.refunds[key] = r
	a.stats.refunds++
	a.stats.refunded += r.Amount
	if method == payment.MethodLostResponse {
		return payment.Result[payment.Refund]{}, errLost
	}
	return payment.Result[payment.Refund]{Value: r}, nil
}

func (a *acquirer) lookupRefund(ctx context.Context, key string) (payment.Refund, error) {
	if err := unsent(ctx); err != nil {
		return payment.Refund{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.lookups++
	if r, ok := a.refunds[key]; ok {
		return r, nil
	}
	return payment.Refund{}, payment.ErrNotFound
}

// counted is what the acquirer has counted so far.
func (a *acquirer) counted() ledger {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// postsUnder is how many POSTs the acquirer received under key.
func (a *acquirer) postsUnder(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.posts[key]
}

// chargeKeys are the keys the acquirer made charges under.
func (a *acquirer) chargeKeys() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var keys []string
	for k := range a.charges {
		keys = append(keys, k)
	}
	return keys
}

// wantCounted fails the test unless the acquirer counted the movements and
// calls of want; -1 stands for any number.
func wantCounted(t *testing.T, a *acquirer, want ledger) {
	t.Helper()
	got := a.counted()
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"charges", got.charges, want.charges},
		{"declined charges", got.declined, want.declined},
		{"refunds", got.refunds, want.refunds},
		{"requests (POSTs)", got.requests, want.requests},
		{"lookups", got.lookups, want.lookups},
		{"duplicates absorbed", got.duplicates, want.duplicates},
	} {
		if c.want >= 0 && c.got != c.want {
			t.Errorf("channel %s = %d, want %d (counted %+v)", c.name, c.got, c.want, got)
		}
	}
}

// useCases is an order.Service on the package's database with ch as its
// channel and lease as its records' lease, wired as internal/app wires it:
// a channel call is bounded by half the lease, which is also when a
// duplicate is told to come back, and the channel is trusted to remember a
// key for a day (PAYMENT_CHANNEL_KEY_WINDOW's default).
func useCases(t *testing.T, ch order.Channel, lease time.Duration) *order.Service {
	t.Helper()
	return useCasesOn(t, openDB(t, 3*time.Second), ch, lease)
}

// openDB is a pool of the service's own on the package's database, closed
// when the test ends; lockTimeout bounds how long a duplicate waits at a
// record's key (DB_LOCK_TIMEOUT).
func openDB(t *testing.T, lockTimeout time.Duration) *gorm.DB {
	t.Helper()
	db, err := database.Open(context.Background(), dbURL, database.Options{MaxConns: 10, StatementTimeout: 5 * time.Second, LockTimeout: lockTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(db) })
	return db
}

// useCasesOn is useCases on the pool db. Every money intent the test
// started must be finished when it ends: a later test's Sweep would take
// it over against that test's channel and spoil its exact counts.
func useCasesOn(t *testing.T, db *gorm.DB, ch order.Channel, lease time.Duration) *order.Service {
	t.Helper()
	policy := idempotency.Policy{Windows: []idempotency.Window{{Name: "client_retry", Duration: time.Hour}}, Margin: time.Hour,
		MoneyOperations: order.MoneyOperations, Operations: order.Operations}
	timeout := lease / 2
	t.Cleanup(func() {
		const unfinished = `state IN ('PROCESSING', 'FAILED_RETRYABLE') AND operation IN ('order.pay', 'order.cancel')`
		if n := count(t, db, `SELECT count(*) FROM idempotency_records WHERE `+unfinished); n != 0 {
			t.Errorf("the test left %d unfinished money intents behind (now removed)", n)
			db.Exec(`DELETE FROM idempotency_records WHERE ` + unfinished)
		}
	})
	return order.NewService(order.Deps{DB: db, Channel: recordedChannel(t, ch), Steps: stepsOf(t),
		Records: &idempotency.Store{Lease: lease, PhaseTimeout: timeout, Policy: policy, Removed: order.CleanupSteps(stepsOf(t)), Attempt: steps.Attempt},
		Inbox:   &idempotency.Inbox{Retention: time.Hour},
		Money:   order.MoneyConfig{ChannelTimeout: timeout, RetryAfter: time.Second, ChannelKeyWindow: 24 * time.Hour}})
}

// withChannelBound is s with at most n intents at the channel at once
// (MaxChannelCalls). NewService makes the bound, so it is a new service on
// s's dependencies.
func withChannelBound(s *order.Service, n int) *order.Service {
	deps := s.Deps
	deps.Money.MaxChannelCalls = n
	return order.NewService(deps)
}

// newKey returns an Idempotency-Key no other test uses: a new intent.
func newKey(label string) string { return label + "-" + uuid.NewString()[:8] }

// acme and globex are callers of the two tenants with key.
func acme(key string) order.Caller   { return order.Caller{TenantID: "acme", Key: key} }
func globex(key string) order.Caller { return order.Caller{TenantID: "globex", Key: key} }

// purchase is a valid create request for customer: 2 × 1250, a total of 2500.
func purchase(customer string) order.CreateRequest {
	return order.CreateRequest{CustomerID: customer, Currency: "EUR",
		Items: []order.ItemRequest{{SKU: "SKU-1", Quantity: 2, UnitPrice: 1250}}}
}

// purchaseTotal is what purchase costs.
const purchaseTotal = 2500

// placeOrder creates an acme order and returns its id.
func placeOrder(t *testing.T, s *order.Service) string {
	t.Helper()
	res, err := s.Create(context.Background(), acme(newKey("create")), purchase("cus_"+uuid.NewString()[:8]))
	if err != nil || res.Outcome != idempotency.OutcomeCreated {
		t.Fatalf("create = %+v, %v", res, err)
	}
	return res.Resource
}

// payWith is a pay request with the channel's test token method.
func payWith(method string) order.PayRequest { return order.PayRequest{PaymentMethod: method} }

// shown is the part of an order's representation the tests look at.
type shown struct {
	ID          string `json:"id"`
	Status      string `json:"status"`
	TotalAmount int64  `json:"total_amount"`
	Payment     *struct {
		Status   string `json:"status"`
		Amount   int64  `json:"amount"`
		ChargeID string `json:"charge_id"`
		RefundID string `json:"refund_id"`
	} `json:"payment"`
}

// shownBy is the order a result shows; a failed result shows none.
func shownBy(t *testing.T, res idempotency.Result) shown {
	t.Helper()
	var o shown
	if err := json.Unmarshal(res.Body, &o); err != nil {
		t.Fatalf("the result shows no order (%v): %+v", err, res)
	}
	return o
}

// orderNow is the acme order as a read shows it now.
func orderNow(t *testing.T, s *order.Service, id string) shown {
	t.Helper()
	o, err := s.Get(context.Background(), "acme", id)
	if err != nil {
		t.Fatalf("get order %s: %v", id, err)
	}
	body, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return shownBy(t, idempotency.Result{Body: body})
}

// eventsOf lists the acme order's history, e.g. "create,pay,payment_succeeded".
func eventsOf(t *testing.T, s *order.Service, id string) string {
	t.Helper()
	page, err := s.History(context.Background(), "acme", id, order.PageRequest{Limit: 100})
	if err != nil {
		t.Fatalf("history of %s: %v", id, err)
	}
	names := make([]string, len(page.Events))
	for i, e := range page.Events {
		names[i] = string(e.Event)
	}
	return strings.Join(names, ",")
}

// wantOutcome fails the test unless res is outcome, with no error.
func wantOutcome(t *testing.T, what string, res idempotency.Result, err error, outcome idempotency.Outcome) {
	t.Helper()
	if err != nil || res.Outcome != outcome {
		t.Fatalf("%s = %s (%v) %s, want %s", what, res.Outcome, err, res.Body, outcome)
	}
}

// wantFailed fails the test unless res is the intent's final error with
// code, returned without an error, and returns that error.
func wantFailed(t *testing.T, what string, res idempotency.Result, err error, code problem.Code) *problem.Error {
	t.Helper()
	if err != nil || res.Outcome != idempotency.OutcomeFailed || res.Failure == nil || res.Failure.Code != code {
		t.Fatalf("%s = %+v, %v; want the final error %s", what, res, err, code)
	}
	return res.Failure
}

// wantError fails the test unless err has code (and so no result was
// recorded), and returns its problem.
func wantError(t *testing.T, what string, err error, code problem.Code) *problem.Error {
	t.Helper()
	if problem.CodeOf(err) != code {
		t.Fatalf("%s: error %v, want %s", what, err, code)
	}
	return problem.As(err)
}

// wantRetryAfter fails the test unless err tells the client to send the
// same key again after some time (a 409 or 503 with Retry-After).
func wantRetryAfter(t *testing.T, what string, err error) {
	t.Helper()
	if problem.As(err).RetryAfter <= 0 {
		t.Errorf("%s (%v) says nothing of when to retry", what, err)
	}
}

// wantExecuted fails the test if res is a replay.
func wantExecuted(t *testing.T, res idempotency.Result) {
	t.Helper()
	if res.Replayed {
		t.Errorf("a result that executed is marked replayed: %+v", res)
	}
}

// wantReplay fails the test unless again is first replayed: the same
// outcome, resource, representation and failure, marked replayed.
func wantReplay(t *testing.T, first, again idempotency.Result) {
	t.Helper()
	if again.Outcome != first.Outcome || again.Resource != first.Resource || !bytes.Equal(again.Body, first.Body) ||
		failureText(again.Failure) != failureText(first.Failure) {
		t.Fatalf("replay differs:\nfirst  %s %s %s %s\nreplay %s %s %s %s", first.Outcome, first.Resource, first.Body, failureText(first.Failure),
			again.Outcome, again.Resource, again.Body, failureText(again.Failure))
	}
	if !again.Replayed {
		t.Errorf("the replay is not marked replayed")
	}
}

// failureText is a failed result's error as it is stored and sent: its JSON.
func failureText(e *problem.Error) string {
	if e == nil {
		return ""
	}
	b, _ := json.Marshal(e)
	return string(b)
}

// count runs a SELECT count(*) … and returns the number.
func count(t *testing.T, db *gorm.DB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.Raw(query, args...).Scan(&n).Error; err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// recordOf reads the acme tenant's record of (op, key).
func recordOf(t *testing.T, s *order.Service, op, key string) idempotency.Record {
	t.Helper()
	rec, err := s.Records.Get(s.DB, idempotency.Scope{TenantID: "acme", Operation: op, Key: key})
	if err != nil {
		t.Fatalf("record %s %s: %v", op, key, err)
	}
	return rec
}

// leaseRunsOut makes the acme intent (op, key) due now: its owner looks
// dead, or its Retry-After has passed.
func leaseRunsOut(t *testing.T, s *order.Service, op, key string) {
	t.Helper()
	res := s.DB.Exec(`UPDATE idempotency_records SET lease_expires_at = now() - interval '1s'
		WHERE tenant_id = 'acme' AND operation = ? AND idempotency_key = ?`, op, key)
	if res.Error != nil || res.RowsAffected != 1 {
		t.Fatalf("expire the lease of %s %s: %v (%d rows)", op, key, res.Error, res.RowsAffected)
	}
}

// setStatus moves an order to status directly in the store, for tests that
// need an order in a given state.
func setStatus(t *testing.T, s *order.Service, id string, status order.Status) {
	t.Helper()
	if err := s.DB.Exec("UPDATE orders SET status = ? WHERE id = ?", status, id).Error; err != nil {
		t.Fatalf("set status: %v", err)
	}
}

// atOnce runs call for 0..n-1, every call released at the same moment, and
// waits for them all.
func atOnce(n int, call func(i int)) {
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-gate
			call(i)
		})
	}
	close(gate)
	wg.Wait()
}

// panicOf runs f and returns what it panicked with, or nil: a use case
// that panics, as a crashing process would stop, panics out of the call.
func panicOf(f func()) (panicked any) {
	defer func() { panicked = recover() }()
	f()
	return nil
}
