package httpapi

// The payment channel's webhooks: a replay source like any other. The
// channel tells the verdict on a payment it took on to finish later by
// signed webhooks, delivered at least once, in no order, retried for days.
// The receiver keeps the same rules as every door: the signature stands
// for the API key (nothing unverified is read), and the webhook-id names
// one intent of the sender. This door reads and verifies a delivery; what
// comes of it, exactly once, is the use case's (order.ReceiveChannelEvent).

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
	"github.com/orderservice/orderservice/internal/webhook"
)

// webhookTolerance is how far a delivery's timestamp may be from now: a
// delivery captured and sent again later, even with its signature, is
// rejected once it is older than this.
const webhookTolerance = 5 * time.Minute

// rejectedDelivery is how the webhook metric counts a delivery rejected
// here, before the use case: its label is "refused" (metrics.WebhookOutcomes).
const rejectedDelivery = "refused"

// channelEvent is the part of a channel event the receiver reads: its type
// and the key of the charge or refund it is about. The rest is a hint the
// service does not trust: it asks the channel.
type channelEvent struct {
	Type string `json:"type"`
	Data struct {
		IdempotencyKey string `json:"idempotency_key"`
	} `json:"data"`
}

// webhookAnswer is the body of a 200: what came of the delivery.
type webhookAnswer struct {
	WebhookID string        `json:"webhook_id"`
	Receipt   order.Receipt `json:"outcome"`
}

// paymentWebhook is POST /webhooks/payment-channel.
func (s *Server) paymentWebhook(c echo.Context) error {
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), c.Request().Body, maxBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return echo.ErrStatusRequestEntityTooLarge
	}
	if err != nil {
		return problem.Errorf(problem.InvalidRequest, "body: could not be read")
	}
	if err := webhook.Verify(s.WebhookSecrets, c.Request().Header, body, time.Now(), webhookTolerance); err != nil {
		s.Metrics.Webhook(rejectedDelivery)
		return problem.Errorf(problem.Unauthenticated, "The webhook does not verify (%v); nothing was done.", err)
	}
	id := c.Request().Header.Get(webhook.HeaderID)
	ev, err := readEvent(id, body)
	if err != nil {
		s.Metrics.Webhook(rejectedDelivery)
		return err
	}
	receipt, err := s.Orders.ReceiveChannelEvent(c.Request().Context(), id, ev.Type, ev.Data.IdempotencyKey)
	if err != nil {
		return err // transient: the channel delivers it again
	}
	s.Metrics.Webhook(string(receipt))
	traceWebhook(c, id, ev, receipt)
	return c.JSON(http.StatusOK, webhookAnswer{WebhookID: id, Receipt: receipt})
}

// Bounds of a delivery, as api/openapi.yaml states them (the inbox's key
// and the channel's ids).
const (
	maxWebhookID  = 255
	maxEventType  = 64
	maxChannelKey = 255
)

// readEvent reads a verified delivery: its id and body within their bounds,
// a JSON object with a type and data.
func readEvent(id string, body []byte) (channelEvent, error) {
	var ev channelEvent
	switch {
	case len(id) > maxWebhookID:
		return ev, invalidField(webhook.HeaderID, "must be at most %d characters", maxWebhookID)
	case !storable(id):
		return ev, invalidField(webhook.HeaderID, notStorable)
	case json.Unmarshal(body, &ev) != nil:
		return ev, invalidField("body", "is not a payment channel event (JSON with type and data)")
	case ev.Type == "" || len(ev.Type) > maxEventType:
		return ev, invalidField("type", "must be 1 to %d characters", maxEventType)
	case !storable(ev.Type):
		return ev, invalidField("type", notStorable)
	case len(ev.Data.IdempotencyKey) > maxChannelKey:
		return ev, invalidField("data.idempotency_key", "must be at most %d characters", maxChannelKey)
	case !storable(ev.Data.IdempotencyKey):
		return ev, invalidField("data.idempotency_key", notStorable)
	}
	return ev, nil
}

// storable reports whether PostgreSQL can hold s as text: valid UTF-8
// without NUL. A signature proves who sent a delivery, not that its words
// can be stored; one that cannot is rejected here, with 400 naming the
// field and nothing read or written, rather than failing its transaction
// (SQLSTATE 22021) as a 500, an error of ours. (A sender that retries
// every answer but 2xx, as the mock channel does, still retries the 400
// for its window: a malformed event is the sender's to fix.)
func storable(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

const notStorable = "must be valid UTF-8 without NUL"

func invalidField(field, why string, args ...any) error {
	return problem.Errorf(problem.InvalidRequest, "%s: "+why, append([]any{field}, args...)...).With("field", field)
}
