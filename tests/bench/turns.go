package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/messaging"
)

// The tenants of scenarios 13 and 14: loud queues a backlog of commands
// (13), quiet sends one create at a time (13) or keeps a few in flight
// beside the bench's own flood (14).
const (
	loudTenant, loudKey   = "acme", "bench-key-acme-0123456789"
	quietTenant, quietKey = "globex", "bench-key-globex-0123456789"
)

// turnsResult is scenario 13: a quiet tenant's creates, one at a time, alone
// and then behind a loud tenant's backlog of commands, in one run.
type turnsResult struct {
	Backlog, Creates, Workers int
	// Alone and Behind are the quiet tenant's creates, from the publish to
	// its result: before the backlog, and while it is queued.
	Alone, Behind latencies
	// BacklogFirst and BacklogLast are the loud tenant's commands not yet
	// answered (not delivered, or delivered and not acknowledged) when the
	// quiet tenant's first and last measured creates were sent.
	BacklogFirst, BacklogLast uint64
	// Drain is from the loud tenant's first publish to its last result.
	Drain time.Duration
	// Answered are the loud tenant's results with status 201; Orders its
	// orders in the database afterwards.
	Answered int
	Orders   int64
}

// latencies summarises one set of request times.
type latencies struct{ P50, P99, Max time.Duration }

func latenciesOf(d []time.Duration) latencies {
	s := slices.Sorted(slices.Values(d))
	return latencies{P50: quantile(s, 0.50), P99: quantile(s, 0.99), Max: quantile(s, 1)}
}

// Drained is Drain to a tenth of a second, as the report shows it.
func (r turnsResult) Drained() time.Duration { return r.Drain.Round(100 * time.Millisecond) }

// Queued is Backlog, for the report's count.
func (r turnsResult) Queued() int64 { return int64(r.Backlog) }

// Throughput is the loud tenant's commands answered per second.
func (r turnsResult) Throughput() float64 {
	if r.Drain <= 0 {
		return 0
	}
	return float64(r.Answered) / r.Drain.Seconds()
}

// ShareOfDrain is the quiet tenant's p99 behind the backlog ÷ the time the
// backlog took to drain: one consumer in stream order would make it wait
// for all of it (about 1).
func (r turnsResult) ShareOfDrain() float64 {
	if r.Drain <= 0 {
		return 0
	}
	return r.Behind.P99.Seconds() / r.Drain.Seconds()
}

// turnsAim is the most of the drain a quiet tenant's p99 may take.
const turnsAim = 0.05

// Met is whether the quiet tenant's p99 met the aim, and the backlog was
// there throughout the measure.
func (r turnsResult) Met() bool { return r.ShareOfDrain() < turnsAim && r.BacklogLast > 0 }

// TurnsAim is turnsAim for the report.
func (turnsResult) TurnsAim() float64 { return turnsAim }

// turns is scenario 13.
func (b *bench) turns(ctx context.Context, res *results) error {
	keys := fmt.Sprintf("%s=%s,%s=%s,%s=%s", benchTenant, benchAPIKey, loudTenant, loudKey, quietTenant, quietKey)
	if err := b.restart(ctx, b.opts.Pool, map[string]string{"API_KEYS": keys}); err != nil {
		return err
	}
	if err := b.reset(ctx); err != nil {
		return err
	}
	r := turnsResult{Backlog: b.opts.Backlog, Creates: b.opts.QuietCreates, Workers: b.svc.Config.Commands.Workers}
	quiet, err := b.tenantConn(quietTenant, quietKey)
	if err != nil {
		return err
	}
	defer quiet.nc.Close()
	loud, err := b.tenantConn(loudTenant, loudKey)
	if err != nil {
		return err
	}
	defer loud.nc.Close()

	if _, err := quiet.creates(ctx, b, max(r.Creates/10, 5), nil); err != nil { // warm-up
		return err
	}
	alone, err := quiet.creates(ctx, b, r.Creates, nil)
	if err != nil {
		return err
	}
	r.Alone = latenciesOf(alone)
	b.progress("  %s alone: %d creates, p50 %s p99 %s", quietTenant, r.Creates, ms(r.Alone.P50), ms(r.Alone.P99))

	results := make(chan *nats.Msg, r.Backlog)
	sub, err := loud.nc.ChanSubscribe(messaging.ResultSubject(loudTenant, "create"), results)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := loud.nc.Flush(); err != nil {
		return err
	}
	start := time.Now()
	if err := loud.publish(ctx, b, r.Backlog); err != nil {
		return err
	}
	backlog := func() uint64 { return b.backlog(ctx, loudTenant) }
	behind, err := quiet.creates(ctx, b, r.Creates, func(i int) {
		switch i {
		case 0:
			r.BacklogFirst = backlog()
		case r.Creates - 1:
			r.BacklogLast = backlog()
		}
	})
	if err != nil {
		return err
	}
	r.Behind = latenciesOf(behind)
	b.progress("  %s behind %s's %d: p50 %s p99 %s (%s's backlog %d → %d)", quietTenant, loudTenant, r.Backlog, ms(r.Behind.P50), ms(r.Behind.P99),
		loudTenant, r.BacklogFirst, r.BacklogLast)

	timeout := time.After(max(5*time.Minute, time.Duration(r.Backlog)*20*time.Millisecond))
	for received := 0; received < r.Backlog; received++ {
		select {
		case m := <-results:
			if m.Header.Get(messaging.HeaderStatus) == "201" {
				r.Answered++
			}
		case <-timeout:
			res.fail("turns: %d of %s's %d commands answered", received, loudTenant, r.Backlog)
			received = r.Backlog
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.Drain = time.Since(start)
	if r.Orders, err = b.count(ctx, `SELECT count(*) FROM orders WHERE tenant_id = $1`, loudTenant); err != nil {
		return err
	}
	b.progress("  %s's %d commands answered in %s: %.0f/s", loudTenant, r.Answered, r.Drain.Round(time.Millisecond), r.Throughput())
	if r.Answered != r.Backlog || r.Orders != int64(r.Backlog) {
		res.fail("turns: %s's %d commands made %d orders and %d results 201", loudTenant, r.Backlog, r.Orders, r.Answered)
	}
	if r.BacklogLast == 0 {
		res.fail("turns: %s's backlog drained before %s's last create: raise -backlog", loudTenant, quietTenant)
	}
	res.Turns = r
	return nil
}

// benchTenantConn is one tenant's NATS connection, as its checkout service
// would hold it.
type benchTenantConn struct {
	tenant string
	nc     *nats.Conn
	js     jetstream.JetStream
}

func (b *bench) tenantConn(tenant, key string) (*benchTenantConn, error) {
	nc, err := nats.Connect(b.svc.NATSURL, nats.UserInfo(tenant, key), nats.CustomInboxPrefix(messaging.InboxPrefix(tenant)))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &benchTenantConn{tenant: tenant, nc: nc, js: js}, nil
}

// creates sends n creates one at a time, each once the last was answered,
// and returns each one's time from its publish to its result; before(i) is
// called before the i-th is sent.
func (c *benchTenantConn) creates(ctx context.Context, b *bench, n int, before func(i int)) ([]time.Duration, error) {
	results, err := c.nc.SubscribeSync(messaging.ResultSubject(c.tenant, "create"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = results.Unsubscribe() }()
	if err := c.nc.Flush(); err != nil {
		return nil, err
	}
	took := make([]time.Duration, 0, n)
	for i := range n {
		if before != nil {
			before(i)
		}
		msg, key, err := b.createCommand(c.tenant)
		if err != nil {
			return nil, err
		}
		sent := time.Now()
		if _, err := c.js.PublishMsg(ctx, msg); err != nil {
			return nil, fmt.Errorf("%s's create: %w", c.tenant, err)
		}
		for {
			r, err := results.NextMsgWithContext(ctx)
			if err != nil {
				return nil, fmt.Errorf("%s's result: %w", c.tenant, err)
			}
			if r.Header.Get(messaging.HeaderKey) == key {
				if s := r.Header.Get(messaging.HeaderStatus); s != "201" {
					return nil, fmt.Errorf("%s's create answered %s: %s", c.tenant, s, r.Data)
				}
				break
			}
		}
		took = append(took, time.Since(sent))
	}
	return took, nil
}

// publish sends n creates at once (JetStream-acknowledged, asynchronously).
func (c *benchTenantConn) publish(ctx context.Context, b *bench, n int) error {
	for range n {
		msg, _, err := b.createCommand(c.tenant)
		if err != nil {
			return err
		}
		if _, err := c.js.PublishMsgAsync(msg, jetstream.WithStallWait(time.Minute)); err != nil {
			return fmt.Errorf("%s's backlog: %w", c.tenant, err)
		}
	}
	select {
	case <-c.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// createCommand is a create command of tenant with a fresh key.
func (b *bench) createCommand(tenant string) (*nats.Msg, string, error) {
	key, i := b.keys.next()
	body, err := json.Marshal(newCreate(i))
	if err != nil {
		return nil, "", err
	}
	msg := nats.NewMsg(messaging.CommandSubject(tenant, "create"))
	msg.Header.Set(messaging.HeaderKey, key)
	msg.Data = body
	return msg, key, nil
}

// backlog is how many of tenant's commands the service has not answered
// yet: stored and not delivered, or delivered and not acknowledged.
func (b *bench) backlog(ctx context.Context, tenant string) uint64 {
	cons, err := b.svc.Door.JS().Consumer(ctx, messaging.CommandsStream, messaging.ConsumerFor(tenant))
	if err != nil {
		return 0
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return 0
	}
	return info.NumPending + uint64(info.NumAckPending)
}
