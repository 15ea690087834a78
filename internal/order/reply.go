package order

// What the payment channel's reply to one payment means for the intent:
// phase 2 (askChannel) classifies it once, phase 3 (storeReply) stores it.

import (
	"errors"
	"strings"

	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// verdict is what the channel's reply means for one payment: the request
// classified once, where the reply is read (payment.Client), and named here.
type verdict int

const (
	// unknown: no definitive reply (timeout, 5xx, 429, lost connection).
	// The same request under the same key may be sent again.
	unknown verdict = iota
	// moved: the charge or refund was made.
	moved
	// declined: the acquirer declined the charge (402).
	declined
	// refused: the channel refused the request and will not act on it
	// (any other 4xx): as final as a decline.
	refused
	// pending: the channel took the charge on and tells its verdict later
	// (a webhook, or a lookup by the key): the intent's answer is 202 and
	// the order waits in PAYMENT_PENDING (payment_later.go).
	pending
)

// channelReply is what the channel said of one payment.
type channelReply struct {
	verdict  verdict
	ref      string // the channel's id of the charge or refund, when made
	reason   string // the channel's words, for a refusal or a status that proves nothing
	replayed bool
	answered bool // the channel answered with the charge or refund, in whatever status
}

// chargeReply is what a charge the channel answered with proves. Only the
// channel's three outcomes for a charge are taken as such: made, declined,
// or taken on to finish later, which a charge that requires the customer's
// action is too (pending: 202, its verdict told later like any pending
// charge's). Any other status ("failed", a status added after this was
// written) is unknown: the intent stays resumable and the key is asked
// about again later, never stored as a decline without proof that no
// money moved.
func chargeReply(ch payment.Charge, replayed bool) channelReply {
	r := channelReply{verdict: unknown, ref: ch.ID, reason: ch.Status, replayed: replayed, answered: true}
	switch ch.Status {
	case payment.StatusSucceeded:
		r.verdict = moved
	case payment.StatusDeclined:
		r.verdict = declined
	case payment.StatusPending, payment.StatusRequiresAction:
		r.verdict = pending
	}
	return r
}

// refundReply is what a refund the channel answered with proves: it
// succeeded, or it failed and returned nothing (as final as a refusal,
// with reason refund_failed). A refund still pending, or in a status not
// known here, is not done: unknown.
func refundReply(rf payment.Refund, replayed bool) channelReply {
	r := channelReply{verdict: unknown, ref: rf.ID, reason: rf.Status, replayed: replayed, answered: true}
	switch rf.Status {
	case payment.StatusSucceeded:
		r.verdict = moved
	case payment.StatusFailed:
		r.verdict, r.reason = refused, refundFailed
	}
	return r
}

// refundFailed is the reason a refund the channel made with status failed
// is refused for: it returned nothing.
const refundFailed = "refund_failed"

// provesNothing reports a reply in which the channel answered, but in a
// status that proves no outcome: asked again at once, it says the same.
func (r channelReply) provesNothing() bool { return r.verdict == unknown && r.answered }

// callOutcome is how a call that returned r and err ended, as
// Observer.ChannelCall is told: an outcome, or a charge taken on (ok); a
// refusal (rejected); no reply (unavailable); or an answer in a status that
// proves no outcome (no_outcome).
func callOutcome(err error, r channelReply) string {
	switch {
	case errors.Is(err, payment.ErrRejected):
		return "rejected"
	case err != nil:
		return "unavailable"
	case r.provesNothing():
		return "no_outcome"
	}
	return "ok"
}

// final reports whether the reply is the channel's last word on the
// payment: the money moved, or it never will.
func (r channelReply) final() bool {
	return r.verdict == moved || r.verdict == declined || r.verdict == refused
}

// paymentStatus is what the payment row stores of a reply.
func (r channelReply) paymentStatus() PaymentStatus {
	switch r.verdict {
	case moved:
		return PaymentSucceeded
	case pending:
		return PaymentPending
	}
	return PaymentFailed
}

// channelRef is the channel's id of what it made, or nil.
func (r channelReply) channelRef() *string {
	if r.ref == "" {
		return nil
	}
	ref := r.ref
	return &ref
}

// event is the order's transition for a reply on a payment of kind (none
// while it is pending): the table in fsm.go decides whether the order may
// make it.
func (r channelReply) event(kind PaymentKind) Event {
	switch {
	case r.verdict == pending:
		return ""
	case kind == KindRefund && r.verdict == moved:
		return EventRefundSucceeded
	case kind == KindRefund:
		return EventRefundFailed
	case r.verdict == moved:
		return EventPaymentSucceeded
	}
	return EventPaymentFailed
}

// failure is the final error a reply that moved no money is stored as (a
// decline, a refusal), or nil when the money moved or may still move.
func (r channelReply) failure(kind PaymentKind, orderID string) *problem.Error {
	switch {
	case r.verdict == moved, r.verdict == pending:
		return nil
	case kind == KindRefund:
		return problem.Errorf(CodeRefundRefused, "The payment channel refused the refund (%s); the order stays PAID.", r.reason).
			With("order_id", orderID)
	case r.verdict == refused:
		return problem.Errorf(CodePaymentRefused, "The payment channel refused the charge (%s); the order may be paid again with a new Idempotency-Key.", r.reason).
			With("order_id", orderID)
	}
	return problem.Errorf(CodePaymentDeclined, "The payment channel declined the charge; the order may be paid again with a new Idempotency-Key.").
		With("order_id", orderID)
}

// refusalReason is the channel's code for a refusal, safe to show a client.
func refusalReason(err error) string {
	var se *payment.StatusError
	if errors.As(err, &se) && se.Code != "" && len(se.Code) <= maxRefusalReason &&
		strings.Trim(se.Code, "abcdefghijklmnopqrstuvwxyz0123456789_") == "" {
		return se.Code
	}
	return "refused"
}

// maxRefusalReason bounds the channel's code a refusal's detail repeats:
// the channel's words reach the client only as a short snake_case code, so
// the detail stays within api/openapi.yaml's bound whatever the channel sends.
const maxRefusalReason = 64

// storedReply is the reply a payment's stored verdict stands for: how an
// intent answers when the verdict came in by another way first. A late
// verdict that failed is a refund that failed (refund.failed, or a lookup
// of it) or a charge the acquirer declined (charge.declined, or a lookup).
func storedReply(p *Payment) channelReply {
	switch {
	case p == nil || p.Status == PaymentPending:
		return channelReply{verdict: pending}
	case p.Status == PaymentSucceeded:
		return channelReply{verdict: moved, ref: deref(p.ChannelRef)}
	case p.Kind == KindRefund:
		return channelReply{verdict: refused, reason: refundFailed}
	}
	return channelReply{verdict: declined}
}
