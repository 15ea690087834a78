// Package answer is what the service says back, whichever door asked: an
// intent's result or a use case's error as a status, headers and bytes.
// The code → status table is here, once; HTTP writes an Answer to the
// wire, the message door puts the same status and bytes in a result
// message, so a replay is the same answer through either door.
package answer

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
)

// ProblemType is the media type of a problem document (RFC 9457).
const ProblemType = "application/problem+json"

// codes is the one table from a domain error's code to its HTTP status and
// the problem document's title. A code missing here is a 500.
var codes = map[problem.Code]struct {
	status int
	title  string
}{
	problem.InvalidRequest:       {http.StatusBadRequest, "The request is invalid"},
	problem.KeyMissing:           {http.StatusBadRequest, "Idempotency-Key is required"},
	problem.KeyInvalid:           {http.StatusBadRequest, "Idempotency-Key is malformed"},
	problem.Unauthenticated:      {http.StatusUnauthorized, "Missing or unknown API key"},
	order.CodePaymentDeclined:    {http.StatusPaymentRequired, "The payment was declined"},
	order.CodePaymentRefused:     {http.StatusPaymentRequired, "The payment channel refused the charge"},
	order.CodeRefundRefused:      {http.StatusConflict, "The payment channel refused the refund"},
	order.CodeNotFound:           {http.StatusNotFound, "Order not found"},
	problem.NotFound:             {http.StatusNotFound, "Not found"},
	problem.MethodNotAllowed:     {http.StatusMethodNotAllowed, "Method not allowed"},
	problem.RequestInProgress:    {http.StatusConflict, "A request with this key is in progress"},
	order.CodeInvalidTransition:  {http.StatusConflict, "The order cannot make this transition"},
	problem.PayloadTooLarge:      {http.StatusRequestEntityTooLarge, "The request body is too large"},
	problem.UnsupportedMediaType: {http.StatusUnsupportedMediaType, "Unsupported media type"},
	problem.KeyReused:            {http.StatusUnprocessableEntity, "Idempotency-Key reused with different parameters"},
	problem.Internal:             {http.StatusInternalServerError, "Internal error"},
	problem.ServiceUnavailable:   {http.StatusServiceUnavailable, "Service temporarily unavailable"},
	problem.QuotaExceeded:        {http.StatusTooManyRequests, "Request cannot be satisfied as assigned quota has been exceeded"},
	problem.RequestTimeout:       {http.StatusRequestTimeout, "The request body did not arrive in time"},
}

// StatusOf is the HTTP status of a code; an unknown code is 500.
func StatusOf(code problem.Code) int {
	if c, ok := codes[code]; ok {
		return c.status
	}
	return http.StatusInternalServerError
}

// Response is an answer: a status, the headers that matter and the body.
type Response struct {
	Status      int
	Location    string
	ContentType string
	Body        []byte
	// Replayed is sent as Idempotent-Replayed: true.
	Replayed bool
	// RetryAfter, when set, is sent as Retry-After (whole seconds).
	RetryAfter time.Duration
}

// Render is the HTTP form of an intent's result: 201 with the new order's
// Location, 200, 202 (taken on, finishes later), or the failure's problem
// document. Any transport that must
// answer with the bytes HTTP would send calls it; it depends on nothing but
// the result, so a replay of a stored result is the same bytes as the first
// answer.
func Render(res idempotency.Result) Response {
	switch res.Outcome {
	case idempotency.OutcomeCreated:
		return Response{Status: http.StatusCreated, Location: "/v1/orders/" + res.Resource,
			ContentType: "application/json", Body: res.Body, Replayed: res.Replayed}
	case idempotency.OutcomeDone:
		return Response{Status: http.StatusOK, ContentType: "application/json", Body: res.Body, Replayed: res.Replayed}
	case idempotency.OutcomeAccepted:
		return Response{Status: http.StatusAccepted, ContentType: "application/json", Body: res.Body, Replayed: res.Replayed}
	}
	r := RenderError(res.Failure)
	r.Replayed = res.Replayed
	return r
}

// RenderError is the HTTP form of an error a use case (or the HTTP layer)
// returned: its problem document, status and Retry-After. Problem
// names the domain error it answers (an error without a code is an
// unavailable dependency, 503, or a hidden internal one, 500).
func RenderError(err error) Response {
	p := Problem(err)
	status, body := renderProblem(p)
	return Response{Status: status, ContentType: ProblemType, Body: body, RetryAfter: p.RetryAfter}
}

// renderProblem writes e as an RFC 9457 document. encoding/json writes a
// map's keys sorted, so the same error is always the same bytes; and, as
// order.Wire writes every body, as they read (`Bearer <key>`), not
// HTML-escaped (`\u003ckey\u003e`).
func renderProblem(e *problem.Error) (status int, body []byte) {
	status = StatusOf(e.Code)
	doc := make(map[string]any, 5+len(e.Extensions))
	for k, v := range e.Extensions {
		doc[k] = v
	}
	doc["type"] = "urn:orderservice:problem:" + string(e.Code)
	if e.Type != "" {
		doc["type"] = e.Type
	}
	doc["title"] = codes[e.Code].title
	doc["status"] = status
	doc["detail"] = e.Detail
	doc["code"] = e.Code
	body, err := order.Wire(doc)
	if err != nil { // only a non-marshalable extension gets here
		return http.StatusInternalServerError, []byte(`{"type":"urn:orderservice:problem:internal","title":"Internal error","status":500,"code":"internal"}`)
	}
	return status, body
}

// Problem maps an error a use case returned to the problem it answers: a
// domain problem as it is, an unavailable dependency as 503 (retry with the
// same key), anything else as 500.
func Problem(err error) *problem.Error {
	switch {
	case problem.CodeOf(err) != problem.Internal:
		return problem.As(err)
	case database.IsUnavailable(err) || database.IsLockTimeout(err) || errors.Is(err, context.DeadlineExceeded):
		return &problem.Error{Code: problem.ServiceUnavailable, Detail: "A dependency is unavailable; retry with the same Idempotency-Key.", RetryAfter: time.Second}
	case errors.Is(err, context.Canceled):
		// The caller hung up (or the service is stopping) before the work
		// finished: nothing went wrong that a retry with the same key
		// would not resolve, and nobody may be there to read the answer.
		return &problem.Error{Code: problem.ServiceUnavailable, Detail: "The request was cancelled before it finished; retry with the same Idempotency-Key.", RetryAfter: time.Second}
	}
	return problem.As(err)
}

// Transient reports whether p is an answer that a later try of the same
// intent may change: a dependency was unavailable, the intent is still in
// progress elsewhere, or the service failed. Every other answer is final.
func Transient(p *problem.Error) bool {
	switch p.Code {
	case problem.ServiceUnavailable, problem.RequestInProgress, problem.Internal:
		return true
	}
	return false
}
