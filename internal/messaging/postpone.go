package messaging

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// A command that meets its own intent in flight (409 request_in_progress:
// another delivery, an HTTP request or the sweeper is running it) is no
// failure: it waits for that intent to be answered and is then answered
// with the stored outcome, spending none of its deliveries. Waiting holds
// the message and a goroutine, so waiting is bounded, and bounded per
// tenant, so that no tenant can pile waiters up at another's cost:
//
//   - one waiter per intent: a second command of an intent that already
//     has one is handed back (a nak with a delay) instead;
//   - at most Consumer.WaitersPerTenant waiters per tenant: past it, a
//     tenant's next command in flight is handed back too;
//   - a command handed back spends no delivery: the delivery that brings
//     it again is not counted against COMMAND_MAX_DELIVER, on the
//     instance that handed it back (another instance sees it as delivered
//     more often, which only makes it look its intent's record up first:
//     overDelivered never dead-letters an intent in flight or answered).
//
// A waiter waits off the worker pool, so duplicates of a slow intent never
// hold the workers every tenant shares.

// DefaultWaitersPerTenant is WaitersPerTenant when it is not set: each
// waiter may hold a command of up to 1 MiB.
const DefaultWaitersPerTenant = 16

// postpone keeps a delivery whose intent is in flight elsewhere, and
// serves it again after wait, and again, until it is answered, when its
// intent has no waiter yet and its tenant is under its share of waiters;
// it reports whether it did. Otherwise it hands the command back for a
// later delivery (its tenant's lane takes its turns as before), which
// spends no delivery.
//
// What bounds a wait: an owner's lease lapses and the intent is taken over
// (by this command's next run, or by the sweeper), so an intent is in
// flight only while someone works on it. Should it stay in flight for half
// of ORDER_COMMANDS's max_age after the stream stored the command, or past
// the horizon, the command is dead-lettered then, with the reason, while
// there is time: the stream would drop it at its max_age, unanswered and
// in no DLQ. When the consumer stops, the command is handed back (a nak)
// for another instance to serve.
func (c *Consumer) postpone(ctx context.Context, d delivery, cmd command, received time.Time, wait time.Duration, done func()) bool {
	s := c.serving
	if why := s.waiters.enter(cmd, c.waitersPerTenant()); why != "" {
		later := max(wait, c.Backoff.Max)
		s.waiters.handBack(d, time.Now(), c.handedBackKept())
		observer(c.Observe).MessageHandedBack(cmd.opLabel())
		c.logger().Info("messaging: command handed back, its intent is in flight and "+why, "subject", d.subject(), "key", cmd.key,
			"delivery", d.count, "retry_in", later.String())
		_ = d.msg.NakWithDelay(later)
		return false
	}
	observer(c.Observe).MessagePostponed(cmd.opLabel())
	c.logger().Info("messaging: command postponed, its intent is in flight", "subject", d.subject(), "key", cmd.key,
		"delivery", d.count, "retry_in", wait.String())
	s.workers.Go(func() {
		defer done()
		defer s.waiters.leave(cmd)
		for ; wait > 0; wait = c.serve(ctx, d, cmd, received) {
			if left := c.postponeLeft(d, time.Now()); left < wait {
				c.deadLetter(ctx, d, cmd, fmt.Sprintf("its intent was still in flight %s after the command was stored: dead-lettered before %s's max_age drops it",
					time.Since(d.stored).Round(time.Second), CommandsStream))
				return
			}
			t := time.NewTimer(wait)
			select {
			case <-s.stopping:
				t.Stop()
				_ = d.msg.Nak()
				return
			case <-t.C:
			}
		}
	})
	return true
}

// waitersPerTenant is WaitersPerTenant, or its default.
func (c *Consumer) waitersPerTenant() int {
	if c.WaitersPerTenant > 0 {
		return c.WaitersPerTenant
	}
	return DefaultWaitersPerTenant
}

// handedBackKept is how long the count of a command's hand-backs is kept
// for the delivery that brings it again: as long as it may be postponed.
// One that does not come back to this instance by then went to another.
func (c *Consumer) handedBackKept() time.Duration {
	if c.MaxAge > 0 {
		return c.MaxAge / 2
	}
	return time.Hour
}

// postponement is how long a command waits for its intent in flight
// before it is served again: the intent's Retry-After, within the backoff.
func (c *Consumer) postponement(retryAfter time.Duration) time.Duration {
	return max(min(retryAfter, c.Backoff.Max), c.Backoff.Base, time.Millisecond)
}

// postponeLeft is how much longer, at now, d may be postponed: until half
// of ORDER_COMMANDS's max_age after the stream stored it, and never past
// the horizon after it was first published. Neither set: no bound.
func (c *Consumer) postponeLeft(d delivery, now time.Time) time.Duration {
	left := time.Duration(math.MaxInt64)
	if c.MaxAge > 0 {
		left = c.MaxAge/2 - now.Sub(d.stored)
	}
	if c.Horizon > 0 {
		left = min(left, c.Horizon-now.Sub(d.published))
	}
	return left
}

// waiters is what one run of a Consumer counts of its postponed commands.
type waiters struct {
	mu        sync.Mutex
	intents   map[intent]bool // the intents with a waiter
	perTenant map[string]int  // waiters by tenant
	// handedBack counts, by command, the deliveries that handed it back
	// and are still to be taken off its delivery count.
	handedBack map[commandCopy]handBacks
	// pruned is when handBack last forgot the stale hand-backs: at most
	// once a minute, so that a flood of hand-backs does not scan the map
	// at each one.
	pruned time.Time
}

// intent names an intent as its record does, by tenant, operation and key.
type intent struct{ tenant, op, key string }

// commandCopy names one copy of a command in ORDER_COMMANDS (see msgID).
type commandCopy struct {
	seq    uint64
	stored int64
}

type handBacks struct {
	n    int
	last time.Time
}

func newWaiters() *waiters {
	return &waiters{intents: map[intent]bool{}, perTenant: map[string]int{}, handedBack: map[commandCopy]handBacks{}}
}

// enter makes cmd its intent's waiter, or says why it may not be one.
func (w *waiters) enter(cmd command, perTenant int) (why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	in := intent{cmd.tenant, cmd.op, cmd.key}
	switch {
	case w.intents[in]:
		return "another command of the same intent waits for it"
	case w.perTenant[cmd.tenant] >= perTenant:
		return fmt.Sprintf("its tenant has %d commands waiting already", w.perTenant[cmd.tenant])
	}
	w.intents[in] = true
	w.perTenant[cmd.tenant]++
	return ""
}

// leave ends cmd's wait.
func (w *waiters) leave(cmd command) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.intents, intent{cmd.tenant, cmd.op, cmd.key})
	if w.perTenant[cmd.tenant]--; w.perTenant[cmd.tenant] <= 0 {
		delete(w.perTenant, cmd.tenant)
	}
}

// waiting is how many commands of tenant wait.
func (w *waiters) waiting(tenant string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.perTenant[tenant]
}

// handBack records that d handed its command back, with the hand-backs
// its earlier deliveries made, for the delivery that brings it again. It
// forgets those older than keep (looking at most once a minute): their
// command went to another instance.
func (w *waiters) handBack(d delivery, now time.Time, keep time.Duration) {
	if d.seq == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if now.Sub(w.pruned) >= time.Minute {
		w.pruned = now
		for k, h := range w.handedBack {
			if now.Sub(h.last) > keep {
				delete(w.handedBack, k)
			}
		}
	}
	w.handedBack[commandCopy{d.seq, d.stored.UnixNano()}] = handBacks{n: d.handedBack + 1, last: now}
}

// takeHandedBack is how many earlier deliveries of d's command handed it
// back, and forgets them: d carries the count on.
func (w *waiters) takeHandedBack(d delivery) int {
	if d.seq == 0 || d.count == 1 { // a first delivery was never handed back: no lock on the common path
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	k := commandCopy{d.seq, d.stored.UnixNano()}
	h := w.handedBack[k]
	delete(w.handedBack, k)
	return h.n
}
