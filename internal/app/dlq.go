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
	done, err := q.Replay(ctx, seqs...)
	replayed := 0
	for _, r := range done {
		if r.Duplicate {
			fmt.Fprintf(stdout, "kept %d: %s dropped it as a duplicate (Nats-Msg-Id %s is inside its duplicate window); replay it later\n",
				r.Sequence, messaging.CommandsStream, r.Header.Get(messaging.HeaderMsgID))
			continue
		}
		replayed++
		fmt.Fprintf(stdout, "replayed %d to %s (Idempotency-Key %s)\n", r.Sequence, r.Subject, r.Header.Get(messaging.HeaderKey))
	}
	fmt.Fprintf(stdout, "%d dead-lettered commands replayed\n", replayed)
	return err
}
