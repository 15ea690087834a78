package messaging_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/messaging"
)

// A tenant's user may publish on its five operation subjects and nothing
// else: the broker refuses another subject of its own prefix (an unknown
// operation, a token too many, one as long as the control line allows)
// as it refuses another tenant's, before the stream stores it.
func TestATenantPublishesOnlyOnItsFiveOperationSubjects(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	violations := make(chan error, 16)
	acme := w.tenantConn("acme", nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	js, err := jetstream.New(acme)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("each of the five is stored", func(t *testing.T) {
		for _, op := range messaging.Ops {
			if _, err := js.Publish(ctx, messaging.CommandSubject("acme", op), []byte("{}")); err != nil {
				t.Errorf("%s: %v", op, err)
			}
		}
	})
	refused := []string{
		messaging.CommandSubject("acme", "refund"),
		messaging.CommandSubject("acme", "create") + ".now",
		"orders.commands.acme",
		messaging.CommandSubject("acme", strings.Repeat("x", 4050)),
		messaging.CommandSubject("globex", "create"),
	}
	for _, subject := range refused {
		t.Run("refused: "+subject[:min(len(subject), 40)], func(t *testing.T) {
			if err := acme.Publish(subject, []byte("{}")); err != nil {
				t.Fatalf("publish: %v", err)
			}
			if err := acme.Flush(); err != nil {
				t.Fatalf("flush: %v", err)
			}
			select {
			case err := <-violations:
				if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject[:min(len(subject), 40)]) {
					t.Errorf("the broker's error %v, want a permissions violation for this subject", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the broker accepted the publish")
			}
			if !acme.IsConnected() {
				t.Errorf("acme's connection is %v after the refusal, want it kept", acme.Status())
			}
		})
	}
	t.Run("the stream holds the five, and nothing else", func(t *testing.T) {
		stream, err := w.js.Stream(ctx, messaging.CommandsStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := stream.Info(ctx)
		if err != nil || info.State.Msgs != uint64(len(messaging.Ops)) {
			t.Errorf("ORDER_COMMANDS holds %d commands (%v), want %d", info.State.Msgs, err, len(messaging.Ops))
		}
	})
}
