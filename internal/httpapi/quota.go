package httpapi

// Each tenant's quotas, and the IETF RateLimit fields that tell them
// (draft-ietf-httpapi-ratelimit-headers: RateLimit-Policy says the
// policies, RateLimit what is left of each, as structured-field lists of
// items with parameters). A tenant over its quota is refused with 429 and
// the draft's quota-exceeded problem naming the policy it broke; the
// service over its own capacity answers 503 (admission.go). The quotas are
// this instance's: see docs/scaling.md for what a shared limiter would
// change.

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/problem"
)

// Limits are one tenant's share of the service over HTTP.
type Limits struct {
	// Weight is its weight in the admission's turns (at least 1).
	Weight int
	// Requests may be sent per Window (a token bucket: Requests at once,
	// refilled at Requests per Window); Window is whole seconds.
	Requests int
	Window   time.Duration
	// Concurrent is the most of its requests in flight at once, queued
	// ones included; 0 sets none.
	Concurrent int
}

// The policies' names in the RateLimit fields and in violated-policies.
const (
	policyRequests   = "requests"
	policyConcurrent = "concurrent"
)

// Quotas hold every tenant's quotas on this instance.
type Quotas struct {
	tenants map[string]*quota
}

// quota is one tenant's: its bucket of requests, its requests in flight,
// and its RateLimit-Policy, rendered once.
type quota struct {
	name     string
	limits   Limits
	bucket   *rate.Limiter
	inFlight atomic.Int64
	policy   string
}

// NewQuotas keeps each tenant's limits; a tenant not named has none.
func NewQuotas(limits map[string]Limits) *Quotas {
	q := &Quotas{tenants: make(map[string]*quota, len(limits))}
	for tenant, l := range limits {
		t := &quota{name: tenant, limits: l,
			bucket: rate.NewLimiter(rate.Limit(float64(l.Requests)/l.Window.Seconds()), l.Requests)}
		t.policy = fmt.Sprintf("%q;q=%d;w=%d", policyRequests, l.Requests, int64(l.Window/time.Second))
		if l.Concurrent > 0 {
			t.policy += fmt.Sprintf(", %q;q=%d;qu=%q", policyConcurrent, l.Concurrent, "concurrent-requests")
		}
		q.tenants[tenant] = t
	}
	return q
}

// take counts one request of tenant against its quotas at now and writes
// its RateLimit-Policy and RateLimit fields on w. Within them, it returns
// the function that counts the request out when it ends, and the RateLimit
// field's t (0 when none is sent); over one, it answers 429 and returns
// the policy broken. A nil *Quotas, or a tenant without quotas, takes
// nothing.
func (q *Quotas) take(w http.ResponseWriter, r *http.Request, tenant string, now time.Time) (release func(), reset time.Duration, broken Refusal) {
	t := q.of(tenant)
	if t == nil {
		return func() {}, 0, ""
	}
	h := w.Header()
	h.Set("RateLimit-Policy", t.policy)
	inFlight := t.inFlight.Add(1)
	release = func() { t.inFlight.Add(-1) }
	if c := int64(t.limits.Concurrent); c > 0 && inFlight > c {
		release()
		h.Set("RateLimit", t.remaining(now, c))
		t.refuse(w, r, policyConcurrent, time.Second,
			"Tenant %s has %d requests in flight, its most (the %q policy): nothing of this request was recorded. Retry after the Retry-After interval with the same Idempotency-Key.",
			tenant, c, policyConcurrent)
		return nil, 0, RefusedConcurrencyQuota
	}
	if !t.bucket.AllowN(now, 1) {
		release()
		wait := t.untilNext(now)
		h.Set("RateLimit", t.remaining(now, inFlight-1))
		t.refuse(w, r, policyRequests, wait,
			"Tenant %s sent more than %d requests in %s (the %q policy): nothing of this request was recorded. Retry after the Retry-After interval with the same Idempotency-Key.",
			tenant, t.limits.Requests, t.limits.Window, policyRequests)
		return nil, 0, RefusedRateQuota
	}
	h.Set("RateLimit", t.remaining(now, inFlight))
	if t.bucket.TokensAt(now) < float64(t.limits.Requests) {
		reset = t.untilNext(now)
	}
	return release, reset, ""
}

func (q *Quotas) of(tenant string) *quota {
	if q == nil {
		return nil
	}
	return q.tenants[tenant]
}

// remaining is the RateLimit field: the requests left in the bucket, with
// the whole seconds until one more is (none while it is full), and the
// requests that may still be in flight beside inFlight.
func (t *quota) remaining(now time.Time, inFlight int64) string {
	tokens := t.bucket.TokensAt(now)
	v := fmt.Sprintf("%q;r=%d", policyRequests, int64(max(0, math.Floor(tokens))))
	if tokens < float64(t.limits.Requests) {
		v += ";t=" + strconv.FormatInt(int64(t.untilNext(now)/time.Second), 10)
	}
	if c := int64(t.limits.Concurrent); c > 0 {
		v += fmt.Sprintf(", %q;r=%d", policyConcurrent, max(0, c-inFlight))
	}
	return v
}

// untilNext is how long until the bucket holds one more whole request, in
// whole seconds rounded up (at least one): Retry-After of a refusal, and
// the RateLimit field's t, so that Retry-After is never earlier than t.
func (t *quota) untilNext(now time.Time) time.Duration {
	tokens := t.bucket.TokensAt(now)
	need := math.Floor(tokens) + 1 - tokens
	secs := math.Ceil(need / float64(t.bucket.Limit()))
	return time.Duration(max(1, secs)) * time.Second
}

// refuse answers 429 with Retry-After and the draft's quota-exceeded
// problem, naming the policy broken.
func (t *quota) refuse(w http.ResponseWriter, r *http.Request, policy string, wait time.Duration, format string, args ...any) {
	p := problem.Errorf(problem.QuotaExceeded, format, args...).With("violated-policies", []string{policy})
	p.Type = problem.TypeQuotaExceeded
	writeRefusal(w, r, http.StatusTooManyRequests, wait, answer.RenderError(p).Body)
}
