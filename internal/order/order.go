// Package order is the order capability: the Order entity, its rules and
// lifecycle table, its storage, and the use cases (create, pay, cancel,
// ship, deliver) that each run exactly once per idempotency key. A use case
// returns an idempotency.Result, what came of the intent in words no
// transport owns; internal/httpapi (or any other transport) renders it.
package order

import (
	"database/sql/driver"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
)

// Order is one customer order. Amounts are integer minor units of Currency.
type Order struct {
	ID             uuid.UUID `gorm:"type:uuid;primaryKey"`
	TenantID       string
	CustomerID     string
	Status         Status
	Currency       string
	TotalAmount    int64
	Metadata       Metadata `gorm:"type:jsonb"`
	Carrier        *string
	TrackingNumber *string
	Version        int64
	CreatedAt      time.Time
	UpdatedAt      time.Time
	Items          []Item    `gorm:"foreignKey:OrderID"`
	payments       []Payment `gorm:"-"`
}

// Item is one line of an order.
type Item struct {
	OrderID   uuid.UUID `gorm:"type:uuid;primaryKey"`
	LineNo    int       `gorm:"primaryKey"`
	SKU       string    `gorm:"column:sku"`
	Quantity  int
	UnitPrice int64
	LineTotal int64
}

// TableName tells GORM the table the migration created.
func (Item) TableName() string { return "order_items" }

// HistoryEntry is one row of an order's history: a transition and the
// intent (operation and idempotency key) that caused it.
type HistoryEntry struct {
	ID             int64 `gorm:"primaryKey;->"`
	OrderID        uuid.UUID
	Event          Event
	Operation      string
	IdempotencyKey string
	FromStatus     Status
	ToStatus       Status
	CreatedAt      time.Time
}

// TableName tells GORM the table the migration created.
func (HistoryEntry) TableName() string { return "order_events" }

// Metadata is a small string map stored as jsonb.
type Metadata map[string]string

// Value encodes the map for the jsonb column.
func (m Metadata) Value() (driver.Value, error) {
	if m == nil {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// Scan decodes the jsonb column.
func (m *Metadata) Scan(src any) error {
	var b []byte
	switch v := src.(type) {
	case []byte:
		b = v
	case string:
		b = []byte(v)
	default:
		return errors.New("order: metadata is not jsonb")
	}
	return json.Unmarshal(b, m)
}

// The order's rules: each intent method fires its event in the lifecycle
// table (fsm.go), which forbids an illegal one before anything is written,
// and says what the intent must do next. They do no I/O.

// Pay moves an unpaid order to PAYMENT_PENDING and returns the charge of its
// total, by method, that the payment channel is to make.
func (o *Order) Pay(method string) (Payment, error) {
	if err := o.fire(EventPay); err != nil {
		return Payment{}, err
	}
	return Payment{Kind: KindCharge, Amount: o.TotalAmount, Currency: o.Currency, PaymentMethod: &method}, nil
}

// HoldsMoney reports whether the order is paid, so that cancelling it means
// refunding it first.
func (o *Order) HoldsMoney() bool { return o.Status == StatusPaid }

// Cancel cancels an order that holds no money.
func (o *Order) Cancel() error { return o.fire(EventCancel) }

// Refund moves a paid order to REFUND_PENDING and returns the refund of the
// charge that paid it; the order is CANCELLED once the refund succeeded.
func (o *Order) Refund() (Payment, error) {
	charge := o.paidCharge()
	if err := o.fire(EventRefund); err != nil {
		return Payment{}, err
	}
	if charge == nil || charge.ChannelRef == nil {
		return Payment{}, errors.New("paid order has no succeeded charge to refund")
	}
	return Payment{Kind: KindRefund, Amount: charge.Amount, Currency: charge.Currency, RefundOf: charge.ChannelRef}, nil
}

// Ship moves a paid order to SHIPPED with its shipment details.
func (o *Order) Ship(carrier, trackingNumber string) error {
	if err := o.fire(EventShip); err != nil {
		return err
	}
	o.Carrier, o.TrackingNumber = &carrier, &trackingNumber
	return nil
}

// Deliver moves a shipped order to DELIVERED.
func (o *Order) Deliver() error { return o.fire(EventDeliver) }

// applyReply applies the channel's reply on the pending payment p: the
// order makes the reply's transition (none while the charge is still
// pending) and its loaded payment (which the representation shows) takes
// the reply's status.
func (o *Order) applyReply(p Payment, reply channelReply, at time.Time) (Event, error) {
	ev := reply.event(p.Kind)
	if ev != "" {
		if err := o.fire(ev); err != nil {
			return ev, err
		}
	}
	for i := range o.payments {
		if q := &o.payments[i]; q.ID == p.ID {
			q.Status, q.ChannelRef, q.UpdatedAt = reply.paymentStatus(), reply.channelRef(), at
		}
	}
	return ev, nil
}

// payment is the order's loaded payment id.
func (o *Order) payment(id uuid.UUID) *Payment {
	for i := range o.payments {
		if o.payments[i].ID == id {
			return &o.payments[i]
		}
	}
	return nil
}

// paidCharge is the charge that made the order PAID.
func (o *Order) paidCharge() *Payment {
	for i := len(o.payments) - 1; i >= 0; i-- {
		if p := &o.payments[i]; p.Kind == KindCharge && p.Status == PaymentSucceeded {
			return p
		}
	}
	return nil
}
