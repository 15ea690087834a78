package httpapi

// The payment channel's webhooks: a replay source like any other. The
// channel tells the outcome of a payment it took on to finish later by
// signed webhooks, delivered at least once, in no order, retried for days.
// The receiver keeps the same rules as every door: the signature stands
// for the API key (nothing unverified is read), the webhook-id names one
// intent of the sender, and the inbox's primary key, in the transaction of
// the effect, decides that a second delivery does nothing.

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
	"github.com/orderservice/orderservice/internal/webhook"
)

// webhookTolerance is how far a delivery's timestamp may be from now: a
// delivery captured and sent again later, even with its signature, is
// refused once it is older than this.
const webhookTolerance = 5 * time.Minute

// channelEvent is the part of a channel event the receiver reads: its type
// and the key of the charge or refund it is about. The rest is a hint the
// receiver does not trust: it asks the channel (order.ResolvePending).
type channelEvent struct {
	Type string `json:"type"`
	Data struct {
		IdempotencyKey string `json:"idempotency_key"`
	} `json:"data"`
}

// paymentOutcomes are the event types that tell a payment's outcome.
var paymentOutcomes = map[string]bool{
	payment.EventChargeSucceeded: true, payment.EventChargeDeclined: true,
	payment.EventRefundSucceeded: true, payment.EventRefundFailed: true,
}

// webhookAnswer is the body of a 200: what came of the delivery.
type webhookAnswer struct {
	WebhookID string `json:"webhook_id"`
	Outcome   string `json:"outcome"`
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
		s.Metrics.Webhook("refused")
		return problem.Errorf(problem.Unauthenticated, "The webhook does not verify (%v); nothing was done.", err)
	}
	id := c.Request().Header.Get(webhook.HeaderID)
	ev, err := readEvent(id, body)
	if err != nil {
		s.Metrics.Webhook("refused")
		return err
	}
	outcome, err := s.receive(c, id, ev)
	if err != nil {
		return err // transient: the channel delivers it again
	}
	s.Metrics.Webhook(outcome)
	traceWebhook(c, id, ev, outcome)
	return c.JSON(http.StatusOK, webhookAnswer{WebhookID: id, Outcome: outcome})
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
// can be stored; one that cannot is refused here, with 400, rather than
// failing its transaction (SQLSTATE 22021) and coming back as a 500 the
// channel would retry for days.
func storable(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

const notStorable = "must be valid UTF-8 without NUL"

func invalidField(field, why string, args ...any) error {
	return problem.Errorf(problem.InvalidRequest, "%s: "+why, append([]any{field}, args...)...).With("field", field)
}

// receive acts on a verified delivery once: a payment's outcome is
// resolved with the delivery noted in the same transaction; any other
// event is noted as ignored. A delivery noted before is a duplicate.
func (s *Server) receive(c echo.Context, id string, ev channelEvent) (string, error) {
	ctx := c.Request().Context()
	if seen, err := s.Inbox.Seen(s.DB.WithContext(ctx), id); err != nil || seen {
		return "duplicate", err
	}
	note := func(tx *gorm.DB, late order.Late) error { return s.Inbox.Note(tx, id, ev.Type, string(late)) }
	late := order.LateIgnored
	var err error
	if paymentOutcomes[ev.Type] && ev.Data.IdempotencyKey != "" {
		late, err = s.Orders.ResolvePending(ctx, ev.Data.IdempotencyKey, note)
	} else {
		err = database.Transact(ctx, s.DB, func(tx *gorm.DB) error { return note(tx, late) })
	}
	if errors.Is(err, idempotency.ErrDelivered) {
		return "duplicate", nil
	}
	return string(late), err
}
