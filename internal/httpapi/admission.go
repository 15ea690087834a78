package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/problem"
)

// Admission is the service's load shedding: at most MaxInFlight requests
// to /v1 are served at once; a request that finds every slot taken waits in
// a FIFO queue of at most MaxQueue, for at most QueueTimeout. A request that
// cannot get a slot is shed with 503 service_unavailable and Retry-After
// before it reaches the router: nothing is authenticated, decoded or
// recorded, so its retry with the same Idempotency-Key is a fresh attempt.
// A request gives its slot back early when it goes on to wait on something
// other than the service (Yield): a pay during its call to the
// payment channel, a duplicate waiting for its first attempt's outcome.
//
// A queue is for bursts, and a burst is not overload: the service drains
// it well within its latency budget. How many may wait follows from how
// fast slots come free (Little's law): the slots over the time a request
// holds one (a moving average) is the rate at which waiters get in, and a
// queue longer than that rate times the target could not drain within it.
// The bound is never below the slots (nor 8), nor above MaxQueue.
//
// The average starts afresh when a queue forms in an empty one, so a burst
// is judged by how fast its own requests leave, not by the last one's
// (once a few have: see queueLimit). A burst that arrives at once queues
// whole: its quick requests (duplicates that give their slot back to wait
// for the first) keep the bound high.
// At the onset of overload the slots are soon seen held for tens of
// milliseconds, and the excess is shed as it arrives, in microseconds,
// rather than after waiting.
//
// What tells overload from a burst is how long requests wait for their
// slot (their sojourn), as CoDel judges a queue: a standing queue is one
// whose waiters have all waited longer than a target for a whole interval
// (QueueTimeout/10 and QueueTimeout/5: 100ms and 200ms by default). Then,
// and for CongestedFor after it or after an arrival the queue had no room
// for, a request that finds no free slot is shed at once instead of
// waiting. Requests shed so are no new sign of overload and do not prolong
// it: the congestion ends CongestedFor after the last sign, arrivals queue
// again, and the queue is judged afresh. (Were every request shed a sign,
// clients that honour Retry-After would keep the service shedding after
// the overload is gone: shedding congests, the congestion sheds.) A place
// in the queue is a promise: the bound keeps what is queued within the
// target of being served, so the waiters already queued are served, not
// sent away after waiting (CoDel drops from the head of a queue it does not
// bound), and whether a request is shed is decided as it arrives, with
// nothing waited for (the queue timeout, for an estimate gone wrong, is the
// one exception). Shedding a request costs a few microseconds (no routing,
// no per-request log line: the requests shed are counted, and logged at
// most once a second), so the excess does not eat the capacity the
// accepted requests need.
type Admission struct {
	slots       *semaphore.Weighted
	maxInFlight int64
	maxQueue    int64
	// holdNanos is a moving average of how long a request holds its slot,
	// over holds slots given back since the queue last formed (0: none).
	holdNanos    atomic.Int64
	holds        atomic.Int64
	queueTimeout time.Duration
	queued       atomic.Int64
	// congestedUntil is a UnixNano time; before it, nobody queues.
	congestedUntil atomic.Int64
	// target and interval judge the queue: a standing queue is one whose
	// every waiter waited longer than target for interval.
	target, interval time.Duration
	// aboveUntil is the UnixNano time at which the waiters will have
	// waited longer than target for a whole interval, if none waits less
	// meanwhile (0: the last one waited less).
	aboveUntil atomic.Int64

	// OnShed, when set, is told of every request shed (for metrics).
	OnShed func()
	// Logger gets one line a second while requests are shed.
	Logger    *slog.Logger
	shedTotal atomic.Int64
	reported  atomic.Int64 // UnixNano of the last log line
}

// CongestedFor is how long after a sign of overload (see congest) a
// request that finds no free slot is shed at once rather than queued.
const CongestedFor = time.Second

// NewAdmission limits the service to maxInFlight requests at once, with a
// queue of maxQueue waiting at most queueTimeout. maxInFlight 0 admits
// everything (no load shedding): it returns nil, which Wrap accepts.
func NewAdmission(maxInFlight, maxQueue int, queueTimeout time.Duration) *Admission {
	if maxInFlight <= 0 {
		return nil
	}
	return &Admission{slots: semaphore.NewWeighted(int64(maxInFlight)), maxInFlight: int64(maxInFlight), maxQueue: int64(maxQueue), queueTimeout: queueTimeout,
		target: queueTimeout / 10, interval: queueTimeout / 5}
}

// overloaded is the body of a shed request's 503, rendered once.
var overloaded = func() []byte {
	return answer.RenderError(&problem.Error{Code: problem.ServiceUnavailable,
		Detail: "The service is overloaded and did not start this request: nothing of it was recorded, and a record of an earlier attempt with the same Idempotency-Key is untouched. Retry after the Retry-After interval with the same key."}).Body
}()

// Wrap sheds load on the /v1 routes of next; /healthz, /readyz and
// /metrics are always served. A nil *Admission returns next.
func (a *Admission) Wrap(next http.Handler) http.Handler {
	if a == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !underV1(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		if !a.acquire(r.Context()) {
			a.shed(w, r)
			return
		}
		start := time.Now()
		ctx, release := withSlot(r.Context(), func() {
			a.slots.Release(1)
			a.held(time.Since(start))
		})
		defer release()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// acquire takes a slot, or reports that the request is to be shed.
func (a *Admission) acquire(ctx context.Context) bool {
	if a.slots.TryAcquire(1) {
		return true
	}
	enqueued := time.Now().UnixNano()
	if enqueued < a.congestedUntil.Load() {
		// Shed for the congestion alone: no new sign of overload, so
		// it does not prolong the congestion. Once it ends, arrivals queue
		// again and the queue judges afresh.
		return false
	}
	n := a.queued.Add(1)
	if n == 1 {
		// A queue forming in an empty one may be a burst: how long slots
		// were held before says nothing of how fast this queue drains.
		a.holds.Store(0)
		a.holdNanos.Store(0)
	}
	if n > a.queueLimit() {
		a.queued.Add(-1)
		a.congest(enqueued) // the queue is as long as drains within the target
		return false
	}
	wait, cancel := context.WithTimeout(ctx, a.queueTimeout)
	err := a.slots.Acquire(wait, 1)
	cancel()
	a.queued.Add(-1)
	if err != nil {
		if ctx.Err() == nil { // a client that gave up is no sign of overload
			a.congest(time.Now().UnixNano()) // the queue timeout: the estimate was wrong
		}
		return false
	}
	a.waited(time.Now().UnixNano(), enqueued)
	return true
}

// held adds one slot's holding time to the moving average: the mean of
// the first eight since the queue formed, then a weight of 1/8.
func (a *Admission) held(d time.Duration) {
	w := min(a.holds.Add(1), 8)
	for {
		old := a.holdNanos.Load()
		avg := int64(d)
		if old != 0 {
			avg = old + (int64(d)-old)/w
		}
		if a.holdNanos.CompareAndSwap(old, max(avg, 1)) {
			return
		}
	}
}

// queueLimit is how many may wait for a slot now: as many as get one
// within the target, at the rate slots come free. Until as many slots as
// the service has (at most eight) were given back since the queue formed,
// there is no bound but MaxQueue: one request's hold, slowed by the very
// burst it belongs to, is no estimate of how fast that burst drains.
func (a *Admission) queueLimit() int64 {
	hold := a.holdNanos.Load()
	if hold == 0 || a.holds.Load() < min(a.maxInFlight, 8) {
		return a.maxQueue
	}
	return min(a.maxQueue, max(a.maxInFlight, minQueue, a.maxInFlight*int64(a.target)/hold))
}

// minQueue is the shortest bound: a few duplicates of one request sent
// at once queue even on a service with one slot held for long.
const minQueue = 8

// waited judges the queue by one waiter's sojourn, as CoDel does: one that
// waited less than target shows the queue still drains; once every waiter
// for a whole interval waited longer, the queue stands, and the service is
// congested.
func (a *Admission) waited(now, enqueued int64) {
	if time.Duration(now-enqueued) < a.target {
		a.aboveUntil.Store(0)
		return
	}
	until := a.aboveUntil.Load()
	switch {
	case until == 0:
		a.aboveUntil.CompareAndSwap(0, now+int64(a.interval))
	case now >= until:
		a.congest(now)
	}
}

// congest marks the service overloaded for CongestedFor from now: a sign
// of overload was seen (a standing queue, an arrival the queue had no
// room for, a queue timeout).
//
// The evidence that a queue stands is spent: once the congestion ends, the
// queue that forms is judged afresh, over a whole interval of its own
// waiters, not by the slow waiters that ended the last one (clients that
// honour Retry-After come back together, and their first wait may be
// long).
func (a *Admission) congest(now int64) {
	a.congestedUntil.Store(now + int64(CongestedFor))
	a.aboveUntil.Store(0)
}

// shed answers a request the service has no slot for: 503 with
// Retry-After, counted, and logged at most once a second.
func (a *Admission) shed(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	if a.OnShed != nil {
		a.OnShed()
	}
	n := a.shedTotal.Add(1)
	if last := a.reported.Load(); a.Logger != nil && now.UnixNano()-last > int64(time.Second) && a.reported.CompareAndSwap(last, now.UnixNano()) {
		a.Logger.Warn("load shedding: requests refused with 503 at the admission limit", "refused_total", n)
	}
	h := w.Header()
	h.Set("Content-Type", answer.ProblemType)
	h.Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	if r.Method != http.MethodHead {
		_, _ = w.Write(overloaded)
	}
}

// underV1 reports whether path is one of the /v1 routes, the API that
// admission control and CORS apply to.
func underV1(path string) bool { return path == "/v1" || strings.HasPrefix(path, "/v1/") }
