package order

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/tracing"
)

// The transactional outbox: every transition writes its event here in the
// transaction that makes it (insertOrder, saveTransition), so an event is
// published if and only if its transition committed. A relay (package
// messaging) publishes the rows through Outbox.Relay.

// EventMessage is the body of an event published on
// orders.events.<tenant>.<event>: the transition, the intent that caused
// it, and the order as GET /v1/orders/{id} showed it right after.
type EventMessage struct {
	EventID        string          `json:"event_id"`
	Event          string          `json:"event"`
	OrderID        string          `json:"order_id"`
	FromStatus     Status          `json:"from_status"`
	ToStatus       Status          `json:"to_status"`
	Operation      string          `json:"operation"`
	IdempotencyKey string          `json:"idempotency_key"`
	OccurredAt     time.Time       `json:"occurred_at"`
	Order          json.RawMessage `json:"order"`
}

// PublishedEvents lists every event name the outbox publishes.
var PublishedEvents = []string{"created", "payment_pending", "paid", "payment_failed", "refund_pending",
	"refunded", "refund_failed", "cancelled", "shipped", "delivered"}

// PublishedName is the name a transition is published under: what happened
// to the order, in the past tense, rather than the command that asked for
// it. A successful refund is "refunded" (its to_status is CANCELLED); a
// cancel without money is "cancelled". An event without a name of its own
// is published under its FSM name (refund_failed is).
func PublishedName(ev Event) string {
	switch ev {
	case EventCreate:
		return "created"
	case EventPay:
		return "payment_pending"
	case EventPaymentSucceeded:
		return "paid"
	case EventPaymentFailed:
		return "payment_failed"
	case EventRefund:
		return "refund_pending"
	case EventRefundSucceeded:
		return "refunded"
	case EventCancel:
		return "cancelled"
	case EventShip:
		return "shipped"
	case EventDeliver:
		return "delivered"
	}
	return string(ev)
}

// OutboxEvent is one row of the outbox.
type OutboxEvent struct {
	ID          int64 `gorm:"primaryKey;->"`
	EventID     uuid.UUID
	TenantID    string
	OrderID     uuid.UUID
	Event       string
	Payload     []byte
	CreatedAt   time.Time
	PublishedAt *time.Time
	// Traceparent is the trace of the transaction that wrote the event
	// (W3C traceparent; empty when it was not traced): the relay links its
	// publish to it.
	Traceparent *string
}

// TableName tells GORM the table the migration created.
func (OutboxEvent) TableName() string { return "order_outbox" }

// writeOutbox adds the event of o's transition to the outbox, in the
// caller's transaction, with a snapshot of o as it now stands.
func writeOutbox(tx *gorm.DB, o *Order, from Status, ev Event, op, key string, at time.Time) error {
	id, err := uuid.NewV7()
	if err != nil {
		return err
	}
	snapshot, err := Wire(o)
	if err != nil {
		return err
	}
	name := PublishedName(ev)
	payload, err := Wire(EventMessage{EventID: id.String(), Event: name, OrderID: o.ID.String(),
		FromStatus: from, ToStatus: o.Status, Operation: op, IdempotencyKey: key, OccurredAt: at, Order: snapshot})
	if err != nil {
		return err
	}
	var trace *string
	if tp := tracing.Traceparent(tx.Statement.Context); tp != "" {
		trace = &tp
	}
	return tx.Create(&OutboxEvent{EventID: id, TenantID: o.TenantID, OrderID: o.ID, Event: name,
		Payload: payload, CreatedAt: at, Traceparent: trace}).Error
}

// Outbox is the relay's view of the outbox table.
type Outbox struct {
	DB *gorm.DB
}

// Relay takes up to batch unpublished events and hands them to publish,
// which returns the ids of those it published (in JetStream's keeping); they
// are marked published when publish returns, in the same transaction.
//
// The rows stay locked (FOR UPDATE SKIP LOCKED) while publish runs, so any
// number of relays, on any instances, take disjoint batches. A batch holds
// at most one event per order, the order's oldest unpublished one: a later
// event of that order waits until this one is marked, so one order's events
// are published in the order they were committed even when a publish fails
// half way and is retried. If the process dies inside publish, nothing is
// marked and the next relay publishes the batch again, with the same ids.
func (x *Outbox) Relay(ctx context.Context, batch int, publish func([]OutboxEvent) ([]int64, error)) (int, error) {
	var published int
	var pubErr error
	err := database.Transact(ctx, x.DB, func(tx *gorm.DB) error {
		var events []OutboxEvent
		err := tx.Raw(`SELECT * FROM order_outbox o
			WHERE published_at IS NULL
			  AND NOT EXISTS (SELECT 1 FROM order_outbox e
			                  WHERE e.order_id = o.order_id AND e.published_at IS NULL AND e.id < o.id)
			ORDER BY id LIMIT ? FOR UPDATE OF o SKIP LOCKED`, batch).Find(&events).Error
		if err != nil || len(events) == 0 {
			return err
		}
		var ids []int64
		ids, pubErr = publish(events)
		if len(ids) == 0 {
			return nil
		}
		published = len(ids)
		// What JetStream holds is marked even when the rest of the batch
		// failed; the rest stays for the next pass.
		return tx.Exec("UPDATE order_outbox SET published_at = now() WHERE id IN ?", ids).Error
	})
	return published, errors.Join(err, pubErr)
}

// Lag is the age of the oldest unpublished event, 0 when all are published:
// a stuck relay shows here long before anyone misses an event.
func (x *Outbox) Lag(ctx context.Context) (time.Duration, error) {
	var oldest []time.Time
	err := x.DB.WithContext(ctx).Raw("SELECT created_at FROM order_outbox WHERE published_at IS NULL ORDER BY id LIMIT 1").
		Find(&oldest).Error
	if err != nil || len(oldest) == 0 {
		return 0, err
	}
	return max(time.Since(oldest[0]), 0), nil
}

// Clean deletes up to batch events published before cutoff and returns how
// many it deleted.
func (x *Outbox) Clean(ctx context.Context, cutoff time.Time, batch int) (int, error) {
	res := x.DB.WithContext(ctx).Exec(`DELETE FROM order_outbox WHERE id IN (
		SELECT id FROM order_outbox WHERE published_at < ? ORDER BY published_at LIMIT ?)`, cutoff, batch)
	return int(res.RowsAffected), res.Error
}
