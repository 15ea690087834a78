package app

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"
)

// stage is a step of the shutdown. Each part of the service says, as it
// starts, how it stops and at which stage; Close runs the stages in this
// order, all within SHUTDOWN_TIMEOUT.
type stage int

const (
	// stopWaiting: the duplicates waiting for a first attempt's outcome
	// stop waiting, so that no door waits on them.
	stopWaiting stage = iota
	// stopDoors: the doors take no new work and let what they serve
	// finish: the commands, then the order API.
	stopDoors
	// stopWorkers: the background loops (sweeper, cleanup, waiter) take no
	// new work and return.
	stopWorkers
	// stopChannel: the embedded payment channel stops serving, after the
	// requests that call it.
	stopChannel
	// endRequests: work still in flight is cancelled (the deadline passed,
	// or nothing is left to wait for) and the handlers still running
	// return, before what they use is closed.
	endRequests
	// closeChannel: the embedded channel's ledger is closed.
	closeChannel
	// release: the broker door, the embedded NATS server and the pool are
	// closed, the last opened first.
	release
	stages // how many there are
)

// shutdown is how to stop what start started: the stops of each stage,
// in the order they were added.
type shutdown [stages][]func(context.Context) error

// at adds stop to stage s.
func (sd *shutdown) at(s stage, stop func(context.Context) error) { sd[s] = append(sd[s], stop) }

// run runs every stage, each one's stops the last added first (as defers
// run: what started last stops first), and returns their errors.
func (sd *shutdown) run(ctx context.Context) error {
	var errs []error
	for s := range stages {
		for i := len(sd[s]) - 1; i >= 0; i-- {
			errs = append(errs, sd[s][i](ctx))
		}
	}
	return errors.Join(errs...)
}

// waitFor waits for wg, or for ctx's deadline plus a moment for cancelled
// work to notice it; false when that moment passed first.
func waitFor(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		select {
		case <-done:
			return true
		case <-time.After(time.Second):
			return false
		}
	}
}

// requests counts the requests being served, so that Close can let them
// return before it closes what they use.
type requests struct {
	mu     sync.Mutex
	wg     sync.WaitGroup
	closed bool
}

// track serves h counted. A request that arrives after close (on a
// connection accepted just before its server closed) is refused 503, as
// while the service starts.
func (rs *requests) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs.mu.Lock()
		if rs.closed {
			rs.mu.Unlock()
			unavailable(w, "The service is stopping and did not start this request; nothing was recorded. Retry with the same Idempotency-Key.")
			return
		}
		rs.wg.Add(1)
		rs.mu.Unlock()
		defer rs.wg.Done()
		h.ServeHTTP(w, r)
	})
}

// close refuses the requests still to come and returns what to wait on for
// those being served.
func (rs *requests) close() *sync.WaitGroup {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.closed = true
	return &rs.wg
}
