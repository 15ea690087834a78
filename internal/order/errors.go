package order

import (
	"errors"
	"fmt"
	"time"

	"github.com/orderservice/orderservice/internal/problem"
)

// The order's own error codes: what an order use case refuses, in the
// words of the contract. Their HTTP statuses are internal/httpapi's business.
const (
	// CodeNotFound: the tenant has no order with this id.
	CodeNotFound problem.Code = "order_not_found"
	// CodeInvalidTransition: the order's lifecycle forbids the operation now.
	CodeInvalidTransition problem.Code = "invalid_transition"
	// CodePaymentDeclined: the acquirer declined the charge.
	CodePaymentDeclined problem.Code = "payment_declined"
	// CodePaymentRefused: the payment channel refused the charge.
	CodePaymentRefused problem.Code = "payment_refused"
	// CodeRefundRefused: the payment channel refused the refund.
	CodeRefundRefused problem.Code = "refund_refused"
)

// errNotFound is the answer for an order that does not exist for the
// caller's tenant, whether or not another tenant has one with that id.
func errNotFound(id string) error {
	return refuse(problem.Errorf(CodeNotFound, "No order %s exists.", id))
}

// errNoSuchID is the answer for a path that names no order at all.
func errNoSuchID() error {
	return refuse(problem.Errorf(CodeNotFound, "No order exists with this id."))
}

// errTransition names the current status and the refused event, and why
// when a guard said so.
func errTransition(from Status, ev Event, why error) error {
	reason := fmt.Sprintf("An order in status %s cannot %s.", from, ev)
	if why != nil {
		reason = fmt.Sprintf("An order in status %s cannot %s: %s.", from, ev, why)
	}
	return refuse(problem.Errorf(CodeInvalidTransition, "%s", reason).With("current_status", from).With("event", ev))
}

// errKeyRanBefore refuses a money intent whose key moved money on this
// order before and whose record has since expired.
func errKeyRanBefore(op string) error {
	return refuse(problem.Errorf(problem.KeyReused,
		"This Idempotency-Key already ran %s, and its record has expired; use a new key for a new intent.", op))
}

// errPostponed says the channel's answer is not known yet: a retry with the
// same key, or the sweeper, finishes the intent.
func errPostponed(retryAfter time.Duration) error {
	return &problem.Error{Code: problem.ServiceUnavailable, RetryAfter: retryAfter,
		Detail: "The payment channel's answer is not known yet; retry with the same Idempotency-Key."}
}

// errChannelBusy refuses a money intent in phase 1 when MaxChannelCalls
// intents are at the channel already; phase 1 rolls back, so nothing is
// recorded and the same key is a fresh attempt.
func errChannelBusy() error {
	return &problem.Error{Code: problem.ServiceUnavailable, RetryAfter: time.Second,
		Detail: "The payment channel is at capacity and this request was not started: nothing of it was recorded, and a record of an earlier attempt with the same Idempotency-Key is untouched. Retry with the same key."}
}

// errSuperseded answers a request whose lease was taken over while it
// worked: the new owner will record the outcome, which a retry then replays.
func errSuperseded() error {
	return &problem.Error{Code: problem.RequestInProgress, RetryAfter: time.Second,
		Detail: "This intent was taken over by another attempt; retry with the same Idempotency-Key to receive its result."}
}

// refusal marks a domain error as the intent's definitive answer: a use
// case stores it as a failed result and replays it like a success. Every
// other error is transient: it rolls the intent back and records nothing,
// so the same key may simply be sent again.
type refusal struct{ err *problem.Error }

func (r refusal) Error() string { return r.err.Error() }

// Unwrap lets errors.As and problem.CodeOf see the domain error.
func (r refusal) Unwrap() error { return r.err }

func refuse(e *problem.Error) error { return refusal{e} }

// refusalOf returns the domain error when err is a definitive refusal.
func refusalOf(err error) (*problem.Error, bool) {
	var r refusal
	if errors.As(err, &r) {
		return r.err, true
	}
	return nil, false
}
