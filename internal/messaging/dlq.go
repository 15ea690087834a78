package messaging

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// deadLetter moves a command to ORDER_COMMANDS_DLQ with its headers and
// body unchanged, adding only the Dead-Letter-* headers and, once, when it
// was first published (HeaderFirstPublished), and then terminates it in
// ORDER_COMMANDS. If the DLQ publish fails the command is left
// unacknowledged, to be redelivered and dead-lettered again: a dead letter
// is never dropped.
func (c *Consumer) deadLetter(ctx context.Context, d delivery, op, reason string) {
	msg := d.msg
	m := nats.NewMsg(dlqSubject(msg.Subject()))
	for k, vs := range msg.Headers() {
		m.Header[k] = append([]string(nil), vs...)
	}
	m.Header.Set(HeaderReason, reason)
	m.Header.Set(HeaderDLSubject, msg.Subject())
	m.Header.Set(HeaderDLDeliveries, strconv.Itoa(d.count))
	m.Header.Set(HeaderDLSequence, strconv.FormatUint(d.seq, 10))
	m.Header.Set(HeaderFirstPublished, d.published.UTC().Format(time.RFC3339Nano))
	m.Data = msg.Data()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.JS.PublishMsg(pctx, m); err != nil {
		c.logger().Error("messaging: could not dead-letter a command; it stays in "+CommandsStream, "subject", msg.Subject(), "err", err)
		_ = msg.NakWithDelay(c.Backoff.Max)
		return
	}
	c.logger().Warn("messaging: command dead-lettered", "subject", msg.Subject(), "key", msg.Headers().Get(HeaderKey),
		"reason", reason, "deliveries", d.count)
	if err := msg.TermWithReason("dead-lettered: " + reason); err != nil {
		c.logger().Warn("messaging: term of a dead-lettered command lost", "err", err)
	}
	observer(c.Observe).MessageDeadLettered(op)
}

// firstPublished is when a command was first published: the time its
// stream stored this copy, or the earlier time a dead letter carried into
// its replay. A publisher can only make its own command older (and so
// refused sooner), never younger.
func firstPublished(h nats.Header, stored time.Time) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, h.Get(HeaderFirstPublished)); err == nil && t.Before(stored) {
		return t
	}
	return stored
}

// DeadLetter is one command in ORDER_COMMANDS_DLQ.
type DeadLetter struct {
	Sequence uint64
	Time     time.Time
	// Subject is where the command was published and is replayed to.
	Subject string
	Header  nats.Header
	Data    []byte
}

// Reason is why the command was dead-lettered.
func (d DeadLetter) Reason() string { return d.Header.Get(HeaderReason) }

// DLQ is the operator's handle on the dead-letter stream: `orderservice
// dlq list` and `orderservice dlq replay`.
type DLQ struct {
	JS jetstream.JetStream
}

// Depth is how many dead letters the DLQ holds, as the stream counts them.
func (q *DLQ) Depth(ctx context.Context) (uint64, error) {
	s, err := q.JS.Stream(ctx, DLQStream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", DLQStream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// List returns every dead letter, oldest first.
func (q *DLQ) List(ctx context.Context) ([]DeadLetter, error) {
	s, err := q.JS.Stream(ctx, DLQStream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", DLQStream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []DeadLetter
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		d, err := q.get(ctx, s, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted by an earlier replay
		}
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

func (q *DLQ) get(ctx context.Context, s jetstream.Stream, seq uint64) (DeadLetter, error) {
	raw, err := s.GetMsg(ctx, seq)
	if err != nil {
		return DeadLetter{}, err
	}
	subject := raw.Header.Get(HeaderDLSubject)
	if subject == "" {
		subject = "orders." + strings.TrimPrefix(raw.Subject, DLQPrefix)
	}
	return DeadLetter{Sequence: raw.Sequence, Time: raw.Time, Subject: subject, Header: raw.Header, Data: raw.Data}, nil
}

// FirstPublished is when the command was first published, as its dead
// letter says (or the dead letter's own time, for one written before
// dead letters said so).
func (d DeadLetter) FirstPublished() time.Time { return firstPublished(d.Header, d.Time) }

// Replayed is what Replay did with one dead letter: replayed, or not and why.
type Replayed struct {
	DeadLetter
	// Refused says why the dead letter was not replayed (it is kept):
	// its intent's record may be gone.
	Refused string
	// Err is the publish or delete that failed (the dead letter is kept,
	// or, when only the delete failed, is in both streams: replaying it
	// again is harmless).
	Err error
}

// Replay publishes the dead letters with the given sequences (all of them
// when none is given) to their original subjects, with what their tenant
// sent: the body and headers, less the Dead-Letter-* ones and the broker's
// Nats-* control headers (an expected sequence or a message id would make
// the stream refuse or drop the copy). HeaderFirstPublished goes along, so
// the consumer knows the command's age too. Each dead letter is deleted
// from the DLQ once ORDER_COMMANDS holds its copy.
//
// A dead letter first published more than horizon ago is refused, not
// replayed: the record of its intent may have been removed, and the copy
// would run as a first attempt. Zero horizon: no bound.
//
// A failing dead letter does not stop the others: each gets its outcome.
// The error is for the dead letters that could not be read at all.
func (q *DLQ) Replay(ctx context.Context, horizon time.Duration, seqs ...uint64) ([]Replayed, error) {
	s, err := q.JS.Stream(ctx, DLQStream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", DLQStream, err)
	}
	var letters []DeadLetter
	if len(seqs) == 0 {
		if letters, err = q.List(ctx); err != nil {
			return nil, err
		}
	}
	var missing []error
	for _, seq := range seqs {
		d, err := q.get(ctx, s, seq)
		if err != nil {
			missing = append(missing, fmt.Errorf("dead letter %d: %w", seq, err))
			continue
		}
		letters = append(letters, d)
	}
	out := make([]Replayed, 0, len(letters))
	for _, d := range letters {
		out = append(out, q.replay(ctx, s, d, horizon))
	}
	return out, errors.Join(missing...)
}

// replay republishes one dead letter and deletes it from the DLQ.
func (q *DLQ) replay(ctx context.Context, s jetstream.Stream, d DeadLetter, horizon time.Duration) Replayed {
	if age := time.Since(d.FirstPublished()); horizon > 0 && age > horizon {
		return Replayed{DeadLetter: d, Refused: fmt.Sprintf(
			"first published %s ago, past the %s its record is sure to be kept: its record may be gone, and a replay would run it as a first attempt",
			age.Round(time.Second), horizon)}
	}
	m := nats.NewMsg(d.Subject)
	for k, vs := range d.Header {
		if !strings.HasPrefix(k, "Dead-Letter-") && !strings.HasPrefix(strings.ToLower(k), "nats-") {
			m.Header[k] = vs
		}
	}
	m.Header.Set(HeaderFirstPublished, d.FirstPublished().UTC().Format(time.RFC3339Nano))
	m.Data = d.Data
	if _, err := q.JS.PublishMsg(ctx, m); err != nil {
		return Replayed{DeadLetter: d, Err: fmt.Errorf("publish to %s: %w", d.Subject, err)}
	}
	if err := s.DeleteMsg(ctx, d.Sequence); err != nil {
		return Replayed{DeadLetter: d, Err: fmt.Errorf("replayed but not deleted from %s: %w", DLQStream, err)}
	}
	return Replayed{DeadLetter: d}
}
