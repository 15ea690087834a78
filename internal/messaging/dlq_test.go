package messaging_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/messaging"
)

func TestTransientFailuresEndInTheDLQAndAReplayCompletesOnce(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil)
	acme := w.tenantConn("acme")
	acmeJS, _ := jetstream.New(acme)
	results := subscribe(t, acme, messaging.ResultSubject("acme", "pay"))
	dead := subscribe(t, w.nc, messaging.DLQPrefix+">")

	created := w.api.Do(t, http.MethodPost, "/v1/orders", "dlq-create", createBody("cus_dlq"))
	if created.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.Status, created.Body)
	}
	id := jsonField(t, created.Body, "id")
	w.faults(map[string]any{"unavailable_rate": 1})

	body := fmt.Sprintf(`{"order_id":%q,"payment_method":"pm_ok"}`, id)
	publish(t, acmeJS, messaging.CommandSubject("acme", "pay"), "dlq-pay", body, "X-Trace", "trace-7")
	d := next(t, dead, "dead letter")
	<-w.counters.deadCh

	t.Run("after COMMAND_MAX_DELIVER deliveries the command is in the DLQ, headers and body unchanged", func(t *testing.T) {
		if !bytes.Equal(d.Data, []byte(body)) {
			t.Errorf("body = %s, want %s", d.Data, body)
		}
		if d.Header.Get(messaging.HeaderKey) != "dlq-pay" || d.Header.Get("X-Trace") != "trace-7" {
			t.Errorf("original headers lost: %v", d.Header)
		}
		if d.Header.Get(messaging.HeaderDLDeliveries) != "5" || d.Header.Get(messaging.HeaderDLSubject) != "orders.commands.acme.pay" ||
			!strings.Contains(d.Header.Get(messaging.HeaderReason), "after 5 deliveries") {
			t.Errorf("dead-letter headers: %v", d.Header)
		}
		if got := w.counters.get(w.counters.received, "pay"); got != 5 {
			t.Errorf("deliveries = %d, want 5", got)
		}
		if got := w.counters.get(w.counters.dead, "pay"); got != 1 {
			t.Errorf("dead-lettered = %d, want 1", got)
		}
		if len(results) != 0 {
			t.Errorf("%d results published for a command that never finished", len(results))
		}
	})

	q := &messaging.DLQ{JS: w.js}
	letters, err := q.List(context.Background())
	if err != nil || len(letters) != 1 || letters[0].Header.Get(messaging.HeaderKey) != "dlq-pay" {
		t.Fatalf("dlq list = %+v, %v", letters, err)
	}

	w.faults(map[string]any{"unavailable_rate": 0})
	replayed, err := q.Replay(context.Background())
	if err != nil || len(replayed) != 1 || replayed[0].Duplicate {
		t.Fatalf("replay = %+v, %v", replayed, err)
	}
	r := next(t, results, "result of the replayed command")
	<-w.counters.ackedCh

	t.Run("the replay completes the payment once", func(t *testing.T) {
		if r.Header.Get(messaging.HeaderStatus) != "200" || r.Header.Get(messaging.HeaderKey) != "dlq-pay" {
			t.Fatalf("result %v %s", r.Header, r.Data)
		}
		if got := jsonField(t, r.Data, "status"); got != "PAID" {
			t.Errorf("order status = %s", got)
		}
		stats := w.channelStats()
		if stats["charges"] != float64(1) {
			t.Errorf("channel charges = %v, want 1", stats["charges"])
		}
		if n := w.count("SELECT count(*) FROM payments WHERE order_id = ? AND status = 'succeeded'", id); n != 1 {
			t.Errorf("succeeded payments = %d, want 1", n)
		}
	})
	t.Run("the DLQ is empty after the replay", func(t *testing.T) {
		letters, err := q.List(context.Background())
		if err != nil || len(letters) != 0 {
			t.Errorf("dlq list = %+v, %v", letters, err)
		}
	})
	t.Run("a second replay of the same command only replays its outcome", func(t *testing.T) {
		publish(t, w.js, messaging.CommandSubject("acme", "pay"), "dlq-pay", body, "X-Trace", "trace-7")
		again := next(t, results, "result")
		if again.Header.Get(messaging.HeaderReplayed) != "true" || !bytes.Equal(again.Data, r.Data) {
			t.Errorf("again = %v %s", again.Header, again.Data)
		}
		if stats := w.channelStats(); stats["charges"] != float64(1) {
			t.Errorf("channel charges = %v, want 1", stats["charges"])
		}
	})
}

func TestMalformedCommandsAreDeadLetteredAtOnce(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil)
	dead := subscribe(t, w.nc, messaging.DLQPrefix+">")
	results := subscribe(t, w.nc, messaging.ResultPrefix+">")

	cases := []struct {
		name, subject, key, body, reason string
	}{
		{"no Idempotency-Key", "orders.commands.acme.create", "", createBody("c1"), "Idempotency-Key"},
		{"a malformed Idempotency-Key", "orders.commands.acme.create", "bad key\twith tab", createBody("c2"), "Idempotency-Key"},
		{"a body that is not JSON", "orders.commands.acme.create", "m-3", `{"customer_id":`, "not JSON"},
		{"an unknown operation", "orders.commands.acme.refund", "m-4", `{}`, "unknown operation"},
		{"a command on an order without order_id", "orders.commands.acme.pay", "m-5", `{"payment_method":"pm_ok"}`, "order_id"},
		{"an order_id that is not a string", "orders.commands.acme.ship", "m-6", `{"order_id":7}`, "order_id"},
		{"an unknown tenant", "orders.commands.initech.create", "m-7", createBody("c7"), "unknown tenant"},
		{"a subject with extra tokens", "orders.commands.acme.create.now", "m-8", createBody("c8"), "not orders.commands"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			publish(t, w.js, c.subject, c.key, c.body)
			d := next(t, dead, "dead letter")
			if d.Header.Get(messaging.HeaderDLDeliveries) != "1" {
				t.Errorf("deliveries = %q, want 1: malformed goes at once", d.Header.Get(messaging.HeaderDLDeliveries))
			}
			if !strings.Contains(d.Header.Get(messaging.HeaderReason), c.reason) {
				t.Errorf("Dead-Letter-Reason = %q, want it to mention %q", d.Header.Get(messaging.HeaderReason), c.reason)
			}
			if !bytes.Equal(d.Data, []byte(c.body)) || d.Header.Get(messaging.HeaderKey) != c.key || d.Header.Get(messaging.HeaderDLSubject) != c.subject {
				t.Errorf("dead letter changed: %v %s", d.Header, d.Data)
			}
		})
	}
	if len(results) != 0 {
		t.Errorf("%d results published for malformed commands", len(results))
	}
	if n := w.count("SELECT count(*) FROM orders WHERE customer_id IN ('c1','c2','c7','c8')"); n != 0 {
		t.Errorf("orders = %d, want 0", n)
	}
}

func TestACommandWhoseHandlersAlwaysDieIsDeadLettered(t *testing.T) {
	w := newWorld(t)
	// Every handler dies between commit and ack, as a process that crashes
	// on this command would; COMMAND_MAX_DELIVER is 3.
	w.consumer(messaging.ConsumerHooks{BeforeAck: func(string, string) error { return errors.New("killed") }}, nil,
		func(c *messaging.Consumer) { c.MaxDeliver, c.AckWait = 3, time.Second })
	dead := subscribe(t, w.nc, messaging.DLQPrefix+">")
	results := subscribe(t, w.nc, messaging.ResultSubject("acme", "create"))
	key := fmt.Sprintf("always-dies-%d", time.Now().UnixNano())
	publish(t, w.js, messaging.CommandSubject("acme", "create"), key, createBody("cus_"+key))

	d := next(t, dead, "dead letter")
	<-w.counters.deadCh
	if d.Header.Get(messaging.HeaderDLDeliveries) != "4" || !strings.Contains(d.Header.Get(messaging.HeaderReason), "without an answer") {
		t.Errorf("dead letter headers: %v", d.Header)
	}
	if got := w.counters.get(w.counters.received, "create"); got != 4 {
		t.Errorf("deliveries = %d, want 3 handled and the 4th dead-lettered", got)
	}
	if len(results) != 3 {
		t.Errorf("results = %d, want 3 (each handler published before dying)", len(results))
	}
	if n := w.count("SELECT count(*) FROM orders WHERE customer_id = ?", "cus_"+key); n != 1 {
		t.Errorf("orders = %d, want 1", n)
	}
}
