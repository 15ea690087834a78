package order

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
)

// Sweep takes over up to batch money intents whose owner stopped (lease
// expired) or that wait for a retry (FAILED_RETRYABLE past its Retry-After),
// and settles each: the channel is first asked for the real outcome under
// the intent's stable key. Every instance may sweep at once; SKIP LOCKED
// and the fencing token keep them off each other's records. It returns how
// many intents it resumed.
func (s *Service) Sweep(ctx context.Context, batch int) (int, error) {
	var due []idempotency.Record
	err := database.Transact(ctx, s.DB, func(tx *gorm.DB) error {
		var err error
		due, err = s.Records.ClaimDue(tx, MoneyOperations, batch)
		return err
	})
	if err != nil {
		return 0, err
	}
	// The intents taken over are finished even if ctx ends meanwhile (the
	// process is stopping), rather than left PROCESSING until their lease
	// runs out; a stopping sweeper only takes no new batch. The shutdown
	// deadline (Lifetime) still bounds them: what is left then is left to
	// the lease and the next sweeper.
	work, cancel := s.detach(ctx)
	defer cancel()
	for _, rec := range due {
		if work.Err() != nil {
			break
		}
		s.observe().Takeover(rec.Operation, "sweeper")
		p, err := pendingPayment(s.DB.WithContext(work), rec.Scope())
		if err != nil {
			return 0, err
		}
		if p == nil { // phase 1 writes the payment with the claim, so this is a bug
			s.logger().ErrorContext(ctx, "unfinished money intent has no payment", "operation", rec.Operation, "key", rec.IdempotencyKey)
			continue
		}
		s.resume(work, rec, *p)
	}
	return len(due), nil
}

// resume settles one intent the sweeper took over. A postponed (503) or
// superseded outcome is normal here: the intent stays resumable and a later
// sweep or retry finishes it. A panic is contained to this intent, as a
// request's would be, so one bad record cannot stop the process.
func (s *Service) resume(ctx context.Context, rec idempotency.Record, p Payment) {
	defer func() {
		if r := recover(); r != nil {
			s.logger().ErrorContext(ctx, "sweeper recovered from a panic", "operation", rec.Operation, "key", rec.IdempotencyKey, "panic", r)
		}
	}()
	if _, err := s.settle(ctx, rec, p, true); err != nil {
		s.logger().DebugContext(ctx, "sweep left intent unfinished", "operation", rec.Operation, "key", rec.IdempotencyKey, "err", err)
	}
}

// RunSweeper sweeps every interval until ctx is done.
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
		}
	}
}
