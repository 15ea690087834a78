package app

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/orderservice/orderservice/internal/httpapi"
)

// TenantLimits are HTTP_TENANT_LIMITS: each named tenant's own weight and
// quotas, a list of `tenant;weight=2;requests=100;window=60s;concurrent=16`,
// comma separated, the parameters in any order and each optional (one not
// given takes the HTTP_TENANT_* default). The limits are not secrets, so
// they sit beside API_KEYS rather than in it.
type TenantLimits map[string]TenantLimit

// TenantLimit is one tenant's settings; a zero field takes the default.
type TenantLimit struct {
	Weight, Requests, Concurrent int
	Window                       time.Duration
}

// UnmarshalText reads HTTP_TENANT_LIMITS.
func (tl *TenantLimits) UnmarshalText(text []byte) error {
	out := TenantLimits{}
	for item := range strings.SplitSeq(string(text), ",") {
		if strings.TrimSpace(item) == "" {
			continue
		}
		params := strings.Split(item, ";")
		tenant := strings.TrimSpace(params[0])
		if tenant == "" {
			return fmt.Errorf("%q: name the tenant first, as in acme;weight=2", item)
		}
		if _, dup := out[tenant]; dup {
			return fmt.Errorf("tenant %q is named twice", tenant)
		}
		var l TenantLimit
		for _, p := range params[1:] {
			if err := l.set(p); err != nil {
				return fmt.Errorf("tenant %s: %w", tenant, err)
			}
		}
		out[tenant] = l
	}
	*tl = out
	return nil
}

// set reads one name=value parameter.
func (l *TenantLimit) set(param string) error {
	name, value, _ := strings.Cut(strings.TrimSpace(param), "=")
	if name == "window" {
		d, err := time.ParseDuration(value)
		if err != nil || d < time.Second || d%time.Second != 0 {
			return fmt.Errorf("window=%s: must be a duration of whole seconds, at least 1s", value)
		}
		l.Window = d
		return nil
	}
	n, err := strconv.Atoi(value)
	if err != nil || n < 1 {
		return fmt.Errorf("%s=%s: must be an integer of at least 1", name, value)
	}
	switch name {
	case "weight":
		l.Weight = n
	case "requests":
		l.Requests = n
	case "concurrent":
		l.Concurrent = n
	default:
		return fmt.Errorf("%q: the parameters are weight, requests, window and concurrent", param)
	}
	return nil
}

// Limits are every tenant's limits on /v1: its own where HTTP_TENANT_LIMITS
// names it, the defaults elsewhere.
func (c Config) Limits() map[string]httpapi.Limits {
	h := c.HTTP
	out := make(map[string]httpapi.Limits, len(c.APIKeys))
	for tenant := range c.APIKeys {
		own := h.TenantLimits[tenant]
		out[tenant] = httpapi.Limits{Weight: cmp.Or(own.Weight, 1), Requests: cmp.Or(own.Requests, h.TenantRequests),
			Window: cmp.Or(own.Window, h.TenantWindow), Concurrent: cmp.Or(own.Concurrent, h.TenantConcurrent)}
	}
	return out
}

// Weights are the tenants' weights in the admission's turns.
func (c Config) Weights() map[string]int {
	out := map[string]int{}
	for tenant, l := range c.Limits() {
		out[tenant] = l.Weight
	}
	return out
}

// checkTenantLimits refuses limits for a tenant API_KEYS does not name, and
// defaults that cannot be a RateLimit-Policy.
func (c Config) checkTenantLimits() error {
	h := c.HTTP
	if h.TenantRequests < 1 || h.TenantConcurrent < 0 {
		return fmt.Errorf("HTTP_TENANT_REQUESTS must be at least 1, HTTP_TENANT_CONCURRENT not negative")
	}
	if h.TenantWindow < time.Second || h.TenantWindow%time.Second != 0 {
		return fmt.Errorf("HTTP_TENANT_WINDOW must be whole seconds, at least 1s, not %s", h.TenantWindow)
	}
	var unknown []string
	for tenant := range h.TenantLimits {
		if _, ok := c.APIKeys[tenant]; !ok {
			unknown = append(unknown, tenant)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return fmt.Errorf("HTTP_TENANT_LIMITS names %s, which API_KEYS does not", strings.Join(unknown, ", "))
	}
	return nil
}

// checkServerTimeouts refuses a phase without a bound, and a write
// timeout that would cut off an answer the service is still allowed to
// work on.
func (c Config) checkServerTimeouts() error {
	h := c.HTTP
	if h.ReadHeaderTimeout <= 0 || h.BodyTimeout <= 0 || h.WriteTimeout <= 0 || h.IdleTimeout <= 0 {
		return fmt.Errorf("HTTP_READ_HEADER_TIMEOUT, HTTP_BODY_TIMEOUT, HTTP_WRITE_TIMEOUT and HTTP_IDLE_TIMEOUT must be positive durations")
	}
	longest := h.BodyTimeout + h.QueueTimeout + c.Database.StatementTimeout + max(h.MaxWait, c.Payment.ChannelTimeout)
	if h.WriteTimeout <= longest {
		return fmt.Errorf("HTTP_WRITE_TIMEOUT (%s) must be longer than a request may work (%s: HTTP_BODY_TIMEOUT, HTTP_QUEUE_TIMEOUT, DB_STATEMENT_TIMEOUT and the longer of MAX_WAIT and PAYMENT_CHANNEL_TIMEOUT)",
			h.WriteTimeout, longest)
	}
	return nil
}

// refusalReasons are the reason labels of orderservice_http_refused_total.
func refusalReasons() []string {
	out := make([]string, len(httpapi.Refusals))
	for i, r := range httpapi.Refusals {
		out[i] = string(r)
	}
	return out
}

// tenantNames are the tenants API_KEYS names.
func (c Config) tenantNames() []string { return slices.Sorted(maps.Keys(c.APIKeys)) }
