package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/problem"
)

// Admission is the service's load shedding, shared fairly between
// tenants: at most MaxInFlight requests to /v1 are served at once, and a
// request that finds every slot taken waits in its tenant's FIFO queue for
// at most QueueTimeout, or is refused with 503 service_unavailable and
// Retry-After before it reaches the router, nothing decoded or recorded.
// Why slots go to tenants in turn, how long a queue may be (Little's law)
// and how a standing queue is told from a burst (CoDel's sojourn) is
// explained in docs/concepts.md, section 9, "Inside the admission limit";
// share, queueLimit, waited and congest each apply one of its rules.
type Admission struct {
	maxInFlight, maxQueue int64
	queueTimeout          time.Duration
	// target and interval judge a tenant's queue: a standing queue is one
	// whose every waiter waited longer than target for interval.
	target, interval time.Duration
	weights          map[string]int64

	mu   sync.Mutex
	free int64 // slots nobody holds; while one is free, nobody waits
	// queued counts the waiters, beyond those of every tenant waiting
	// beyond its share (bounded by MaxQueue).
	queued, beyond int64
	tenants        map[string]*tenantTurn
	// holdNanos is a moving average of how long a request holds its slot,
	// over holds slots given back since the queue last formed (0: none).
	holdNanos, holds int64

	// OnRefuse, when set, is told of every request refused (for metrics).
	OnRefuse func(tenant string, why Refusal)
	// Logger gets one line a second while requests are refused.
	Logger       *slog.Logger
	refusedTotal atomic.Int64
	reported     atomic.Int64 // UnixNano of the last log line
}

// tenantTurn is one tenant's part of the slots: what it holds, who of it
// waits, and how its queue was judged.
type tenantTurn struct {
	name    string
	weight  int64
	held    int64
	waiters []*waiter // FIFO
	// congestedUntil is a UnixNano time; before it, the tenant's queue is
	// no longer than the slots it holds.
	congestedUntil int64
	// aboveUntil is the UnixNano time at which its waiters will have
	// waited longer than target for a whole interval, if none waits less
	// meanwhile (0: the last one waited less).
	aboveUntil int64
}

// waiter is one request waiting for a slot; granted is closed when it
// has one.
type waiter struct {
	enqueued int64
	granted  chan struct{}
	has      bool // under Admission.mu: it was given a slot
	beyond   bool // it queued beyond its tenant's share
	// congested: it queued while its tenant was congested; its wait is
	// no evidence for the judgement made once the congestion ends.
	congested bool
}

// Refusal names why a request was refused, the reason label of
// orderservice_http_refused_total: a fixed set (Refusals).
type Refusal string

// The reasons a request is refused before it reaches the router.
const (
	// RefusedQueueFull: its tenant's queue had no room (503).
	RefusedQueueFull Refusal = "queue_full"
	// RefusedCongested: its tenant's queue stood, and held as many as
	// the slots it holds (503).
	RefusedCongested Refusal = "congested"
	// RefusedQueueTimeout: it waited HTTP_QUEUE_TIMEOUT without a slot (503).
	RefusedQueueTimeout Refusal = "queue_timeout"
	// RefusedRateQuota: its tenant used up its requests for the window (429).
	RefusedRateQuota Refusal = "rate_quota"
	// RefusedConcurrencyQuota: its tenant had its most requests in flight (429).
	RefusedConcurrencyQuota Refusal = "concurrency_quota"
	// RefusedBodyTimeout: its body did not arrive within HTTP_BODY_TIMEOUT (408).
	RefusedBodyTimeout Refusal = "body_timeout"
)

// Refusals are every Refusal, for the metric's series.
var Refusals = []Refusal{RefusedQueueFull, RefusedCongested, RefusedQueueTimeout, RefusedRateQuota, RefusedConcurrencyQuota, RefusedBodyTimeout}

// CongestedFor is how long after a sign of overload (see congest) a
// tenant's queue holds no more than the slots it holds.
const CongestedFor = time.Second

// NewAdmission limits the service to maxInFlight requests at once, with
// queues of maxQueue (beyond the tenants' shares) waiting at most
// queueTimeout; weights are the tenants' weights (a tenant not named, and
// a request of no tenant, weighs 1). maxInFlight 0 admits everything (no
// load shedding): it returns nil, which Wrap accepts.
func NewAdmission(maxInFlight, maxQueue int, queueTimeout time.Duration, weights map[string]int) *Admission {
	if maxInFlight <= 0 {
		return nil
	}
	a := &Admission{maxInFlight: int64(maxInFlight), maxQueue: int64(maxQueue), queueTimeout: queueTimeout,
		target: queueTimeout / 10, interval: queueTimeout / 5, weights: map[string]int64{},
		free: int64(maxInFlight), tenants: map[string]*tenantTurn{}}
	for tenant, w := range weights {
		a.weights[tenant] = int64(max(w, 1))
	}
	return a
}

// overloaded is the body of a refused request's 503, rendered once: the
// draft's temporary-reduced-capacity problem type, the service's code.
var overloaded = func() []byte {
	return answer.RenderError(&problem.Error{Code: problem.ServiceUnavailable, Type: problem.TypeTemporaryReducedCapacity,
		Detail: "The service is at its capacity and did not start this request: nothing of it was recorded, and a record of an earlier attempt with the same Idempotency-Key is untouched. Retry after the Retry-After interval with the same key."}).Body
}()

// Wrap sheds load on the /v1 routes of next, each request in the turn of
// the tenant Guard identified it as (none: the anonymous tenant "");
// /healthz, /readyz and /metrics are always served. A nil *Admission
// returns next.
func (a *Admission) Wrap(next http.Handler) http.Handler {
	if a == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !underV1(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		c := callerOf(r.Context())
		t, why := a.acquire(r.Context(), c.tenant)
		switch {
		case why != "" && r.Context().Err() != nil:
			return // the client gave up waiting: nobody reads an answer, nothing is refused
		case why != "":
			a.refuse(w, r, c, why)
			return
		}
		start := time.Now()
		ctx, release := withSlot(r.Context(), func() { a.release(t, time.Since(start)) })
		defer release()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// acquire takes a slot for tenant, or says why the request is refused.
func (a *Admission) acquire(ctx context.Context, tenant string) (*tenantTurn, Refusal) {
	now := time.Now().UnixNano()
	a.mu.Lock()
	t := a.turnOf(tenant)
	if a.free > 0 {
		a.free--
		t.held++
		a.mu.Unlock()
		return t, ""
	}
	w := &waiter{enqueued: now}
	if why := a.room(t, w, now); why != "" {
		a.mu.Unlock()
		return t, why
	}
	w.granted = make(chan struct{})
	if a.queued == 0 {
		// A queue forming in an empty one may be a burst: how long slots
		// were held before says nothing of how fast this queue drains.
		a.holds, a.holdNanos = 0, 0
	}
	t.waiters = append(t.waiters, w)
	a.queued++
	if w.beyond {
		a.beyond++
	}
	a.mu.Unlock()

	timer := time.NewTimer(a.queueTimeout)
	defer timer.Stop()
	var why Refusal
	select {
	case <-w.granted:
	case <-timer.C:
		why = RefusedQueueTimeout
	case <-ctx.Done():
		why = RefusedQueueTimeout // the client gave up (Wrap answers nothing)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.has { // granted, maybe just as the wait ended: keep the slot
		if !w.congested {
			a.waited(t, time.Now().UnixNano(), now)
		}
		return t, ""
	}
	a.leave(t, w)
	if ctx.Err() == nil { // a client that gave up is no sign of overload
		a.congest(t, time.Now().UnixNano()) // the queue timeout: the estimate was wrong, or a stall
	}
	return t, why
}

// room decides, as w arrives and finds no free slot, whether t may queue
// it: within its share always; beyond it, while its queue drains within
// the target (fewer while t is congested) and MaxQueue is not reached.
func (a *Admission) room(t *tenantTurn, w *waiter, now int64) Refusal {
	w.congested = now < t.congestedUntil
	waiting := int64(len(t.waiters))
	if t.held+waiting < a.share(t) {
		return ""
	}
	w.beyond = true
	if w.congested {
		// Refused for the congestion alone: no new sign of overload, so it
		// does not prolong the congestion. What queues gets in within one
		// turn of the slots t holds.
		if waiting >= t.held || a.beyond >= a.maxQueue {
			return RefusedCongested
		}
		return ""
	}
	if waiting >= a.queueLimit(t) || a.beyond >= a.maxQueue {
		a.congest(t, now) // the queue is as long as drains within the target
		return RefusedQueueFull
	}
	return ""
}

// share is t's fair share of the slots: its weight over the weights of
// the tenants with requests in flight, t's own included; at least one.
func (a *Admission) share(t *tenantTurn) int64 {
	total := t.weight
	for _, u := range a.tenants {
		if u != t && (u.held > 0 || len(u.waiters) > 0) {
			total += u.weight
		}
	}
	return max(1, a.maxInFlight*t.weight/total)
}

// queueLimit is how many of t's requests may wait now: as many as get in
// within the target at the rate t's slots come free. Until as many slots
// as the service has (at most eight) were given back since the queue
// formed, there is no bound but MaxQueue: one request's hold, slowed by
// the very burst it belongs to, is no estimate of how fast that burst
// drains.
func (a *Admission) queueLimit(t *tenantTurn) int64 {
	if a.holdNanos == 0 || a.holds < min(a.maxInFlight, 8) {
		return a.maxQueue
	}
	return min(a.maxQueue, max(t.held, minQueue, t.held*int64(a.target)/a.holdNanos))
}

// minQueue is the shortest bound: a few duplicates of one request sent
// at once queue even on a service with one slot held for long.
const minQueue = 8

// release gives t's slot back after it was held for d: to the waiting
// tenant that holds the fewest for its weight, or free.
func (a *Admission) release(t *tenantTurn, d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held(d)
	t.held--
	next := a.nextTurn()
	if next == nil {
		a.free++
		return
	}
	w := next.waiters[0]
	a.leave(next, w)
	next.held++
	w.has = true
	close(w.granted)
}

// nextTurn is the tenant whose turn it is: of those waiting, the one
// holding the fewest slots for its weight; of equals, the one whose first
// waiter came first.
func (a *Admission) nextTurn() *tenantTurn {
	var next *tenantTurn
	for _, t := range a.tenants {
		if len(t.waiters) == 0 {
			continue
		}
		if next == nil {
			next = t
			continue
		}
		mine, theirs := t.held*next.weight, next.held*t.weight
		if mine < theirs || (mine == theirs && t.waiters[0].enqueued < next.waiters[0].enqueued) {
			next = t
		}
	}
	return next
}

// leave takes w out of t's queue.
func (a *Admission) leave(t *tenantTurn, w *waiter) {
	if i := slices.Index(t.waiters, w); i >= 0 {
		t.waiters = slices.Delete(t.waiters, i, i+1)
	}
	a.queued--
	if w.beyond {
		a.beyond--
	}
}

// turnOf is tenant's part of the slots, made on its first request. The
// tenants are the configured ones (a request reaches admission only once
// its API key named one), so the map stays as small as API_KEYS.
func (a *Admission) turnOf(tenant string) *tenantTurn {
	t, ok := a.tenants[tenant]
	if !ok {
		weight := a.weights[tenant]
		t = &tenantTurn{name: tenant, weight: max(weight, 1)}
		a.tenants[tenant] = t
	}
	return t
}

// held adds one slot's holding time to the moving average: the mean of
// the first eight since the queue formed, then a weight of 1/8.
func (a *Admission) held(d time.Duration) {
	a.holds++
	w := min(a.holds, 8)
	avg := int64(d)
	if a.holdNanos != 0 {
		avg = a.holdNanos + (int64(d)-a.holdNanos)/w
	}
	a.holdNanos = max(avg, 1)
}

// waited judges t's queue by one waiter's sojourn, as CoDel does: one that
// waited less than target shows the queue still drains; once every waiter
// for a whole interval waited longer, the queue stands, and t is
// congested.
func (a *Admission) waited(t *tenantTurn, now, enqueued int64) {
	if time.Duration(now-enqueued) < a.target {
		t.aboveUntil = 0
		return
	}
	switch {
	case t.aboveUntil == 0:
		t.aboveUntil = now + int64(a.interval)
	case now >= t.aboveUntil:
		a.congest(t, now)
	}
}

// congest marks t overloaded for CongestedFor from now: a sign of
// overload was seen (a standing queue, an arrival the queue had no room
// for, a queue timeout).
//
// The evidence that a queue stands is spent: once the congestion ends, the
// queue that forms is judged afresh, over a whole interval of its own
// waiters, not by the slow waiters that ended the last one (clients that
// honour Retry-After come back together, and their first wait may be
// long).
func (a *Admission) congest(t *tenantTurn, now int64) {
	t.congestedUntil = now + int64(CongestedFor)
	t.aboveUntil = 0
}

// refuse answers a request the service has no slot for: 503 with
// Retry-After (a second, or when its quota has more, if later), counted,
// and logged at most once a second.
func (a *Admission) refuse(w http.ResponseWriter, r *http.Request, c caller, why Refusal) {
	if a.OnRefuse != nil {
		a.OnRefuse(c.tenant, why)
	}
	now := time.Now()
	n := a.refusedTotal.Add(1)
	if last := a.reported.Load(); a.Logger != nil && now.UnixNano()-last > int64(time.Second) && a.reported.CompareAndSwap(last, now.UnixNano()) {
		a.Logger.Warn("load shedding: requests refused with 503 at the admission limit", "refused_total", n, "tenant", c.tenant, "reason", string(why))
	}
	writeRefusal(w, r, http.StatusServiceUnavailable, max(time.Second, c.reset), overloaded)
}

// writeRefusal writes a problem body rendered beforehand, with
// Retry-After when wait is set.
func writeRefusal(w http.ResponseWriter, r *http.Request, status int, wait time.Duration, body []byte) {
	h := w.Header()
	h.Set("Content-Type", answer.ProblemType)
	if wait > 0 {
		h.Set("Retry-After", retryAfter(wait))
	}
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

// underV1 reports whether path is one of the /v1 routes, the API that
// admission control and CORS apply to.
func underV1(path string) bool { return path == "/v1" || strings.HasPrefix(path, "/v1/") }
