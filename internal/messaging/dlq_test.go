package messaging_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
	replayed, err := q.Replay(context.Background(), time.Hour)
	if err != nil || len(replayed) != 1 || replayed[0].Err != nil || replayed[0].Refused != "" {
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
		// answered is the subject its tenant is answered on, with the
		// problem HTTP sends (code) for the same fault; "" for none: a
		// subject that names no known tenant names nobody to answer.
		answered, code string
	}{
		{"no Idempotency-Key", "orders.commands.acme.create", "", createBody("c1"), "Idempotency-Key", "orders.results.acme.create", "idempotency_key_missing"},
		{"a malformed Idempotency-Key", "orders.commands.acme.create", "bad key\twith tab", createBody("c2"), "Idempotency-Key", "orders.results.acme.create", "idempotency_key_invalid"},
		{"a body that is not JSON", "orders.commands.acme.create", "m-3", `{"customer_id":`, "not valid JSON", "orders.results.acme.create", "invalid_request"},
		{"an unknown operation", "orders.commands.acme.refund", "m-4", `{}`, "unknown operation", "orders.results.acme.malformed", "invalid_request"},
		{"a command on an order without order_id", "orders.commands.acme.pay", "m-5", `{"payment_method":"pm_ok"}`, "order_id", "orders.results.acme.pay", "invalid_request"},
		{"an order_id that is not a string", "orders.commands.acme.ship", "m-6", `{"order_id":7}`, "order_id", "orders.results.acme.ship", "invalid_request"},
		{"a subject with extra tokens", "orders.commands.acme.create.now", "m-8", createBody("c8"), "not orders.commands", "orders.results.acme.malformed", "invalid_request"},
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
			want := messaging.DLQMalformed // a subject that did not parse: one fixed subject
			if c.answered != "" && !strings.HasSuffix(c.answered, "."+messaging.Malformed) {
				want = "orders.dlq." + strings.TrimPrefix(c.subject, "orders.")
			}
			if d.Subject != want {
				t.Errorf("the letter of %s is kept under %s, want %s", c.subject, d.Subject, want)
			}
			if c.answered == "" {
				return
			}
			r := next(t, results, "refusal")
			if r.Subject != c.answered || r.Header.Get(messaging.HeaderStatus) != "400" || r.Header.Get(messaging.HeaderKey) != c.key ||
				jsonField(t, r.Data, "code") != c.code || !strings.Contains(d.Header.Get(messaging.HeaderReason), jsonField(t, r.Data, "detail")) {
				t.Errorf("refusal on %s: %v %s; want %s, 400 %s, the letter's reason", r.Subject, r.Header, r.Data, c.answered, c.code)
			}
		})
	}
	t.Run("two Idempotency-Key values, as HTTP's 400 (whatever the case of the names)", func(t *testing.T) {
		m := nats.NewMsg("orders.commands.acme.create")
		m.Header[messaging.HeaderKey] = []string{"m-9a"}
		m.Header["idempotency-key"] = []string{"m-9b"}
		m.Data = []byte(createBody("c9"))
		if _, err := w.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		d := next(t, dead, "dead letter")
		if !strings.Contains(d.Header.Get(messaging.HeaderReason), "more than once") {
			t.Errorf("Dead-Letter-Reason = %q, want the key's reason", d.Header.Get(messaging.HeaderReason))
		}
		r := next(t, results, "refusal")
		if r.Header.Get(messaging.HeaderStatus) != "400" || jsonField(t, r.Data, "code") != "idempotency_key_invalid" || r.Header.Get(messaging.HeaderKey) != "" {
			t.Errorf("refusal %v %s, want HTTP's 400 idempotency_key_invalid, and no key: which would it be?", r.Header, r.Data)
		}
	})
	if len(results) != 0 {
		t.Errorf("%d more results published for refused commands", len(results))
	}
	if n := w.count("SELECT count(*) FROM orders WHERE customer_id IN ('c1','c2','c7','c8','c9')"); n != 0 {
		t.Errorf("orders = %d, want 0", n)
	}
}

// Every handler dies before its intent commits, as a process that crashes
// on this command would: past COMMAND_MAX_DELIVER deliveries (3) its intent
// is still unfinished, and that is what dead-letters it.
func TestACommandWhoseHandlersAlwaysDieIsDeadLettered(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{BeforeRun: func(string, string) error { return errors.New("killed") }}, nil,
		func(c *messaging.Consumer) { c.MaxDeliver, c.AckWait = 3, time.Second })
	dead := subscribe(t, w.nc, messaging.DLQPrefix+">")
	results := subscribe(t, w.nc, messaging.ResultSubject("acme", "create"))
	key := fmt.Sprintf("always-dies-%d", time.Now().UnixNano())
	publish(t, w.js, messaging.CommandSubject("acme", "create"), key, createBody("cus_"+key))

	d := next(t, dead, "dead letter")
	<-w.counters.deadCh
	if d.Header.Get(messaging.HeaderDLDeliveries) != "4" || !strings.Contains(d.Header.Get(messaging.HeaderReason), "no run recorded its intent") {
		t.Errorf("dead letter headers: %v", d.Header)
	}
	if got := w.counters.get(w.counters.received, "create"); got != 4 {
		t.Errorf("deliveries = %d, want 3 handled and the 4th dead-lettered", got)
	}
	if len(results) != 0 {
		t.Errorf("results = %d, want 0: no handler got as far as an answer", len(results))
	}
	if n := w.count("SELECT count(*) FROM orders WHERE customer_id = ?", "cus_"+key); n != 0 {
		t.Errorf("orders = %d, want 0", n)
	}
}

// Every handler of the first 3 deliveries dies after its intent committed
// and its result was published, before the ack. The 4th delivery is past
// COMMAND_MAX_DELIVER, but its intent is answered: it is replayed and
// acknowledged, not dead-lettered, and ORDER_RESULTS keeps one result for
// the one command.
func TestAnOverDeliveredCommandWhoseIntentIsAnsweredIsReplayedNotDeadLettered(t *testing.T) {
	w := newWorld(t)
	var deaths atomic.Int32
	w.consumer(messaging.ConsumerHooks{BeforeAck: func(string, string) error {
		if deaths.Add(1) <= 3 {
			return errors.New("killed")
		}
		return nil
	}}, nil, func(c *messaging.Consumer) { c.MaxDeliver, c.AckWait = 3, time.Second })
	results := subscribe(t, w.nc, messaging.ResultSubject("acme", "create"))
	key := fmt.Sprintf("dies-thrice-%d", time.Now().UnixNano())
	publish(t, w.js, messaging.CommandSubject("acme", "create"), key, createBody("cus_"+key))

	<-w.counters.ackedCh
	if got := w.counters.get(w.counters.received, "create"); got != 4 {
		t.Errorf("deliveries = %d, want 4", got)
	}
	if got := w.counters.get(w.counters.dead, "create"); got != 0 {
		t.Errorf("dead-lettered = %d, want 0: its intent was answered", got)
	}
	if got := w.counters.get(w.counters.replayed, "create"); got != 1 {
		t.Errorf("acknowledged replays = %d, want 1", got)
	}
	if n := w.count("SELECT count(*) FROM orders WHERE customer_id = ?", "cus_"+key); n != 1 {
		t.Errorf("orders = %d, want 1", n)
	}
	// Each handler published before dying; the 4th result may reach this
	// subscriber just after the ack that woke the test, so wait for it,
	// and then a while for a fifth that must not come.
	for i := 1; i <= 4; i++ {
		next(t, results, fmt.Sprintf("result %d of 4 (each handler published before dying)", i))
	}
	select {
	case m := <-results:
		t.Errorf("a fifth result was published live: %v %s", m.Header, m.Data)
	case <-time.After(300 * time.Millisecond):
	}
	if n := streamResults(t, w, key); n != 1 {
		t.Errorf("%s holds %d results for the command, want 1", messaging.ResultsStream, n)
	}
}

// streamResults counts the results ORDER_RESULTS keeps for key.
func streamResults(t *testing.T, w *world, key string) int {
	t.Helper()
	ctx := context.Background()
	s, err := w.js.Stream(ctx, messaging.ResultsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		if m.Header.Get(messaging.HeaderKey) == key {
			n++
		}
	}
	return n
}

// The operator's `dlq replay --all` republishes what the tenant sent: a
// dead letter carrying a broker control header (an expected sequence that
// can no longer hold) is replayed without it, a dead letter first published
// past the horizon is kept with its reason, and neither stops the others.
func TestAReplayOfEveryDeadLetterGoesOnPastTheOnesItCannotReplay(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil)
	dead := subscribe(t, w.nc, messaging.DLQPrefix+">")
	results := subscribe(t, w.nc, messaging.ResultSubject("acme", "create"))

	// Three dead letters of creates, written to the DLQ as the consumer
	// writes them (the ways they got there are tested above).
	old := time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339Nano)
	letters := []struct {
		key    string
		header map[string]string
	}{
		{"replay-expected-seq", map[string]string{"Nats-Expected-Last-Subject-Sequence": "0", "Nats-Msg-Id": "tenant-id-1"}},
		{"replay-too-old", map[string]string{messaging.HeaderFirstPublished: old}},
		{"replay-plain", nil},
	}
	for _, l := range letters {
		m := nats.NewMsg(messaging.DLQPrefix + "commands.acme.create")
		m.Header.Set(messaging.HeaderKey, l.key)
		for k, v := range l.header {
			m.Header.Set(k, v)
		}
		m.Header.Set(messaging.HeaderDLSubject, messaging.CommandSubject("acme", "create"))
		m.Header.Set(messaging.HeaderReason, "test")
		m.Data = []byte(createBody("cus_" + l.key))
		if _, err := w.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		next(t, dead, "dead letter")
	}
	// A command on the subject first, so that the expected sequence 0 no
	// longer holds.
	publish(t, w.js, messaging.CommandSubject("acme", "create"), "replay-first", createBody("cus_replay_first"))
	next(t, results, "result")

	q := &messaging.DLQ{JS: w.js}
	replayed, err := q.Replay(context.Background(), time.Hour)
	if err != nil || len(replayed) != 3 {
		t.Fatalf("replay = %+v, %v", replayed, err)
	}
	for _, r := range replayed {
		key := r.Header.Get(messaging.HeaderKey)
		switch key {
		case "replay-too-old":
			if r.Refused == "" || !strings.Contains(r.Refused, "record may be gone") {
				t.Errorf("%s: refused = %q, want the reason", key, r.Refused)
			}
		default:
			if r.Err != nil || r.Refused != "" {
				t.Errorf("%s: %v %s", key, r.Err, r.Refused)
			}
		}
	}
	for range 2 {
		if got := next(t, results, "result of a replay"); got.Header.Get(messaging.HeaderStatus) != "201" {
			t.Errorf("replayed create = %v %s", got.Header, got.Data)
		}
	}
	left, err := q.List(context.Background())
	if err != nil || len(left) != 1 || left[0].Header.Get(messaging.HeaderKey) != "replay-too-old" {
		t.Errorf("dlq after the replay = %+v, %v; want only the one too old", left, err)
	}
	if n := w.count("SELECT count(*) FROM orders WHERE customer_id IN ('cus_replay-expected-seq', 'cus_replay-plain', 'cus_replay-too-old')"); n != 2 {
		t.Errorf("orders = %d, want 2", n)
	}
}

// A command first published longer ago than the consumer's horizon (a dead
// letter replayed late, or a copy of one redelivered) may be the first sight
// of an intent whose record is gone: the consumer dead-letters it unrun.
func TestACommandPastTheHorizonIsDeadLetteredUnrun(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil, func(c *messaging.Consumer) { c.Horizon = time.Hour })
	dead := subscribe(t, w.nc, messaging.DLQPrefix+">")
	results := subscribe(t, w.nc, messaging.ResultSubject("acme", "create"))
	old := time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339Nano)
	publish(t, w.js, messaging.CommandSubject("acme", "create"), "past-horizon", createBody("cus_past_horizon"),
		messaging.HeaderFirstPublished, old)

	d := next(t, dead, "dead letter")
	// The letter writes the time with every nanosecond digit: the same
	// instant, whatever trailing zeros the publisher left out.
	kept, err := time.Parse(time.RFC3339Nano, d.Header.Get(messaging.HeaderFirstPublished))
	if sent, _ := time.Parse(time.RFC3339Nano, old); !strings.Contains(d.Header.Get(messaging.HeaderReason), "first published") || err != nil || !kept.Equal(sent) {
		t.Errorf("dead letter headers: %v", d.Header)
	}
	if len(results) != 0 {
		t.Errorf("%d results, want none", len(results))
	}
	if n := w.count("SELECT count(*) FROM orders WHERE customer_id = 'cus_past_horizon'"); n != 0 {
		t.Errorf("orders = %d, want 0", n)
	}
}
