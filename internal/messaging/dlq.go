package messaging

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// deadLetter moves a command to ORDER_COMMANDS_DLQ and terminates it in
// ORDER_COMMANDS. The letter is the command as its tenant sent it, body
// and the headers a copy may carry (see copyable), plus the Dead-Letter-*
// headers and, once, when it was first published (HeaderFirstPublished).
// It is kept under cmd's dlqSubject, built from the parsed subject.
//
// A dead letter is never dropped silently, and never holds up the
// consumer for good: a command not yet acknowledged or terminated takes
// one of the consumer's MaxAckPending slots, and a thousand of them stop
// every tenant's commands. So:
//   - the letter is too large (larger than the DLQ's max_msg_size or the
//     broker's max_payload): a smaller letter is stored at once, with only
//     the body, the Idempotency-Key and our headers, and if that is too
//     large too, without the body (its size and digest kept); its reason
//     says so. Too large is an answer, not an outage: the same letter is
//     never sent again as if the DLQ were down;
//   - any other failure, the DLQ unreachable or refusing for another
//     reason (full, gone, no JetStream): the command is left
//     unacknowledged and tried again, whole, on a later delivery, up to
//     deadLetterDeliveries. A letter is never cut for a reason that is
//     not its own size: a DLQ out of room would otherwise keep letters
//     without their bodies for good;
//   - past those, the command is terminated with an error log that names
//     it: ORDER_COMMANDS keeps it, readable by its sequence, until its
//     max_age.
func (c *Consumer) deadLetter(ctx context.Context, d delivery, cmd command, reason string) {
	msg, op := d.msg, cmd.opLabel()
	told := reason
	duplicate, err := c.storeLetter(ctx, letter(d, cmd, told, whole))
	for _, smaller := range []letterForm{withoutOtherHeaders, withoutBody} {
		if !tooLarge(err) {
			break
		}
		told = fmt.Sprintf("%s; %s, since %s refused the letter as it was: %v", reason, smaller.says, DLQStream, err)
		duplicate, err = c.storeLetter(ctx, letter(d, cmd, told, smaller))
	}
	reason = told
	if err != nil && d.count < c.deadLetterDeliveries() {
		c.logger().Error("messaging: could not dead-letter a command; it stays in "+CommandsStream+" and is tried again",
			"subject", d.subject(), "sequence", d.seq, "delivery", d.count, "err", err)
		_ = msg.NakWithDelay(c.Backoff.Delay(d.count))
		return
	}
	if err != nil {
		c.logger().Error("messaging: dead letter given up; the command is terminated, and kept in "+CommandsStream+" until its max_age",
			"subject", d.subject(), "sequence", d.seq, "key", cmd.key, "reason", reason, "deliveries", d.count, "err", err)
		observer(c.Observe).DeadLetterGivenUp(op) // counted before the term, which may be lost
		_ = msg.TermWithReason("not dead-lettered: " + reason)
		return
	}
	if duplicate { // an earlier delivery stored it, and its term was lost
		c.logger().Info("messaging: command already dead-lettered", "subject", d.subject(), "sequence", d.seq)
	} else {
		c.logger().Warn("messaging: command dead-lettered", "subject", d.subject(), "key", cmd.key,
			"reason", reason, "deliveries", d.count)
		observer(c.Observe).MessageDeadLettered(op)
	}
	if err := msg.TermWithReason("dead-lettered: " + reason); err != nil {
		c.logger().Warn("messaging: term of a dead-lettered command lost", "err", err)
	}
}

// dlqSubject is where cmd's dead letter is kept:
// orders.dlq.commands.<tenant>.<op> from the parsed subject, or
// DLQMalformed when the subject named no known tenant and operation.
func (cmd command) dlqSubject() string {
	if cmd.tenant == "" || cmd.op == "" {
		return DLQMalformed
	}
	return DLQPrefix + strings.TrimPrefix(CommandSubject(cmd.tenant, cmd.op), "orders.")
}

// letterForm is what of its command a dead letter carries.
type letterForm struct {
	// keep picks the tenant's headers the letter carries.
	keep func(header string) bool
	body bool
	says string // how the reason says what the letter lacks
}

// The forms a dead letter is tried in, each only when the DLQ refused the
// one before.
var (
	whole               = letterForm{keep: copyable, body: true}
	withoutOtherHeaders = letterForm{keep: isKey, body: true, says: "stored without its other headers"}
	withoutBody         = letterForm{keep: func(string) bool { return false }, says: "stored without its body (its size and SHA-256 in " +
		HeaderDLBodySize + " and " + HeaderDLBodyDigest + ")"}
)

// letter is the dead letter of d in form f: its body, the headers f keeps,
// and ours.
//
// Its Nats-Msg-Id is its own, named after the command (msgID), which no
// other command shares: two commands are two letters whatever ids their
// tenants gave them, and a command delivered again after its term was
// lost is recognised as the letter it already is. Its size does not
// depend on the clock (firstPublishedLayout), so a command's letter is
// the same size on every delivery.
func letter(d delivery, cmd command, reason string, f letterForm) *nats.Msg {
	msg := d.msg
	m := nats.NewMsg(cmd.dlqSubject())
	for k, vs := range msg.Headers() {
		if f.keep(k) {
			m.Header[k] = append([]string(nil), vs...)
		}
	}
	if id := d.msgID("dead-letter"); id != "" {
		m.Header.Set(HeaderMsgID, id)
	}
	m.Header.Set(HeaderReason, reason)
	subject := msg.Subject()
	if len(subject) > maxShown {
		m.Header.Set(HeaderDLSubjectTruncated, strconv.Itoa(len(subject)))
		subject = subject[:maxShown]
	}
	m.Header.Set(HeaderDLSubject, subject)
	m.Header.Set(HeaderDLDeliveries, strconv.Itoa(d.count))
	m.Header.Set(HeaderDLSequence, strconv.FormatUint(d.seq, 10))
	m.Header.Set(HeaderFirstPublished, d.published.UTC().Format(firstPublishedLayout))
	if f.body {
		m.Data = msg.Data()
		return m
	}
	if cmd.key != "" { // the parsed key: a raw one may be as large as the body
		m.Header.Set(HeaderKey, cmd.key)
	}
	sum := sha256.Sum256(msg.Data())
	m.Header.Set(HeaderDLBodySize, strconv.Itoa(len(msg.Data())))
	m.Header.Set(HeaderDLBodyDigest, "sha-256=:"+base64.StdEncoding.EncodeToString(sum[:])+":")
	return m
}

// firstPublishedLayout writes HeaderFirstPublished: RFC 3339 with every
// nanosecond digit, so the header is as long whatever the time.
const firstPublishedLayout = "2006-01-02T15:04:05.000000000Z07:00"

// storeLetter publishes a dead letter; duplicate when the DLQ already had
// it (see letter).
func (c *Consumer) storeLetter(ctx context.Context, m *nats.Msg) (duplicate bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ack, err := c.JS.PublishMsg(ctx, m)
	if err != nil {
		return false, err
	}
	return ack.Duplicate, nil
}

// tooLarge reports whether err says that this letter, as it is, is too
// large to be stored: larger than the DLQ's max_msg_size (the stream's
// answer), or than the broker's max_payload (nats.go's, before sending).
// Sending it again would fail again; a smaller letter may not. Any other
// error, the DLQ's own included (out of room, gone), is no answer about
// the letter: it is sent again, whole, later.
func tooLarge(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, nats.ErrMaxPayload) ||
		errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}

// deadLetterDeliveries is how many deliveries a command gets in all
// before its dead letter is given up: COMMAND_MAX_DELIVER to run, and as
// many again to be dead-lettered (a retryable intent is run again on each
// of those, so the channel may be asked up to twice COMMAND_MAX_DELIVER
// times while the DLQ cannot be reached).
func (c *Consumer) deadLetterDeliveries() int { return 2 * max(c.MaxDeliver, 1) }

// copyable reports whether a copy of a command, its dead letter or the
// replay of that, may carry the header as it is. Not the broker's Nats-*
// control headers: they spoke to ORDER_COMMANDS when the tenant published,
// and on a copy they would make the other stream refuse it
// (Nats-Expected-Stream) or drop it as a duplicate (Nats-Msg-Id). Not the
// Dead-Letter-* ones either: each dead letter writes its own, and a replay
// is a command again.
func copyable(header string) bool {
	h := strings.ToLower(header)
	return !strings.HasPrefix(h, "nats-") && !strings.HasPrefix(h, "dead-letter-")
}

// isKey reports whether header is Idempotency-Key: all a smaller dead
// letter keeps of its command's headers, since a replay needs it.
func isKey(header string) bool { return strings.EqualFold(header, HeaderKey) }

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

// Key is the Idempotency-Key the command carried, whatever the case its
// publisher wrote the header in; "" for none (or several, which is
// malformed: the reason says so).
func (d DeadLetter) Key() string { return keyIn(d.Header) }

// keyIn reads the one Idempotency-Key of h, as the consumer does
// (headerValues), for an operator's eyes.
func keyIn(h nats.Header) string {
	if vs := headerValues(h, HeaderKey); len(vs) == 1 {
		return vs[0]
	}
	return ""
}

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

// unreplayable says why the letter cannot be sent again as its command,
// "" when it can: its subject was kept truncated, is not a command's
// (orders.commands.<tenant>.<op> with one of Ops), or its body was not
// kept. A replay publishes only to a subject that parses.
func (d DeadLetter) unreplayable() string {
	if n := d.Header.Get(HeaderDLSubjectTruncated); n != "" {
		return fmt.Sprintf("its subject was %s bytes, kept truncated: there is no subject to replay it to", n)
	}
	if _, _, refusal := parseSubject(d.Subject, func(tenant string) bool { return CheckTenant(tenant) == nil }); refusal != nil {
		return "not a command's subject: " + refusal.Detail
	}
	if n := d.Header.Get(HeaderDLBodySize); n != "" {
		return fmt.Sprintf("stored without its body (%s bytes, %s %s): its tenant must send it again", n, HeaderDLBodyDigest, d.Header.Get(HeaderDLBodyDigest))
	}
	return ""
}

// Replayed is what Replay did with one dead letter: replayed, or not and why.
type Replayed struct {
	DeadLetter
	// Unread is why the dead letter asked for by its sequence could not
	// be read (only Sequence is set then): jetstream.ErrMsgNotFound when
	// the DLQ does not hold it (replayed or deleted already).
	Unread error
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
// sent: the body and the headers a copy may carry (see copyable: not the
// Dead-Letter-* ones, nor the broker's Nats-* control headers, which would
// make the stream refuse or drop the copy). HeaderFirstPublished goes
// along, so the consumer knows the command's age too. Each dead letter is
// deleted from the DLQ once ORDER_COMMANDS holds its copy.
//
// A dead letter first published more than horizon ago is refused, not
// replayed: the record of its intent may have been removed, and the copy
// would run as a first attempt. Zero horizon: no bound.
//
// A failing dead letter does not stop the others: each, and each sequence
// that could not be read, gets its outcome. The error is for a DLQ that
// could not be read at all.
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
	out := make([]Replayed, 0, max(len(letters), len(seqs)))
	for _, seq := range seqs {
		d, err := q.get(ctx, s, seq)
		if err != nil {
			out = append(out, Replayed{DeadLetter: DeadLetter{Sequence: seq}, Unread: err})
			continue
		}
		letters = append(letters, d)
	}
	for _, d := range letters {
		out = append(out, q.replay(ctx, s, d, horizon))
	}
	return out, nil
}

// replay republishes one dead letter and deletes it from the DLQ.
func (q *DLQ) replay(ctx context.Context, s jetstream.Stream, d DeadLetter, horizon time.Duration) Replayed {
	if age := time.Since(d.FirstPublished()); horizon > 0 && age > horizon {
		return Replayed{DeadLetter: d, Refused: fmt.Sprintf(
			"first published %s ago, past the %s its record is sure to be kept: its record may be gone, and a replay would run it as a first attempt",
			age.Round(time.Second), horizon)}
	}
	if why := d.unreplayable(); why != "" {
		return Replayed{DeadLetter: d, Refused: why}
	}
	m := nats.NewMsg(d.Subject)
	for k, vs := range d.Header {
		if copyable(k) {
			m.Header[k] = vs
		}
	}
	m.Header.Set(HeaderFirstPublished, d.FirstPublished().UTC().Format(firstPublishedLayout))
	m.Data = d.Data
	if _, err := q.JS.PublishMsg(ctx, m); err != nil {
		return Replayed{DeadLetter: d, Err: fmt.Errorf("publish to %s: %w", d.Subject, err)}
	}
	if err := s.DeleteMsg(ctx, d.Sequence); err != nil {
		return Replayed{DeadLetter: d, Err: fmt.Errorf("replayed but not deleted from %s: %w", DLQStream, err)}
	}
	return Replayed{DeadLetter: d}
}
