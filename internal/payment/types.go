// Package payment holds the wire types of the payment channel and the HTTP
// client the order service uses to charge and refund through it.
package payment

import "time"

// Charge statuses: a charge is either made or declined, never pending.
const (
	// StatusSucceeded marks a charge or refund that moved money.
	StatusSucceeded = "succeeded"
	// StatusDeclined marks a charge the acquirer refused (402).
	StatusDeclined = "declined"
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
	// MethodRefundRefused succeeds, but every refund of the charge is refused with 422.
	MethodRefundRefused = "pm_refund_refused"
)

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
