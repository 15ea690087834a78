package order

// What a payment intent decides, and how it asks the channel. Pay and
// Cancel give their rule (a plan); applyRule applies it in phase 1 and
// writes the payment under its stable channel key (channelKey);
// askChannel is phase 2; moveOnReply and intentResult are what phase 3
// stores. How the phases run, and resume, is once.go.

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

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order/steps"
	"github.com/orderservice/orderservice/internal/payment"
)

// Pay charges the order total through the payment channel.
func (s *Service) Pay(ctx context.Context, c Caller, orderID string, req PayRequest) (idempotency.Result, error) {
	method := strings.TrimSpace(req.PaymentMethod)
	if err := checkText("payment_method", method, maxSKULength); err != nil {
		return idempotency.Result{}, err
	}
	// A token the channel does not know would only be refused there, after
	// the order had moved to PAYMENT_PENDING: reject it before anything is
	// recorded, so the same key may be sent again with a real one.
	tokens := slices.Concat(payment.Methods, payment.AsyncMethods)
	if !slices.Contains(tokens, method) {
		return idempotency.Result{}, invalid("payment_method", "must be one of the channel's test tokens: %s", strings.Join(tokens, ", "))
	}
	return s.runPaymentIntent(ctx, c, OpPay, orderID, PayRequest{PaymentMethod: method}, func(o *Order) (plan, error) {
		charge, err := o.Pay(method)
		return viaChannel(EventPay, charge), err
	})
}

// Cancel cancels an order. An unpaid order is cancelled in phase 1; a paid
// one is refunded through the channel first and is CANCELLED once the
// refund succeeded.
func (s *Service) Cancel(ctx context.Context, c Caller, orderID string, req CancelRequest) (idempotency.Result, error) {
	n, err := req.normalize()
	if err != nil {
		return idempotency.Result{}, err
	}
	return s.runPaymentIntent(ctx, c, OpCancel, orderID, n, func(o *Order) (plan, error) {
		if !o.HoldsMoney() {
			return withoutChannel(EventCancel), o.Cancel()
		}
		refund, err := o.Refund()
		return viaChannel(EventRefund, refund), err
	})
}

// plan is what an order's rule decided in phase 1: the event it fired and,
// when money must move, the payment the channel is to make.
type plan struct {
	event      Event
	viaChannel bool
	payment    Payment
}

func viaChannel(ev Event, p Payment) plan { return plan{event: ev, viaChannel: true, payment: p} }
func withoutChannel(ev Event) plan        { return plan{event: ev} }

// applyRule locks the order and applies the intent's rule to it, writing
// the transition and, when money must move, the pending payment with its
// stable downstream key (pending). Without the channel the intent is done:
// res is its result.
func (s *Service) applyRule(tx *gorm.DB, c Caller, op string, id uuid.UUID, rule func(*Order) (plan, error)) (res idempotency.Result, pending *Payment, err error) {
	o, err := lockOrder(tx, c.TenantID, id)
	if err != nil {
		return res, nil, err
	}
	// A payment under this scope means the key moved money before, on this
	// order or another, and its record has since been archived and
	// removed: running it again would be a second movement of money for
	// one key (and the payments' unique scope would stop it anyway).
	if _, ranBefore, err := pendingPayment(tx, idempotency.Scope{TenantID: c.TenantID, Operation: op, Key: c.Key}); err != nil || ranBefore {
		if err == nil {
			err = errKeyRanBefore(op)
		}
		return res, nil, err
	}
	from := o.Status
	pl, err := rule(o)
	if err != nil {
		return res, nil, err
	}
	if !pl.viaChannel {
		if err := saveTransition(tx, o, from, pl.event, op, c.Key); err != nil {
			return res, nil, err
		}
		res, err = done(o)
		return res, nil, err
	}
	p := pl.payment
	if p.ID, err = uuid.NewV7(); err != nil {
		return res, nil, err
	}
	p.OrderID, p.TenantID, p.Status = o.ID, o.TenantID, PaymentPending
	p.Operation, p.IdempotencyKey = op, c.Key
	p.ChannelKey = channelKey(o.TenantID, op, o.ID, c.Key)
	if err := insertPayment(tx, &p); err != nil {
		return res, nil, err
	}
	// Before the transition, so that its outbox event shows the order with
	// the pending payment, as GET would right after.
	o.payments = append(o.payments, p)
	return res, &p, saveTransition(tx, o, from, pl.event, op, c.Key)
}

// channelKey derives the downstream idempotency key of one intent from the
// tenant, the operation, the order and the client's key. It is stored on the
// payment row and never recomputed differently: a new key per retry would
// let the channel charge twice.
func channelKey(tenantID, op string, orderID uuid.UUID, key string) string {
	sum := sha256.Sum256([]byte(tenantID + "\x00" + op + "\x00" + orderID.String() + "\x00" + key))
	return "os_" + hex.EncodeToString(sum[:20])
}

// Phase 2, ask: the channel, under the payment's key, holding no
// transaction.

// askChannel is phase 2: it asks the channel about p as how says. An error
// is one the channel's reply cannot be classified past (a hook's); the
// channel's own failures are an unknown reply.
func (s *Service) askChannel(ctx context.Context, p Payment, how asking) (res channelReply, err error) {
	// The deadline is fixed first and the key window judged against it;
	// however long the request then takes to leave, it cannot outlive the
	// deadline it was judged by (keywindow.go).
	deadline := time.Now().Add(s.Money.ChannelTimeout)
	how = s.atTheCall(p, how, deadline)
	s.step(ctx, func() steps.Event {
		return steps.Decide{Intent: paymentIntentOf(p), Token: steps.OwnerOf(ctx), ChannelKey: p.ChannelKey, How: how.String(), Deadline: deadline, FirstAttempt: p.CreatedAt, KeyWindow: s.Money.ChannelKeyWindow}
	})
	defer func() { s.step(ctx, func() steps.Event { return replyStep(ctx, p, res, err) }) }()
	if err := s.Hooks.run(s.Hooks.BeforeChannelCall); err != nil {
		return channelReply{}, err
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	start := time.Now()
	var replayed bool
	switch p.Kind {
	case KindCharge:
		var ch payment.Charge
		ch, replayed, err = lookupOrSend(how,
			func() (payment.Charge, error) { return s.Channel.LookupCharge(ctx, p.ChannelKey) },
			func() (payment.Result[payment.Charge], error) {
				return s.Channel.Charge(ctx, p.ChannelKey, payment.ChargeRequest{Amount: p.Amount, Currency: p.Currency,
					Reference: p.OrderID.String(), PaymentMethod: deref(p.PaymentMethod)})
			})
		res = chargeReply(ch, replayed)
	case KindRefund:
		var rf payment.Refund
		rf, replayed, err = lookupOrSend(how,
			func() (payment.Refund, error) { return s.Channel.LookupRefund(ctx, p.ChannelKey) },
			func() (payment.Result[payment.Refund], error) {
				return s.Channel.Refund(ctx, p.ChannelKey, payment.RefundRequest{ChargeID: deref(p.RefundOf), Amount: p.Amount})
			})
		res = refundReply(rf, replayed)
	}
	s.observe().ChannelCall(ctx, string(p.Kind), time.Since(start), callOutcome(err, res), res.replayed)
	switch {
	case errors.Is(err, payment.ErrRejected):
		s.logger().WarnContext(ctx, "payment channel refused the request", "kind", p.Kind, "channel_key", p.ChannelKey, "err", err)
		return channelReply{verdict: refused, reason: refusalReason(err)}, nil
	case err != nil:
		// Verdict unknown: keep the intent resumable and let a retry or the
		// sweeper ask again under the same key.
		s.logger().WarnContext(ctx, "payment channel gave no definitive reply", "kind", p.Kind, "channel_key", p.ChannelKey, "err", err)
		return channelReply{verdict: unknown}, nil
	case res.verdict == unknown:
		s.logger().WarnContext(ctx, "payment channel answered a status that proves no outcome", "kind", p.Kind, "channel_key", p.ChannelKey, "status", res.reason)
	}
	return res, nil
}

// lookupOrSend asks the channel for what it holds under the key unless how
// is send, and sends the request (same key) when how allows and the
// channel holds nothing.
func lookupOrSend[T any](how asking, lookup func() (T, error), post func() (payment.Result[T], error)) (v T, replayed bool, err error) {
	if how != send {
		v, err := lookup()
		if how == lookUpOnly || !errors.Is(err, payment.ErrNotFound) {
			return v, false, err
		}
	}
	r, err := post()
	return r.Value, r.Replayed, err
}

// transientStore reports a database failure worth trying again: the
// server is unreachable, failing over, or a lock is held too long.
func transientStore(err error) bool {
	return database.IsUnavailable(err) || database.IsLockTimeout(err)
}

// moveOnReply stores reply on the pending payment p and makes the order's
// transition for it, in tx; o is the order as it then is. A reply that is
// still pending only notes the channel's id of the charge. stored is false
// when the payment was no longer pending: its verdict came in another way
// first (a webhook, the sweeper's lookup: payment_later.go), and o shows it.
func moveOnReply(tx *gorm.DB, p Payment, reply channelReply) (o *Order, stored bool, err error) {
	if o, err = lockOrder(tx, p.TenantID, p.OrderID); err != nil {
		return nil, false, err
	}
	from := o.Status
	at, err := storePaymentReply(tx, p.ID, reply.paymentStatus(), reply.channelRef())
	if errors.Is(err, errNotPending) {
		return o, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	ev, err := o.applyReply(p, reply, at)
	if err != nil || ev == "" {
		return o, err == nil, err
	}
	return o, true, saveTransition(tx, o, from, ev, p.Operation, p.IdempotencyKey)
}

// intentResult is what a payment intent answers once its reply is stored:
// the order (200), the order still waiting for the verdict (202), or the
// failure (a decline, a refusal). When the verdict came in another way
// first, the intent answers with that verdict, as the order shows it.
func intentResult(o *Order, p Payment, reply channelReply, stored bool) (idempotency.Result, error) {
	if !stored {
		reply = storedReply(o.payment(p.ID))
	}
	if fail := reply.failure(p.Kind, o.ID.String()); fail != nil {
		return idempotency.Failed(o.ID.String(), fail), nil
	}
	if reply.verdict == pending {
		return accepted(o)
	}
	return done(o)
}

// askAgainAfter is how long an intent whose verdict is unknown is left
// before it is asked about again. With no reply from the channel (down,
// an answer lost) a moment may mend it: RetryAfter. A reply in a status
// that proves no outcome (a refund still pending, a status this service
// does not know) is only heard again if asked at once: the wait doubles
// with each attempt of the intent, up to maxAskAgainAfter.
func (s *Service) askAgainAfter(rec idempotency.Record, reply channelReply) time.Duration {
	if !reply.provesNothing() {
		return s.Money.RetryAfter
	}
	doublings := min(max(rec.Attempts-1, 0), 16)
	return max(s.Money.RetryAfter, min(s.Money.RetryAfter<<doublings, maxAskAgainAfter))
}

// maxAskAgainAfter bounds the wait between two askings of an intent the
// channel answers without an outcome: a refund may stay pending for days,
// and an operator who fixed the cause should not wait long for the sweeper.
const maxAskAgainAfter = 5 * time.Minute
