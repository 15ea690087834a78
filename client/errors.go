package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Problem codes of the service that callers commonly act on.
const (
	// CodeKeyReused: the key was already used with other parameters (422).
	CodeKeyReused = "idempotency_key_reused"
	// CodeInProgress: the first request with the key is still running (409).
	CodeInProgress = "request_in_progress"
	// CodeInvalidTransition: the order's state forbids the operation (409).
	CodeInvalidTransition = "invalid_transition"
	// CodeOrderNotFound: no such order for this tenant (404).
	CodeOrderNotFound = "order_not_found"
	// CodePaymentDeclined: the payment channel declined the charge (402).
	CodePaymentDeclined = "payment_declined"
	// CodeServiceUnavailable: a transient failure, or the service over its
	// capacity; retry with the same key (503).
	CodeServiceUnavailable = "service_unavailable"
	// CodeQuotaExceeded: the tenant is over one of its quotas; retry with
	// the same key after Retry-After (429).
	CodeQuotaExceeded = "quota_exceeded"
	// CodeRequestTimeout: the body did not arrive in time; send it again,
	// whole, with the same key (408).
	CodeRequestTimeout = "request_timeout"
)

// ProblemError is a non-2xx answer of the service, read from its
// application/problem+json body (RFC 9457). Match it with errors.As.
type ProblemError struct {
	// Status is the HTTP status.
	Status int
	// Code is the problem's stable code, e.g. "idempotency_key_reused";
	// empty when the body was not a problem document (e.g. from a proxy).
	Code string
	// Title is the problem's short title.
	Title string
	// Detail is the problem's human sentence.
	Detail string
	// Type is the problem's type URI.
	Type string
	// RetryAfter is the Retry-After hint; without one, the RateLimit
	// field's t of a policy with nothing left; zero when neither says.
	RetryAfter time.Duration
	// ViolatedPolicies names, for quota_exceeded, the tenant's policies the
	// request broke (draft-ietf-httpapi-ratelimit-headers).
	ViolatedPolicies []string
	// Raw is the response body as received, extension members included.
	Raw []byte
	// Attempts counts the requests the client sent for the call.
	Attempts int
	// Key is the idempotency key those requests carried, empty for reads.
	Key string
}

// Error describes the problem in one line.
func (e *ProblemError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "order service answered %d", e.Status)
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	}
	switch {
	case e.Detail != "":
		b.WriteString(": " + e.Detail)
	case e.Title != "":
		b.WriteString(": " + e.Title)
	}
	if e.Attempts > 1 {
		fmt.Fprintf(&b, " (after %d attempts)", e.Attempts)
	}
	return b.String()
}

// newProblemError reads a non-2xx answer; a body that is not a problem
// document leaves Code empty and is kept in Raw.
func newProblemError(resp *http.Response, body []byte) *ProblemError {
	e := &ProblemError{Status: resp.StatusCode, Raw: body, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	if e.RetryAfter == 0 {
		e.RetryAfter = rateLimitWait(resp.Header.Values("RateLimit"))
	}
	var doc struct {
		Type             string   `json:"type"`
		Title            string   `json:"title"`
		Detail           string   `json:"detail"`
		Code             string   `json:"code"`
		ViolatedPolicies []string `json:"violated-policies"`
	}
	if json.Unmarshal(body, &doc) == nil {
		e.Type, e.Title, e.Detail, e.Code, e.ViolatedPolicies = doc.Type, doc.Title, doc.Detail, doc.Code, doc.ViolatedPolicies
	}
	if e.Title == "" && e.Detail == "" {
		e.Title = http.StatusText(resp.StatusCode)
	}
	return e
}

func problemOf(err error) (*ProblemError, bool) {
	var pe *ProblemError
	ok := errors.As(err, &pe)
	return pe, ok
}

func hasCode(err error, code string) bool {
	pe, ok := problemOf(err)
	return ok && pe.Code == code
}

// IsKeyReused reports whether the key was already used for other parameters
// (422): a bug in the caller, who sent a different intent under an old key.
func IsKeyReused(err error) bool { return hasCode(err, CodeKeyReused) }

// IsQuotaExceeded reports whether the tenant was over one of its quotas
// (429 quota_exceeded) on the last attempt, when the call gave up: the
// policies are in the ProblemError's ViolatedPolicies.
func IsQuotaExceeded(err error) bool { return hasCode(err, CodeQuotaExceeded) }

// IsInProgress reports whether the first request with the key was still
// running when the client gave up waiting (409 request_in_progress).
func IsInProgress(err error) bool { return hasCode(err, CodeInProgress) }

// IsInvalidTransition reports whether the order's state forbids the
// operation (409 invalid_transition), e.g. paying a paid order.
func IsInvalidTransition(err error) bool { return hasCode(err, CodeInvalidTransition) }

// IsNotFound reports whether the order (or route) does not exist (404).
func IsNotFound(err error) bool {
	pe, ok := problemOf(err)
	return ok && pe.Status == http.StatusNotFound
}

// IsDeclined reports whether the payment channel declined the charge (402).
// The order is then PAYMENT_FAILED and may be paid again under a new key.
func IsDeclined(err error) bool { return hasCode(err, CodePaymentDeclined) }
