package order

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/orderservice/orderservice/internal/idempotency"
)

// orderJSON is the wire form of an order (see api/openapi.yaml, Order).
type orderJSON struct {
	ID          string            `json:"id"`
	CustomerID  string            `json:"customer_id"`
	Status      Status            `json:"status"`
	Currency    string            `json:"currency"`
	Items       []itemJSON        `json:"items"`
	TotalAmount int64             `json:"total_amount"`
	Metadata    map[string]string `json:"metadata"`
	Payment     *paymentJSON      `json:"payment"`
	Shipment    *shipmentJSON     `json:"shipment"`
	Version     int64             `json:"version"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
}

type itemJSON struct {
	SKU       string `json:"sku"`
	Quantity  int    `json:"quantity"`
	UnitPrice int64  `json:"unit_price"`
	LineTotal int64  `json:"line_total"`
}

type paymentJSON struct {
	Status        string `json:"status"`
	Amount        int64  `json:"amount"`
	Currency      string `json:"currency"`
	PaymentMethod string `json:"payment_method,omitempty"`
	ChargeID      string `json:"charge_id,omitempty"`
	RefundID      string `json:"refund_id,omitempty"`
}

type shipmentJSON struct {
	Carrier        string `json:"carrier"`
	TrackingNumber string `json:"tracking_number"`
}

type historyJSON struct {
	ID             int64     `json:"id"`
	OrderID        string    `json:"order_id"`
	Event          Event     `json:"event"`
	Operation      string    `json:"operation"`
	IdempotencyKey string    `json:"idempotency_key"`
	FromStatus     Status    `json:"from_status"`
	ToStatus       Status    `json:"to_status"`
	CreatedAt      time.Time `json:"created_at"`
}

// MarshalJSON writes the wire form of the order.
func (o *Order) MarshalJSON() ([]byte, error) {
	v := orderJSON{
		ID: o.ID.String(), CustomerID: o.CustomerID, Status: o.Status, Currency: o.Currency,
		Items: make([]itemJSON, len(o.Items)), TotalAmount: o.TotalAmount, Metadata: o.Metadata,
		Version: o.Version, CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt,
	}
	if v.Metadata == nil {
		v.Metadata = map[string]string{}
	}
	for i, it := range o.Items {
		v.Items[i] = itemJSON{SKU: it.SKU, Quantity: it.Quantity, UnitPrice: it.UnitPrice, LineTotal: it.LineTotal}
	}
	if o.Carrier != nil {
		v.Shipment = &shipmentJSON{Carrier: *o.Carrier, TrackingNumber: deref(o.TrackingNumber)}
	}
	v.Payment = paymentSummary(o.payments)
	return Wire(v)
}

// paymentSummary condenses an order's money movements: the last charge, and
// "refunded" once a refund of it succeeded.
func paymentSummary(payments []Payment) *paymentJSON {
	var sum *paymentJSON
	for _, p := range payments {
		switch p.Kind {
		case KindCharge:
			sum = &paymentJSON{Status: string(p.Status), Amount: p.Amount, Currency: p.Currency,
				PaymentMethod: deref(p.PaymentMethod), ChargeID: deref(p.ChannelRef)}
			if p.Status == PaymentFailed {
				sum.Status = "declined"
			}
		case KindRefund:
			if sum != nil && p.Status == PaymentSucceeded {
				sum.Status, sum.RefundID = "refunded", deref(p.ChannelRef)
			}
		}
	}
	return sum
}

// MarshalJSON writes the wire form of a history entry.
func (h HistoryEntry) MarshalJSON() ([]byte, error) {
	return Wire(historyJSON{ID: h.ID, OrderID: h.OrderID.String(), Event: h.Event, Operation: h.Operation,
		IdempotencyKey: h.IdempotencyKey, FromStatus: h.FromStatus, ToStatus: h.ToStatus, CreatedAt: h.CreatedAt})
}

// created is the result of the intent that made o: its representation,
// stored so that every replay shows the order as it was then.
func created(o *Order) (idempotency.Result, error) {
	body, err := Wire(o)
	return idempotency.Created(o.ID.String(), body), err
}

// done is the result of an intent that acted on o.
func done(o *Order) (idempotency.Result, error) {
	body, err := Wire(o)
	return idempotency.Done(o.ID.String(), body), err
}

// accepted is the result of an intent that took o on and finishes later.
func accepted(o *Order) (idempotency.Result, error) {
	body, err := Wire(o)
	return idempotency.Accepted(o.ID.String(), body), err
}

// Wire writes v as the JSON a client reads: `<`, `>` and `&` as they are
// (`"customer_id":"A&B"`), not HTML-escaped (`A\u0026B`) as json.Marshal
// writes them; a body is JSON for a program, never markup in a page. The
// bodies of answers and events are written this way, so the bytes a
// replay sends again are these.
func Wire(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
