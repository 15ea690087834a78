package order

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/payment"
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
	// A token the channel does not know would only be refused there, after
	// the order had moved to PAYMENT_PENDING: refuse it before anything is
	// recorded, so the same key may be sent again with a real one.
	if !slices.Contains(payment.Methods, method) {
		return idempotency.Response{}, invalid("payment_method", "must be one of the channel's test tokens: %s", strings.Join(payment.Methods, ", "))
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

// paymentOf is the payment the intent (op, key) asked the channel for, if any.
func (o *Order) paymentOf(op, key string) *Payment {
	for i := range o.payments {
		if p := &o.payments[i]; p.Operation == op && p.IdempotencyKey == key {
			return p
		}
	}
	return nil
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
	if err := tx.Create(p).Error; err != nil {
		return err
	}
	// Before the transition, so that its outbox event shows the order with
	// the pending payment, as GET would right after.
	o.payments = append(o.payments, *p)
	return saveTransition(tx, o, from, ev, op, key)
}

// channelKey derives the downstream idempotency key of one intent from the
// tenant, the operation, the order and the client's key. It is stored on the
// payment row and never recomputed differently: a new key per retry would
// let the channel charge twice.
func channelKey(tenantID, op string, orderID uuid.UUID, key string) string {
	sum := sha256.Sum256([]byte(tenantID + "\x00" + op + "\x00" + orderID.String() + "\x00" + key))
	return "os_" + hex.EncodeToString(sum[:20])
}
