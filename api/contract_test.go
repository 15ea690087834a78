// Package api holds the OpenAPI document of the order service. Its test
// boots the real service and checks that what it actually answers is what
// openapi.yaml says, so the document cannot drift from the code.
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
)

var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "api"))
}

// exchange is one request of the scenario and the status it must get.
type exchange struct {
	name   string
	method string
	path   string // may use {order} for the scenario's current order
	key    string
	body   string
	header http.Header
	status int
	// invalid marks a request that breaks the document on purpose: the
	// document must refuse it too, unless unsayable (a size limit or an
	// unknown API key, which a schema cannot express).
	invalid   bool
	unsayable bool
}

func TestResponsesMatchOpenAPI(t *testing.T) {
	doc := loadDoc(t)
	// globex may send one request a minute: its second is over its quota.
	m := apptest.Start(t, dbURL, map[string]string{"HTTP_TENANT_LIMITS": "globex;requests=1;window=60s"})
	doc.Servers = openapi3.Servers{{URL: m.URL()}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatalf("router: %v", err)
	}
	client := &http.Client{}
	create := `{"customer_id":"cus_1","currency":"EUR","items":[{"sku":"SKU-1","quantity":2,"unit_price":1250}],"metadata":{"gift":"yes"}}`
	vars := map[string]string{}

	scenario := []exchange{
		{name: "create", method: "POST", path: "/v1/orders", key: "c-1", body: create, status: 201},
		{name: "create replay", method: "POST", path: "/v1/orders", key: "c-1", body: create, status: 201},
		{name: "create key reuse", method: "POST", path: "/v1/orders", key: "c-1", body: strings.Replace(create, "EUR", "USD", 1), status: 422},
		{name: "create without key", method: "POST", path: "/v1/orders", body: create, status: 400, invalid: true},
		{name: "create with a bad key", method: "POST", path: "/v1/orders", key: "two words", body: create, status: 400, invalid: true},
		{name: "create with a bad body", method: "POST", path: "/v1/orders", key: "c-2", body: `{"customer_id":""}`, status: 400, invalid: true},
		{name: "create with a server-owned field", method: "POST", path: "/v1/orders", key: "c-6", body: strings.Replace(create, "{", `{"tenant_id":"globex",`, 1), status: 400, invalid: true},
		{name: "create as text", method: "POST", path: "/v1/orders", key: "c-3", body: create, header: http.Header{"Content-Type": {"text/plain"}}, status: 415, invalid: true},
		{name: "create too large", method: "POST", path: "/v1/orders", key: "c-4", body: `{"customer_id":"` + strings.Repeat("x", 1<<20) + `"}`, status: 413, invalid: true, unsayable: true},
		{name: "unauthenticated", method: "GET", path: "/v1/orders", header: http.Header{"Authorization": {"Bearer nope"}}, status: 401, invalid: true, unsayable: true},
		{name: "get", method: "GET", path: "/v1/orders/{order}", status: 200},
		{name: "get unknown", method: "GET", path: "/v1/orders/01a22895-0000-7000-8000-000000000000", status: 404},
		{name: "list", method: "GET", path: "/v1/orders?limit=1&status=CREATED", status: 200},
		{name: "list with a bad limit", method: "GET", path: "/v1/orders?limit=1000", status: 400, invalid: true},
		{name: "ship before paying", method: "POST", path: "/v1/orders/{order}/ship", key: "s-0", body: `{"carrier":"DHL","tracking_number":"JD1"}`, status: 409},
		{name: "pay declined", method: "POST", path: "/v1/orders/{order}/pay", key: "p-0", body: `{"payment_method":"pm_declined"}`, status: 402},
		{name: "pay, response lost", method: "POST", path: "/v1/orders/{order}/pay", key: "p-1", body: `{"payment_method":"pm_lost_response"}`, status: 503},
		{name: "pay retried", method: "POST", path: "/v1/orders/{order}/pay", key: "p-1", body: `{"payment_method":"pm_lost_response"}`, status: 200},
		{name: "pay replay", method: "POST", path: "/v1/orders/{order}/pay", key: "p-1", body: `{"payment_method":"pm_lost_response"}`, status: 200},
		{name: "pay a paid order", method: "POST", path: "/v1/orders/{order}/pay", key: "p-2", body: `{"payment_method":"pm_ok"}`, status: 409},
		{name: "ship", method: "POST", path: "/v1/orders/{order}/ship", key: "s-1", body: `{"carrier":"DHL","tracking_number":"JD1"}`, status: 200},
		{name: "cancel a shipped order", method: "POST", path: "/v1/orders/{order}/cancel", key: "x-1", status: 409},
		{name: "deliver", method: "POST", path: "/v1/orders/{order}/deliver", key: "d-1", status: 200},
		{name: "deliver an unknown order", method: "POST", path: "/v1/orders/01a22895-0000-7000-8000-000000000000/deliver", key: "d-2", status: 404},
		{name: "events", method: "GET", path: "/v1/orders/{order}/events", status: 200},
		{name: "records", method: "GET", path: "/v1/idempotency-records?key=p-1", status: 200},
		{name: "policy", method: "GET", path: "/v1/idempotency-policy", status: 200},
		{name: "second order", method: "POST", path: "/v1/orders", key: "c-5", body: create, status: 201},
		{name: "pay with pm_ok", method: "POST", path: "/v1/orders/{order}/pay", key: "p-5", body: `{"payment_method":"pm_ok"}`, status: 200},
		{name: "cancel a paid order (refund)", method: "POST", path: "/v1/orders/{order}/cancel", key: "x-5", body: `{"reason":"changed my mind"}`, status: 200},
		{name: "a tenant's one request a minute", method: "GET", path: "/v1/orders", header: http.Header{"Authorization": {"Bearer " + apptest.KeyGlobex}}, status: 200},
		{name: "a tenant over its quota", method: "GET", path: "/v1/orders", header: http.Header{"Authorization": {"Bearer " + apptest.KeyGlobex}}, status: 429},
		{name: "healthz", method: "GET", path: "/healthz", status: 200},
		{name: "readyz", method: "GET", path: "/readyz", status: 200},
		{name: "metrics", method: "GET", path: "/metrics", status: 200},
	}
	for _, ex := range scenario {
		t.Run(ex.name, func(t *testing.T) {
			path := strings.ReplaceAll(ex.path, "{order}", vars["order"])
			req, _ := http.NewRequest(ex.method, m.URL()+path, strings.NewReader(ex.body))
			req.Header.Set("Authorization", "Bearer "+apptest.KeyAcme)
			if ex.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			if ex.key != "" {
				req.Header.Set("Idempotency-Key", ex.key)
			}
			for k, v := range ex.header {
				req.Header[k] = v
			}
			route, params, err := router.FindRoute(req)
			if err != nil {
				t.Fatalf("no route in openapi.yaml for %s %s: %v", ex.method, path, err)
			}
			in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
				Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}}
			reqErr := openapi3filter.ValidateRequest(context.Background(), in)
			req.Body = io.NopCloser(strings.NewReader(ex.body))
			switch {
			case !ex.invalid && reqErr != nil:
				t.Errorf("the document calls a request invalid that the service accepts: %v", reqErr)
			case ex.invalid && !ex.unsayable && reqErr == nil:
				t.Errorf("the document accepts a request that the service refuses with %d", ex.status)
			}
			res, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != ex.status {
				t.Fatalf("status %d, want %d: %s", res.StatusCode, ex.status, body)
			}
			// Every answer to /v1 whose key names a tenant tells its quotas.
			known := res.StatusCode != http.StatusUnauthorized
			if strings.HasPrefix(path, "/v1/") && known && (res.Header.Get("RateLimit-Policy") == "" || res.Header.Get("RateLimit") == "") {
				t.Errorf("a %d from /v1 without RateLimit-Policy (%q) and RateLimit (%q)", res.StatusCode, res.Header.Get("RateLimit-Policy"), res.Header.Get("RateLimit"))
			}
			if loc := res.Header.Get("Location"); strings.HasPrefix(loc, "/v1/orders/") {
				vars["order"] = strings.TrimPrefix(loc, "/v1/orders/")
			}
			err = openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
				RequestValidationInput: in, Status: res.StatusCode, Header: res.Header,
				Body:    io.NopCloser(bytes.NewReader(body)),
				Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
			})
			if err != nil {
				t.Errorf("response does not match openapi.yaml: %v\n%s", err, body)
			}
		})
	}
}

// loadDoc loads and validates openapi.yaml.
func loadDoc(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("openapi.yaml")
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is invalid: %v", err)
	}
	return doc
}

// TestAPathOutsideTheAPISaysWhereItIs: a path outside /v1 that the service
// does not serve (a newcomer's /orders) is a problem document whose detail
// says the API is under /v1, as the document's description quotes it.
func TestAPathOutsideTheAPISaysWhereItIs(t *testing.T) {
	doc := loadDoc(t)
	m := apptest.Start(t, dbURL, nil)
	problemSchema := doc.Components.Schemas["Problem"].Value
	description := strings.Join(strings.Fields(doc.Info.Description), " ")
	for _, path := range []string{"/orders", "/", "/v2/orders"} {
		res, err := http.Get(m.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var p map[string]any
		if err := json.Unmarshal(body, &p); err != nil {
			t.Fatalf("GET %s: %d, not JSON: %s", path, res.StatusCode, body)
		}
		detail, _ := p["detail"].(string)
		switch {
		case res.StatusCode != http.StatusNotFound || res.Header.Get("Content-Type") != "application/problem+json" || p["code"] != "not_found":
			t.Errorf("GET %s: %d %s %s, want 404 not_found as application/problem+json", path, res.StatusCode, res.Header.Get("Content-Type"), body)
		case !strings.Contains(detail, "/v1"):
			t.Errorf("GET %s: the detail does not say where the API is: %q", path, detail)
		case !strings.Contains(description, `"`+detail+`"`):
			t.Errorf("GET %s: openapi.yaml's description does not quote the detail %q", path, detail)
		}
		if err := problemSchema.VisitJSON(p); err != nil {
			t.Errorf("GET %s: the body is not the document's Problem: %v", path, err)
		}
	}
}
