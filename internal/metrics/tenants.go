package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// tenants are the collectors of each tenant's share of the HTTP door: its
// requests, and those refused before the router (by a quota, the
// admission limit, or a body too slow), by why. Their labels are bounded:
// the tenants are those API_KEYS names (a request with another key is
// answered 401 and counted by no tenant), the reasons a fixed set.
type tenants struct {
	requests *prometheus.CounterVec
	refused  *prometheus.CounterVec
}

func newTenants() tenants {
	return tenants{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "orderservice_http_tenant_requests_total",
			Help: "Requests to /v1 whose API key named a tenant, by tenant: refused or not."}, []string{"tenant"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "orderservice_http_refused_total",
			Help: "Requests to /v1 refused before the router, by tenant and reason: rate_quota and concurrency_quota (429, the tenant's quota), queue_full, congested and queue_timeout (503, the service's capacity), body_timeout (408, a body that did not arrive within HTTP_BODY_TIMEOUT)."},
			[]string{"tenant", "reason"}),
	}
}

func (t tenants) collectors() []prometheus.Collector {
	return []prometheus.Collector{t.requests, t.refused}
}

// WatchTenants exports every tenant's series at zero, for each reason a
// request may be refused, so that a rate() has a series before the first
// refusal.
func (m *Metrics) WatchTenants(names, reasons []string) {
	if m == nil {
		return
	}
	for _, tenant := range names {
		m.tenants.requests.WithLabelValues(tenant)
		for _, why := range reasons {
			m.tenants.refused.WithLabelValues(tenant, why)
		}
	}
}

// TenantRequest counts one request to /v1 of tenant.
func (m *Metrics) TenantRequest(tenant string) {
	if m == nil {
		return
	}
	m.tenants.requests.WithLabelValues(tenant).Inc()
}

// Refused counts one request of tenant refused before the router, and
// why; a 503 is also one more request shed
// (orderservice_http_requests_shed_total).
func (m *Metrics) Refused(tenant, reason string, status int) {
	if m == nil {
		return
	}
	m.tenants.refused.WithLabelValues(tenant, reason).Inc()
	if status == http.StatusServiceUnavailable {
		m.shed.Inc()
	}
}
