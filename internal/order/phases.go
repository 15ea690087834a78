package order

// The three phases of a money intent: claim and record what is about to
// happen, ask the channel with no transaction open, record the answer.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
		if out, pay, err = s.beginMoney(tx, c, id, begin); pay != nil && err == nil {
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
	// The client may hang up; the money phases still run to the end, so the
	// outcome is recorded and its retry gets the replay.
	// An owner that died mid-flight left no word of the channel's answer,
	// so its successor asks the channel first; an intent that failed
	// retryably simply sends the same request under the same key again.
	lookupFirst := claim.ResumedFrom == idempotency.Processing
	if claim.Resumed {
		s.observe().Takeover(op, "retry")
	}
	return s.settle(context.WithoutCancel(ctx), claim.Record, *pay, lookupFirst)
}

// beginMoney locks the order and lets begin decide: a pending payment for
// the channel, or an outcome reached without it.
func (s *Service) beginMoney(tx *gorm.DB, c Caller, id uuid.UUID, begin func(tx *gorm.DB, o *Order, key string) (*Payment, error)) (outcome, *Payment, error) {
	o, err := lockOrder(tx, c.TenantID, id)
	if err != nil {
		return outcome{}, nil, err
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

// channelResult is what the channel said of one payment.
type channelResult struct {
	status   PaymentStatus // PaymentSucceeded or PaymentFailed; PaymentPending if unknown
	ref      string
	replayed bool
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
	if res.status == PaymentPending {
		return s.postpone(ctx, rec)
	}

	var resp idempotency.Response
	err = database.Transact(ctx, s.DB, func(tx *gorm.DB) error {
		// The fence first: a superseded owner must not even try the
		// transition, which its successor may already have made.
		if err := s.Records.Hold(tx, rec.Scope(), rec.LeaseToken); err != nil {
			return err
		}
		o, err := lockOrder(tx, p.TenantID, p.OrderID)
		if err != nil {
			return err
		}
		from, ev := o.Status, outcomeEvent(p.Kind, res.status)
		if err := o.fire(ev); err != nil {
			return err
		}
		if err := o.settlePayment(tx, p.ID, res.status, res.ref); err != nil {
			return err
		}
		if err := saveTransition(tx, o, from, ev, p.Operation, p.IdempotencyKey); err != nil {
			return err
		}
		state := idempotency.Succeeded
		if ev == EventPaymentFailed {
			state = idempotency.FailedFinal
			resp = failure(problem.Errorf(problem.PaymentDeclined, "The payment channel declined the charge; the order may be paid again with a new Idempotency-Key.").
				With("order_id", o.ID.String()), "").resp
		} else if resp, err = ok(o); err != nil {
			return err
		}
		if err := s.Hooks.run(s.Hooks.BeforeSettleCommit); err != nil {
			return err
		}
		return s.Records.Complete(tx, rec.Scope(), rec.LeaseToken, state, resp, o.ID.String())
	})
	if errors.Is(err, idempotency.ErrFenced) {
		return idempotency.Response{}, superseded()
	}
	return resp, err
}

// settlePayment records the channel's answer on the pending payment, in the
// database and in the order's loaded payments (which the response shows).
func (o *Order) settlePayment(tx *gorm.DB, id uuid.UUID, status PaymentStatus, ref string) error {
	now := tx.NowFunc()
	res := tx.Model(&Payment{}).Where("id = ? AND status = ?", id, PaymentPending).
		Updates(map[string]any{"status": status, "channel_ref": ref, "updated_at": now})
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("payment %s is not pending", id)
	}
	for i := range o.payments {
		if p := &o.payments[i]; p.ID == id {
			p.Status, p.ChannelRef, p.UpdatedAt = status, &ref, now
		}
	}
	return nil
}

func outcomeEvent(kind PaymentKind, status PaymentStatus) Event {
	switch {
	case kind == KindRefund:
		return EventRefundSucceeded
	case status == PaymentSucceeded:
		return EventPaymentSucceeded
	}
	return EventPaymentFailed
}

// askChannel is phase 2. With lookupFirst (a takeover from an owner that
// died) it first asks the channel what happened under the key, and only when
// the channel has nothing sends the request, with the same key. Only a
// definitive answer leaves here as succeeded or failed.
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
		res.status, res.ref = chargeStatus(ch), ch.ID
	case KindRefund:
		var rf payment.Refund
		rf, res.replayed, err = lookupOrSend(lookupFirst,
			func() (payment.Refund, error) { return s.Channel.LookupRefund(ctx, p.ChannelKey) },
			func() (payment.Result[payment.Refund], error) {
				return s.Channel.Refund(ctx, p.ChannelKey, payment.RefundRequest{ChargeID: deref(p.RefundOf), Amount: p.Amount})
			})
		res.status, res.ref = PaymentSucceeded, rf.ID
	}
	s.observe().ChannelCall(string(p.Kind), time.Since(start), err, res.replayed)
	if err != nil {
		// Outcome unknown (or refused, which a correct request never is):
		// keep the intent resumable and let a retry or the sweeper ask again.
		level := slog.LevelWarn
		if errors.Is(err, payment.ErrRejected) {
			level = slog.LevelError
		}
		s.logger().Log(ctx, level, "payment channel gave no definitive answer", "kind", p.Kind, "channel_key", p.ChannelKey, "err", err)
		return channelResult{status: PaymentPending}, nil
	}
	return res, nil
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

func chargeStatus(ch payment.Charge) PaymentStatus {
	if ch.Status == "succeeded" {
		return PaymentSucceeded
	}
	return PaymentFailed
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
