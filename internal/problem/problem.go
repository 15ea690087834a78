// Package problem is the service's small error vocabulary, in the style of
// WTF Dial's error.go: an Error carries a stable Code a client can switch on
// and a Detail it can read. The codes here belong to no capability (a request
// is malformed, a key was reused, a dependency is down); a capability
// declares its own codes beside its rules (internal/order/errors.go). Which
// HTTP status and title a code has is decided once, in internal/answer,
// which both doors use.
package problem

import (
	"errors"
	"fmt"
	"time"
)

// Code is a stable, documented error name that clients can switch on.
type Code string

// The codes that belong to no capability.
const (
	InvalidRequest       Code = "invalid_request"
	KeyMissing           Code = "idempotency_key_missing"
	KeyInvalid           Code = "idempotency_key_invalid"
	KeyReused            Code = "idempotency_key_reused"
	RequestInProgress    Code = "request_in_progress"
	Unauthenticated      Code = "unauthenticated"
	NotFound             Code = "not_found"
	MethodNotAllowed     Code = "method_not_allowed"
	PayloadTooLarge      Code = "payload_too_large"
	UnsupportedMediaType Code = "unsupported_media_type"
	Internal             Code = "internal"
	ServiceUnavailable   Code = "service_unavailable"
	QuotaExceeded        Code = "quota_exceeded"
	RequestTimeout       Code = "request_timeout"
)

// Problem types of draft-ietf-httpapi-ratelimit-headers, for the answers
// that are about capacity: a tenant over its quota (429), the service over
// its own (503). Other problems' types are the service's own, from their
// codes.
const (
	TypeQuotaExceeded            = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	TypeTemporaryReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)

// Error is an error with a Code a client can act on. Detail is shown to the
// client, so it never holds SQL, stack traces or constraint names. The JSON
// form is how a definitive failure is stored and replayed.
type Error struct {
	Code   Code   `json:"code"`
	Detail string `json:"detail"`
	// Extensions are extra members of the answer, e.g. "field".
	Extensions map[string]any `json:"extensions,omitempty"`
	// Type, when set, is the problem's type URI instead of the one its
	// code names (one of the Type constants).
	Type string `json:"type,omitempty"`
	// RetryAfter, when set, tells the client when to try again. It is
	// never stored: only transient errors carry it.
	RetryAfter time.Duration `json:"-"`
}

// Errorf builds an Error with a formatted detail.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// Error returns the code and the detail.
func (e *Error) Error() string { return string(e.Code) + ": " + e.Detail }

// Is matches any *Error with the same Code, so
// errors.Is(err, problem.Errorf(problem.NotFound, "")) works.
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
