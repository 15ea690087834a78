// Command inboxconsumer is a small consumer of the order events, written
// the way every consumer of an at-least-once stream must be: it keeps its
// own inbox of the event ids it has applied, in the same transaction as
// the effect, so an event that arrives twice is applied once.
//
// JetStream's duplicate window (Nats-Msg-Id) only drops a copy published
// within minutes of the first. It does nothing for a copy the relay
// publishes later (it died after publishing and came back an hour later),
// for a redelivery to this consumer (it died after applying, before its
// ack), for an operator who replays the stream from the start, or for
// a second consumer instance racing the first. The inbox covers them all.
//
// It counts paid orders per customer: run it next to the service with
//
//	NATS_URL=nats://orderservice:orderservice-dev-secret@127.0.0.1:4223 \
//	DATABASE_URL=postgres://postgres:postgres@localhost:5432/orderservice \
//	go run ./examples/inboxconsumer
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv("NATS_URL"), os.Getenv("DATABASE_URL")); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "inboxconsumer:", err)
		os.Exit(1)
	}
}

// schema is the consumer's own: its inbox, and the state it derives.
const schema = `
CREATE TABLE IF NOT EXISTS example_inbox (
    event_id   uuid        PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS example_paid_orders (
    customer_id text   PRIMARY KEY,
    paid        bigint NOT NULL
);`

// event is the part of an order event this consumer reads.
type event struct {
	EventID string `json:"event_id"`
	Event   string `json:"event"`
	Order   struct {
		CustomerID string `json:"customer_id"`
	} `json:"order"`
}

func run(ctx context.Context, natsURL, dbURL string) error {
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.Exec(ctx, schema); err != nil {
		return err
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDER_EVENTS", jetstream.ConsumerConfig{
		Durable: "example-paid-orders", FilterSubject: "orders.events.*.paid", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return err
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		if err := apply(ctx, db, msg.Data()); err != nil {
			fmt.Fprintln(os.Stderr, "inboxconsumer: not applied, will be redelivered:", err)
			_ = msg.Nak()
			return
		}
		_ = msg.Ack() // lost? the redelivery finds the event in the inbox
	})
	if err != nil {
		return err
	}
	defer cc.Stop()
	<-ctx.Done()
	return ctx.Err()
}

// apply records the event in the inbox and applies its effect in one
// transaction. An event already in the inbox changes nothing: the insert
// conflicts, and the effect is skipped.
func apply(ctx context.Context, db *pgxpool.Pool, data []byte) error {
	var ev event
	if err := json.Unmarshal(data, &ev); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, "INSERT INTO example_inbox (event_id) VALUES ($1) ON CONFLICT DO NOTHING", ev.EventID)
		if err != nil || tag.RowsAffected() == 0 {
			return err // seen before: already applied
		}
		_, err = tx.Exec(ctx, `INSERT INTO example_paid_orders (customer_id, paid) VALUES ($1, 1)
			ON CONFLICT (customer_id) DO UPDATE SET paid = example_paid_orders.paid + 1`, ev.Order.CustomerID)
		return err
	})
}
