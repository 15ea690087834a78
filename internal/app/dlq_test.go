package app_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/tests/apptest"
)

// TestDLQSaysWhatItDid pins what `orderservice dlq` prints for the two
// cases an operator met with confusing output: a dead letter without an
// Idempotency-Key (a malformed command) is said to have none, and a
// sequence that is not in the DLQ is named as not found, before the sum
// that counts it.
func TestDLQSaysWhatItDid(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	d := nats.NewMsg(messaging.DLQPrefix + "commands.acme.create")
	d.Header.Set(messaging.HeaderDLSubject, messaging.CommandSubject("acme", "create"))
	d.Header.Set(messaging.HeaderReason, "malformed: no Idempotency-Key")
	d.Data = []byte(`{"customer_id":"cus_keyless"}`)
	ack, err := m.Door.JS().PublishMsg(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"NATS_EMBEDDED_ADDR": m.Embedded.Addr(), "LOG_LEVEL": "warn", "DATABASE_URL": dbURL}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := app.Run(context.Background(), args, env, &out)
		return out.String(), err
	}

	list, err := run("dlq", "list")
	if err != nil || !strings.Contains(list, "(none)") {
		t.Errorf("dlq list of a dead letter without a key: %v\n%s", err, list)
	}
	out, err := run("dlq", "replay", fmt.Sprint(ack.Sequence))
	if err != nil || !strings.Contains(out, "(no Idempotency-Key)") || strings.Contains(out, "Idempotency-Key )") {
		t.Errorf("dlq replay of a dead letter without a key: %v\n%s", err, out)
	}
	t.Log(out)

	out, err = run("dlq", "replay", "99999")
	notFound, sum := strings.Index(out, "not found: dead letter 99999"), strings.Index(out, "0 dead-lettered commands replayed, 0 kept, 1 not found")
	if err == nil || notFound < 0 || sum < notFound {
		t.Errorf("dlq replay 99999 (no such dead letter): %v\n%s\nwant the sequence named as not found, then the sum counting it", err, out)
	}
	if err != nil && strings.Contains(err.Error(), "message not found") {
		t.Errorf("the error repeats the broker's words after the lines that said it: %v", err)
	}
	t.Logf("%s%v", out, err)
}
