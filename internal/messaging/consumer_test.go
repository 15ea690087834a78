package messaging_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/messaging"
)

func TestCreateByMessage(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil)
	acme := w.tenantConn("acme")
	acmeJS, _ := jetstream.New(acme)
	results := subscribe(t, acme, messaging.ResultSubject("acme", "create"))

	publish(t, acmeJS, messaging.CommandSubject("acme", "create"), "msg-R1", createBody("cus_msg_R1"))
	res := next(t, results, "result")

	t.Run("the result carries the key, the HTTP status and the HTTP body", func(t *testing.T) {
		if got := res.Header.Get(messaging.HeaderKey); got != "msg-R1" {
			t.Errorf("Idempotency-Key = %q", got)
		}
		if got := res.Header.Get(messaging.HeaderStatus); got != "201" {
			t.Errorf("Status = %q, body %s", got, res.Data)
		}
		if res.Header.Get(messaging.HeaderReplayed) != "" {
			t.Error("a first execution is marked replayed")
		}
		id := jsonField(t, res.Data, "id")
		get := w.api.Do(t, http.MethodGet, "/v1/orders/"+id, "", nil)
		if get.Status != http.StatusOK || !bytes.Equal(bytes.TrimSpace(get.Body), res.Data) {
			t.Errorf("GET = %d %s, result body %s", get.Status, get.Body, res.Data)
		}
	})
	t.Run("the same key over HTTP is the same intent: one order, HTTP replays the message's bytes", func(t *testing.T) {
		r := w.api.Do(t, http.MethodPost, "/v1/orders", "msg-R1", createBody("cus_msg_R1"))
		if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.Body, res.Data) {
			t.Fatalf("HTTP = %d %v %s, want a 201 replay of %s", r.Status, r.Header, r.Body, res.Data)
		}
		if n := w.count("SELECT count(*) FROM orders WHERE customer_id = 'cus_msg_R1'"); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})
	t.Run("an HTTP create first makes the message replay it, byte for byte", func(t *testing.T) {
		first := w.api.Do(t, http.MethodPost, "/v1/orders", "http-first", createBody("cus_http_first"))
		if first.Status != http.StatusCreated {
			t.Fatalf("HTTP = %d %s", first.Status, first.Body)
		}
		publish(t, acmeJS, messaging.CommandSubject("acme", "create"), "http-first", createBody("cus_http_first"))
		r := next(t, results, "result")
		if r.Header.Get(messaging.HeaderStatus) != "201" || r.Header.Get(messaging.HeaderReplayed) != "true" || !bytes.Equal(r.Data, first.Body) {
			t.Fatalf("result = %v %s, want a 201 replay of %s", r.Header, r.Data, first.Body)
		}
		if n := w.count("SELECT count(*) FROM orders WHERE customer_id = 'cus_http_first'"); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})
	t.Run("a body HTTP refuses with 400 gets that 400 as a result, the same bytes", func(t *testing.T) {
		bad := `{"customer_id":5,"currency":"EUR","items":[]}`
		publish(t, acmeJS, messaging.CommandSubject("acme", "create"), "bad-type", bad)
		r := next(t, results, "result")
		h := w.api.Do(t, http.MethodPost, "/v1/orders", "bad-type-http", bad)
		if r.Header.Get(messaging.HeaderStatus) != "400" || h.Status != http.StatusBadRequest || !bytes.Equal(r.Data, h.Body) {
			t.Fatalf("result %v %s, HTTP %d %s", r.Header, r.Data, h.Status, h.Body)
		}
	})
	t.Run("commands on an order name it in order_id; a refusal is HTTP's 409, byte for byte", func(t *testing.T) {
		id := jsonField(t, res.Data, "id")
		deliver := subscribe(t, acme, messaging.ResultSubject("acme", "deliver"))
		publish(t, acmeJS, messaging.CommandSubject("acme", "deliver"), "deliver-too-early", fmt.Sprintf(`{"order_id":%q}`, id))
		r := next(t, deliver, "deliver result")
		h := w.api.Do(t, http.MethodPost, "/v1/orders/"+id+"/deliver", "deliver-too-early-http", nil)
		if r.Header.Get(messaging.HeaderStatus) != "409" || h.Status != http.StatusConflict || !bytes.Equal(r.Data, h.Body) {
			t.Fatalf("result %v %s, HTTP %d %s", r.Header, r.Data, h.Status, h.Body)
		}
	})
}

func TestRedeliveryAfterCommitBeforeAck(t *testing.T) {
	w := newWorld(t)
	died := make(chan string, 1)
	var once sync.Once
	crashing := w.consumer(messaging.ConsumerHooks{BeforeAck: func(subject, key string) error {
		err := errors.New("killed between commit and ack")
		once.Do(func() { died <- key })
		return err
	}}, nil)
	acme := w.tenantConn("acme")
	acmeJS, _ := jetstream.New(acme)
	results := subscribe(t, acme, messaging.ResultSubject("acme", "create"))

	publish(t, acmeJS, messaging.CommandSubject("acme", "create"), "crash-R1", createBody("cus_crash_R1"))
	first := next(t, results, "first result")
	if key := <-died; key != "crash-R1" {
		t.Fatalf("hook saw %q", key)
	}
	if err := crashing.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A new instance on the same durable consumer: JetStream redelivers the
	// unacknowledged command once its ack wait has passed.
	w.consumer(messaging.ConsumerHooks{}, nil)
	second := next(t, results, "result of the redelivery")
	<-w.counters.ackedCh

	t.Run("one order", func(t *testing.T) {
		if n := w.count("SELECT count(*) FROM orders WHERE customer_id = 'cus_crash_R1'"); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})
	t.Run("two identical result bodies, the second a replay", func(t *testing.T) {
		if !bytes.Equal(first.Data, second.Data) || first.Header.Get(messaging.HeaderStatus) != "201" || second.Header.Get(messaging.HeaderStatus) != "201" {
			t.Fatalf("first %v %s\nsecond %v %s", first.Header, first.Data, second.Header, second.Data)
		}
		if first.Header.Get(messaging.HeaderReplayed) != "" || second.Header.Get(messaging.HeaderReplayed) != "true" {
			t.Errorf("replayed headers: first %q, second %q", first.Header.Get(messaging.HeaderReplayed), second.Header.Get(messaging.HeaderReplayed))
		}
	})
	t.Run("two deliveries, the second counted as redelivered and replayed, one ack", func(t *testing.T) {
		c := w.counters
		if c.get(c.received, "create") != 2 || c.get(c.redelivered, "create") != 1 || c.get(c.acked, "create") != 1 || c.get(c.replayed, "create") != 1 {
			t.Errorf("received %d redelivered %d acked %d replayed %d", c.get(c.received, "create"), c.get(c.redelivered, "create"),
				c.get(c.acked, "create"), c.get(c.replayed, "create"))
		}
	})
}

func TestTwoInstancesShareOneDurableConsumer(t *testing.T) {
	w := newWorld(t)
	a, b := newCounters(), newCounters()
	w.consumer(messaging.ConsumerHooks{}, a)
	w.consumer(messaging.ConsumerHooks{}, b)
	acme := w.tenantConn("acme")
	acmeJS, _ := jetstream.New(acme)
	results := subscribe(t, acme, messaging.ResultSubject("acme", "create"))

	const n = 60
	for i := range n {
		publish(t, acmeJS, messaging.CommandSubject("acme", "create"), fmt.Sprintf("shared-%d", i), createBody(fmt.Sprintf("cus_shared_%d", i)))
	}
	seen := map[string]int{}
	for range n {
		r := next(t, results, "result")
		seen[r.Header.Get(messaging.HeaderKey)]++
		if r.Header.Get(messaging.HeaderStatus) != "201" || r.Header.Get(messaging.HeaderReplayed) != "" {
			t.Errorf("result %v %s", r.Header, r.Data)
		}
	}
	if len(seen) != n {
		t.Errorf("%d distinct keys answered, want %d", len(seen), n)
	}
	for range n { // the ack follows the result
		select {
		case <-a.ackedCh:
		case <-b.ackedCh:
		}
	}
	if got := a.get(a.received, "create") + b.get(b.received, "create"); got != n {
		t.Errorf("deliveries across both instances = %d, want %d (each command handled once)", got, n)
	}
	if got := a.get(a.acked, "create") + b.get(b.acked, "create"); got != n {
		t.Errorf("acks = %d, want %d", got, n)
	}
	if got := w.count("SELECT count(*) FROM orders WHERE customer_id LIKE 'cus_shared_%'"); got != n {
		t.Errorf("orders = %d, want %d", got, n)
	}
	t.Logf("instance A handled %d, instance B %d", a.get(a.received, "create"), b.get(b.received, "create"))
}

// A command's ack wait runs from the moment JetStream hands it over. An
// instance fetches only as many commands as it has idle workers, so none
// waits in a buffer behind slow ones until JetStream gives up on it: with
// one worker, an ack wait of 1s and commands of 500ms, eight commands are
// delivered eight times, answered once each, and none is dead-lettered.
func TestCommandsWaitingForAWorkerAreNotRedelivered(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{BeforeRun: func(string, string) error {
		time.Sleep(500 * time.Millisecond) // a slow command
		return nil
	}}, nil, func(c *messaging.Consumer) { c.Workers, c.AckWait, c.MaxDeliver = 1, time.Second, 2 })
	acme := w.tenantConn("acme")
	acmeJS, _ := jetstream.New(acme)
	results := subscribe(t, acme, messaging.ResultSubject("acme", "create"))

	const n = 8
	for i := range n {
		publish(t, acmeJS, messaging.CommandSubject("acme", "create"), fmt.Sprintf("slow-%d", i), createBody(fmt.Sprintf("cus_slow_%d", i)))
	}
	for range n {
		<-w.counters.ackedCh
	}
	c := w.counters
	if got := c.get(c.received, "create"); got != n {
		t.Errorf("deliveries = %d, want %d: a command waiting for the worker was redelivered", got, n)
	}
	if got := c.get(c.dead, "create"); got != 0 {
		t.Errorf("dead-lettered = %d, want 0", got)
	}
	// The results travel to the subscriber on their own: wait for each,
	// then make sure no second one follows.
	answered := map[string]int{}
	for range n {
		answered[next(t, results, "result").Header.Get(messaging.HeaderKey)]++
	}
	select {
	case r := <-results:
		t.Errorf("a result beyond one per command: %v", r.Header)
	case <-time.After(200 * time.Millisecond):
	}
	if len(answered) != n {
		t.Errorf("results for %d distinct commands, want one per command (%d): %v", len(answered), n, answered)
	}
	if got := w.count("SELECT count(*) FROM orders WHERE customer_id LIKE 'cus_slow_%'"); got != n {
		t.Errorf("orders = %d, want %d", got, n)
	}
}

// A tenant's credentials read nothing of another tenant or of the service:
// every subject they might try is refused by the broker (the shared reply
// inbox, where the service's pull requests are answered with commands, among
// them), and while acme's command runs, globex receives nothing at all.
func TestATenantReadsNothingOfAnotherThroughTheBroker(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil)
	violations := make(chan error, 64)
	globex := w.tenantConn("globex", nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	got := make(chan *nats.Msg, 64)
	forbidden := []string{"_INBOX.>", messaging.InboxPrefix("acme") + ".>", ">", "orders.>", "orders.commands.>",
		messaging.ResultSubject("acme", "create"), messaging.EventPrefix + "acme.>", messaging.DLQPrefix + ">", "$JS.API.>", "$JS.ACK.>"}
	for _, subject := range forbidden {
		if _, err := globex.ChanSubscribe(subject, got); err != nil {
			t.Fatalf("subscribe %s: %v", subject, err)
		}
	}
	if err := globex.Flush(); err != nil {
		t.Fatal(err)
	}
	refused := 0
	for refused < len(forbidden) {
		select {
		case err := <-violations:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("unexpected error: %v", err)
			}
			refused++
		case <-time.After(10 * time.Second):
			t.Fatalf("the broker refused %d of globex's %d subscriptions to what is not its own", refused, len(forbidden))
		}
	}
	if _, err := globex.Request("$JS.API.STREAM.INFO."+messaging.CommandsStream, nil, 2*time.Second); err == nil {
		t.Error("globex read ORDER_COMMANDS's stream info")
	}

	acme := w.tenantConn("acme")
	acmeJS, _ := jetstream.New(acme)
	results := subscribe(t, acme, messaging.ResultSubject("acme", "create"))
	publish(t, acmeJS, messaging.CommandSubject("acme", "create"), "isolation-1", createBody("cus_isolation"))
	next(t, results, "acme's result")
	if _, err := (&messaging.DLQ{JS: w.js}).List(context.Background()); err != nil { // the operator's reads, on the shared inbox
		t.Fatal(err)
	}
	if err := globex.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		m := <-got
		t.Errorf("globex received %d messages, the first on %s: %s", len(got)+1, m.Subject, m.Data)
	}

	t.Run("its own inbox still carries JetStream's acknowledgements", func(t *testing.T) {
		js, _ := jetstream.New(globex)
		if _, err := js.Publish(context.Background(), messaging.CommandSubject("globex", "create"), []byte(createBody("cus_globex"))); err != nil {
			t.Errorf("globex's own command: %v", err)
		}
	})
}

// A tenant name is one subject token: a name that would be a pattern in
// its permissions is no tenant.
func TestATenantNameIsOneSubjectToken(t *testing.T) {
	for name, want := range map[string]bool{"acme": true, "Globex_2-eu": true, "": false, "a.b": false, "*": false, ">": false, "a b": false, "café": false} {
		if got := messaging.IsToken(name); got != want {
			t.Errorf("IsToken(%q) = %v, want %v", name, got, want)
		}
	}
}
