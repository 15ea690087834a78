// Package problem is the service's small error vocabulary: an Error carries a
// stable Code, each Code has exactly one HTTP status, and Render turns any
// error into an RFC 9457 application/problem+json document.
package problem

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Code is a stable, documented error name that clients can switch on.
type Code string

// The codes of the contract. Each maps to one status in statusOf.
const (
	InvalidRequest       Code = "invalid_request"
	KeyMissing           Code = "idempotency_key_missing"
	KeyInvalid           Code = "idempotency_key_invalid"
	Unauthenticated      Code = "unauthenticated"
	PaymentDeclined      Code = "payment_declined"
	PaymentRefused       Code = "payment_refused"
	RefundRefused        Code = "refund_refused"
	OrderNotFound        Code = "order_not_found"
	NotFound             Code = "not_found"
	MethodNotAllowed     Code = "method_not_allowed"
	RequestInProgress    Code = "request_in_progress"
	InvalidTransition    Code = "invalid_transition"
	PayloadTooLarge      Code = "payload_too_large"
	UnsupportedMediaType Code = "unsupported_media_type"
	KeyReused            Code = "idempotency_key_reused"
	Internal             Code = "internal"
	ServiceUnavailable   Code = "service_unavailable"
)

var statusOf = map[Code]int{
	InvalidRequest:       http.StatusBadRequest,
	KeyMissing:           http.StatusBadRequest,
	KeyInvalid:           http.StatusBadRequest,
	Unauthenticated:      http.StatusUnauthorized,
	PaymentDeclined:      http.StatusPaymentRequired,
	PaymentRefused:       http.StatusPaymentRequired,
	RefundRefused:        http.StatusConflict,
	OrderNotFound:        http.StatusNotFound,
	NotFound:             http.StatusNotFound,
	MethodNotAllowed:     http.StatusMethodNotAllowed,
	RequestInProgress:    http.StatusConflict,
	InvalidTransition:    http.StatusConflict,
	PayloadTooLarge:      http.StatusRequestEntityTooLarge,
	UnsupportedMediaType: http.StatusUnsupportedMediaType,
	KeyReused:            http.StatusUnprocessableEntity,
	Internal:             http.StatusInternalServerError,
	ServiceUnavailable:   http.StatusServiceUnavailable,
}

var titleOf = map[Code]string{
	InvalidRequest:       "The request is invalid",
	KeyMissing:           "Idempotency-Key is required",
	KeyInvalid:           "Idempotency-Key is malformed",
	Unauthenticated:      "Missing or unknown API key",
	PaymentDeclined:      "The payment was declined",
	PaymentRefused:       "The payment channel refused the charge",
	RefundRefused:        "The payment channel refused the refund",
	OrderNotFound:        "Order not found",
	NotFound:             "Not found",
	MethodNotAllowed:     "Method not allowed",
	RequestInProgress:    "A request with this key is in progress",
	InvalidTransition:    "The order cannot make this transition",
	PayloadTooLarge:      "The request body is too large",
	UnsupportedMediaType: "Unsupported media type",
	KeyReused:            "Idempotency-Key reused with different parameters",
	Internal:             "Internal error",
	ServiceUnavailable:   "Service temporarily unavailable",
}

// Status is the HTTP status of code; unknown codes are 500.
func Status(code Code) int {
	if s, ok := statusOf[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Error is an error with a Code a client can act on. Detail is shown to the
// client, so it never holds SQL, stack traces or constraint names.
type Error struct {
	Code   Code
	Detail string
	// RetryAfter, when set, is sent as the Retry-After header (whole seconds).
	RetryAfter time.Duration
	// Extensions are extra members of the problem document, e.g. "field".
	Extensions map[string]any
}

// Errorf builds an Error with a formatted detail.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Detail }

// Is matches any *Error with the same Code, so errors.Is(err, problem.Errorf(problem.OrderNotFound, ""))
// and the sentinel style both work.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Code == e.Code
}

// With returns a copy of e with one extension member added.
func (e *Error) With(key string, value any) *Error {
	c := *e
	c.Extensions = make(map[string]any, len(e.Extensions)+1)
	for k, v := range e.Extensions {
		c.Extensions[k] = v
	}
	c.Extensions[key] = value
	return &c
}

// CodeOf returns err's Code, or Internal when err carries none.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Internal
}

// As returns err as an *Error, turning anything without a code into an
// Internal error whose detail hides the cause.
func As(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: Internal, Detail: "An unexpected error occurred."}
}

// ContentType is the media type of a problem document.
const ContentType = "application/problem+json"

// Render returns the status and the problem+json body for err.
func Render(err error) (status int, body []byte) {
	e := As(err)
	status = Status(e.Code)
	doc := make(map[string]any, 5+len(e.Extensions))
	for k, v := range e.Extensions {
		doc[k] = v
	}
	doc["type"] = "urn:orderservice:problem:" + string(e.Code)
	doc["title"] = titleOf[e.Code]
	doc["status"] = status
	doc["detail"] = e.Detail
	doc["code"] = e.Code
	body, mErr := json.Marshal(doc)
	if mErr != nil { // only a non-marshalable extension gets here
		body = []byte(`{"type":"urn:orderservice:problem:internal","title":"Internal error","status":500,"code":"internal"}`)
		status = http.StatusInternalServerError
	}
	return status, body
}
