package messaging

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/httpapi"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/transport"
)

// Consumer runs the commands of ORDER_COMMANDS through the order use cases.
// Every instance runs one on the same durable pull consumer, so each
// command is handled by one instance at a time, and by another one if the
// first dies before acknowledging it.
type Consumer struct {
	JS     jetstream.JetStream
	Orders Orders
	// Tenants maps tenant to API key; a subject must name one of them.
	Tenants map[string]string
	// MaxDeliver is COMMAND_MAX_DELIVER: deliveries before a transient
	// failure is dead-lettered.
	MaxDeliver int
	// AckWait is how long JetStream waits for an answer before it
	// redelivers; a command still running says "in progress" well before.
	AckWait time.Duration
	// Backoff bounds the delay before a transiently failed command is
	// delivered again.
	Backoff Backoff
	// Workers is how many commands one instance runs at once.
	Workers int
	Observe Observer
	Logger  *slog.Logger
	// Hooks inject failures for tests.
	Hooks ConsumerHooks

	iter    jetstream.MessagesContext
	workers sync.WaitGroup
}

// ConsumerHooks are fault-injection points; nil functions do nothing.
type ConsumerHooks struct {
	// BeforeAck runs once the outcome is committed and its result
	// published, before the acknowledgement. An error stops the handling
	// there, as a process dying at that instant would: no ack, no nak.
	BeforeAck func(subject, key string) error
}

// Backoff is a bounded exponential delay: Base, doubled per delivery, at
// most Max.
type Backoff struct {
	Base, Max time.Duration
}

// Delay is the wait before delivery number deliveries+1.
func (b Backoff) Delay(deliveries int) time.Duration {
	d := b.Base
	for i := 1; i < deliveries && d < b.Max; i++ {
		d *= 2
	}
	return min(d, b.Max)
}

// Observer is told what the metrics count. A nil Observer is fine.
type Observer interface {
	// MessageReceived counts a delivered command; redelivered when it was
	// delivered before.
	MessageReceived(op string, redelivered bool)
	// MessageAcked counts a command answered and acknowledged; replayed
	// when the answer was a stored outcome.
	MessageAcked(op string, replayed bool)
	// MessageDeadLettered counts a command moved to the DLQ.
	MessageDeadLettered(op string)
	// OutboxPublished counts events the relay published, and how many of
	// them JetStream already had (duplicates dropped by Nats-Msg-Id).
	OutboxPublished(published, duplicates int)
}

type noObserver struct{}

func (noObserver) MessageReceived(string, bool) {}
func (noObserver) MessageAcked(string, bool)    {}
func (noObserver) MessageDeadLettered(string)   {}
func (noObserver) OutboxPublished(int, int)     {}

func observer(o Observer) Observer {
	if o == nil {
		return noObserver{}
	}
	return o
}

func (c *Consumer) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// ConsumerConfig is the durable consumer every instance creates or updates
// to the same settings. JetStream's own MaxDeliver is unlimited on purpose:
// COMMAND_MAX_DELIVER is enforced by handle, which dead-letters a command
// on its last transient failure, and at once any command delivered more
// often than that (its every handler died before answering). Were the
// server to stop delivering instead, a command whose dead-lettering failed
// would stay in the stream unhandled, and no one would know.
func ConsumerConfig(ackWait time.Duration) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable: ConsumerName, Description: "order commands, shared by every orderservice instance",
		FilterSubject: CommandPrefix + ">", AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy, AckWait: ackWait, MaxDeliver: -1,
		MaxAckPending: 1000,
	}
}

// Start creates (or updates) the durable consumer and starts the workers.
// ctx bounds the setup only; Stop ends the work.
func (c *Consumer) Start(ctx context.Context) error {
	cons, err := c.JS.CreateOrUpdateConsumer(ctx, CommandsStream, ConsumerConfig(c.AckWait))
	if err != nil {
		return fmt.Errorf("durable consumer %s on %s: %w", ConsumerName, CommandsStream, err)
	}
	// A bounded prefetch: a fetched command's ack wait runs while it waits
	// for a worker (another instance could have taken it), but a buffer of
	// only one command per worker starves them between pulls (half the
	// throughput in `make bench`).
	iter, err := cons.Messages(jetstream.PullMaxMessages(4 * c.Workers))
	if err != nil {
		return err
	}
	c.iter = iter
	msgs := make(chan jetstream.Msg)
	go func() {
		defer close(msgs)
		for {
			msg, err := iter.Next()
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			if err != nil {
				c.logger().Warn("messaging: fetching commands", "err", err)
				time.Sleep(100 * time.Millisecond)
				continue
			}
			msgs <- msg
		}
	}()
	work := context.Background()
	for range c.Workers {
		c.workers.Add(1)
		go func() {
			defer c.workers.Done()
			for msg := range msgs {
				c.handle(work, msg)
			}
		}()
	}
	return nil
}

// Stop stops fetching, lets the workers finish the commands they hold (a
// command fetched but not started is redelivered elsewhere after AckWait)
// and returns when they have, or when ctx ends.
func (c *Consumer) Stop(ctx context.Context) error {
	if c.iter == nil {
		return nil
	}
	c.iter.Drain()
	done := make(chan struct{})
	go func() { c.workers.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("messaging: commands still running at shutdown: %w", ctx.Err())
	}
}

// handle runs one delivery of a command to its end: a result published and
// the command acknowledged, a nak for a later delivery, or a dead letter.
// It acknowledges only after the use case returned, that is after its
// outcome committed: a crash before the ack redelivers the command, and
// the record replays the outcome.
func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg) {
	obs := observer(c.Observe)
	deliveries, seq := 1, uint64(0)
	if md, err := msg.Metadata(); err == nil {
		deliveries, seq = int(md.NumDelivered), md.Sequence.Stream
	}
	op := opLabel(msg.Subject())
	obs.MessageReceived(op, deliveries > 1)
	cmd, reason := parseCommand(msg.Subject(), msg.Headers(), msg.Data(), c.Tenants)
	if reason == "" && deliveries > c.MaxDeliver {
		reason = fmt.Sprintf("delivered %d times without an answer: every instance that took it stopped first", deliveries)
	}
	if reason != "" {
		c.deadLetter(ctx, msg, op, seq, deliveries, reason)
		return
	}

	stop := c.keepInProgress(msg)
	res, err := useCases[cmd.op].run(ctx, c.Orders, order.Caller{TenantID: cmd.tenant, Key: cmd.key}, cmd.orderID, cmd.body)
	stop()
	// The answer is what HTTP sends for the same intent: the one renderer.
	var resp httpapi.Response
	if err == nil {
		resp = httpapi.Render(res)
	} else {
		p := transport.Problem(err)
		resp = httpapi.RenderError(p)
		status := resp.Status
		if transport.Transient(p) {
			if deliveries >= c.MaxDeliver {
				c.deadLetter(ctx, msg, op, seq, deliveries,
					fmt.Sprintf("still failing after %d deliveries: %d %s", deliveries, status, p.Code))
				return
			}
			delay := max(c.Backoff.Delay(deliveries), min(p.RetryAfter, c.Backoff.Max))
			c.logger().Warn("messaging: command postponed", "subject", msg.Subject(), "key", cmd.key,
				"delivery", deliveries, "status", status, "code", p.Code, "retry_in", delay.String())
			_ = msg.NakWithDelay(delay)
			return
		}
	}

	if err := c.publishResult(ctx, cmd, resp); err != nil {
		// The outcome is committed; the redelivery replays it.
		c.logger().Warn("messaging: result not published, command redelivered", "subject", msg.Subject(), "key", cmd.key, "err", err)
		_ = msg.NakWithDelay(c.Backoff.Delay(deliveries))
		return
	}
	if c.Hooks.BeforeAck != nil {
		if err := c.Hooks.BeforeAck(msg.Subject(), cmd.key); err != nil {
			return
		}
	}
	if err := msg.Ack(); err != nil {
		c.logger().Warn("messaging: ack lost, the command will be redelivered and replayed", "subject", msg.Subject(), "err", err)
		return
	}
	obs.MessageAcked(op, resp.Replayed)
}

// keepInProgress tells JetStream, until stop is called, that the command is
// still being worked on, so a slow payment is not redelivered meanwhile.
func (c *Consumer) keepInProgress(msg jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(c.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() { close(done) }
}

// publishResult publishes the outcome on orders.results.<tenant>.<op>:
// Status is the HTTP status, the body is the HTTP body byte for byte, and
// a replay says so, as the HTTP header does.
func (c *Consumer) publishResult(ctx context.Context, cmd command, resp httpapi.Response) error {
	m := nats.NewMsg(ResultSubject(cmd.tenant, cmd.op))
	m.Header.Set(HeaderKey, cmd.key)
	m.Header.Set(HeaderStatus, strconv.Itoa(resp.Status))
	if resp.ContentType != "" {
		m.Header.Set(HeaderContentType, resp.ContentType)
	}
	if resp.Location != "" {
		m.Header.Set(HeaderLocation, resp.Location)
	}
	if resp.Replayed {
		m.Header.Set(HeaderReplayed, "true")
	}
	m.Data = resp.Body
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := c.JS.PublishMsg(ctx, m)
	return err
}
