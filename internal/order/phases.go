package order

// The three phases of a money intent: claim and record what is about to
// happen, ask the channel with no transaction open, record the answer.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// moneyIntent runs an operation that may call the payment channel:
//
//	phase 1, one transaction: claim or replay the intent; lock the order;
//	         begin decides: either it finished in this transaction (no
//	         payment) or it wrote a pending payment with its stable key;
//	phase 2, no transaction:  ask the channel, under that key;
//	phase 3, one transaction: record the outcome, fenced by the lease token.
//
// A retry of an unfinished intent (failed retryably, or its owner's lease
// expired) skips begin and resumes the payment that phase 1 recorded.
func (s *Service) moneyIntent(ctx context.Context, c Caller, op, orderID string, fields any,
	begin func(tx *gorm.DB, o *Order, key string) (*Payment, error)) (idempotency.Response, error) {
	id, in, err := c.intentOn(op, orderID, fields)
	if err != nil {
		return idempotency.Response{}, err
	}

	// Phase 1 ends either with the intent finished (replayed, refused, or
	// done without the channel: resp) or with a pending payment to settle.
	var resp idempotency.Response
	var pay *Payment
	var claim idempotency.Claim
	err = database.Transact(ctx, s.DB, func(tx *gorm.DB) error {
		var err error
		resp, pay = idempotency.Response{}, nil
		if claim, err = s.Records.ClaimOrReplay(tx, in); err != nil {
			return err
		}
		if claim.Replay != nil {
			resp = *claim.Replay
			return nil
		}
		if claim.Resumed { // an earlier attempt recorded its payment: resume it
			if pay, err = pendingPayment(tx, in.Scope); pay != nil || err != nil {
				return err
			}
		}
		var out outcome
		if out, pay, err = s.beginMoney(tx, c, op, id, begin); pay != nil && err == nil {
			return nil // the record stays PROCESSING while the channel works
		}
		resp, err = s.finish(tx, in, claim.Token(), out, err)
		return err
	})
	if err != nil || pay == nil {
		return resp, err
	}
	if err := s.Hooks.run(s.Hooks.AfterPhase1); err != nil {
		return idempotency.Response{}, err
	}
	// The client may hang up; the money phases still run to the end (or to
	// the shutdown deadline), so the outcome is recorded and its retry gets
	// the replay.
	// An owner that died mid-flight left no word of the channel's answer,
	// so its successor asks the channel first; an intent that failed
	// retryably simply sends the same request under the same key again.
	lookupFirst := claim.ResumedFrom == idempotency.Processing
	if claim.Resumed {
		s.observe().Takeover(op, "retry")
	}
	work, cancel := s.detach(ctx)
	defer cancel()
	return s.settle(work, claim.Record, *pay, lookupFirst)
}

// beginMoney locks the order and lets begin decide: a pending payment for
// the channel, or an outcome reached without it.
func (s *Service) beginMoney(tx *gorm.DB, c Caller, op string, id uuid.UUID, begin func(tx *gorm.DB, o *Order, key string) (*Payment, error)) (outcome, *Payment, error) {
	o, err := lockOrder(tx, c.TenantID, id)
	if err != nil {
		return outcome{}, nil, err
	}
	if o.paymentOf(op, c.Key) != nil {
		// This intent moved money before, and its record has since been
		// archived and removed: running it again would mean a second
		// movement under the same downstream key.
		return outcome{}, nil, problem.Errorf(problem.KeyReused,
			"This Idempotency-Key already ran %s on this order and its record has expired; use a new key for a new intent.", op)
	}
	p, err := begin(tx, o, c.Key)
	if err != nil || p != nil {
		return outcome{}, p, err
	}
	resp, err := ok(o)
	return outcome{resp: resp, resource: id.String()}, nil, err
}

// pendingPayment finds the payment an earlier attempt of the intent wrote.
func pendingPayment(tx *gorm.DB, scope idempotency.Scope) (*Payment, error) {
	var p Payment
	err := tx.Where("tenant_id = ? AND operation = ? AND idempotency_key = ?", scope.TenantID, scope.Operation, scope.Key).Take(&p).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, nil
	}
	return &p, err
}

// answer is what the channel's reply means for one payment: the request
// classified once, where the reply is read (payment.Client), and named here.
type answer int

const (
	// unknown: no definitive reply (timeout, 5xx, 429, lost connection).
	// The same request under the same key may be sent again.
	unknown answer = iota
	// moved: the charge or refund was made.
	moved
	// declined: the acquirer declined the charge (402).
	declined
	// refused: the channel refused the request and will not act on it
	// (any other 4xx): as final as a decline.
	refused
)

// channelResult is what the channel said of one payment.
type channelResult struct {
	answer   answer
	ref      string // the channel's id of the charge or refund, when made
	reason   string // the channel's words, for a refusal
	replayed bool
}

// paymentStatus is what the payment row records of a definitive answer.
func (r channelResult) paymentStatus() PaymentStatus {
	if r.answer == moved {
		return PaymentSucceeded
	}
	return PaymentFailed
}

// event is the order's transition for a definitive answer on a payment of
// kind: the table in fsm.go decides whether the order may make it.
func (r channelResult) event(kind PaymentKind) Event {
	switch {
	case kind == KindRefund && r.answer == moved:
		return EventRefundSucceeded
	case kind == KindRefund:
		return EventRefundFailed
	case r.answer == moved:
		return EventPaymentSucceeded
	}
	return EventPaymentFailed
}

// failure is the problem a definitive non-success answer is stored as, or
// nil when the money moved.
func (r channelResult) failure(kind PaymentKind, orderID string) error {
	switch {
	case r.answer == moved:
		return nil
	case kind == KindRefund:
		return problem.Errorf(problem.RefundRefused, "The payment channel refused the refund (%s); the order stays PAID.", r.reason).
			With("order_id", orderID)
	case r.answer == refused:
		return problem.Errorf(problem.PaymentRefused, "The payment channel refused the charge (%s); the order may be paid again with a new Idempotency-Key.", r.reason).
			With("order_id", orderID)
	}
	return problem.Errorf(problem.PaymentDeclined, "The payment channel declined the charge; the order may be paid again with a new Idempotency-Key.").
		With("order_id", orderID)
}

// settle drives a pending payment to its outcome (phases 2 and 3). It is
// used by the request that started the payment, by a client retry, and by
// the sweeper after a takeover.
func (s *Service) settle(ctx context.Context, rec idempotency.Record, p Payment, lookupFirst bool) (idempotency.Response, error) {
	res, err := s.askChannel(ctx, p, lookupFirst)
	if err == nil {
		err = s.Hooks.run(s.Hooks.AfterChannelCall)
	}
	if err != nil {
		return idempotency.Response{}, err
	}
	if res.answer == unknown {
		return s.postpone(ctx, rec)
	}
	resp, err := s.record(ctx, rec, p, res)
	switch {
	case errors.Is(err, idempotency.ErrFenced):
		return idempotency.Response{}, superseded()
	case database.IsUnavailable(err) || database.IsLockTimeout(err):
		// The channel answered but the answer could not be stored: the
		// intent is resumable at once, and its retry sends the same key
		// again, which the channel answers from its own record.
		return s.postpone(ctx, rec)
	}
	return resp, err
}

// record is phase 3: one transaction that stores the channel's definitive
// answer on the payment, moves the order and completes the intent, fenced
// by the lease token.
func (s *Service) record(ctx context.Context, rec idempotency.Record, p Payment, res channelResult) (idempotency.Response, error) {
	var resp idempotency.Response
	err := database.Transact(ctx, s.DB, func(tx *gorm.DB) error {
		// The fence first: a superseded owner must not even try the
		// transition, which its successor may already have made.
		if err := s.Records.Hold(tx, rec.Scope(), rec.LeaseToken); err != nil {
			return err
		}
		o, err := lockOrder(tx, p.TenantID, p.OrderID)
		if err != nil {
			return err
		}
		from, ev := o.Status, res.event(p.Kind)
		if err := o.fire(ev); err != nil {
			return err
		}
		if err := o.settlePayment(tx, p.ID, res.paymentStatus(), res.ref); err != nil {
			return err
		}
		if err := saveTransition(tx, o, from, ev, p.Operation, p.IdempotencyKey); err != nil {
			return err
		}
		state := idempotency.Succeeded
		if fail := res.failure(p.Kind, o.ID.String()); fail != nil {
			state, resp = idempotency.FailedFinal, failure(fail, "").resp
		} else if resp, err = ok(o); err != nil {
			return err
		}
		if err := s.Hooks.run(s.Hooks.BeforeSettleCommit); err != nil {
			return err
		}
		return s.Records.Complete(tx, rec.Scope(), rec.LeaseToken, state, resp, o.ID.String())
	})
	return resp, err
}

// settlePayment records the channel's answer on the pending payment, in the
// database and in the order's loaded payments (which the response shows).
func (o *Order) settlePayment(tx *gorm.DB, id uuid.UUID, status PaymentStatus, ref string) error {
	now := tx.NowFunc()
	var channelRef *string
	if ref != "" {
		channelRef = &ref
	}
	res := tx.Model(&Payment{}).Where("id = ? AND status = ?", id, PaymentPending).
		Updates(map[string]any{"status": status, "channel_ref": channelRef, "updated_at": now})
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("payment %s is not pending", id)
	}
	for i := range o.payments {
		if p := &o.payments[i]; p.ID == id {
			p.Status, p.ChannelRef, p.UpdatedAt = status, channelRef, now
		}
	}
	return nil
}

// askChannel is phase 2. With lookupFirst (a takeover from an owner that
// died) it first asks the channel what happened under the key, and only when
// the channel has nothing sends the request, with the same key.
func (s *Service) askChannel(ctx context.Context, p Payment, lookupFirst bool) (channelResult, error) {
	ctx, cancel := context.WithTimeout(ctx, s.Money.ChannelTimeout)
	defer cancel()
	var res channelResult
	var err error
	start := time.Now()
	switch p.Kind {
	case KindCharge:
		var ch payment.Charge
		ch, res.replayed, err = lookupOrSend(lookupFirst,
			func() (payment.Charge, error) { return s.Channel.LookupCharge(ctx, p.ChannelKey) },
			func() (payment.Result[payment.Charge], error) {
				return s.Channel.Charge(ctx, p.ChannelKey, payment.ChargeRequest{Amount: p.Amount, Currency: p.Currency,
					Reference: p.OrderID.String(), PaymentMethod: deref(p.PaymentMethod)})
			})
		res.answer, res.ref = declined, ch.ID
		if ch.Status == payment.StatusSucceeded {
			res.answer = moved
		}
	case KindRefund:
		var rf payment.Refund
		rf, res.replayed, err = lookupOrSend(lookupFirst,
			func() (payment.Refund, error) { return s.Channel.LookupRefund(ctx, p.ChannelKey) },
			func() (payment.Result[payment.Refund], error) {
				return s.Channel.Refund(ctx, p.ChannelKey, payment.RefundRequest{ChargeID: deref(p.RefundOf), Amount: p.Amount})
			})
		res.answer, res.ref = moved, rf.ID
	}
	s.observe().ChannelCall(string(p.Kind), time.Since(start), err, res.replayed)
	switch {
	case errors.Is(err, payment.ErrRejected):
		s.logger().WarnContext(ctx, "payment channel refused the request", "kind", p.Kind, "channel_key", p.ChannelKey, "err", err)
		return channelResult{answer: refused, reason: refusalReason(err)}, nil
	case err != nil:
		// Outcome unknown: keep the intent resumable and let a retry or the
		// sweeper ask again under the same key.
		s.logger().WarnContext(ctx, "payment channel gave no definitive answer", "kind", p.Kind, "channel_key", p.ChannelKey, "err", err)
		return channelResult{answer: unknown}, nil
	}
	return res, nil
}

// refusalReason is the channel's code for a refusal, safe to show a client.
func refusalReason(err error) string {
	var se *payment.StatusError
	if errors.As(err, &se) && se.Code != "" {
		return se.Code
	}
	return "refused"
}

// lookupOrSend asks the channel for what it holds under the key when
// lookupFirst, and sends the request (same key) when it holds nothing or
// when there is nothing to look up.
func lookupOrSend[T any](lookupFirst bool, lookup func() (T, error), send func() (payment.Result[T], error)) (T, bool, error) {
	if lookupFirst {
		v, err := lookup()
		if !errors.Is(err, payment.ErrNotFound) {
			return v, false, err
		}
	}
	r, err := send()
	return r.Value, r.Replayed, err
}

// postpone records that the outcome is unknown: FAILED_RETRYABLE with the
// lease released until RetryAfter, and a 503 for the client, who may send
// the same key again at once.
func (s *Service) postpone(ctx context.Context, rec idempotency.Record) (idempotency.Response, error) {
	err := database.Transact(ctx, s.DB, func(tx *gorm.DB) error {
		return s.Records.Fail(tx, rec.Scope(), rec.LeaseToken, s.Money.RetryAfter)
	})
	if errors.Is(err, idempotency.ErrFenced) {
		return idempotency.Response{}, superseded()
	}
	if err != nil {
		return idempotency.Response{}, err
	}
	return idempotency.Response{}, &problem.Error{Code: problem.ServiceUnavailable, RetryAfter: s.Money.RetryAfter,
		Detail: "The payment channel's answer is not known yet; retry with the same Idempotency-Key."}
}

// superseded answers a request whose lease was taken over while it worked:
// the new owner will record the outcome, which a retry then replays.
func superseded() error {
	return &problem.Error{Code: problem.RequestInProgress, RetryAfter: time.Second,
		Detail: "This intent was taken over by another attempt; retry with the same Idempotency-Key to receive its result."}
}
