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
	"github.com/orderservice/orderservice/internal/problem"
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
	// WaitersPerTenant bounds the commands of one tenant that wait, on
	// this instance, for their intent in flight (postpone.go); zero:
	// DefaultWaitersPerTenant.
	WaitersPerTenant int
	// Horizon is how long after its first publication a command may still
	// be run: as long as a record its intent may have written is sure to
	// exist (see Horizon). An older one, a dead letter replayed late or a
	// redelivery of one, is dead-lettered unrun. Zero: no bound.
	Horizon time.Duration
	// MaxAge is ORDER_COMMANDS's max_age: a command whose intent stays in
	// flight for half of it is dead-lettered before the stream drops it
	// (see postpone). Zero: no bound but the horizon.
	MaxAge  time.Duration
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
	// MessagePostponed counts a delivery that met its intent in flight
	// and waits for it (see postpone).
	MessagePostponed(op string)
	// MessageHandedBack counts a delivery that met its intent in flight
	// and was handed back for a later delivery instead of waiting: its
	// intent already had a waiter, or its tenant its share of waiters
	// (see postpone). It spends no delivery.
	MessageHandedBack(op string)
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
func (noObserver) MessagePostponed(string)                                   {}
func (noObserver) MessageHandedBack(string)                                  {}
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
// the command acknowledged, a nak for a later delivery, a dead letter, or,
// while its intent is in flight elsewhere, a postponement. It acknowledges
// only after the use case returned, that is after its outcome committed: a
// crash before the ack redelivers the command, and the record replays the
// outcome.
func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg) {
	received := time.Now()
	d := delivery{msg: msg, count: 1, stored: received, published: received}
	if md, err := msg.Metadata(); err == nil {
		d.count, d.seq, d.stored, d.published = int(md.NumDelivered), md.Sequence.Stream, md.Timestamp, md.Timestamp
	}
	redelivered := d.count > 1
	d.handedBack = c.serving.waiters.takeHandedBack(d)
	d.count -= d.handedBack // a delivery that only handed the command back spent nothing
	d.published = firstPublished(msg.Headers(), d.published)
	cmd, refusal := parseCommand(msg.Subject(), msg.Headers(), msg.Data(), c.Tenants)
	observer(c.Observe).MessageReceived(cmd.opLabel(), redelivered)
	ctx, span := traceDelivery(ctx, d)
	stop := c.keepInProgress(msg)
	done := func() { stop(); span.End() }
	switch age := time.Since(d.published); {
	case refusal != nil:
		c.refuse(ctx, d, cmd, refusal)
	case c.Horizon > 0 && age > c.Horizon:
		c.deadLetter(ctx, d, cmd, fmt.Sprintf("first published %s ago, past the %s its record is sure to be kept: not run, since it could be the first sight of an intent whose record is gone",
			age.Round(time.Second), c.Horizon))
	default:
		if wait := c.serve(ctx, d, cmd, received); wait > 0 && c.postpone(ctx, d, cmd, received, wait, done) {
			return
		}
	}
	done()
}

// serve runs a well-formed command's use case and answers it, or naks or
// dead-letters it. When its intent is in flight elsewhere (another
// delivery, an HTTP request, the sweeper) it does none of those and
// returns how long to wait before serving it again; 0 otherwise.
func (c *Consumer) serve(ctx context.Context, d delivery, cmd command, received time.Time) (postponeFor time.Duration) {
	caller := order.Caller{TenantID: cmd.tenant, Key: cmd.key}
	if d.count > c.MaxDeliver {
		// Delivered more often than allowed. An answered intent is
		// replayed, which runs nothing. A retryable one ran to its end
		// (its last dead letter could not be stored): it is run again, and
		// dead-lettered below with its own failure if it fails again. One
		// in flight waits for its owner, or the sweeper once the lease
		// lapses, without being run: a command that kills every instance
		// that runs it is not run again. Any other may be such a command.
		state, err := c.Orders.IntentState(ctx, caller, cmd.operation)
		if err != nil {
			c.logger().Warn("messaging: could not read the record of an over-delivered command", "subject", d.subject(), "key", cmd.key, "err", err)
			_ = d.msg.NakWithDelay(c.Backoff.Delay(d.count))
			return 0
		}
		switch reason, inFlight := overDelivered(d.count, state); {
		case inFlight:
			return c.postponement(c.Backoff.Max)
		case reason != "":
			c.deadLetter(ctx, d, cmd, reason)
			return 0
		}
	}
	if c.Hooks.BeforeRun != nil {
		if err := c.Hooks.BeforeRun(d.msg.Subject(), cmd.key); err != nil {
			return 0
		}
	}

	res, err := runUseCase(ctx, c.Orders, caller, cmd)
	// The answer is what HTTP sends for the same intent: the one renderer.
	var resp answer.Response
	if err == nil {
		resp = answer.Render(res)
	} else {
		p := answer.Problem(err)
		resp = answer.RenderError(p)
		switch {
		case p.Code == problem.RequestInProgress:
			// Not a failure: the intent will be answered, and then replayed.
			return c.postponement(p.RetryAfter)
		case answer.Transient(p):
			if d.count >= c.MaxDeliver {
				c.deadLetter(ctx, d, cmd, fmt.Sprintf("still failing after %d deliveries: %d %s", d.count, resp.Status, p.Code))
				return 0
			}
			delay := max(c.Backoff.Delay(d.count), min(p.RetryAfter, c.Backoff.Max))
			c.logger().Warn("messaging: command failed, tried again later", "subject", d.subject(), "key", cmd.key,
				"delivery", d.count, "status", resp.Status, "code", p.Code, "retry_in", delay.String())
			_ = d.msg.NakWithDelay(delay)
			return 0
		}
	}
	c.respond(ctx, d, cmd, resp, received)
	return 0
}

// respond publishes the command's result and acknowledges the command.
func (c *Consumer) respond(ctx context.Context, d delivery, cmd command, resp answer.Response, received time.Time) {
	if err := c.publishResult(ctx, cmd, d.msgID("result"), resp); err != nil {
		// The outcome is committed; the redelivery replays it.
		c.logger().Warn("messaging: result not published, command redelivered", "subject", d.subject(), "key", cmd.key, "err", err)
		_ = d.msg.NakWithDelay(c.Backoff.Delay(d.count))
		return
	}
	if c.Hooks.BeforeAck != nil {
		if err := c.Hooks.BeforeAck(d.msg.Subject(), cmd.key); err != nil {
			return
		}
	}
	if err := d.msg.Ack(); err != nil {
		c.logger().Warn("messaging: ack lost, the command will be redelivered and replayed", "subject", d.subject(), "err", err)
		return
	}
	observer(c.Observe).MessageAcked(ctx, cmd.opLabel(), resp.Replayed, time.Since(received))
}

// refuse answers a command refused for its form with the problem HTTP
// sends for the same fault, on its tenant's results subject when its
// subject named a known tenant, and dead-letters it with that problem as
// its reason. The result goes first: the dead letter terminates the
// command, after which a lost result could not be published again. A
// result that cannot be published holds the command for a later delivery,
// as a dead letter that cannot be stored does, and no longer.
func (c *Consumer) refuse(ctx context.Context, d delivery, cmd command, p *problem.Error) {
	resp := answer.RenderError(p)
	reason := fmt.Sprintf("%d %s: %s", resp.Status, p.Code, p.Detail)
	if cmd.tenant != "" {
		if cmd.key == "" { // echo the key it sent, malformed or not, so its publisher can match the answer
			if k := keyIn(d.msg.Headers()); len(k) <= idempotency.MaxKeyLength+2 {
				cmd.key = k
			}
		}
		if err := c.publishResult(ctx, cmd, d.msgID("result"), resp); err != nil {
			if d.count < c.deadLetterDeliveries() {
				c.logger().Warn("messaging: refusal not published, command redelivered", "subject", d.subject(), "err", err)
				_ = d.msg.NakWithDelay(c.Backoff.Delay(d.count))
				return
			}
			reason += fmt.Sprintf("; its tenant could not be told: %v", err)
		}
	}
	c.deadLetter(ctx, d, cmd, reason)
}

// overDelivered is what becomes of a command delivered count times, more
// than COMMAND_MAX_DELIVER, given its intent's state: served (replayed, or
// run again) when its intent is answered or retryable; postponed when it is
// in flight (its owner, or the sweeper once the lease lapses, moves it on);
// else dead-lettered, and the reason says what the record shows, not a
// guess at what stopped it.
func overDelivered(count int, state idempotency.State) (reason string, inFlight bool) {
	switch {
	case state.Definitive(), state == idempotency.FailedRetryable:
		return "", false
	case state == idempotency.Processing:
		return "", true
	default:
		return fmt.Sprintf("delivered %d times and no run recorded its intent: each stopped, or was refused, before it began", count), false
	}
}

// delivery is one delivery of a command, as JetStream numbered it.
type delivery struct {
	msg    jetstream.Msg
	seq    uint64    // in ORDER_COMMANDS
	stored time.Time // when ORDER_COMMANDS stored this copy
	// count is how often it was delivered, this time included, less the
	// deliveries that only handed it back (handedBack): those a command
	// may spend are counted against COMMAND_MAX_DELIVER.
	count      int
	handedBack int
	// published is when the command was first published: by its tenant,
	// not by a replay of its dead letter (see firstPublished).
	published time.Time
}

// subject is the command's subject for a log or a trace: cut to maxShown
// bytes, since a tenant may send one of 4 KB.
func (d delivery) subject() string {
	if s := d.msg.Subject(); len(s) > maxShown {
		return s[:maxShown] + "…"
	}
	return d.msg.Subject()
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

// publishResult publishes the outcome on orders.results.<tenant>.<op>
// (<op> Malformed for a refusal of a subject that named none):
// Status is the HTTP status, the body is the HTTP body byte for byte, and
// a replay says so, as the HTTP header does.
//
// Its Nats-Msg-Id, msgID, names the command, so ORDER_RESULTS keeps one
// result per command even if a handler died between publishing and
// acknowledging and the redelivery published its replay again.
func (c *Consumer) publishResult(ctx context.Context, cmd command, msgID string, resp answer.Response) error {
	op := cmd.op
	if op == "" { // refused for a subject that named no known operation
		op = Malformed
	}
	m := nats.NewMsg(ResultSubject(cmd.tenant, op))
	if cmd.key != "" {
		m.Header.Set(HeaderKey, cmd.key)
	}
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
