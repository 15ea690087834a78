package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/internal/order"
)

// messageResult is scenario 9: creates as commands through JetStream
// against the same creates over HTTP, at the consumer's concurrency, and
// the outbox's lag from a transition to its event's arrival.
type messageResult struct {
	Workers  int
	Commands int
	// HTTP is closed-loop POST /v1/orders with Workers requests in flight.
	HTTP point
	// Drain is from the first command published to the last result received.
	Drain   time.Duration
	Results int   // results received, all 201
	Orders  int64 // orders in the database afterwards
	// Lag is the time from an order's creation (its transaction's time) to
	// the arrival of its "created" event at a subscriber, during HTTP.
	LagP50, LagP99, LagMax time.Duration
	LagEvents              int
	// OutboxInterval and OutboxBatch are the service's relay settings.
	OutboxInterval time.Duration
	OutboxBatch    int
}

// Throughput is commands answered per second.
func (m messageResult) Throughput() float64 {
	if m.Drain <= 0 {
		return 0
	}
	return float64(m.Results) / m.Drain.Seconds()
}

// messages is scenario 9.
func (b *bench) messages(ctx context.Context, res *results) error {
	cfg := b.svc.Config
	workers := cfg.Commands.Workers
	m := messageResult{Workers: workers, Commands: b.opts.Commands, OutboxInterval: cfg.Outbox.Interval, OutboxBatch: cfg.Outbox.Batch}
	nc, err := nats.Connect(b.svc.NATSURL, nats.UserInfo(benchTenant, benchAPIKey), nats.CustomInboxPrefix(messaging.InboxPrefix(benchTenant)))
	if err != nil {
		return err
	}
	defer nc.Close()

	// HTTP at the consumer's concurrency, watching the events it causes.
	if err := b.reset(ctx); err != nil {
		return err
	}
	if b.opts.Warmup > 0 {
		b.fire(ctx, shot{name: "http-warmup", client: b.client, workers: workers,
			targeter: freshCreates(b.svc.URL()+"/v1/orders", &b.keys), duration: b.opts.Warmup})
		if err := b.reset(ctx); err != nil {
			return err
		}
	}
	stop, err := watchLag(nc, messaging.EventSubject(benchTenant, "created"))
	if err != nil {
		return err
	}
	m.HTTP = b.fire(ctx, shot{name: "http-create", client: b.client, workers: workers,
		targeter: freshCreates(b.svc.URL()+"/v1/orders", &b.keys), duration: b.opts.Duration})
	created, err := b.count(ctx, `SELECT count(*) FROM orders`)
	if err != nil {
		return err
	}
	got := stop(int(created), time.Minute)
	slices.Sort(got)
	m.LagEvents = len(got)
	m.LagP50, m.LagP99, m.LagMax = quantile(got, 0.50), quantile(got, 0.99), quantile(got, 1)
	b.progress("  HTTP c=%d %8.0f req/s; outbox lag p50 %s p99 %s over %d events", workers, m.HTTP.Throughput, ms(m.LagP50), ms(m.LagP99), m.LagEvents)
	if m.LagEvents < int(created) {
		res.fail("outbox: %d created events arrived for %d orders", m.LagEvents, created)
	}

	// The same creates as commands: publish them all, wait for every result.
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if b.opts.Warmup > 0 {
		if _, _, err := b.sendCommands(ctx, nc, js, max(m.Commands/10, 10)); err != nil {
			return err
		}
	}
	if err := b.reset(ctx); err != nil {
		return err
	}
	m.Results, m.Drain, err = b.sendCommands(ctx, nc, js, m.Commands)
	if err != nil {
		return err
	}
	if m.Orders, err = b.count(ctx, `SELECT count(*) FROM orders`); err != nil {
		return err
	}
	b.progress("  JetStream %d commands in %s: %8.0f commands/s", m.Results, m.Drain.Round(time.Millisecond), m.Throughput())
	if m.Orders != int64(m.Commands) || m.Results != m.Commands {
		res.fail("messages: %d commands made %d orders and %d results", m.Commands, m.Orders, m.Results)
	}
	res.Messages = m
	return nil
}

// sendCommands publishes n create commands with fresh keys and waits for
// their n results; it returns how many were 201 and the time from the first
// publish to the last result.
func (b *bench) sendCommands(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, n int) (int, time.Duration, error) {
	results := make(chan *nats.Msg, n)
	sub, err := nc.ChanSubscribe(messaging.ResultSubject(benchTenant, "create"), results)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	futures := make([]jetstream.PubAckFuture, 0, n)
	for range n {
		msg, _, err := b.createCommand(benchTenant)
		if err != nil {
			return 0, 0, err
		}
		f, err := js.PublishMsgAsync(msg, jetstream.WithStallWait(time.Minute))
		if err != nil {
			return 0, 0, err
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return 0, 0, fmt.Errorf("publish a command: %w", err)
		}
	}
	ok := 0
	timeout := time.After(5 * time.Minute)
	for range n {
		select {
		case r := <-results:
			if r.Header.Get(messaging.HeaderStatus) == "201" {
				ok++
			}
		case <-timeout:
			return ok, time.Since(start), fmt.Errorf("only %d of %d results arrived", ok, n)
		case <-ctx.Done():
			return ok, time.Since(start), ctx.Err()
		}
	}
	return ok, time.Since(start), nil
}

// watchLag subscribes to subject and records, for every event, the time
// from its occurred_at to its arrival. The stop it returns waits until want
// events arrived (or within passed) and returns the lags.
func watchLag(nc *nats.Conn, subject string) (func(want int, within time.Duration) []time.Duration, error) {
	var mu sync.Mutex
	var lags []time.Duration
	arrived := make(chan struct{}, 1)
	sub, err := nc.Subscribe(subject, func(msg *nats.Msg) {
		now := time.Now()
		var ev order.EventMessage
		if json.Unmarshal(msg.Data, &ev) != nil {
			return
		}
		mu.Lock()
		lags = append(lags, now.Sub(ev.OccurredAt))
		mu.Unlock()
		select {
		case arrived <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		return nil, err
	}
	stop := func(want int, within time.Duration) []time.Duration {
		deadline := time.After(within)
		for {
			mu.Lock()
			n := len(lags)
			mu.Unlock()
			if n >= want {
				break
			}
			select {
			case <-arrived:
				continue
			case <-deadline:
			}
			break
		}
		_ = sub.Unsubscribe()
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lags)
	}
	return stop, nil
}
