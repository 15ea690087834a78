package messaging

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/order"
)

// Relay publishes the outbox's events to orders.events.<tenant>.<event>,
// with Nats-Msg-Id = the event id, at least once and in order per order.
// Every instance runs one; order.Outbox.Relay keeps their batches apart.
type Relay struct {
	Outbox *order.Outbox
	JS     jetstream.JetStream
	// Batch is how many events one pass takes at most.
	Batch int
	// Interval is the pause after a pass that found nothing to do.
	Interval time.Duration
	Observe  Observer
	Logger   *slog.Logger
	// Hooks inject failures for tests.
	Hooks RelayHooks
}

// RelayHooks are fault-injection points; nil functions do nothing.
type RelayHooks struct {
	// AfterPublish runs after each event's publish was acknowledged, with
	// how many of the batch are published so far. An error ends the pass
	// there, before anything is marked, as a relay killed mid-batch would.
	AfterPublish func(published int) error
}

// errKilled ends a pass the way a crash would, for the hook.
var errKilled = errors.New("relay stopped by a hook")

// Run relays until ctx ends, pausing Interval whenever the outbox is empty
// and after an error.
func (r *Relay) Run(ctx context.Context) {
	for {
		n, err := r.Pass(ctx)
		if err != nil && ctx.Err() == nil {
			r.logger().Warn("messaging: outbox relay pass failed; it is retried", "err", err)
		}
		if n < r.Batch || err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(r.Interval):
			}
		}
	}
}

func (r *Relay) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}

// Pass publishes one batch and returns how many events it marked published.
// The events of a batch are published asynchronously and then awaited: an
// event counts as published once JetStream acknowledged it (as new or as a
// duplicate of an id it already has).
func (r *Relay) Pass(ctx context.Context) (int, error) {
	return r.Outbox.Relay(ctx, r.Batch, func(events []order.OutboxEvent) ([]int64, error) {
		futures := make([]jetstream.PubAckFuture, len(events))
		for i, e := range events {
			m := nats.NewMsg(EventSubject(e.TenantID, e.Event))
			m.Header.Set(HeaderMsgID, e.EventID.String())
			m.Header.Set(HeaderContentType, "application/json")
			m.Data = e.Payload
			span := tracePublish(ctx, m, e)
			f, err := r.JS.PublishMsgAsync(m)
			span.End()
			if err != nil {
				return r.await(ctx, events[:i], futures[:i], err)
			}
			futures[i] = f
		}
		return r.await(ctx, events, futures, nil)
	})
}

// await collects the acknowledgements of the published events and returns
// the ids of those JetStream holds, with the first failure.
func (r *Relay) await(ctx context.Context, events []order.OutboxEvent, futures []jetstream.PubAckFuture, failed error) ([]int64, error) {
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	var ids []int64
	duplicates := 0
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				duplicates++
			}
			ids = append(ids, events[i].ID)
			if r.Hooks.AfterPublish != nil {
				if err := r.Hooks.AfterPublish(len(ids)); err != nil {
					return nil, errors.Join(errKilled, err)
				}
			}
		case err := <-f.Err():
			failed = errors.Join(failed, fmt.Errorf("publish event %s: %w", events[i].EventID, err))
		case <-timeout.C:
			return ids, errors.Join(failed, errors.New("timed out waiting for JetStream to acknowledge events"))
		case <-ctx.Done():
			return ids, errors.Join(failed, ctx.Err())
		}
	}
	observer(r.Observe).OutboxPublished(len(ids)-duplicates, duplicates)
	return ids, failed
}

// OutboxCleaner deletes published events once they are older than the
// records' retention: until then an event may still be wanted again (a
// consumer rebuilding its state asks for it), exactly as a record may.
type OutboxCleaner struct {
	Outbox    *order.Outbox
	Retention time.Duration
	Batch     int
	Logger    *slog.Logger
}

// Pass deletes every published event older than the retention, in batches,
// and returns how many it deleted.
func (c *OutboxCleaner) Pass(ctx context.Context) (int, error) {
	cutoff := time.Now().Add(-c.Retention)
	total := 0
	for {
		n, err := c.Outbox.Clean(ctx, cutoff, c.Batch)
		total += n
		if err != nil || n < c.Batch {
			return total, err
		}
	}
}

// Run cleans every interval until ctx ends.
func (c *OutboxCleaner) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if n, err := c.Pass(ctx); err != nil && ctx.Err() == nil {
			c.Logger.Warn("messaging: outbox cleanup failed", "err", err)
		} else if n > 0 {
			c.Logger.Info("messaging: outbox cleaned", "deleted", n, "retention", c.Retention.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
