package mockchannel

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/payment"
)

// opKind names a key space: a charge key and a refund key never collide.
type opKind string

const (
	opCharge opKind = "charge"
	opRefund opKind = "refund"
)

// outcome is the channel's answer to a valid POST: made now (fresh) or
// replayed from the record the key already has.
type outcome[Res any] struct {
	value  Res
	status int
	method string // the payment method whose test behaviour applies
	fresh  bool
}

// store is the channel's ledger in PostgreSQL. Each method is one statement
// or one transaction, and the primary keys on the idempotency keys decide
// every race: there is no "look, then insert" that a concurrent request
// could slip between.
type store struct {
	db *gorm.DB
	// asyncDelay is how long a pm_async_* charge stays pending.
	asyncDelay time.Duration
	// keyWindow is how long a key deduplicates POSTs (forget.go).
	keyWindow time.Duration
	// holdBack is how long a new event waits before its first delivery
	// (the webhook delay and reorder faults).
	holdBack func() time.Duration
	// toSettle and eventRecorded wake the settling and delivery loops
	// when this process has written work for them.
	toSettle, eventRecorded signal
}

// chargeRow is a row of charges.
type chargeRow struct {
	IdempotencyKey string
	ID             string
	Status         string
	Amount         int64
	Currency       string
	Reference      string
	PaymentMethod  string
	AmountRefunded int64
	CreatedAt      time.Time
}

const chargeColumns = `idempotency_key, id, status, amount, currency, reference, payment_method, amount_refunded, created_at`

func (r chargeRow) charge() payment.Charge {
	return payment.Charge{ID: r.ID, Status: r.Status, Amount: r.Amount, Currency: r.Currency, Reference: r.Reference,
		PaymentMethod: r.PaymentMethod, IdempotencyKey: r.IdempotencyKey, CreatedAt: r.CreatedAt.UTC()}
}

func (r chargeRow) request() payment.ChargeRequest {
	return payment.ChargeRequest{Amount: r.Amount, Currency: r.Currency, Reference: r.Reference, PaymentMethod: r.PaymentMethod}
}

func (r chargeRow) outcome(fresh bool) outcome[payment.Charge] {
	status := http.StatusCreated
	switch r.Status {
	case payment.StatusDeclined:
		status = http.StatusPaymentRequired
	case payment.StatusPending, payment.StatusRequiresAction:
		status = http.StatusAccepted
	}
	return outcome[payment.Charge]{value: r.charge(), status: status, method: r.PaymentMethod, fresh: fresh}
}

// refundRow is a row of refunds, with the payment method of the charge it
// refunds (whose test behaviour applies to it).
type refundRow struct {
	IdempotencyKey string
	ID             string
	ChargeID       string
	Status         string
	Amount         int64
	CreatedAt      time.Time
	PaymentMethod  string
}

const refundColumns = `r.idempotency_key, r.id, r.charge_id, r.status, r.amount, r.created_at, c.payment_method`

func (r refundRow) outcome(fresh bool) outcome[payment.Refund] {
	rf := payment.Refund{ID: r.ID, ChargeID: r.ChargeID, Status: r.Status, Amount: r.Amount,
		IdempotencyKey: r.IdempotencyKey, CreatedAt: r.CreatedAt.UTC()}
	return outcome[payment.Refund]{value: rf, status: http.StatusCreated, method: r.PaymentMethod, fresh: fresh}
}

// ledgerErr turns a database failure into the channel's vocabulary: one it
// may recover from is a 503 that a retry with the same key resolves.
func ledgerErr(err error) error {
	if err == nil {
		return nil
	}
	if database.IsUnavailable(err) {
		return fmt.Errorf("%w: the ledger is unreachable: %v", errUnavailable, err)
	}
	return fmt.Errorf("ledger: %w", err)
}

// failOnce gives pm_unavailable_once its single 503 per key, before any
// effect: the key is marked and the 503 counted in one statement, so a
// restart neither forgets the mark nor gives a second 503.
func (s *store) failOnce(ctx context.Context, kind opKind, key string) error {
	res := s.db.WithContext(ctx).Exec(`WITH given AS (
			INSERT INTO unavailable_given (kind, idempotency_key) VALUES (?, ?)
			ON CONFLICT DO NOTHING RETURNING 1)
		INSERT INTO counters (name, shard, value) SELECT ?, ?, 1 FROM given
		ON CONFLICT (name, shard) DO UPDATE SET value = counters.value + 1`,
		kind, key, counterUnavailable, rand.IntN(counterShards))
	if res.Error != nil {
		return ledgerErr(res.Error)
	}
	if res.RowsAffected > 0 {
		return fmt.Errorf("%w (%s: first attempt for this key)", errUnavailable, payment.MethodUnavailableOnce)
	}
	return nil
}

// claimCharge replays the charge already made under key, or makes it.
func (s *store) claimCharge(ctx context.Context, p *post, req payment.ChargeRequest) (outcome[payment.Charge], error) {
	var none outcome[payment.Charge]
	key := p.key
	if err := s.forgetExpired(ctx, opCharge, key); err != nil {
		return none, err
	}
	// A duplicate is answered from its record before anything else applies.
	if row, found, err := s.chargeByKey(ctx, key); err != nil || found {
		if err != nil {
			return none, err
		}
		return replayCharge(row, req)
	}
	if req.PaymentMethod == payment.MethodUnavailableOnce {
		if err := s.failOnce(ctx, opCharge, key); err != nil {
			return none, err
		}
	}
	status := payment.StatusSucceeded
	var settleIn any // seconds until a charge taken on settles; NULL for the others
	switch req.PaymentMethod {
	case payment.MethodDeclined:
		status = payment.StatusDeclined
	case payment.MethodAsyncOK, payment.MethodAsyncDeclined:
		status, settleIn = payment.StatusPending, s.asyncDelay.Seconds()
	case payment.MethodRequiresAction:
		status, settleIn = payment.StatusRequiresAction, s.asyncDelay.Seconds()
	}
	// The primary key decides which of concurrent requests charges.
	var made []chargeRow
	err := database.Transact(ctx, s.db, func(tx *gorm.DB) error {
		err := tx.Raw(`INSERT INTO charges (idempotency_key, id, status, amount, currency, reference, payment_method, settles_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, now() + make_interval(secs => ?))
			ON CONFLICT (idempotency_key) DO NOTHING RETURNING `+chargeColumns,
			key, "ch_"+uuid.NewString(), status, req.Amount, req.Currency, req.Reference, req.PaymentMethod, settleIn).Scan(&made).Error
		if err != nil || len(made) == 0 {
			return err
		}
		// A charge taken on is told of when it settles.
		if settleIn == nil {
			if err := s.recordChargeEvent(tx, made[0]); err != nil {
				return err
			}
		}
		return countPostIn(tx, p)
	})
	if err != nil {
		return none, ledgerErr(err)
	}
	if len(made) == 1 {
		p.counted = true
		if settleIn != nil {
			s.toSettle.notify()
		} else {
			s.eventRecorded.notify()
		}
		return made[0].outcome(true), nil
	}
	// Another request charged under key first: its charge is the answer.
	row, found, err := s.chargeByKey(ctx, key)
	if err != nil {
		return none, err
	}
	if !found { // reset between the two statements
		return none, fmt.Errorf("%w: the charge under this key was reset while in flight", errUnavailable)
	}
	return replayCharge(row, req)
}

func replayCharge(row chargeRow, req payment.ChargeRequest) (outcome[payment.Charge], error) {
	if row.request() != req {
		return outcome[payment.Charge]{}, fmt.Errorf("%w: the charge under this key has other amount, currency, reference or payment_method", errKeyReused)
	}
	return row.outcome(false), nil
}

// claimRefund replays the refund already made under key, or makes it. The
// refunded amount is reserved on the charge row in the refund's own
// transaction, so concurrent refunds can never exceed the charge.
func (s *store) claimRefund(ctx context.Context, p *post, req payment.RefundRequest) (outcome[payment.Refund], error) {
	var none outcome[payment.Refund]
	key := p.key
	if err := s.forgetExpired(ctx, opRefund, key); err != nil {
		return none, err
	}
	if row, found, err := s.refundByKey(ctx, key); err != nil || found {
		if err != nil {
			return none, err
		}
		return replayRefund(row, req)
	}
	charge, err := s.refundable(ctx, key, req)
	if err != nil {
		return none, err
	}
	status, settleIn := s.refundStatus(charge.PaymentMethod)
	made, left, err := s.insertRefund(ctx, p, req, status, settleIn)
	switch {
	case errors.Is(err, errRefundExceeds):
		return none, fmt.Errorf("%w: amount %d exceeds the %d still refundable", errRefundInvalid, req.Amount, left)
	case errors.Is(err, errRefundExists):
		// Another request refunded under key first: its refund is the answer.
		row, found, err := s.refundByKey(ctx, key)
		if err != nil {
			return none, err
		}
		if !found {
			return none, fmt.Errorf("%w: the refund under this key was reset while in flight", errUnavailable)
		}
		return replayRefund(row, req)
	case err != nil:
		return none, ledgerErr(err)
	}
	p.counted = true
	if settleIn != nil {
		s.toSettle.notify()
	} else {
		s.eventRecorded.notify()
	}
	return made.outcome(true), nil
}

// refundable is the charge req refunds, or why it cannot be refunded: no
// such charge, one that did not succeed, or one made with
// pm_refund_refused (whose refusal is recorded). pm_unavailable_once gives
// its one 503 here.
func (s *store) refundable(ctx context.Context, key string, req payment.RefundRequest) (chargeRow, error) {
	charge, found, err := s.chargeByID(ctx, req.ChargeID)
	if err != nil {
		return charge, err
	}
	if !found {
		return charge, fmt.Errorf("%w: no charge %q", errChargeNotFound, req.ChargeID)
	}
	if charge.PaymentMethod == payment.MethodUnavailableOnce {
		if err := s.failOnce(ctx, opRefund, key); err != nil {
			return charge, err
		}
	}
	switch {
	case charge.Status != payment.StatusSucceeded:
		return charge, fmt.Errorf("%w: charge %q was %s", errRefundInvalid, req.ChargeID, charge.Status)
	case charge.PaymentMethod == payment.MethodRefundRefused:
		if err := s.recordRefusal(ctx, key, req); err != nil {
			return charge, err
		}
		return charge, fmt.Errorf("%w: charge %q was made with %s, whose refunds are always refused", errRefundRefused,
			req.ChargeID, payment.MethodRefundRefused)
	}
	return charge, nil
}

// refundStatus is the status a refund of a charge made with method starts
// in, and the seconds until it settles when it is pending (nil, NULL, for
// the others). A pending refund holds its amount until it settles; a
// failed one returns nothing and holds nothing.
func (s *store) refundStatus(method string) (status string, settleIn any) {
	switch method {
	case payment.MethodRefundPending:
		return payment.StatusPending, s.asyncDelay.Seconds()
	case payment.MethodRefundFailed:
		return payment.StatusFailed, nil
	}
	return payment.StatusSucceeded, nil
}

// Why insertRefund made no refund.
var (
	errRefundExists  = errors.New("a refund under this key exists")
	errRefundExceeds = errors.New("the refund exceeds the charge")
)

// insertRefund makes the refund under p's key and reserves its amount on
// the charge, in one transaction: errRefundExists when a refund under the
// key was made first, errRefundExceeds (with what is left to refund) when
// the charge cannot cover it.
func (s *store) insertRefund(ctx context.Context, p *post, req payment.RefundRequest, status string, settleIn any) (made refundRow, left int64, err error) {
	err = database.Transact(ctx, s.db, func(tx *gorm.DB) error {
		var rows []refundRow
		made, left = refundRow{}, 0
		err := tx.Raw(`WITH r AS (
				INSERT INTO refunds (idempotency_key, id, charge_id, status, amount, settles_at)
				VALUES (?, ?, ?, ?, ?, now() + make_interval(secs => ?))
				ON CONFLICT (idempotency_key) DO NOTHING RETURNING *)
			SELECT `+refundColumns+` FROM r JOIN charges c ON c.id = r.charge_id`,
			p.key, "re_"+uuid.NewString(), req.ChargeID, status, req.Amount, settleIn).Scan(&rows).Error
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			return errRefundExists
		}
		made = rows[0]
		if status == payment.StatusFailed {
			rf := made.outcome(true).value
			if err := s.recordEvent(tx, payment.EventRefundFailed, rf.ID, rf.IdempotencyKey, rf); err != nil {
				return err
			}
			return countPostIn(tx, p)
		}
		res := tx.Exec(`UPDATE charges SET amount_refunded = amount_refunded + ?
			WHERE id = ? AND amount_refunded + ? <= amount`, req.Amount, req.ChargeID, req.Amount)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			if err := tx.Raw(`SELECT amount - amount_refunded FROM charges WHERE id = ?`, req.ChargeID).Scan(&left).Error; err != nil {
				return err
			}
			return errRefundExceeds
		}
		// A pending refund is told of when it settles.
		if rf := made.outcome(true).value; settleIn == nil {
			if err := s.recordEvent(tx, payment.EventRefundSucceeded, rf.ID, rf.IdempotencyKey, rf); err != nil {
				return err
			}
		}
		return countPostIn(tx, p)
	})
	return made, left, err
}

func replayRefund(row refundRow, req payment.RefundRequest) (outcome[payment.Refund], error) {
	if (payment.RefundRequest{ChargeID: row.ChargeID, Amount: row.Amount}) != req {
		return outcome[payment.Refund]{}, fmt.Errorf("%w: the refund under this key has another charge_id or amount", errKeyReused)
	}
	return row.outcome(false), nil
}

func (s *store) chargeByKey(ctx context.Context, key string) (chargeRow, bool, error) {
	return s.oneCharge(ctx, `idempotency_key = ?`, key)
}

func (s *store) chargeByID(ctx context.Context, id string) (chargeRow, bool, error) {
	return s.oneCharge(ctx, `id = ?`, id)
}

func (s *store) oneCharge(ctx context.Context, where string, arg string) (chargeRow, bool, error) {
	var rows []chargeRow
	if err := s.db.WithContext(ctx).Raw(`SELECT `+chargeColumns+` FROM charges WHERE `+where, arg).Scan(&rows).Error; err != nil {
		return chargeRow{}, false, ledgerErr(err)
	}
	if len(rows) == 0 {
		return chargeRow{}, false, nil
	}
	return rows[0], true, nil
}

func (s *store) refundByKey(ctx context.Context, key string) (refundRow, bool, error) {
	var rows []refundRow
	err := s.db.WithContext(ctx).Raw(`SELECT `+refundColumns+` FROM refunds r JOIN charges c ON c.id = r.charge_id
		WHERE r.idempotency_key = ?`, key).Scan(&rows).Error
	if err != nil {
		return refundRow{}, false, ledgerErr(err)
	}
	if len(rows) == 0 {
		return refundRow{}, false, nil
	}
	return rows[0], true, nil
}

// lookupCharge is the charge made under key, for GET /v1/charges.
func (s *store) lookupCharge(ctx context.Context, key string) (payment.Charge, bool, error) {
	row, found, err := s.chargeByKey(ctx, key)
	return row.charge(), found, err
}

// lookupRefund is the refund made under key, for GET /v1/refunds.
func (s *store) lookupRefund(ctx context.Context, key string) (payment.Refund, bool, error) {
	row, found, err := s.refundByKey(ctx, key)
	return row.outcome(false).value, found, err
}

// reset forgets the whole ledger and every counter.
func (s *store) reset(ctx context.Context) error {
	return ledgerErr(s.db.WithContext(ctx).Exec(
		`TRUNCATE charges, refunds, attempts, unavailable_given, counters, webhook_events RESTART IDENTITY`).Error)
}
