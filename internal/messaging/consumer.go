package messaging

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/tracing"
)

// Consumer runs the commands of ORDER_COMMANDS through the order use cases,
// in turns across tenants (turns.go). Every instance runs one on the same
// durable pull consumers, so each command is handled by one instance at a
// time, and by another one if the first dies before acknowledging it.
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
	// Workers is how many commands one instance runs at once, and so how
	// many it fetches: never more than it can start at once (but one per
	// quiet tenant, which waits for its turn).
	Workers int
	// Horizon is how long after its first publication a command may still
	// be run: as long as a record its intent may have written is sure to
	// exist (see Horizon). An older one, a dead letter replayed late or a
	// redelivery of one, is dead-lettered unrun. Zero: no bound.
	Horizon time.Duration
	Observe Observer
	Logger  *slog.Logger
	// Hooks inject failures for tests.
	Hooks ConsumerHooks

	serving *serving // from Start to Stop
}

// ConsumerHooks are fault-injection points; nil functions do nothing.
type ConsumerHooks struct {
	// BeforeRun runs before the use case. An error stops the handling
	// there, as a process dying before its intent committed would.
	BeforeRun func(subject, key string) error
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
	// MessageAcked counts a command answered and acknowledged, and how
	// long the delivery took from its receipt; replayed when the answer
	// was a stored outcome. ctx is the delivery's.
	MessageAcked(ctx context.Context, op string, replayed bool, took time.Duration)
	// MessageDeadLettered counts a command moved to the DLQ.
	MessageDeadLettered(op string)
	// DeadLetterGivenUp counts a command terminated because its dead
	// letter could not be stored: in neither stream's hands but
	// ORDER_COMMANDS's, until its max_age.
	DeadLetterGivenUp(op string)
	// OutboxPublished counts events the relay published, and how many of
	// them JetStream already had (duplicates dropped by Nats-Msg-Id).
	OutboxPublished(published, duplicates int)
}

type noObserver struct{}

func (noObserver) MessageReceived(string, bool)                              {}
func (noObserver) MessageAcked(context.Context, string, bool, time.Duration) {}
func (noObserver) MessageDeadLettered(string)                                {}
func (noObserver) DeadLetterGivenUp(string)                                  {}
func (noObserver) OutboxPublished(int, int)                                  {}

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

// handle runs one delivery of a command to its end: a result published and
// the command acknowledged, a nak for a later delivery, or a dead letter.
// It acknowledges only after the use case returned, that is after its
// outcome committed: a crash before the ack redelivers the command, and
// the record replays the outcome.
func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg) {
	obs := observer(c.Observe)
	received := time.Now()
	d := delivery{msg: msg, count: 1, published: received}
	if md, err := msg.Metadata(); err == nil {
		d.count, d.seq, d.stored, d.published = int(md.NumDelivered), md.Sequence.Stream, md.Timestamp, md.Timestamp
	}
	d.published = firstPublished(msg.Headers(), d.published)
	op := opLabel(msg.Subject())
	obs.MessageReceived(op, d.count > 1)
	ctx, span := traceDelivery(ctx, msg, d)
	defer span.End()
	cmd, reason := parseCommand(msg.Subject(), msg.Headers(), msg.Data(), c.Tenants)
	caller := order.Caller{TenantID: cmd.tenant, Key: cmd.key}
	if age := time.Since(d.published); reason == "" && c.Horizon > 0 && age > c.Horizon {
		reason = fmt.Sprintf("first published %s ago, past the %s its record is sure to be kept: not run, since it could be the first sight of an intent whose record is gone",
			age.Round(time.Second), c.Horizon)
	}
	stop := c.keepInProgress(msg)
	defer stop()
	if reason == "" && d.count > c.MaxDeliver {
		// Delivered more often than allowed. An answered intent is
		// replayed, which runs nothing. A retryable one ran to its end
		// (its last dead letter could not be stored): it is run again, and
		// dead-lettered below with its own failure if it fails again. Any
		// other may be a command no instance survives.
		state, err := c.Orders.IntentState(ctx, caller, "order."+cmd.op)
		if err != nil {
			c.logger().Warn("messaging: could not read the record of an over-delivered command", "subject", msg.Subject(), "key", cmd.key, "err", err)
			_ = msg.NakWithDelay(c.Backoff.Delay(d.count))
			return
		}
		reason = overDelivered(d.count, state)
	}
	if reason != "" {
		c.deadLetter(ctx, d, op, reason)
		return
	}
	if c.Hooks.BeforeRun != nil {
		if err := c.Hooks.BeforeRun(msg.Subject(), cmd.key); err != nil {
			return
		}
	}

	res, err := useCases[cmd.op].run(ctx, c.Orders, caller, cmd.orderID, cmd.body)
	// The answer is what HTTP sends for the same intent: the one renderer.
	var resp answer.Response
	if err == nil {
		resp = answer.Render(res)
	} else {
		p := answer.Problem(err)
		resp = answer.RenderError(p)
		status := resp.Status
		if answer.Transient(p) {
			if d.count >= c.MaxDeliver {
				c.deadLetter(ctx, d, op, fmt.Sprintf("still failing after %d deliveries: %d %s", d.count, status, p.Code))
				return
			}
			delay := max(c.Backoff.Delay(d.count), min(p.RetryAfter, c.Backoff.Max))
			c.logger().Warn("messaging: command postponed", "subject", msg.Subject(), "key", cmd.key,
				"delivery", d.count, "status", status, "code", p.Code, "retry_in", delay.String())
			_ = msg.NakWithDelay(delay)
			return
		}
	}

	if err := c.publishResult(ctx, cmd, d.msgID("result"), resp); err != nil {
		// The outcome is committed; the redelivery replays it.
		c.logger().Warn("messaging: result not published, command redelivered", "subject", msg.Subject(), "key", cmd.key, "err", err)
		_ = msg.NakWithDelay(c.Backoff.Delay(d.count))
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
	obs.MessageAcked(ctx, op, resp.Replayed, time.Since(received))
}

// overDelivered is why a command delivered count times, more than
// COMMAND_MAX_DELIVER, is dead-lettered, given its intent's state; "" when
// it is not (it is replayed or run again). The reason says what the record
// shows, not a guess at what stopped it.
func overDelivered(count int, state idempotency.State) string {
	switch {
	case state.Definitive(), state == idempotency.FailedRetryable:
		return ""
	case state == idempotency.Processing:
		return fmt.Sprintf("delivered %d times and its intent is still PROCESSING: the runs that took it stopped before they finished, or another owner (the sweeper) holds it now", count)
	default:
		return fmt.Sprintf("delivered %d times and no run recorded its intent: each stopped, or was refused, before it began", count)
	}
}

// delivery is one delivery of a command, as JetStream numbered it.
type delivery struct {
	msg    jetstream.Msg
	seq    uint64    // in ORDER_COMMANDS
	stored time.Time // when ORDER_COMMANDS stored this copy
	count  int       // how often it was delivered, this time included
	// published is when the command was first published: by its tenant,
	// not by a replay of its dead letter (see firstPublished).
	published time.Time
}

// msgID is the Nats-Msg-Id of what the service publishes for the command
// (kind "result" or "dead-letter"), so that the stream it goes to keeps
// one per command however often the command is delivered. It names the
// command by its sequence and the time ORDER_COMMANDS stored it: the
// sequence alone names one command only while the stream lives, and a
// stream recreated counts from 1 again, within the duplicate window of
// the old one's results and letters. "" when JetStream gave no metadata.
func (d delivery) msgID(kind string) string {
	if d.seq == 0 {
		return ""
	}
	return fmt.Sprintf("%s-%d-%d", kind, d.seq, d.stored.UnixNano())
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
//
// Its Nats-Msg-Id, msgID, names the command, so ORDER_RESULTS keeps one
// result per command even if a handler died between publishing and
// acknowledging and the redelivery published its replay again.
func (c *Consumer) publishResult(ctx context.Context, cmd command, msgID string, resp answer.Response) error {
	m := nats.NewMsg(ResultSubject(cmd.tenant, cmd.op))
	m.Header.Set(HeaderKey, cmd.key)
	if msgID != "" {
		m.Header.Set(HeaderMsgID, msgID)
	}
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
	tracing.Inject(ctx, m.Header)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := c.JS.PublishMsg(ctx, m)
	return err
}
