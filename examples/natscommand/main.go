// Command natscommand sends one command to the order service through NATS
// JetStream, as a checkout service would, and prints the result the
// service publishes for it. It is docs/messaging.md's example without the
// nats CLI: with `make run` going (its embedded NATS on 127.0.0.1:4223),
//
//	go run ./examples/natscommand -s nats://127.0.0.1:4223 -user acme -password demo-key-acme \
//	  create R1 '{"customer_id":"cus_1","currency":"EUR","items":[{"sku":"A","quantity":1,"unit_price":1250}]}'
//
// (prices are in the currency's minor units: 1250 is 12.50 EUR)
//
// publishes the body on orders.commands.acme.create with the header
// Idempotency-Key: R1, and prints what arrives on orders.results.acme.create
// under that key: its headers (Status, Idempotent-Replayed) and its body,
// the HTTP body byte for byte. A command the service refuses for its form
// (no key, a body that is not JSON) is answered too, with the problem HTTP
// would send. The tenant is the NATS user (its password is its API key),
// and it may publish only on its five operation subjects (the broker
// refuses any other, an unknown operation included, and natscommand says
// so at once) and subscribe only to its own results and to its own reply
// inbox, _INBOX_<tenant>.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "natscommand:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("natscommand", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := fs.String("s", "nats://127.0.0.1:4223", "the NATS server (`make run` embeds one here)")
	user := fs.String("user", "acme", "the NATS user: the tenant")
	password := fs.String("password", "demo-key-acme", "its password: the tenant's API key")
	timeout := fs.Duration("timeout", 15*time.Second, "how long to wait for the result")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: natscommand [flags] OP IDEMPOTENCY-KEY BODY\n"+
			"  OP is create, pay, cancel, ship or deliver; BODY is the HTTP body, plus \"order_id\" for a command on an order")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 3 {
		fs.Usage()
		return errors.New("want OP, IDEMPOTENCY-KEY and BODY")
	}
	op, key, body := fs.Arg(0), fs.Arg(1), fs.Arg(2)
	tenant := *user

	// The broker answers a publish it refuses only with an asynchronous
	// error: caught here, it ends the wait for an acknowledgement that
	// would never come.
	refused := make(chan error, 1)
	nc, err := nats.Connect(*server, nats.UserInfo(*user, *password),
		// The tenant may only receive replies on its own inbox.
		nats.CustomInboxPrefix("_INBOX_"+tenant), nats.Timeout(5*time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				select {
				case refused <- err:
				default:
				}
			}
		}))
	if err != nil {
		return fmt.Errorf("connect to %s as %s (is `make run` going?): %w", *server, *user, err)
	}
	defer nc.Close()

	// Subscribe first: the result may come before the publish returns. A
	// refusal of an operation the service does not know (from a broker that
	// lets one through) comes on orders.results.<tenant>.malformed.
	results := fmt.Sprintf("orders.results.%s.%s", tenant, op)
	refusals := fmt.Sprintf("orders.results.%s.malformed", tenant)
	sub, err := nc.SubscribeSync(fmt.Sprintf("orders.results.%s.>", tenant))
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	m := nats.NewMsg(fmt.Sprintf("orders.commands.%s.%s", tenant, op))
	m.Header.Set("Idempotency-Key", key)
	m.Data = []byte(body)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	publishing, stopPublishing := context.WithCancelCause(ctx)
	defer stopPublishing(nil)
	go func() {
		select {
		case err := <-refused:
			stopPublishing(err)
		case <-publishing.Done():
		}
	}()
	ack, err := js.PublishMsg(publishing, m)
	if cause := context.Cause(publishing); errors.Is(cause, nats.ErrPermissionViolation) {
		return fmt.Errorf("the broker refused the command (%s may publish only on orders.commands.%s.<op>, <op> one of create, pay, cancel, ship, deliver): %w", tenant, tenant, cause)
	}
	if err != nil {
		return fmt.Errorf("publish %s: %w", m.Subject, err)
	}
	fmt.Fprintf(stdout, "→ %s  Idempotency-Key: %s  (stream %s, message %d)\n", m.Subject, key, ack.Stream, ack.Sequence)

	for {
		r, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return fmt.Errorf("no result on %s for Idempotency-Key %s within %s: %w", results, key, *timeout, err)
		}
		if (r.Subject != results && r.Subject != refusals) || r.Header.Get("Idempotency-Key") != key {
			continue // another command's result
		}
		var head []string
		for _, h := range []string{"Status", "Idempotent-Replayed", "Location", "Idempotency-Key"} {
			if v := r.Header.Get(h); v != "" {
				head = append(head, h+": "+v)
			}
		}
		fmt.Fprintf(stdout, "← %s  %s\n%s\n", r.Subject, strings.Join(head, "  "), r.Data)
		return nil
	}
}
