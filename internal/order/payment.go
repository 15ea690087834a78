package order

// What the order use cases know of money: the payments an intent asks the
// payment channel for, the channel as they call it, and how they call it.
// How a payment intent runs is payment_intent.go.

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/payment"
)

// PaymentKind says which way money moves.
type PaymentKind string

// Payment kinds.
const (
	KindCharge PaymentKind = "charge"
	KindRefund PaymentKind = "refund"
)

// PaymentStatus is what we know of a money movement at the channel.
type PaymentStatus string

// Payment statuses. Pending means the verdict is not known yet: the channel
// may or may not have acted, and only a query by ChannelKey can tell.
const (
	PaymentPending   PaymentStatus = "pending"
	PaymentSucceeded PaymentStatus = "succeeded"
	PaymentFailed    PaymentStatus = "failed"
)

// Payment is one charge or refund that an intent asked the channel for.
type Payment struct {
	ID            uuid.UUID `gorm:"type:uuid;primaryKey"`
	OrderID       uuid.UUID `gorm:"type:uuid"`
	TenantID      string
	Kind          PaymentKind
	Status        PaymentStatus
	Amount        int64
	Currency      string
	PaymentMethod *string
	// ChannelKey is the stable downstream idempotency key of the intent.
	ChannelKey string
	ChannelRef *string
	// RefundOf is, for a refund, the channel's id of the charge it returns.
	RefundOf       *string
	Operation      string
	IdempotencyKey string
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

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
	// RetryAfter is what a client is told to wait after an unknown verdict;
	// the sweeper resumes the intent itself after that if nobody retries.
	// After a reply in a status that proves no outcome it doubles with each
	// attempt, up to five minutes (askAgainAfter).
	RetryAfter time.Duration
	// ChannelKeyWindow is how long the channel is trusted to remember an
	// idempotency key (an acquirer's keys expire: a day is common). A call
	// whose deadline falls past it, counted from the payment's first
	// attempt, asks the channel what it holds under the key before sending
	// anything: past it, the same key sent again could move money a second
	// time (keywindow.go). Zero: always ask first.
	ChannelKeyWindow time.Duration
	// PendingCheckEvery is how often the sweeper asks the channel about a
	// charge it took on to finish later, if no webhook told its verdict
	// first (payment_later.go). Zero: a minute.
	PendingCheckEvery time.Duration
	// MaxChannelCalls bounds the intents at the channel at once (0: no
	// bound). One beyond it is shed in phase 1 with 503 and Retry-After,
	// before anything is recorded; see channelSlot. NewService reads it
	// once.
	MaxChannelCalls int
}
