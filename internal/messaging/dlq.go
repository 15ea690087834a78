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
// body unchanged, adding only the Dead-Letter-* headers, and then
// terminates it in ORDER_COMMANDS. If the DLQ publish fails the command is
// left unacknowledged, to be redelivered and dead-lettered again: a dead
// letter is never dropped.
func (c *Consumer) deadLetter(ctx context.Context, msg jetstream.Msg, op string, seq uint64, deliveries int, reason string) {
	m := nats.NewMsg(dlqSubject(msg.Subject()))
	for k, vs := range msg.Headers() {
		m.Header[k] = append([]string(nil), vs...)
	}
	m.Header.Set(HeaderReason, reason)
	m.Header.Set(HeaderDLSubject, msg.Subject())
	m.Header.Set(HeaderDLDeliveries, strconv.Itoa(deliveries))
	m.Header.Set(HeaderDLSequence, strconv.FormatUint(seq, 10))
	m.Data = msg.Data()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.JS.PublishMsg(pctx, m); err != nil {
		c.logger().Error("messaging: could not dead-letter a command; it stays in "+CommandsStream, "subject", msg.Subject(), "err", err)
		_ = msg.NakWithDelay(c.Backoff.Max)
		return
	}
	c.logger().Warn("messaging: command dead-lettered", "subject", msg.Subject(), "key", msg.Headers().Get(HeaderKey),
		"reason", reason, "deliveries", deliveries)
	if err := msg.TermWithReason("dead-lettered: " + reason); err != nil {
		c.logger().Warn("messaging: term of a dead-lettered command lost", "err", err)
	}
	observer(c.Observe).MessageDeadLettered(op)
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

// Replayed is what Replay did with one dead letter.
type Replayed struct {
	DeadLetter
	// Duplicate is true when ORDER_COMMANDS dropped the copy because its
	// Nats-Msg-Id is still inside the stream's duplicate window; the dead
	// letter is kept, to be replayed once the window has passed.
	Duplicate bool
}

// Replay publishes the dead letters with the given sequences (all of them
// when none is given) to their original subjects, with their original
// headers and body, and deletes each from the DLQ once ORDER_COMMANDS
// holds it. A crash in between leaves it in both; replaying it again is
// harmless, since the records absorb whatever already ran.
func (q *DLQ) Replay(ctx context.Context, seqs ...uint64) ([]Replayed, error) {
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
	for _, seq := range seqs {
		d, err := q.get(ctx, s, seq)
		if err != nil {
			return nil, fmt.Errorf("dead letter %d: %w", seq, err)
		}
		letters = append(letters, d)
	}
	var out []Replayed
	for _, d := range letters {
		m := nats.NewMsg(d.Subject)
		for k, vs := range d.Header {
			if !strings.HasPrefix(k, "Dead-Letter-") {
				m.Header[k] = vs
			}
		}
		m.Data = d.Data
		ack, err := q.JS.PublishMsg(ctx, m)
		if err != nil {
			return out, fmt.Errorf("replay dead letter %d to %s: %w", d.Sequence, d.Subject, err)
		}
		if ack.Duplicate {
			out = append(out, Replayed{DeadLetter: d, Duplicate: true})
			continue
		}
		if err := s.DeleteMsg(ctx, d.Sequence); err != nil {
			return out, fmt.Errorf("dead letter %d replayed but not deleted from %s: %w", d.Sequence, DLQStream, err)
		}
		out = append(out, Replayed{DeadLetter: d})
	}
	return out, nil
}
