package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/orderservice/orderservice/internal/httpapi"
)

// The preflight's answer, header by header, and CORS off by default.
func TestPreflights(t *testing.T) {
	const origin = "http://shop.example:3000"
	on := serve(t, &fakeOrders{}, func(s *httpapi.Server) { s.CORSOrigins = []string{origin, "https://admin.example"} })
	off := serve(t, &fakeOrders{}, nil)
	preflight := func(t *testing.T, base, path, from string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodOptions, base+path, nil)
		req.Header.Set("Origin", from)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization,content-type,idempotency-key,prefer")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}

	t.Run("an allowed origin gets the methods and headers, no credentials", func(t *testing.T) {
		res := preflight(t, on.URL, "/v1/orders/0b8e2f5e-8d5e-4b1e-9a57-1f1b1e1d1c1b/pay", origin)
		h := res.Header
		if res.StatusCode != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != origin {
			t.Fatalf("preflight = %d, Allow-Origin %q; want 204 and %q", res.StatusCode, h.Get("Access-Control-Allow-Origin"), origin)
		}
		for _, want := range []string{"authorization", "content-type", "idempotency-key", "prefer"} {
			if !strings.Contains(strings.ToLower(h.Get("Access-Control-Allow-Headers")), want) {
				t.Errorf("Access-Control-Allow-Headers = %q, missing %s", h.Get("Access-Control-Allow-Headers"), want)
			}
		}
		if !strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") || h.Get("Access-Control-Allow-Credentials") != "" {
			t.Errorf("Allow-Methods %q, Allow-Credentials %q; want POST and none", h.Get("Access-Control-Allow-Methods"), h.Get("Access-Control-Allow-Credentials"))
		}
	})
	t.Run("an answer exposes the contract's headers, errors included", func(t *testing.T) {
		for _, auth := range []string{"Bearer " + keyAcme, "Bearer wrong"} {
			req, _ := http.NewRequest(http.MethodGet, on.URL+"/v1/orders", nil)
			req.Header.Set("Origin", origin)
			req.Header.Set("Authorization", auth)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			exposed := res.Header.Get("Access-Control-Expose-Headers")
			for _, want := range []string{"Idempotent-Replayed", "Location", "Retry-After", "Preference-Applied", "RateLimit-Policy", "RateLimit"} {
				if !strings.Contains(strings.ToLower(exposed), strings.ToLower(want)) { // rs/cors writes them canonical: Ratelimit
					t.Errorf("%d answer: Access-Control-Expose-Headers = %q, missing %s", res.StatusCode, exposed, want)
				}
			}
			if res.Header.Get("Access-Control-Allow-Origin") != origin {
				t.Errorf("%d answer: Access-Control-Allow-Origin = %q", res.StatusCode, res.Header.Get("Access-Control-Allow-Origin"))
			}
		}
	})
	for name, tc := range map[string]struct{ base, path, from string }{
		"an origin not on the list":          {on.URL, "/v1/orders", "http://evil.example"},
		"a listed host under another scheme": {on.URL, "/v1/orders", "https://shop.example:3000"},
		"a subdomain of a listed origin":     {on.URL, "/v1/orders", "https://x.admin.example"},
		"a path outside /v1":                 {on.URL, "/metrics", origin},
		"CORS off (the default)":             {off.URL, "/v1/orders", origin},
	} {
		t.Run(name+" gets no CORS headers", func(t *testing.T) {
			res := preflight(t, tc.base, tc.path, tc.from)
			if got := res.Header.Get("Access-Control-Allow-Origin"); got != "" {
				t.Errorf("Access-Control-Allow-Origin = %q, want none", got)
			}
		})
	}
}

func TestCORSOriginsAreExact(t *testing.T) {
	for _, o := range []string{"https://shop.example", "http://127.0.0.1:8080", "http://[::1]:3000"} {
		if err := httpapi.CheckOrigin(o); err != nil {
			t.Errorf("%s refused: %v", o, err)
		}
	}
	for _, o := range []string{"*", "https://*.example", "shop.example", "https://shop.example/", "https://shop.example/app",
		"ftp://shop.example", "https://user@shop.example", "https://Shop.example", "null", "https://shop.example?x=1"} {
		if err := httpapi.CheckOrigin(o); err == nil {
			t.Errorf("%q accepted as an origin", o)
		}
	}
}
