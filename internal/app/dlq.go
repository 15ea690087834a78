package app

import (
	"context"
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
	usage := fmt.Errorf("usage: orderservice dlq list | orderservice dlq replay SEQ... | orderservice dlq replay --all")
	if len(args) == 0 {
		return usage
	}
	var seqs []uint64
	switch args[0] {
	case "list":
		if len(args) != 1 {
			return usage
		}
	case "replay":
		if len(args) == 2 && args[1] == "--all" {
			break
		}
		if len(args) < 2 {
			return usage
		}
		for _, a := range args[1:] {
			seq, err := strconv.ParseUint(a, 10, 64)
			if err != nil || seq == 0 {
				return fmt.Errorf("dlq replay: %q is not a sequence number from `orderservice dlq list`", a)
			}
			seqs = append(seqs, seq)
		}
	default:
		return usage
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
	q := &messaging.DLQ{JS: js}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	if args[0] == "list" {
		letters, err := q.List(ctx)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "SEQ\tDEAD-LETTERED\tSUBJECT\tIDEMPOTENCY-KEY\tDELIVERIES\tREASON")
		for _, d := range letters {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", d.Sequence, d.Time.UTC().Format(time.RFC3339), d.Subject,
				d.Header.Get(messaging.HeaderKey), d.Header.Get(messaging.HeaderDLDeliveries), d.Reason())
		}
		fmt.Fprintf(w, "%d dead-lettered commands\n", len(letters))
		return w.Flush()
	}
	horizon, err := replayHorizon(ctx, cfg, js)
	if err != nil {
		return err
	}
	done, err := q.Replay(ctx, horizon, seqs...)
	replayed, failed := 0, 0
	for _, r := range done {
		switch {
		case r.Refused != "":
			failed++
			fmt.Fprintf(stdout, "kept %d (Idempotency-Key %s): %s\n", r.Sequence, r.Header.Get(messaging.HeaderKey), r.Refused)
		case r.Err != nil:
			failed++
			fmt.Fprintf(stdout, "kept %d (Idempotency-Key %s): %v\n", r.Sequence, r.Header.Get(messaging.HeaderKey), r.Err)
		default:
			replayed++
			fmt.Fprintf(stdout, "replayed %d to %s (Idempotency-Key %s)\n", r.Sequence, r.Subject, r.Header.Get(messaging.HeaderKey))
		}
	}
	fmt.Fprintf(stdout, "%d dead-lettered commands replayed, %d kept\n", replayed, failed)
	if err == nil && failed > 0 {
		err = fmt.Errorf("dlq replay: %d of %d dead letters were not replayed", failed, len(done))
	}
	return err
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
