package order

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/orderservice/orderservice/internal/problem"
)

// The order's own error codes: the final answers of an order use case, in
// the words of the contract. Their HTTP statuses are internal/httpapi's
// business.
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
	return final(problem.Errorf(CodeNotFound, "No order %s exists.", id))
}

// errNoSuchID is the answer for a path that names no order at all.
func errNoSuchID() error {
	return final(problem.Errorf(CodeNotFound, "No order exists with this id."))
}

// errTransition names the current status and the event the lifecycle
// forbids, and why: a guard's reason, or what the lifecycle table lets a
// client do from that status instead ("A PAID order cannot be paid; it can
// be shipped or cancelled.").
func errTransition(from Status, ev Event, why error) error {
	reason := fmt.Sprintf("A %s order cannot be %s", from, asked(ev)) // every status begins with a consonant
	if why != nil {
		reason += ": " + why.Error() + "."
	} else {
		reason += "; " + whatCanHappen(from) + "."
	}
	return final(problem.Errorf(CodeInvalidTransition, "%s", reason).With("current_status", from).With("event", ev))
}

// requested are the events a client's request fires, as an error says
// what was asked of the order: a paid order's cancel is its refund.
var requested = map[Event]string{
	EventPay: "paid", EventShip: "shipped", EventDeliver: "delivered", EventCancel: "cancelled", EventRefund: "cancelled",
}

func asked(ev Event) string {
	if done, ok := requested[ev]; ok {
		return done
	}
	return "moved by " + string(ev)
}

// whatCanHappen says, from the lifecycle table, what a client may still
// ask of an order in status s.
func whatCanHappen(s Status) string {
	var can []string
	waits := false
	for _, e := range lifecycle {
		if !slices.Contains(e.Src, string(s)) {
			continue
		}
		done, byClient := requested[Event(e.Name)]
		switch {
		case !byClient: // only the channel's verdict fires it
			waits = true
		case !slices.Contains(can, done):
			can = append(can, done)
		}
	}
	switch {
	case len(can) > 0:
		if n := len(can); n > 1 {
			return "it can be " + strings.Join(can[:n-1], ", ") + " or " + can[n-1]
		}
		return "it can be " + can[0]
	case waits:
		return "it waits for the payment channel's verdict"
	}
	return "nothing more can happen to it"
}

// errKeyRanBefore is the final answer to a money intent whose key moved
// money on this order before and whose record has since expired.
func errKeyRanBefore(op string) error {
	return final(problem.Errorf(problem.KeyReused,
		"This Idempotency-Key already ran %s, and its record has expired; use a new key for a new intent.", op))
}

// errPostponed says the channel's answer is not known yet: a retry with the
// same key, or the sweeper, finishes the intent.
func errPostponed(retryAfter time.Duration) error {
	return &problem.Error{Code: problem.ServiceUnavailable, RetryAfter: retryAfter,
		Detail: "The payment channel's answer is not known yet; retry with the same Idempotency-Key."}
}

// errChannelBusy sheds a money intent in phase 1 when MaxChannelCalls
// intents are at the channel already; phase 1 rolls back, so nothing is
// recorded and the same key is a fresh attempt.
func errChannelBusy() error {
	return &problem.Error{Code: problem.ServiceUnavailable, RetryAfter: time.Second,
		Detail: "The payment channel is at capacity and this request was not started: nothing of it was recorded, and a record of an earlier attempt with the same Idempotency-Key is untouched. Retry with the same key."}
}

// errSuperseded answers a request whose lease was taken over while it
// worked: the new owner will record the result, which a retry then replays.
func errSuperseded() error {
	return &problem.Error{Code: problem.RequestInProgress, RetryAfter: time.Second,
		Detail: "This intent was taken over by another attempt; retry with the same Idempotency-Key to receive its result."}
}

// finalError marks a domain error as the intent's final answer: a use
// case stores it as a failed result (FAILED_FINAL) and replays it like a
// success. Every other error is transient: it rolls the intent back and
// records nothing, so the same key may simply be sent again.
type finalError struct{ err *problem.Error }

func (f finalError) Error() string { return f.err.Error() }

// Unwrap lets errors.As and problem.CodeOf see the domain error.
func (f finalError) Unwrap() error { return f.err }

// final marks e as the intent's final answer.
func final(e *problem.Error) error { return finalError{e} }

// asFinal returns the domain error when err is an intent's final answer.
func asFinal(err error) (*problem.Error, bool) {
	var f finalError
	if errors.As(err, &f) {
		return f.err, true
	}
	return nil, false
}
