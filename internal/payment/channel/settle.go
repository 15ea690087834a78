package channel

// Payments that finish later: pm_async_ok and pm_async_declined charges are
// taken on as pending (202) with their due time in the ledger, and the
// settling loop settles them when it comes, each with its webhook event.

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/payment"
)

// settlePass settles what is due and says when to look again.
func (s *Server) settlePass(ctx context.Context) (time.Time, error) {
	n, err := s.store.settleDue(ctx)
	if err != nil {
		return time.Time{}, err
	}
	if n > 0 {
		s.log.Debug("pending charges settled", "count", n)
	}
	if n == settleBatch { // more may be due
		return time.Now(), nil
	}
	return s.store.nextSettling(ctx)
}

// settleBatch bounds the charges one settling transaction takes.
const settleBatch = 100

// settleDue settles the pending charges whose time has come, each with its
// event, in one transaction, and returns how many. SKIP LOCKED lets several
// channels on one database share the work without waiting for each other,
// and a charge is taken only while still pending, under its row lock: none
// is settled twice.
func (s *store) settleDue(ctx context.Context) (int, error) {
	var due []chargeRow
	err := database.Transact(ctx, s.db, func(tx *gorm.DB) error {
		due = nil
		err := tx.Raw(`SELECT `+chargeColumns+` FROM charges WHERE status = ? AND settles_at <= now()
			ORDER BY settles_at LIMIT ? FOR UPDATE SKIP LOCKED`, payment.StatusPending, settleBatch).Scan(&due).Error
		if err != nil {
			return err
		}
		for i := range due {
			due[i].Status = payment.StatusSucceeded
			if due[i].PaymentMethod == payment.MethodAsyncDeclined {
				due[i].Status = payment.StatusDeclined
			}
			if err := tx.Exec(`UPDATE charges SET status = ? WHERE idempotency_key = ?`, due[i].Status, due[i].IdempotencyKey).Error; err != nil {
				return err
			}
			if err := s.recordChargeEvent(tx, due[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, ledgerErr(err)
	}
	if len(due) > 0 {
		s.eventRecorded.notify()
	}
	return len(due), nil
}

// nextSettling is when the next pending charge settles; zero when none is pending.
func (s *store) nextSettling(ctx context.Context) (time.Time, error) {
	return s.earliest(ctx, `SELECT min(settles_at) FROM charges WHERE status = 'pending'`)
}
