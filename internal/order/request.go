package order

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/orderservice/orderservice/internal/decode"
	"github.com/orderservice/orderservice/internal/problem"
)

// Limits of a create request, as api/openapi.yaml states them. Text limits
// count characters (Unicode code points), as JSON Schema's maxLength and
// PostgreSQL's length() do, not bytes.
const (
	maxItems         = 100
	maxQuantity      = 1000
	maxMetadata      = 20
	maxMetadataKey   = 64
	maxMetadataValue = 500
	maxIDLength      = 100
	maxSKULength     = 64
	// maxUnitPrice keeps every total exact: 100 items × 1000 × 10^10 is
	// 10^15 minor units, far from int64's limit and below 2^53, so a total
	// is exact in any JSON reader, JavaScript's included.
	maxUnitPrice = 10_000_000_000
)

// CreateRequest is the body of POST /v1/orders. Server-owned fields (id,
// status, total, tenant, timestamps) have no place here; a decoder that
// rejects unknown fields keeps them out.
type CreateRequest struct {
	CustomerID string            `json:"customer_id"`
	Currency   string            `json:"currency"`
	Items      []ItemRequest     `json:"items"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// ClientTraceID is trace-only: accepted, logged, never fingerprinted.
	ClientTraceID string `json:"client_trace_id,omitempty"`
}

// ItemRequest is one line of a create request.
type ItemRequest struct {
	SKU       string `json:"sku"`
	Quantity  int    `json:"quantity"`
	UnitPrice int64  `json:"unit_price"`
}

// UnmarshalJSONFrom reads an item and rejects one without its unit_price:
// 0 is a price (a free item), so a missing one must not read as 0. (A
// missing sku or quantity is rejected by normalize: no sku is empty, no
// quantity 0.)
func (it *ItemRequest) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	var item struct {
		SKU       string `json:"sku"`
		Quantity  int    `json:"quantity"`
		UnitPrice *int64 `json:"unit_price"`
	}
	if err := json.UnmarshalDecode(dec, &item); err != nil {
		return err
	}
	if item.UnitPrice == nil {
		return decode.MissingField("unit_price")
	}
	*it = ItemRequest{SKU: item.SKU, Quantity: item.Quantity, UnitPrice: *item.UnitPrice}
	return nil
}

// ShipRequest is the body of POST /v1/orders/{id}/ship.
type ShipRequest struct {
	Carrier        string `json:"carrier"`
	TrackingNumber string `json:"tracking_number"`
}

// CancelRequest is the optional body of POST /v1/orders/{id}/cancel.
type CancelRequest struct {
	Reason string `json:"reason,omitempty"`
}

// DeliverRequest is the optional, empty body of POST /v1/orders/{id}/deliver.
type DeliverRequest struct{}

// PayRequest is the body of POST /v1/orders/{id}/pay.
type PayRequest struct {
	PaymentMethod string `json:"payment_method"`
}

func invalid(field, format string, args ...any) error {
	return problem.Errorf(problem.InvalidRequest, "%s: %s", field, fmt.Sprintf(format, args...)).With("field", field)
}

// normalize validates r and returns the canonical form of its business
// fields, the one that is stored and fingerprinted: trimmed strings, an
// upper-case currency and items sorted, so that the same purchase written
// in another order or case is recognised as the same intent.
func (r CreateRequest) normalize() (CreateRequest, int64, error) {
	n := CreateRequest{
		CustomerID: strings.TrimSpace(r.CustomerID),
		Currency:   strings.TrimSpace(r.Currency),
		Metadata:   r.Metadata,
	}
	if err := checkText("customer_id", n.CustomerID, maxIDLength); err != nil {
		return n, 0, err
	}
	if utf8.RuneCountInString(r.ClientTraceID) > maxIDLength {
		return n, 0, invalid("client_trace_id", "must be at most %d characters", maxIDLength)
	}
	// Check the ASCII letters before upper-casing: Unicode case mapping
	// would turn look-alikes such as "uſd" into "USD".
	if len(n.Currency) != 3 || strings.Trim(n.Currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") != "" {
		return n, 0, invalid("currency", "must be a three-letter ISO 4217 code")
	}
	n.Currency = strings.ToUpper(n.Currency)
	if len(r.Items) < 1 || len(r.Items) > maxItems {
		return n, 0, invalid("items", "must hold between 1 and %d items", maxItems)
	}
	var total int64
	for i, it := range r.Items {
		field := fmt.Sprintf("items[%d]", i)
		it.SKU = strings.TrimSpace(it.SKU)
		if err := checkText(field+".sku", it.SKU, maxSKULength); err != nil {
			return n, 0, err
		}
		if it.Quantity < 1 || it.Quantity > maxQuantity {
			return n, 0, invalid(field+".quantity", "must be between 1 and %d", maxQuantity)
		}
		if it.UnitPrice < 0 || it.UnitPrice > maxUnitPrice {
			return n, 0, invalid(field+".unit_price", "must be between 0 and %d minor units", maxUnitPrice)
		}
		total += it.UnitPrice * int64(it.Quantity) // at most 10^15: see maxUnitPrice
		n.Items = append(n.Items, it)
	}
	slices.SortStableFunc(n.Items, func(a, b ItemRequest) int {
		return strings.Compare(fmt.Sprintf("%s\x00%020d\x00%04d", a.SKU, a.UnitPrice, a.Quantity),
			fmt.Sprintf("%s\x00%020d\x00%04d", b.SKU, b.UnitPrice, b.Quantity))
	})
	if len(n.Metadata) > maxMetadata {
		return n, 0, invalid("metadata", "may hold at most %d entries", maxMetadata)
	}
	for k, v := range n.Metadata {
		if err := checkText("metadata key", k, maxMetadataKey); err != nil {
			return n, 0, err
		}
		if utf8.RuneCountInString(v) > maxMetadataValue || !utf8.ValidString(v) || strings.ContainsFunc(v, isControl) {
			return n, 0, invalid("metadata."+k, "must be text of at most %d characters without control characters", maxMetadataValue)
		}
	}
	if len(n.Metadata) == 0 {
		n.Metadata = nil // absent and empty metadata are the same intent
	}
	return n, total, nil
}

func (r ShipRequest) normalize() (ShipRequest, error) {
	n := ShipRequest{Carrier: strings.TrimSpace(r.Carrier), TrackingNumber: strings.TrimSpace(r.TrackingNumber)}
	if err := checkText("carrier", n.Carrier, maxIDLength); err != nil {
		return n, err
	}
	return n, checkText("tracking_number", n.TrackingNumber, maxIDLength)
}

func (r CancelRequest) normalize() (CancelRequest, error) {
	n := CancelRequest{Reason: strings.TrimSpace(r.Reason)}
	if utf8.RuneCountInString(n.Reason) > maxMetadataValue || !utf8.ValidString(n.Reason) || strings.ContainsFunc(n.Reason, isControl) {
		return n, invalid("reason", "must be text of at most %d characters without control characters", maxMetadataValue)
	}
	return n, nil
}

// checkText requires 1..max characters of valid UTF-8 without control
// characters.
func checkText(field, s string, max int) error {
	if s == "" {
		return invalid(field, "is required")
	}
	if utf8.RuneCountInString(s) > max {
		return invalid(field, "must be at most %d characters", max)
	}
	if !utf8.ValidString(s) || strings.ContainsFunc(s, isControl) {
		return invalid(field, "must be text without control characters")
	}
	return nil
}

// isControl is a C0 or C1 control character or DEL, NUL included (which
// PostgreSQL cannot store in text or jsonb anyway).
func isControl(r rune) bool { return unicode.IsControl(r) }
