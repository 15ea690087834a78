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
)

// channelReply is what the channel said of one payment.
type channelReply struct {
	verdict  verdict
	ref      string // the channel's id of the charge or refund, when made
	reason   string // the channel's words, for a refusal
	replayed bool
}

// paymentStatus is what the payment row records of a definitive reply.
func (r channelReply) paymentStatus() PaymentStatus {
	if r.verdict == moved {
		return PaymentSucceeded
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

// event is the order's transition for a definitive reply on a payment of
// kind: the table in fsm.go decides whether the order may make it.
func (r channelReply) event(kind PaymentKind) Event {
	switch {
	case kind == KindRefund && r.verdict == moved:
		return EventRefundSucceeded
	case kind == KindRefund:
		return EventRefundFailed
	case r.verdict == moved:
		return EventPaymentSucceeded
	}
	return EventPaymentFailed
}

// failure is the refusal a definitive non-success answer is stored as, or
// nil when the money moved.
func (r channelReply) failure(kind PaymentKind, orderID string) *problem.Error {
	switch {
	case r.verdict == moved:
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
