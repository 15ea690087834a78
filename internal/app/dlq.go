package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/messaging"
)

// dlq is `orderservice dlq list` and `orderservice dlq replay [SEQ... |
// --all]`: manual compensation. A replay republishes dead-lettered
// commands unchanged to their subjects; the idempotency records absorb
// whatever in fact already ran.
func dlq(ctx context.Context, cfg Config, args []string, stdout io.Writer) error {
	list, seqs, err := dlqArgs(args)
	if err != nil {
		return err
	}
	_, nc, _, err := connectNATS(cfg, false)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if list {
		return dlqList(ctx, js, stdout)
	}
	return dlqReplay(ctx, cfg, js, seqs, stdout)
}

// dlqArgs reads dlq's arguments: list, or the sequence numbers to replay
// (none for --all).
func dlqArgs(args []string) (list bool, seqs []uint64, err error) {
	usage := fmt.Errorf("usage: orderservice dlq list | orderservice dlq replay SEQ... | orderservice dlq replay --all")
	switch {
	case len(args) == 1 && args[0] == "list":
		return true, nil, nil
	case len(args) == 2 && args[0] == "replay" && args[1] == "--all":
		return false, nil, nil
	case len(args) < 2 || args[0] != "replay":
		return false, nil, usage
	}
	for _, a := range args[1:] {
		seq, err := strconv.ParseUint(a, 10, 64)
		if err != nil || seq == 0 {
			return false, nil, fmt.Errorf("dlq replay: %q is not a sequence number from `orderservice dlq list`", a)
		}
		seqs = append(seqs, seq)
	}
	return false, seqs, nil
}

// dlqList is `orderservice dlq list`: a line per dead letter.
func dlqList(ctx context.Context, js jetstream.JetStream, stdout io.Writer) error {
	letters, err := (&messaging.DLQ{JS: js}).List(ctx)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SEQ\tDEAD-LETTERED\tSUBJECT\tIDEMPOTENCY-KEY\tDELIVERIES\tREASON")
	for _, d := range letters {
		key := d.Key()
		if key == "" {
			key = "(none)"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", d.Sequence, d.Time.UTC().Format(time.RFC3339), d.Subject,
			key, d.Header.Get(messaging.HeaderDLDeliveries), d.Reason())
	}
	fmt.Fprintf(w, "%d dead-lettered commands\n", len(letters))
	return w.Flush()
}

// dlqReplay is `orderservice dlq replay`: a line per dead letter said
// replayed, kept (and why) or not found, then the sums.
func dlqReplay(ctx context.Context, cfg Config, js jetstream.JetStream, seqs []uint64, stdout io.Writer) error {
	horizon, err := replayHorizon(ctx, cfg, js)
	if err != nil {
		return err
	}
	done, err := (&messaging.DLQ{JS: js}).Replay(ctx, horizon, seqs...)
	if err != nil {
		return err
	}
	replayed, kept, notFound, unread := 0, 0, 0, 0
	for _, r := range done {
		switch {
		case errors.Is(r.Unread, jetstream.ErrMsgNotFound):
			notFound++
			fmt.Fprintf(stdout, "not found: dead letter %d (not in %s: replayed or deleted already? `orderservice dlq list` shows what is there)\n",
				r.Sequence, messaging.DLQStream)
		case r.Unread != nil:
			unread++
			fmt.Fprintf(stdout, "not read: dead letter %d: %v\n", r.Sequence, r.Unread)
		case r.Refused != "":
			kept++
			fmt.Fprintf(stdout, "kept %d (%s): %s\n", r.Sequence, keyOf(r.DeadLetter), r.Refused)
		case r.Err != nil:
			kept++
			fmt.Fprintf(stdout, "kept %d (%s): %v\n", r.Sequence, keyOf(r.DeadLetter), r.Err)
		default:
			replayed++
			fmt.Fprintf(stdout, "replayed %d to %s (%s)\n", r.Sequence, r.Subject, keyOf(r.DeadLetter))
		}
	}
	sum := fmt.Sprintf("%d dead-lettered commands replayed, %d kept", replayed, kept)
	if notFound > 0 {
		sum += fmt.Sprintf(", %d not found", notFound)
	}
	if unread > 0 {
		sum += fmt.Sprintf(", %d not read", unread)
	}
	fmt.Fprintln(stdout, sum)
	if n := len(done) - replayed; n > 0 {
		// The lines above said which and why; the error only says that.
		return fmt.Errorf("dlq replay: %d of %d dead letters were not replayed", n, len(done))
	}
	return nil
}

// keyOf names a dead letter's Idempotency-Key for the operator, or says it
// had none (a malformed command, dead-lettered at once).
func keyOf(d messaging.DeadLetter) string {
	if k := d.Key(); k != "" {
		return "Idempotency-Key " + k
	}
	return "no Idempotency-Key"
}

// replayHorizon is the consumer's Horizon, from the policy the running
// service derives: the configuration, with ORDER_COMMANDS's max_age as the
// message redelivery window. The streams are read, never created.
func replayHorizon(ctx context.Context, cfg Config, js jetstream.JetStream) (time.Duration, error) {
	s, err := js.Stream(ctx, messaging.CommandsStream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", messaging.CommandsStream, err)
	}
	return messaging.Horizon(policyFor(cfg, s.CachedInfo().Config.MaxAge)), nil
}
