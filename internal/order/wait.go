package order

import (
	"context"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/problem"
)

// A duplicate that arrives while its intent's first attempt is still in
// flight is answered 409 request_in_progress at once, unless its caller
// asked to wait (Caller.Wait, HTTP's Prefer: wait). It then waits, holding
// no connection, until the first attempt's outcome is stored, and asks
// again, which replays it.

// Waiter lets a duplicate wait for its intent's first outcome
// (idempotency.Waiter).
type Waiter interface {
	// Await returns true once the intent of scope moved on, false when ctx
	// ended first.
	Await(ctx context.Context, db *gorm.DB, scope idempotency.Scope) bool
}

// awaitFirst runs an idempotent use case (the intent scope) and, when its first attempt is
// still in flight and the caller asked to wait, waits for that attempt's
// outcome, then runs it again. The wait ends with the 409 when it runs out
// (c.Wait, capped by MaxWait), when the caller hangs up, or when the
// service begins to stop (Stopping).
func (s *Service) awaitFirst(ctx context.Context, c Caller, scope idempotency.Scope, run func() (idempotency.Result, error)) (idempotency.Result, error) {
	res, err := run()
	wait := min(c.Wait, s.MaxWait)
	if wait <= 0 || s.Waiter == nil || problem.CodeOf(err) != problem.RequestInProgress {
		return res, err
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	defer cancelOn(s.Stopping, cancel)()
	c.yield() // it waits holding neither the door's slot nor a connection
	for problem.CodeOf(err) == problem.RequestInProgress && s.Waiter.Await(ctx, s.DB, scope) {
		res, err = run()
	}
	if err == nil && c.Waited != nil {
		c.Waited(wait)
	}
	return res, err
}

// cancelOn calls cancel once done is closed, and returns the function that
// stops watching. A nil done is never closed.
func cancelOn(done <-chan struct{}, cancel func()) (stop func()) {
	if done == nil {
		return func() {}
	}
	stopped := make(chan struct{})
	go func() {
		select {
		case <-done:
			cancel()
		case <-stopped:
		}
	}()
	return func() { close(stopped) }
}
