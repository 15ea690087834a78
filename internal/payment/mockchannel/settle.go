package mockchannel

// Payments that finish later: pm_async_ok and pm_async_declined charges are
// taken on as pending (202), pm_requires_action ones wait for the customer
// (202, requires_action), and the refunds of a pm_refund_pending charge are
// pending; each has its due time in the ledger, and the settling loop
// settles it when it comes, with its webhook event.

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/payment"
)

// settlePass settles what is due and says when to look again.
func (s *Server) settlePass(ctx context.Context) (time.Time, error) {
	charges, err := s.store.settleDue(ctx)
	if err != nil {
		return time.Time{}, err
	}
	refunds, err := s.store.settleRefundsDue(ctx)
	if err != nil {
		return time.Time{}, err
	}
	if charges > 0 {
		s.log.Debug("pending charges settled", "count", charges)
	}
	if refunds > 0 {
		s.log.Debug("pending refunds settled", "count", refunds)
	}
	if charges == settleBatch || refunds == settleBatch { // more may be due
		return time.Now(), nil
	}
	return s.store.nextSettling(ctx)
}

// settleBatch bounds the charges (or refunds) one settling transaction takes.
const settleBatch = 100

// settleDue settles the charges taken on whose time has come, each with
// its event, in one transaction, and returns how many. SKIP LOCKED lets
// several channels on one database share the work without waiting for
// each other, and a charge is taken only while still unsettled, under its
// row lock: none is settled twice.
func (s *store) settleDue(ctx context.Context) (int, error) {
	return settleEach(ctx, s, func(tx *gorm.DB, due *[]chargeRow) error {
		return tx.Raw(`SELECT `+chargeColumns+` FROM charges WHERE status IN (?, ?) AND settles_at <= now()
			ORDER BY settles_at LIMIT ? FOR UPDATE SKIP LOCKED`,
			payment.StatusPending, payment.StatusRequiresAction, settleBatch).Scan(due).Error
	}, func(tx *gorm.DB, c *chargeRow) error {
		c.Status = payment.StatusSucceeded
		if c.PaymentMethod == payment.MethodAsyncDeclined {
			c.Status = payment.StatusDeclined
		}
		if err := tx.Exec(`UPDATE charges SET status = ? WHERE idempotency_key = ?`, c.Status, c.IdempotencyKey).Error; err != nil {
			return err
		}
		return s.recordChargeEvent(tx, *c)
	})
}

// settleRefundsDue settles the pending refunds whose time has come, as
// settleDue does charges: each succeeds, with its event. Its amount was
// held on the charge when it was made. It reads refunds alone: a join
// would lock charges after refunds, the other way round from reset's
// TRUNCATE, and the two could deadlock.
func (s *store) settleRefundsDue(ctx context.Context) (int, error) {
	return settleEach(ctx, s, func(tx *gorm.DB, due *[]refundRow) error {
		return tx.Raw(`SELECT idempotency_key, id, charge_id, status, amount, created_at FROM refunds
			WHERE status = ? AND settles_at <= now()
			ORDER BY settles_at LIMIT ? FOR UPDATE SKIP LOCKED`, payment.StatusPending, settleBatch).Scan(due).Error
	}, func(tx *gorm.DB, r *refundRow) error {
		r.Status = payment.StatusSucceeded
		if err := tx.Exec(`UPDATE refunds SET status = ? WHERE idempotency_key = ?`, r.Status, r.IdempotencyKey).Error; err != nil {
			return err
		}
		rf := r.outcome(false).value
		return s.recordEvent(tx, payment.EventRefundSucceeded, rf.ID, rf.IdempotencyKey, rf)
	})
}

// settleEach takes the rows due (pick, locking them) and settles each
// (settle, which writes its event), in one transaction, and returns how
// many it settled.
func settleEach[Row any](ctx context.Context, s *store, pick func(tx *gorm.DB, due *[]Row) error, settle func(tx *gorm.DB, r *Row) error) (int, error) {
	var due []Row
	err := database.Transact(ctx, s.db, func(tx *gorm.DB) error {
		due = nil
		if err := pick(tx, &due); err != nil {
			return err
		}
		for i := range due {
			if err := settle(tx, &due[i]); err != nil {
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

// nextSettling is when the next charge or refund taken on settles; zero
// when none is.
func (s *store) nextSettling(ctx context.Context) (time.Time, error) {
	return s.earliest(ctx, `SELECT min(settles_at) FROM (
			SELECT settles_at FROM charges WHERE status IN ('pending', 'requires_action')
			UNION ALL SELECT settles_at FROM refunds WHERE status = 'pending') due`)
}
