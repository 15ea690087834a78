// Package order is the order capability: the Order entity and its lifecycle
// table, its storage, and the use cases (create, pay, cancel, ship, deliver)
// that each run exactly once per idempotency key.
package order

import (
	"database/sql/driver"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/problem"
)

// Operation names, the middle part of every idempotency scope.
const (
	OpCreate  = "order.create"
	OpPay     = "order.pay"
	OpCancel  = "order.cancel"
	OpShip    = "order.ship"
	OpDeliver = "order.deliver"
)

// Operations lists every idempotent order operation.
var Operations = []string{OpCreate, OpPay, OpCancel, OpShip, OpDeliver}

// MoneyOperations move money through the payment channel: their records are
// archived before they are deleted. A cancel may refund.
var MoneyOperations = []string{OpPay, OpCancel}

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

// ErrNotFound is the answer for an order that does not exist for the
// caller's tenant, whether or not another tenant has one with that id.
func errNotFound(id string) error {
	return problem.Errorf(problem.OrderNotFound, "No order %s exists.", id)
}
