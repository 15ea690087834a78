package mockchannel

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/payment"
)

// The webhook outbox (the webhook_events table): every outcome of a charge
// or refund writes its event in its own transaction, and the delivery loop
// (webhooks.go) sends the events from here, so an outcome is told however
// often the channel restarts, and nothing is told that did not happen.

// Delivery is an event of the webhook outbox and how its delivery went, as
// GET /admin/webhooks lists it.
type Delivery struct {
	// ID is the event's webhook-id, the same on every attempt.
	ID   string `json:"id"`
	Type string `json:"type"`
	// ObjectID and IdempotencyKey name the charge or refund it tells of.
	ObjectID       string    `json:"object_id"`
	IdempotencyKey string    `json:"idempotency_key"`
	CreatedAt      time.Time `json:"created_at"`
	// Attempts counts the requests sent, resends and duplicates included.
	Attempts int `json:"attempts"`
	// LastStatus is the HTTP status of the last attempt; 0 when it got none.
	LastStatus int `json:"last_status"`
	// LastError says why the last attempt failed: the start of the
	// receiver's answer, or the network's error.
	LastError   string     `json:"last_error"`
	DeliveredAt *time.Time `json:"delivered_at"`
	// NextAttemptAt is nil once the event is delivered or given up.
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	// GivenUpAt is when the retry window ended with no delivery.
	GivenUpAt *time.Time `json:"given_up_at"`
}

// eventBody is what a webhook carries: the outcome's type, when it
// happened, and the charge or refund as GET /v1 shows it.
type eventBody struct {
	Type      string    `json:"type"`
	Timestamp time.Time `json:"timestamp"`
	Data      any       `json:"data"`
}

// outboxEvent is an event claimed for delivery.
type outboxEvent struct {
	ID        string
	Type      string
	Body      string
	Attempts  int
	CreatedAt time.Time
}

// chargeEvents names the event telling each final status of a charge.
var chargeEvents = map[string]string{
	payment.StatusSucceeded: payment.EventChargeSucceeded,
	payment.StatusDeclined:  payment.EventChargeDeclined,
}

// recordEvent writes the event telling of data to the outbox, in tx: the
// transaction of the outcome. One event of a type per idempotency key.
func (s *store) recordEvent(tx *gorm.DB, typ, objectID, objectKey string, data any) error {
	body, err := json.Marshal(eventBody{Type: typ, Timestamp: time.Now().UTC(), Data: data})
	if err != nil {
		return err
	}
	return tx.Exec(`INSERT INTO webhook_events (id, type, object_id, object_key, body, next_attempt_at)
		VALUES (?, ?, ?, ?, ?, now() + make_interval(secs => ?)) ON CONFLICT (type, object_key) DO NOTHING`,
		"msg_"+uuid.NewString(), typ, objectID, objectKey, string(body), s.holdBack().Seconds()).Error
}

func (s *store) recordChargeEvent(tx *gorm.DB, r chargeRow) error {
	c := r.charge()
	return s.recordEvent(tx, chargeEvents[c.Status], c.ID, c.IdempotencyKey, c)
}

// recordRefusal tells of a refund the channel refuses (refund.failed). The
// channel keeps no refund for it, so the event is the refusal's only
// record: the refund it carries is the request, marked failed.
func (s *store) recordRefusal(ctx context.Context, key string, req payment.RefundRequest) error {
	rf := payment.Refund{ID: "re_" + uuid.NewString(), ChargeID: req.ChargeID, Status: payment.StatusFailed,
		Amount: req.Amount, IdempotencyKey: key, CreatedAt: time.Now().UTC()}
	if err := s.recordEvent(s.db.WithContext(ctx), payment.EventRefundFailed, rf.ID, key, rf); err != nil {
		return ledgerErr(err)
	}
	s.eventRecorded.notify()
	return nil
}

// claimDelivery takes the next event due for delivery and leases it: it is
// due again when the lease ends, so an attempt cut short by a crash or a
// stop is made again, by this process or another. SKIP LOCKED lets several
// channels on one database share the work.
func (s *store) claimDelivery(ctx context.Context, lease time.Duration) (outboxEvent, bool, error) {
	var evs []outboxEvent
	err := s.db.WithContext(ctx).Raw(`UPDATE webhook_events SET next_attempt_at = now() + make_interval(secs => ?)
		WHERE id = (SELECT id FROM webhook_events WHERE next_attempt_at <= now()
			ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING id, type, body, attempts, created_at`, lease.Seconds()).Scan(&evs).Error
	if err != nil || len(evs) == 0 {
		return outboxEvent{}, false, ledgerErr(err)
	}
	return evs[0], true, nil
}

// eventByID is the event under id, for a resend.
func (s *store) eventByID(ctx context.Context, id string) (outboxEvent, bool, error) {
	var evs []outboxEvent
	err := s.db.WithContext(ctx).Raw(`SELECT id, type, body, attempts, created_at FROM webhook_events WHERE id = ?`, id).Scan(&evs).Error
	if err != nil || len(evs) == 0 {
		return outboxEvent{}, false, ledgerErr(err)
	}
	return evs[0], true, nil
}

// recordDelivered marks the event delivered after sends requests, the last
// answered status.
func (s *store) recordDelivered(ctx context.Context, id string, sends, status int) error {
	return ledgerErr(s.db.WithContext(ctx).Exec(`UPDATE webhook_events SET attempts = attempts + ?, last_status = ?,
		last_error = NULL, delivered_at = coalesce(delivered_at, now()), next_attempt_at = NULL WHERE id = ?`,
		sends, status, id).Error)
}

// recordFailure notes a failed attempt and when the next one is due, or
// that there is none: the event is given up. An event delivered meanwhile
// (a resend, another process) is only counted.
func (s *store) recordFailure(ctx context.Context, id string, a attempt, retryIn time.Duration, giveUp bool) error {
	return ledgerErr(s.db.WithContext(ctx).Exec(`UPDATE webhook_events SET attempts = attempts + 1,
			last_status = nullif(?, 0), last_error = ?,
			next_attempt_at = CASE WHEN delivered_at IS NULL AND NOT ? THEN now() + make_interval(secs => ?) END,
			given_up_at = CASE WHEN delivered_at IS NULL AND ? THEN now() ELSE given_up_at END
		WHERE id = ?`, a.status, a.failure(), giveUp, retryIn.Seconds(), giveUp, id).Error)
}

// recordResendFailure notes a failed resend; the schedule stays as it was.
func (s *store) recordResendFailure(ctx context.Context, id string, a attempt) error {
	return ledgerErr(s.db.WithContext(ctx).Exec(`UPDATE webhook_events SET attempts = attempts + 1,
		last_status = nullif(?, 0), last_error = ? WHERE id = ?`, a.status, a.failure(), id).Error)
}

// nextDelivery is when the next event falls due; zero when none will.
func (s *store) nextDelivery(ctx context.Context) (time.Time, error) {
	return s.earliest(ctx, `SELECT min(next_attempt_at) FROM webhook_events WHERE next_attempt_at IS NOT NULL`)
}

func (s *store) earliest(ctx context.Context, query string) (time.Time, error) {
	var t sql.NullTime
	if err := s.db.WithContext(ctx).Raw(query).Row().Scan(&t); err != nil {
		return time.Time{}, ledgerErr(err)
	}
	return t.Time, nil
}

const deliveryColumns = `id, type, object_id, object_key AS idempotency_key, created_at, attempts,
	coalesce(last_status, 0) AS last_status, coalesce(last_error, '') AS last_error,
	delivered_at, next_attempt_at, given_up_at`

// deliveries lists the outbox, oldest event first.
func (s *store) deliveries(ctx context.Context) ([]Delivery, error) {
	var ds []Delivery
	if err := s.db.WithContext(ctx).Raw(`SELECT ` + deliveryColumns + ` FROM webhook_events ORDER BY seq`).Scan(&ds).Error; err != nil {
		return nil, ledgerErr(err)
	}
	for i := range ds {
		ds[i].utc()
	}
	return ds, nil
}

func (s *store) delivery(ctx context.Context, id string) (Delivery, error) {
	var ds []Delivery
	if err := s.db.WithContext(ctx).Raw(`SELECT `+deliveryColumns+` FROM webhook_events WHERE id = ?`, id).Scan(&ds).Error; err != nil {
		return Delivery{}, ledgerErr(err)
	}
	if len(ds) == 0 {
		return Delivery{}, fmt.Errorf("%w: no event %q", errWebhookNotFound, id)
	}
	ds[0].utc()
	return ds[0], nil
}

// utc shows every time in UTC, as the charges and refunds do.
func (d *Delivery) utc() {
	d.CreatedAt = d.CreatedAt.UTC()
	for _, t := range []**time.Time{&d.DeliveredAt, &d.NextAttemptAt, &d.GivenUpAt} {
		if *t != nil {
			u := (*t).UTC()
			*t = &u
		}
	}
}
