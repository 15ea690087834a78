package app_test

import (
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/httpapi"
)

// HTTP_TENANT_LIMITS sets a tenant's own weight and quotas beside the
// defaults; a tenant it does not name, and a parameter it leaves out,
// takes the HTTP_TENANT_* default. API_KEYS keeps its old syntax.
func TestATenantsLimitsSitBesideItsKey(t *testing.T) {
	cfg, err := app.LoadConfig(map[string]string{
		"API_KEYS":             "acme=demo-key-acme,globex=demo-key-globex,initech=demo-key-initech",
		"HTTP_TENANT_LIMITS":   "acme;weight=3;requests=100;window=60s;concurrent=16, globex;concurrent=4",
		"HTTP_TENANT_REQUESTS": "500",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]httpapi.Limits{
		"acme":    {Weight: 3, Requests: 100, Window: time.Minute, Concurrent: 16},
		"globex":  {Weight: 1, Requests: 500, Window: time.Second, Concurrent: 4},
		"initech": {Weight: 1, Requests: 500, Window: time.Second},
	}
	got := cfg.Limits()
	for tenant, l := range want {
		if got[tenant] != l {
			t.Errorf("%s: %+v, want %+v", tenant, got[tenant], l)
		}
	}
	if len(got) != len(want) {
		t.Errorf("limits for %d tenants, want %d", len(got), len(want))
	}
	if cfg.APIKeys["acme"] != "demo-key-acme" {
		t.Errorf("acme's key = %q: API_KEYS is read as before", cfg.APIKeys["acme"])
	}
}
