package client

import "time"

// Status is the state of an order in the service's state machine.
type Status string

// The order statuses.
const (
	// StatusCreated is a new, unpaid order.
	StatusCreated Status = "CREATED"
	// StatusPaymentPending is an order whose charge is being made.
	StatusPaymentPending Status = "PAYMENT_PENDING"
	// StatusPaid is an order whose charge succeeded.
	StatusPaid Status = "PAID"
	// StatusPaymentFailed is an order whose charge was declined; it may be paid again under a new key.
	StatusPaymentFailed Status = "PAYMENT_FAILED"
	// StatusShipped is a paid order handed to a carrier.
	StatusShipped Status = "SHIPPED"
	// StatusDelivered is a shipped order that arrived.
	StatusDelivered Status = "DELIVERED"
	// StatusCancelled is a cancelled order (refunded first if it was paid).
	StatusCancelled Status = "CANCELLED"
)

// Order is an order as the service reports it.
type Order struct {
	// ID is the order's id, a UUIDv7 chosen by the service.
	ID string `json:"id"`
	// CustomerID is the customer the order belongs to.
	CustomerID string `json:"customer_id"`
	// Status is the order's current state.
	Status Status `json:"status"`
	// Currency is the ISO 4217 code of every amount of the order.
	Currency string `json:"currency"`
	// Items are the order's lines.
	Items []Item `json:"items"`
	// TotalAmount is the sum of the line totals, in minor units.
	TotalAmount int64 `json:"total_amount"`
	// Metadata is the caller's small string map, empty when none was given.
	Metadata map[string]string `json:"metadata"`
	// Payment summarises the order's last charge, nil before any.
	Payment *Payment `json:"payment"`
	// Shipment is set once the order shipped.
	Shipment *Shipment `json:"shipment"`
	// Version increases with every change of the order.
	Version int64 `json:"version"`
	// CreatedAt is when the order was created.
	CreatedAt time.Time `json:"created_at"`
	// UpdatedAt is when the order last changed.
	UpdatedAt time.Time `json:"updated_at"`
}

// Item is one line of an order.
type Item struct {
	// SKU names the product.
	SKU string `json:"sku"`
	// Quantity is how many units were ordered.
	Quantity int `json:"quantity"`
	// UnitPrice is the price of one unit, in minor units.
	UnitPrice int64 `json:"unit_price"`
	// LineTotal is Quantity × UnitPrice, computed by the service.
	LineTotal int64 `json:"line_total"`
}

// Payment is the summary of an order's money movements.
type Payment struct {
	// Status is "succeeded", "declined", "pending" or "refunded".
	Status string `json:"status"`
	// Amount is the amount charged, in minor units.
	Amount int64 `json:"amount"`
	// Currency is the ISO 4217 code of Amount.
	Currency string `json:"currency"`
	// PaymentMethod is the token the order was paid with.
	PaymentMethod string `json:"payment_method,omitempty"`
	// ChargeID is the payment channel's id of the charge.
	ChargeID string `json:"charge_id,omitempty"`
	// RefundID is the payment channel's id of the refund, once refunded.
	RefundID string `json:"refund_id,omitempty"`
}

// Shipment says how an order was shipped.
type Shipment struct {
	// Carrier is the carrier's name.
	Carrier string `json:"carrier"`
	// TrackingNumber is the carrier's tracking number.
	TrackingNumber string `json:"tracking_number"`
}

// OrderPage is one page of a listing, newest order first.
type OrderPage struct {
	// Orders are the orders of the page.
	Orders []Order `json:"orders"`
	// NextCursor fetches the next page; empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// OrderEvent is one entry of an order's history: an operation and the
// idempotency key of the intent that made it.
type OrderEvent struct {
	// ID orders the events of the service.
	ID int64 `json:"id"`
	// OrderID is the order the event belongs to.
	OrderID string `json:"order_id"`
	// Event is the state machine event: create, pay, cancel, ship, deliver, ….
	Event string `json:"event"`
	// Operation is the idempotent operation, e.g. "order.pay".
	Operation string `json:"operation"`
	// IdempotencyKey is the key of the request that made the change.
	IdempotencyKey string `json:"idempotency_key"`
	// FromStatus is the status before the event, empty for create.
	FromStatus Status `json:"from_status"`
	// ToStatus is the status after the event.
	ToStatus Status `json:"to_status"`
	// CreatedAt is when the event happened.
	CreatedAt time.Time `json:"created_at"`
}

// IdempotencyRecord is what the service remembers about one intent.
type IdempotencyRecord struct {
	// Operation is the operation the key was used for, e.g. "order.create".
	Operation string `json:"operation"`
	// IdempotencyKey is the key.
	IdempotencyKey string `json:"idempotency_key"`
	// State is PROCESSING, SUCCEEDED, FAILED_RETRYABLE or FAILED_FINAL.
	State string `json:"state"`
	// Fingerprint is the hex SHA-256 of the request's normalised business fields.
	Fingerprint string `json:"fingerprint"`
	// ResourceID is the order the intent acted on or created, if any.
	ResourceID string `json:"resource_id"`
	// ResponseStatus is the stored HTTP status, nil while none is stored.
	ResponseStatus *int `json:"response_status"`
	// Attempts counts the executions the service started for the key.
	Attempts int `json:"attempts"`
	// LeaseToken fences a superseded owner of the record.
	LeaseToken int64 `json:"lease_token"`
	// LeaseExpiresAt is when a PROCESSING owner's lease ends.
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	// CreatedAt is when the key was first seen.
	CreatedAt time.Time `json:"created_at"`
	// CompletedAt is when the outcome was stored.
	CompletedAt *time.Time `json:"completed_at"`
	// ExpiresAt is the earliest time the record may be removed.
	ExpiresAt *time.Time `json:"expires_at"`
}

// CreateOrderRequest is the body of a create call. The service computes the
// total and owns the id, status and timestamps.
type CreateOrderRequest struct {
	// CustomerID names the customer (1–100 characters).
	CustomerID string `json:"customer_id"`
	// Currency is an ISO 4217 code, e.g. "EUR".
	Currency string `json:"currency"`
	// Items are 1–100 lines.
	Items []ItemRequest `json:"items"`
	// Metadata is an optional small string map.
	Metadata map[string]string `json:"metadata,omitempty"`
	// ClientTraceID is trace-only: logged by the service, never part of the
	// fingerprint, so it may differ between attempts of one intent.
	ClientTraceID string `json:"client_trace_id,omitempty"`
}

// ItemRequest is one line of a create call.
type ItemRequest struct {
	// SKU names the product.
	SKU string `json:"sku"`
	// Quantity is 1–1000.
	Quantity int `json:"quantity"`
	// UnitPrice is the price of one unit in minor units, >= 0.
	UnitPrice int64 `json:"unit_price"`
}

// PayRequest is the body of a pay call; the amount is the order total.
type PayRequest struct {
	// PaymentMethod is a payment channel token, e.g. "pm_ok".
	PaymentMethod string `json:"payment_method"`
}

// CancelRequest is the body of a cancel call.
type CancelRequest struct {
	// Reason is an optional note.
	Reason string `json:"reason,omitempty"`
}

// ShipRequest is the body of a ship call.
type ShipRequest struct {
	// Carrier is the carrier's name.
	Carrier string `json:"carrier"`
	// TrackingNumber is the carrier's tracking number.
	TrackingNumber string `json:"tracking_number"`
}

// ListOptions select and page a listing; zero values are left out.
type ListOptions struct {
	// Limit is the page size, 1–100 (the service's default is 20).
	Limit int
	// Cursor is OrderPage.NextCursor of the previous page.
	Cursor string
	// Status keeps only orders in this status.
	Status Status
	// CustomerID keeps only this customer's orders.
	CustomerID string
}
