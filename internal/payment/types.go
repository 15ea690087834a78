// Package payment holds the wire types of the payment channel and the HTTP
// client the order service uses to charge and refund through it.
package payment

import "time"

// Charge statuses: a charge is made or declined, at once or, when the
// channel takes it on as pending, later. These three are the charge's
// outcomes the order service knows, and a charge that requires action is
// pending by another name; any other status a channel may send ("failed",
// "processing", one added later) proves neither, and the service asks
// again later rather than take it for an outcome.
const (
	// StatusSucceeded marks a charge or refund that moved money.
	StatusSucceeded = "succeeded"
	// StatusDeclined marks a charge the acquirer refused (402).
	StatusDeclined = "declined"
	// StatusPending marks a charge the channel took on (202) and settles
	// later, and a refund under way; its outcome comes by webhook or by a
	// lookup of its key.
	StatusPending = "pending"
	// StatusRequiresAction marks a charge that waits for the customer (a
	// 3-D Secure challenge): taken on (202), neither made nor declined yet;
	// its outcome comes as a pending charge's does.
	StatusRequiresAction = "requires_action"
)

// Test tokens accepted as payment_method by the mock channel.
const (
	// MethodOK succeeds.
	MethodOK = "pm_ok"
	// MethodDeclined is declined with 402.
	MethodDeclined = "pm_declined"
	// MethodLostResponse charges, but the first response per key is lost.
	MethodLostResponse = "pm_lost_response"
	// MethodUnavailableOnce answers 503 before charging on the first attempt per key.
	MethodUnavailableOnce = "pm_unavailable_once"
	// MethodSlow succeeds after a delay.
	MethodSlow = "pm_slow"
	// MethodRefundRefused charges, but every refund of the charge is refused (422 refund_refused).
	MethodRefundRefused = "pm_refund_refused"
	// MethodRefundPending charges; every refund of the charge is pending
	// at first and succeeds after PAYMENT_ASYNC_DELAY.
	MethodRefundPending = "pm_refund_pending"
	// MethodRefundFailed charges; every refund of the charge is made with
	// status failed: nothing is refunded.
	MethodRefundFailed = "pm_refund_failed"
)

// Methods lists every test token the channel accepts as payment_method.
var Methods = []string{MethodOK, MethodDeclined, MethodLostResponse, MethodUnavailableOnce, MethodSlow, MethodRefundRefused,
	MethodRefundPending, MethodRefundFailed}

// Charge is a charge as the channel reports it.
type Charge struct {
	ID             string    `json:"id"`
	Status         string    `json:"status"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	Reference      string    `json:"reference"`
	PaymentMethod  string    `json:"payment_method"`
	IdempotencyKey string    `json:"idempotency_key"`
	CreatedAt      time.Time `json:"created_at"`
}

// ChargeRequest is the body of POST /v1/charges.
type ChargeRequest struct {
	Amount        int64  `json:"amount"`
	Currency      string `json:"currency"`
	Reference     string `json:"reference"`
	PaymentMethod string `json:"payment_method"`
}

// Refund is a refund as the channel reports it.
type Refund struct {
	ID             string    `json:"id"`
	ChargeID       string    `json:"charge_id"`
	Status         string    `json:"status"`
	Amount         int64     `json:"amount"`
	IdempotencyKey string    `json:"idempotency_key"`
	CreatedAt      time.Time `json:"created_at"`
}

// RefundRequest is the body of POST /v1/refunds.
type RefundRequest struct {
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
}

// Result is a definitive answer of the channel to a POST.
type Result[T any] struct {
	// Value is the charge or refund the channel holds for the key.
	Value T
	// Replayed is true when the channel answered from its idempotency record
	// (Idempotent-Replayed: true): a downstream duplicate it absorbed.
	Replayed bool
}

// Test tokens the channel takes on (202) and settles after
// PAYMENT_ASYNC_DELAY, telling the outcome by webhook and by lookup.
const (
	// MethodAsyncOK is pending, then succeeds.
	MethodAsyncOK = "pm_async_ok"
	// MethodAsyncDeclined is pending, then declined.
	MethodAsyncDeclined = "pm_async_declined"
	// MethodRequiresAction requires action (the customer's), then succeeds.
	MethodRequiresAction = "pm_requires_action"
)

// AsyncMethods lists the test tokens the channel settles later; the channel
// accepts them as well as Methods.
var AsyncMethods = []string{MethodAsyncOK, MethodAsyncDeclined, MethodRequiresAction}

// StatusFailed marks a refund that returned nothing: one made with
// pm_refund_failed, or the refund in a refund.failed event of one the
// channel refused (422 refund_refused), which it keeps no refund for.
const StatusFailed = "failed"

// The types of the channel's webhook events, one for each outcome of a
// charge or refund; the event's data is the charge or refund.
const (
	EventChargeSucceeded = "charge.succeeded"
	EventChargeDeclined  = "charge.declined"
	EventRefundSucceeded = "refund.succeeded"
	EventRefundFailed    = "refund.failed"
)
