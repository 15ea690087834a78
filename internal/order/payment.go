package order

import (
	"time"

	"github.com/google/uuid"
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

// Payment statuses. Pending means the outcome is not known yet: the channel
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
