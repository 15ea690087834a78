package httpapi

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/sync/semaphore"

	"github.com/orderservice/orderservice/internal/problem"
)

// Admission is the service's load shedding: at most MaxInFlight requests
// are served at once; a request that finds every slot taken waits in a
// FIFO queue of at most MaxQueue, for at most QueueTimeout. A request that
// cannot get a slot is refused with 503 service_unavailable and
// Retry-After before anything is decoded or recorded, so its retry with the
// same Idempotency-Key is a fresh attempt.
//
// A queue only helps with bursts. Once a waiter has timed out the service
// is overloaded, and queueing more would only make every answer late: for
// congestedFor after the last refusal, a request that finds no free slot is
// refused at once instead of waiting.
type Admission struct {
	slots        *semaphore.Weighted
	maxQueue     int64
	queueTimeout time.Duration
	queued       atomic.Int64
	// congestedUntil is a UnixNano time; before it, nobody queues.
	congestedUntil atomic.Int64
	now            func() time.Time
}

// congestedFor is how long after a refusal a request that finds no free
// slot is refused at once rather than queued.
const congestedFor = time.Second

// NewAdmission limits the service to maxInFlight requests at once, with a
// queue of maxQueue waiting at most queueTimeout. maxInFlight 0 admits
// everything (no load shedding).
func NewAdmission(maxInFlight, maxQueue int, queueTimeout time.Duration) *Admission {
	if maxInFlight <= 0 {
		return nil
	}
	return &Admission{slots: semaphore.NewWeighted(int64(maxInFlight)), maxQueue: int64(maxQueue),
		queueTimeout: queueTimeout, now: time.Now}
}

// errOverloaded is the refusal: 503 with Retry-After, nothing recorded.
func errOverloaded() error {
	return &problem.Error{Code: problem.ServiceUnavailable, RetryAfter: time.Second,
		Detail: "The service is at capacity and did not start this request; nothing was recorded. Retry after the Retry-After interval with the same Idempotency-Key."}
}

// admit is the middleware. A nil *Admission admits everything.
func (a *Admission) admit(next echo.HandlerFunc) echo.HandlerFunc {
	if a == nil {
		return next
	}
	return func(c echo.Context) error {
		if err := a.acquire(c.Request().Context()); err != nil {
			c.Set(ctxShed, true)
			return err
		}
		defer a.slots.Release(1)
		return next(c)
	}
}

// acquire takes a slot, or says why not.
func (a *Admission) acquire(ctx context.Context) error {
	if a.slots.TryAcquire(1) {
		return nil
	}
	if a.now().UnixNano() < a.congestedUntil.Load() {
		return a.refuse()
	}
	if a.queued.Add(1) > a.maxQueue {
		a.queued.Add(-1)
		return a.refuse()
	}
	wait, cancel := context.WithTimeout(ctx, a.queueTimeout)
	err := a.slots.Acquire(wait, 1)
	cancel()
	a.queued.Add(-1)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil: // the client gave up: no sign of overload
		return ctx.Err()
	}
	return a.refuse()
}

func (a *Admission) refuse() error {
	a.congestedUntil.Store(a.now().Add(congestedFor).UnixNano())
	return errOverloaded()
}
