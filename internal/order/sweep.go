package order

// The sweeper: what finishes the work nobody else finishes. Every
// SweepInterval, on every instance, it takes over the money intents whose
// owner stopped or whose client never retried (Sweep), then asks the
// channel about the payments it took on whose verdict no webhook brought
// (SweepPending).

import (
	"context"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
)

// RunSweeper sweeps every interval until ctx is done: the intents nobody
// finishes (Sweep), then the payments whose verdict no webhook brought
// (SweepPending).
func (s *Service) RunSweeper(ctx context.Context, interval time.Duration, batch int) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for {
				n, err := s.Sweep(ctx, batch)
				if err != nil && ctx.Err() == nil {
					s.logger().WarnContext(ctx, "sweep failed", "err", err)
				}
				if err != nil || n < batch {
					break
				}
			}
			if _, err := s.SweepPending(ctx, batch); err != nil && ctx.Err() == nil {
				s.logger().WarnContext(ctx, "sweep of pending payments failed", "err", err)
			}
		}
	}
}

// Sweep takes over up to batch money intents whose owner stopped (lease
// expired) or that wait for a retry (FAILED_RETRYABLE past its Retry-After),
// and finishes each: the channel is first asked for the real verdict under
// the intent's stable key. Every instance may sweep at once; SKIP LOCKED
// and the fencing token keep them off each other's records. It returns how
// many intents it resumed.
func (s *Service) Sweep(ctx context.Context, batch int) (int, error) {
	// A claimed intent's lease runs from its claim, so the sweeper claims
	// no more intents than can be at the channel at once, and finishes them
	// side by side: one that waited behind the others of its batch would
	// be taken over by another instance while its owner had not even
	// started it (both would then ask the channel, and one be fenced).
	due, err := s.Records.CountDue(s.DB.WithContext(ctx), MoneyOperations, batch)
	if err != nil || due == 0 {
		return 0, err
	}
	slots := s.freeSlots(due)
	defer func() {
		for _, p := range slots {
			p.release()
		}
	}()
	if len(slots) == 0 {
		return 0, nil // every slot at the channel is taken: the next sweep
	}
	var claimed []idempotency.Record
	claimedAt := time.Now() // their leases run from no earlier than this
	err = s.transact(ctx, func(tx *gorm.DB) error {
		var err error
		claimed, err = s.Records.ClaimDue(tx, MoneyOperations, len(slots))
		if err == nil {
			s.swept(tx, claimed)
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	for _, p := range slots[len(claimed):] { // another sweeper was quicker: free them now
		p.release()
	}
	// The intents taken over are finished even if ctx ends meanwhile (the
	// process is stopping), rather than left PROCESSING until their lease
	// runs out; a stopping sweeper only takes no new batch. The shutdown
	// deadline (Deps.Done) still bounds them: what is left then is left to
	// the lease and the next sweeper.
	work, cancel := s.detach(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i, rec := range claimed {
		s.observe().Takeover(rec.Operation, "sweeper")
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer slots[i].release() // its slot is free once its reply is stored
			s.resume(work, rec, claimedAt)
		}()
	}
	wg.Wait()
	return len(claimed), nil
}

// resume finishes one intent the sweeper took over, holding one of the
// slots Sweep took for its batch. A postponed or superseded attempt is
// normal here: the intent stays resumable and a later sweep or retry
// finishes it. A panic is contained to this intent, as a request's would
// be, so one bad record cannot stop the process.
func (s *Service) resume(ctx context.Context, rec idempotency.Record, claimedAt time.Time) {
	ctx, span := tracedResume(ctx, rec)
	defer span.End()
	defer func() {
		if r := recover(); r != nil {
			s.logger().ErrorContext(ctx, "sweeper recovered from a panic", "operation", rec.Operation, "key", rec.IdempotencyKey, "panic", r)
		}
	}()
	switch rec.RecoveryPoint {
	case paymentCreated: // phase 1 committed: finish its payment
	case idempotency.Started: // phase 1 never committed: only a retry, which brings the request, can run it
		s.logger().ErrorContext(ctx, "sweeper cannot resume a money intent whose phase 1 never committed", "operation", rec.Operation, "key", rec.IdempotencyKey)
		return
	default:
		s.logger().ErrorContext(ctx, "sweeper cannot resume an unfinished money intent", "operation", rec.Operation, "key", rec.IdempotencyKey, "err", unknownPoint(rec))
		return
	}
	p, err := paymentOf(s.DB.WithContext(ctx), rec)
	if err != nil {
		s.logger().WarnContext(ctx, "sweeper could not read an intent's payment; the next sweep tries again", "operation", rec.Operation, "key", rec.IdempotencyKey, "err", err)
		return
	}
	if _, err := s.finishPayment(ctx, rec, p, lookUpThenSend, claimedAt); err != nil {
		s.logger().DebugContext(ctx, "sweep left intent unfinished", "operation", rec.Operation, "key", rec.IdempotencyKey, "err", err)
	}
}

// SweepPending asks the channel about up to batch payments still pending
// whose intent has ended, each at most once per PendingCheckEvery, and
// stores the verdicts that are final: a webhook that never comes leaves no
// order waiting. It returns how many it resolved.
func (s *Service) SweepPending(ctx context.Context, batch int) (int, error) {
	every := s.Money.PendingCheckEvery
	if every <= 0 {
		every = time.Minute
	}
	due, err := pendingAfterTheirIntent(s.DB.WithContext(ctx), time.Now().Add(-every), batch)
	if err != nil {
		return 0, err
	}
	resolved := 0
	for _, p := range due {
		receipt, err := s.ResolvePending(ctx, p.ChannelKey)
		switch {
		case err != nil && err != errChannelUnknown: // the database failed: the next sweep
			return resolved, err
		case receipt == ReceiptApplied:
			resolved++
		default: // still pending, or the channel could not say: ask again later
			if err := touchPending(s.DB.WithContext(ctx), p.ID); err != nil {
				return resolved, err
			}
		}
	}
	return resolved, nil
}
