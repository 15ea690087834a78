package order

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// Channel is the payment channel as the order use cases need it. Every
// method takes the stable downstream key of one intent.
type Channel interface {
	Charge(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error)
	LookupCharge(ctx context.Context, key string) (payment.Charge, error)
	Refund(ctx context.Context, key string, req payment.RefundRequest) (payment.Result[payment.Refund], error)
	LookupRefund(ctx context.Context, key string) (payment.Refund, error)
}

// MoneyConfig tunes the calls to the payment channel.
type MoneyConfig struct {
	// ChannelTimeout bounds one call to the channel; it must be well below
	// the lease, or a slow call could outlive its owner's right to finish.
	ChannelTimeout time.Duration
	// RetryAfter is what a client is told to wait after an unknown outcome;
	// the sweeper resumes the intent itself after that if nobody retries.
	RetryAfter time.Duration
}

// Pay charges the order total through the payment channel. It runs in
// three phases so that no database connection is held while the channel
// works, and the propagated key makes every retry, crash and takeover of
// this intent converge on one charge.
func (s *Service) Pay(ctx context.Context, c Caller, orderID string, req PayRequest) (idempotency.Response, error) {
	method := strings.TrimSpace(req.PaymentMethod)
	if err := checkText("payment_method", method, maxSKULength); err != nil {
		return idempotency.Response{}, err
	}
	return s.moneyIntent(ctx, c, OpPay, orderID, PayRequest{PaymentMethod: method}, func(tx *gorm.DB, o *Order, key string) (*Payment, error) {
		from := o.Status
		if err := o.fire(EventPay); err != nil {
			return nil, err
		}
		p := &Payment{Kind: KindCharge, Amount: o.TotalAmount, Currency: o.Currency, PaymentMethod: &method}
		return p, s.startPayment(tx, o, from, EventPay, OpPay, key, p)
	})
}

// Cancel cancels an order. An unpaid order is cancelled in one
// transaction; a paid one is refunded through the channel first, by the same
// phased machinery as Pay, and is CANCELLED once the refund succeeded.
func (s *Service) Cancel(ctx context.Context, c Caller, orderID string, req CancelRequest) (idempotency.Response, error) {
	n, err := req.normalize()
	if err != nil {
		return idempotency.Response{}, err
	}
	return s.moneyIntent(ctx, c, OpCancel, orderID, n, func(tx *gorm.DB, o *Order, key string) (*Payment, error) {
		from := o.Status
		if o.Status != StatusPaid {
			if err := o.fire(EventCancel); err != nil {
				return nil, err
			}
			return nil, saveTransition(tx, o, from, EventCancel, OpCancel, key)
		}
		charge := o.settledCharge()
		if err := o.fire(EventRefund); err != nil {
			return nil, err
		}
		if charge == nil || charge.ChannelRef == nil {
			return nil, errors.New("paid order has no settled charge to refund")
		}
		p := &Payment{Kind: KindRefund, Amount: charge.Amount, Currency: charge.Currency, RefundOf: charge.ChannelRef}
		return p, s.startPayment(tx, o, from, EventRefund, OpCancel, key, p)
	})
}

// settledCharge is the charge that made the order PAID.
func (o *Order) settledCharge() *Payment {
	for i := len(o.payments) - 1; i >= 0; i-- {
		if p := &o.payments[i]; p.Kind == KindCharge && p.Status == PaymentSucceeded {
			return p
		}
	}
	return nil
}

// startPayment writes, in phase 1, the order's move to a pending status and
// the payment row with its stable downstream key.
func (s *Service) startPayment(tx *gorm.DB, o *Order, from Status, ev Event, op, key string, p *Payment) error {
	id, err := uuid.NewV7()
	if err != nil {
		return err
	}
	p.ID, p.OrderID, p.TenantID, p.Status = id, o.ID, o.TenantID, PaymentPending
	p.Operation, p.IdempotencyKey = op, key
	p.ChannelKey = channelKey(o.TenantID, op, o.ID, key)
	if err := saveTransition(tx, o, from, ev, op, key); err != nil {
		return err
	}
	if err := tx.Create(p).Error; err != nil {
		return err
	}
	o.payments = append(o.payments, *p)
	return nil
}

// channelKey derives the downstream idempotency key of one intent from the
// tenant, the operation, the order and the client's key. It is stored on the
// payment row and never recomputed differently: a new key per retry would
// let the channel charge twice.
func channelKey(tenantID, op string, orderID uuid.UUID, key string) string {
	sum := sha256.Sum256([]byte(tenantID + "\x00" + op + "\x00" + orderID.String() + "\x00" + key))
	return "os_" + hex.EncodeToString(sum[:20])
}

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

	var resp idempotency.Response
	var pay *Payment
	var claim idempotency.Claim
	err = database.Transact(ctx, s.DB, func(tx *gorm.DB) error {
		resp, pay = idempotency.Response{}, nil
		if claim, err = s.Records.ClaimOrReplay(tx, in); err != nil {
			return err
		}
		if claim.Replay != nil {
			resp = *claim.Replay
			return nil
		}
		if claim.Resumed {
			if pay, err = pendingPayment(tx, in.Scope); pay != nil || err != nil {
				return err
			}
		}
		o, err := lockOrder(tx, c.TenantID, id)
		if err == nil {
			pay, err = begin(tx, o, c.Key)
		}
		if err == nil && pay == nil { // finished without the channel
			resp, err = ok(o)
			if err == nil {
				err = s.Records.Complete(tx, in.Scope, claim.Token(), idempotency.Succeeded, resp, id.String())
			}
			return err
		}
		if err != nil && isFinal(err) {
			out := failure(err, id.String())
			resp = out.resp
			return s.Records.Complete(tx, in.Scope, claim.Token(), idempotency.FailedFinal, out.resp, out.resource)
		}
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
