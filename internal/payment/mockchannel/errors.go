package mockchannel

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"
)

// The channel's error vocabulary; problemFor maps each to one HTTP answer.
var (
	errInvalidRequest  = errors.New("invalid request")
	errKeyMissing      = errors.New("the Idempotency-Key header is required")
	errKeyInvalid      = errors.New("the Idempotency-Key must be 1-255 printable ASCII characters without spaces")
	errKeyReused       = errors.New("idempotency key was already used with different parameters")
	errChargeNotFound  = errors.New("charge not found")
	errRefundNotFound  = errors.New("refund not found")
	errRefundInvalid   = errors.New("refund invalid")
	errRefundRefused   = errors.New("refund refused")
	errUnavailable     = errors.New("service unavailable, retry with the same Idempotency-Key")
	errWebhookNotFound = errors.New("webhook event not found")
	errWebhooksOff     = errors.New("webhooks are not delivered")
)

// failure is the HTTP answer for one error of the vocabulary.
type failure struct {
	err    error
	status int
	code   string
	title  string
}

var failures = []failure{
	{errInvalidRequest, http.StatusBadRequest, "invalid_request", "Invalid request"},
	{errKeyMissing, http.StatusBadRequest, "idempotency_key_missing", "Idempotency-Key missing"},
	{errKeyInvalid, http.StatusBadRequest, "idempotency_key_invalid", "Idempotency-Key invalid"},
	{errKeyReused, http.StatusUnprocessableEntity, "idempotency_key_reused", "Idempotency-Key reused"},
	{errChargeNotFound, http.StatusNotFound, "charge_not_found", "Charge not found"},
	{errRefundNotFound, http.StatusNotFound, "refund_not_found", "Refund not found"},
	{errRefundInvalid, http.StatusUnprocessableEntity, "refund_invalid", "Refund invalid"},
	{errRefundRefused, http.StatusUnprocessableEntity, "refund_refused", "Refund refused"},
	{errUnavailable, http.StatusServiceUnavailable, "service_unavailable", "Service unavailable"},
	{errWebhookNotFound, http.StatusNotFound, "webhook_not_found", "Webhook event not found"},
	{errWebhooksOff, http.StatusConflict, "webhooks_off", "Webhooks are not delivered"},
	// The caller left while we waited for a concurrent request: nothing definitive to say.
	{context.Canceled, http.StatusServiceUnavailable, "service_unavailable", "Service unavailable"},
	{context.DeadlineExceeded, http.StatusServiceUnavailable, "service_unavailable", "Service unavailable"},
}

// problem is an RFC 9457 problem document with a stable code.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

func newProblem(status int, code, title, detail string) problem {
	return problem{Type: "urn:paymentchannel:problem:" + code, Title: title, Status: status, Detail: detail, Code: code}
}

// problemFor turns any handler error into the answer a client sees.
func problemFor(err error) problem {
	for _, f := range failures {
		if errors.Is(err, f.err) {
			return newProblem(f.status, f.code, f.title, err.Error())
		}
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			return newProblem(he.Code, "not_found", "Not found", "no such route")
		case http.StatusMethodNotAllowed:
			return newProblem(he.Code, "method_not_allowed", "Method not allowed", "method not allowed on this route")
		case http.StatusRequestEntityTooLarge:
			return newProblem(he.Code, "payload_too_large", "Payload too large", "request body too large")
		}
	}
	return newProblem(http.StatusInternalServerError, "internal", "Internal error", "internal error")
}

// handleError is echo's error handler: the one place errors become responses.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	p := problemFor(err)
	if p.Status == http.StatusInternalServerError {
		s.log.Error("request failed", "method", c.Request().Method, "path", c.Path(), "err", err)
	}
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, "application/problem+json")
	if p.Status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	c.Response().WriteHeader(p.Status)
	if err := json.NewEncoder(c.Response()).Encode(p); err != nil {
		s.log.Debug("writing problem", "err", err)
	}
}
