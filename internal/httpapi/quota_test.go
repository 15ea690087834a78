package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/httpapi"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
)

// created answers every create with 201, counting the calls.
func created(calls *atomic.Int64) func(context.Context, order.Caller, order.CreateRequest) (idempotency.Result, error) {
	return func(context.Context, order.Caller, order.CreateRequest) (idempotency.Result, error) {
		calls.Add(1)
		return idempotency.Result{Outcome: idempotency.OutcomeCreated, Resource: "o1", Body: []byte(`{"id":"o1"}`)}, nil
	}
}

// heldCreate is a create that holds until release is closed, saying so on
// inside; sendHeld sends one to srv in the background and returns when it
// holds, its status to come on the channel.
func heldCreate(inside, release chan struct{}) func(context.Context, order.Caller, order.CreateRequest) (idempotency.Result, error) {
	return func(context.Context, order.Caller, order.CreateRequest) (idempotency.Result, error) {
		inside <- struct{}{}
		<-release
		return idempotency.Result{Outcome: idempotency.OutcomeCreated, Resource: "o1", Body: []byte(`{"id":"o1"}`)}, nil
	}
}

func sendHeld(t *testing.T, srv *httptest.Server, key string, inside chan struct{}) chan int {
	first := make(chan int, 1)
	go func() {
		r, _ := call(t, srv, http.MethodPost, "/v1/orders", key, nil, createBody)
		first <- r.StatusCode
	}()
	<-inside
	return first
}

// quotaProblem is a 429's body as the draft's quota-exceeded type says it.
type quotaProblem struct {
	Type             string   `json:"type"`
	Status           int      `json:"status"`
	Code             string   `json:"code"`
	ViolatedPolicies []string `json:"violated-policies"`
}

// Every /v1 answer carries RateLimit-Policy and RateLimit, structured-field
// lists of the draft's items; over the requests policy, the tenant gets
// 429 with Retry-After (no earlier than the RateLimit's t) and the
// quota-exceeded problem naming the policy, and nothing reaches the use
// case. Three requests a minute: one every 20s.
func TestATenantOverItsRequestsQuotaGets429(t *testing.T) {
	var calls atomic.Int64
	srv := serve(t, &fakeOrders{create: created(&calls)}, func(s *httpapi.Server) {
		s.Quotas = httpapi.NewQuotas(map[string]httpapi.Limits{"acme": {Weight: 1, Requests: 3, Window: time.Minute, Concurrent: 2}})
	})
	const policy = `"requests";q=3;w=60, "concurrent";q=2;qu="concurrent-requests"`
	for i, want := range []string{`"requests";r=2;t=20, "concurrent";r=1`, `"requests";r=1;t=20, "concurrent";r=1`, `"requests";r=0;t=20, "concurrent";r=1`} {
		r, body := call(t, srv, http.MethodPost, "/v1/orders", "q-"+strconv.Itoa(i), nil, createBody)
		if r.StatusCode != http.StatusCreated {
			t.Fatalf("request %d = %d %s", i, r.StatusCode, body)
		}
		if got := r.Header.Get("RateLimit-Policy"); got != policy {
			t.Errorf("request %d: RateLimit-Policy %q, want %q", i, got, policy)
		}
		if got := r.Header.Get("RateLimit"); got != want {
			t.Errorf("request %d: RateLimit %q, want %q", i, got, want)
		}
	}
	r, body := call(t, srv, http.MethodPost, "/v1/orders", "q-3", nil, createBody)
	var p quotaProblem
	if err := json.Unmarshal([]byte(body), &p); err != nil || r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the fourth request = %d %s, want 429", r.StatusCode, body)
	}
	if p.Type != problem.TypeQuotaExceeded || p.Code != "quota_exceeded" || p.Status != 429 || len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "requests" {
		t.Errorf("the 429's problem = %+v, want the draft's quota-exceeded naming \"requests\"", p)
	}
	if r.Header.Get("Retry-After") != "20" || r.Header.Get("RateLimit") != `"requests";r=0;t=20, "concurrent";r=2` || r.Header.Get("RateLimit-Policy") != policy {
		t.Errorf("the 429's fields: Retry-After %q, RateLimit %q, RateLimit-Policy %q; want 20, r=0;t=20 and the policy",
			r.Header.Get("Retry-After"), r.Header.Get("RateLimit"), r.Header.Get("RateLimit-Policy"))
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("the use case ran %d times, want 3: the refused request reaches none", n)
	}
	// A read counts too, and is refused the same way.
	if r, _ := call(t, srv, http.MethodGet, "/v1/orders", "", nil, ""); r.StatusCode != http.StatusTooManyRequests {
		t.Errorf("a read over the quota = %d, want 429", r.StatusCode)
	}
}

// Over the concurrent policy, the tenant gets 429 naming it, while its
// requests in flight are served.
func TestATenantOverItsConcurrentQuotaGets429(t *testing.T) {
	inside, release := make(chan struct{}, 4), make(chan struct{})
	srv := serve(t, &fakeOrders{create: heldCreate(inside, release)}, func(s *httpapi.Server) {
		s.Quotas = httpapi.NewQuotas(map[string]httpapi.Limits{"acme": {Weight: 1, Requests: 100, Window: time.Second, Concurrent: 1}})
	})
	first := sendHeld(t, srv, "c-1", inside)
	r, body := call(t, srv, http.MethodPost, "/v1/orders", "c-2", nil, createBody)
	var p quotaProblem
	if err := json.Unmarshal([]byte(body), &p); err != nil || r.StatusCode != http.StatusTooManyRequests ||
		len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "concurrent" || r.Header.Get("Retry-After") != "1" {
		t.Errorf("a second request while one is in flight = %d Retry-After %q %s, want 429 naming \"concurrent\", Retry-After 1",
			r.StatusCode, r.Header.Get("Retry-After"), body)
	}
	if got := r.Header.Get("RateLimit"); got != `"requests";r=99;t=1, "concurrent";r=0` {
		t.Errorf("its RateLimit %q, want none left of the concurrent policy", got)
	}
	close(release)
	if code := <-first; code != http.StatusCreated {
		t.Errorf("the request in flight = %d, want 201", code)
	}
	if r, _ := call(t, srv, http.MethodPost, "/v1/orders", "c-3", nil, createBody); r.StatusCode != http.StatusCreated {
		t.Errorf("a request once the first was answered = %d, want 201", r.StatusCode)
	}
}

// The service over its own capacity answers 503 with the draft's
// temporary-reduced-capacity type, and the tenant's RateLimit fields.
func TestTheServiceOverItsCapacityGets503(t *testing.T) {
	inside, release := make(chan struct{}), make(chan struct{})
	srv := serve(t, &fakeOrders{create: heldCreate(inside, release)}, func(s *httpapi.Server) {
		s.Admission = httpapi.NewAdmission(1, 0, time.Second, nil)
		s.Quotas = httpapi.NewQuotas(map[string]httpapi.Limits{"acme": {Weight: 1, Requests: 100, Window: time.Second}})
	})
	first := sendHeld(t, srv, "s-1", inside)
	r, body := call(t, srv, http.MethodPost, "/v1/orders", "s-2", nil, createBody)
	var p quotaProblem
	if err := json.Unmarshal([]byte(body), &p); err != nil || r.StatusCode != http.StatusServiceUnavailable ||
		p.Type != problem.TypeTemporaryReducedCapacity || p.Code != "service_unavailable" || r.Header.Get("Retry-After") != "1" {
		t.Errorf("a request with the one slot held = %d Retry-After %q %s, want 503 temporary-reduced-capacity, Retry-After 1",
			r.StatusCode, r.Header.Get("Retry-After"), body)
	}
	if r.Header.Get("RateLimit-Policy") != `"requests";q=100;w=1` || r.Header.Get("RateLimit") == "" {
		t.Errorf("the 503's RateLimit-Policy %q, RateLimit %q: want the tenant's", r.Header.Get("RateLimit-Policy"), r.Header.Get("RateLimit"))
	}
	close(release)
	if code := <-first; code != http.StatusCreated {
		t.Errorf("the request holding the slot = %d, want 201", code)
	}
}

// A Retry-After is never earlier than the RateLimit field's t on the same
// answer (the draft's SHOULD NOT): a 503 at capacity for a tenant whose
// bucket refills slowly (two requests a minute: one every 30s) says 30,
// not 1.
func TestA503WaitsNoLessThanTheQuotasReset(t *testing.T) {
	inside, release := make(chan struct{}), make(chan struct{})
	srv := serve(t, &fakeOrders{create: heldCreate(inside, release)}, func(s *httpapi.Server) {
		s.Admission = httpapi.NewAdmission(1, 0, time.Second, nil)
		s.Quotas = httpapi.NewQuotas(map[string]httpapi.Limits{"acme": {Weight: 1, Requests: 2, Window: time.Minute}})
	})
	first := sendHeld(t, srv, "slow-1", inside)
	r, body := call(t, srv, http.MethodPost, "/v1/orders", "slow-2", nil, createBody)
	if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("RateLimit") != `"requests";r=0;t=30` || r.Header.Get("Retry-After") != "30" {
		t.Errorf("a 503 with the bucket empty = %d, RateLimit %q, Retry-After %q %s; want 503, t=30, Retry-After 30",
			r.StatusCode, r.Header.Get("RateLimit"), r.Header.Get("Retry-After"), body)
	}
	close(release)
	if code := <-first; code != http.StatusCreated {
		t.Errorf("the request holding the slot = %d, want 201", code)
	}
}
