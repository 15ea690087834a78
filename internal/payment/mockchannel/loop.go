package mockchannel

import (
	"context"
	"time"
)

// pollInterval bounds how long a loop sleeps, and so how late it sees work
// that another channel process on the database wrote.
const pollInterval = time.Second

// signal wakes a loop; one wake pending is as good as many.
type signal chan struct{}

func newSignal() signal { return make(signal, 1) }

func (s signal) notify() {
	select {
	case s <- struct{}{}:
	default:
	}
}

// runLoop calls pass until ctx ends, and again at the time pass names (at
// once if it has passed), on a wake, or after pollInterval, whichever is
// first. A failed pass is logged and tried again: the ledger keeps the work.
func (s *Server) runLoop(ctx context.Context, name string, wake signal, pass func(context.Context) (time.Time, error)) {
	for {
		next, err := pass(ctx)
		if ctx.Err() != nil {
			return
		}
		wait := pollInterval
		if err != nil {
			s.log.Warn(name+" failed", "err", err)
		} else if !next.IsZero() {
			wait = min(wait, time.Until(next))
		}
		t := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}
