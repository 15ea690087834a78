package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/httpapi"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
)

// call sends one request to srv as acme (or unauthenticated when key is
// "") and returns the response with its body read.
func call(t *testing.T, srv *httptest.Server, method, path, idemKey string, header http.Header, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+keyAcme)
	req.Header.Set("Content-Type", "application/json")
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

const createBody = `{"customer_id":"cus_1","currency":"EUR","items":[{"sku":"SKU-1","quantity":1,"unit_price":100}]}`

// The door hands the use case the caller and the decoded request, and
// writes what it returns: a result with its status and headers, an error
// as application/problem+json with the status its code maps to.
func TestTheDoorWritesWhatTheUseCaseReturns(t *testing.T) {
	const id = "0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3"
	var got order.Caller
	var res idempotency.Result
	var fail error
	srv := serve(t, &fakeOrders{create: func(_ context.Context, c order.Caller, req order.CreateRequest) (idempotency.Result, error) {
		got = c
		if req.CustomerID != "cus_1" {
			t.Errorf("customer_id = %q", req.CustomerID)
		}
		return res, fail
	}}, nil)

	res = idempotency.Result{Outcome: idempotency.OutcomeCreated, Resource: id, Body: []byte(`{"id":"` + id + `"}`)}
	r, body := call(t, srv, http.MethodPost, "/v1/orders", `"k-1"`, nil, createBody)
	if r.StatusCode != http.StatusCreated || r.Header.Get("Location") != "/v1/orders/"+id || body != `{"id":"`+id+`"}` {
		t.Errorf("created = %d Location %q %s", r.StatusCode, r.Header.Get("Location"), body)
	}
	if got.TenantID != "acme" || got.Key != "k-1" || got.Wait != 0 {
		t.Errorf("caller = %+v, want acme, k-1 (unquoted), no wait", got)
	}
	if r.Header.Get("Idempotent-Replayed") != "" {
		t.Errorf("a first execution says Idempotent-Replayed %q", r.Header.Get("Idempotent-Replayed"))
	}

	res.Replayed = true
	if r, _ := call(t, srv, http.MethodPost, "/v1/orders", "k-1", nil, createBody); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a replay says Idempotent-Replayed %q", r.Header.Get("Idempotent-Replayed"))
	}

	for _, tc := range []struct {
		err        error
		status     int
		code       string
		retryAfter string
	}{
		{problem.Errorf(problem.RequestInProgress, "busy"), http.StatusConflict, "request_in_progress", ""},
		{problem.Errorf(problem.KeyReused, "other"), http.StatusUnprocessableEntity, "idempotency_key_reused", ""},
		{&problem.Error{Code: problem.ServiceUnavailable, Detail: "later", RetryAfter: 1500 * time.Millisecond}, http.StatusServiceUnavailable, "service_unavailable", "2"},
		{&problem.Error{Code: problem.ServiceUnavailable, Detail: "soon", RetryAfter: time.Millisecond}, http.StatusServiceUnavailable, "service_unavailable", "1"},
		{errors.New("a bug"), http.StatusInternalServerError, "internal", ""},
	} {
		res, fail = idempotency.Result{}, tc.err
		r, body := call(t, srv, http.MethodPost, "/v1/orders", "k-2", nil, createBody)
		if r.StatusCode != tc.status || r.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, `"code":"`+tc.code+`"`) {
			t.Errorf("%v = %d %s %s, want %d problem+json %s", tc.err, r.StatusCode, r.Header.Get("Content-Type"), body, tc.status, tc.code)
		}
		if got := r.Header.Get("Retry-After"); got != tc.retryAfter {
			t.Errorf("%v: Retry-After %q, want %q", tc.err, got, tc.retryAfter)
		}
	}
}

// A request the door refuses reaches no use case.
func TestTheDoorRefusesBeforeTheUseCase(t *testing.T) {
	srv := serve(t, &fakeOrders{create: func(context.Context, order.Caller, order.CreateRequest) (idempotency.Result, error) {
		t.Error("the use case was called")
		return idempotency.Result{}, nil
	}}, nil)
	for name, tc := range map[string]struct {
		key, body string
		header    http.Header
		status    int
		code      string
	}{
		"no Idempotency-Key":      {"", createBody, nil, http.StatusBadRequest, "idempotency_key_missing"},
		"a body that is not JSON": {"k", "{", nil, http.StatusBadRequest, "invalid_request"},
		"an unknown field":        {"k", `{"tenant_id":"globex"}`, nil, http.StatusBadRequest, "invalid_request"},
		"a Prefer line too long":  {"k", createBody, http.Header{"Prefer": {"wait=1, " + strings.Repeat("x", 200)}}, http.StatusBadRequest, "invalid_request"},
		"a body as text/plain":    {"k", createBody, http.Header{"Content-Type": {"text/plain"}}, http.StatusUnsupportedMediaType, "unsupported_media_type"},
		"an unknown API key":      {"k", createBody, http.Header{"Authorization": {"Bearer nobody"}}, http.StatusUnauthorized, "unauthenticated"},
	} {
		t.Run(name, func(t *testing.T) {
			r, body := call(t, srv, http.MethodPost, "/v1/orders", tc.key, tc.header, tc.body)
			if r.StatusCode != tc.status || !strings.Contains(body, `"code":"`+tc.code+`"`) {
				t.Errorf("= %d %s, want %d %s", r.StatusCode, body, tc.status, tc.code)
			}
		})
	}
}

// Prefer: wait is the caller's Wait; the use case honours it and says how
// long it let the caller wait, which the door sends as Preference-Applied.
func TestPreferWaitIsTheCallersWait(t *testing.T) {
	var wait time.Duration
	waited := false
	srv := serve(t, &fakeOrders{pay: func(_ context.Context, c order.Caller, _ string, _ order.PayRequest) (idempotency.Result, error) {
		wait = c.Wait
		if waited {
			c.Waited(5 * time.Second)
		}
		return idempotency.Result{Outcome: idempotency.OutcomeDone, Body: []byte(`{}`), Replayed: waited}, nil
	}}, nil)
	pay := func(prefer ...string) *http.Response {
		r, _ := call(t, srv, http.MethodPost, "/v1/orders/x/pay", "k", http.Header{"Prefer": prefer}, `{"payment_method":"pm_ok"}`)
		return r
	}
	for prefer, want := range map[string]time.Duration{"wait=7": 7 * time.Second, "respond-async, wait=3": 3 * time.Second,
		"wait=soon": 0, "handling=lenient": 0} {
		if r := pay(prefer); r.StatusCode != http.StatusOK || wait != want || r.Header.Get("Preference-Applied") != "" {
			t.Errorf("Prefer %q: %d, Wait %s, Preference-Applied %q; want 200, %s, none", prefer, r.StatusCode, wait, r.Header.Get("Preference-Applied"), want)
		}
	}
	waited = true
	if r := pay("wait=10"); r.Header.Get("Preference-Applied") != "wait=5" {
		t.Errorf("after a wait: Preference-Applied %q, want wait=5", r.Header.Get("Preference-Applied"))
	}
}

func TestReadyz(t *testing.T) {
	var err error
	srv := serve(t, &fakeOrders{}, func(s *httpapi.Server) {
		s.Ready = func(context.Context) (uint, error) { return 7, err }
	})
	r, body := call(t, srv, http.MethodGet, "/readyz", "", nil, "")
	if r.StatusCode != http.StatusOK || body != `{"schema_version":7,"status":"ready"}`+"\n" {
		t.Errorf("ready = %d %q", r.StatusCode, body)
	}
	err = &problem.Error{Code: problem.ServiceUnavailable, Detail: "Database migrations are pending.", RetryAfter: time.Second}
	r, body = call(t, srv, http.MethodGet, "/readyz", "", nil, "")
	if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") != "1" || !strings.Contains(body, "migrations are pending") {
		t.Errorf("not ready = %d Retry-After %q %s", r.StatusCode, r.Header.Get("Retry-After"), body)
	}
}

// The idempotency views show what the service returns, in their wire form.
func TestTheIdempotencyViews(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	srv := serve(t, &fakeOrders{
		records: func(_ context.Context, tenantID, key string) ([]idempotency.Record, error) {
			if tenantID != "acme" || key != "k 1" {
				t.Errorf("records of %q %q", tenantID, key)
			}
			return []idempotency.Record{{Operation: order.OpCreate, IdempotencyKey: key, State: idempotency.Processing,
				Fingerprint: "fp", Attempts: 1, LeaseToken: 3, CreatedAt: created}}, nil
		},
		policy: order.PolicyView{WindowSources: map[string]string{"client_retry": "setting"}, OutboxRetention: "24h0m0s"},
	}, nil)
	r, body := call(t, srv, http.MethodGet, "/v1/idempotency-records?key=k%201", "", nil, "")
	var recs struct{ Records []map[string]any }
	if err := json.Unmarshal([]byte(body), &recs); err != nil || r.StatusCode != http.StatusOK || len(recs.Records) != 1 {
		t.Fatalf("records = %d %s", r.StatusCode, body)
	}
	if rec := recs.Records[0]; rec["state"] != "PROCESSING" || rec["response_status"] != nil || rec["lease_token"] != 3.0 || rec["created_at"] != "2026-01-02T03:04:05Z" {
		t.Errorf("record = %v", rec)
	}
	r, body = call(t, srv, http.MethodGet, "/v1/idempotency-policy", "", nil, "")
	if r.StatusCode != http.StatusOK || !strings.Contains(body, `"window_sources":{"client_retry":"setting"}`) || !strings.Contains(body, `"outbox_retention":"24h0m0s"`) {
		t.Errorf("policy = %d %s", r.StatusCode, body)
	}
}

// Every order operation is posted to the path its verb names, under the
// order it acts on: the route reaches its use case (here one the fake does
// not expect, hence 500), where an unknown path would be 404.
func TestEveryOperationHasItsRoute(t *testing.T) {
	srv := serve(t, &fakeOrders{}, nil)
	for _, op := range order.Operations {
		path := "/v1/orders"
		if order.OnOrder(op) {
			path += "/0b7c4a36-0f4b-4c1e-9a55-7d2f8e0c1a2b/" + order.Verb(op)
		}
		r, body := call(t, srv, http.MethodPost, path, "k-"+op, nil, `{}`)
		if r.StatusCode != http.StatusInternalServerError {
			t.Errorf("POST %s (%s) = %d %s, want the use case's 500", path, op, r.StatusCode, body)
		}
	}
	if r, _ := call(t, srv, http.MethodPost, "/v1/orders/0b7c4a36-0f4b-4c1e-9a55-7d2f8e0c1a2b/refund", "k", nil, `{}`); r.StatusCode != http.StatusNotFound {
		t.Errorf("POST …/refund = %d, want 404: no operation has that verb", r.StatusCode)
	}
}
