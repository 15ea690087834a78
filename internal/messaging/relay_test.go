package messaging_test

import (
	"bytes"
	"context"
	"encoding/json"
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
	"github.com/orderservice/orderservice/internal/order"
)

func TestRelayKilledMidBatchPublishesEveryEventOnce(t *testing.T) {
	w := newWorld(t)
	// Events of earlier tests in this database are not this test's business.
	if err := w.db.Exec("UPDATE order_outbox SET published_at = now() WHERE published_at IS NULL").Error; err != nil {
		t.Fatal(err)
	}
	// Four orders: created, paid (payment_pending, paid) and shipped: 4
	// events each, 16 in all, every order's in a fixed order.
	var ids []string
	for i := range 4 {
		key := fmt.Sprintf("relay-%c-%d", 'a'+i, time.Now().UnixNano())
		r := w.api.Do(t, http.MethodPost, "/v1/orders", key, createBody("cus_"+key))
		id := jsonField(t, r.Body, "id")
		ids = append(ids, id)
		if r := w.api.Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", key+"-pay", map[string]string{"payment_method": "pm_ok"}); r.Status != http.StatusOK {
			t.Fatalf("pay: %d %s", r.Status, r.Body)
		}
		if r := w.api.Do(t, http.MethodPost, "/v1/orders/"+id+"/ship", key+"-ship", map[string]string{"carrier": "DHL", "tracking_number": "T" + key}); r.Status != http.StatusOK {
			t.Fatalf("ship: %d %s", r.Status, r.Body)
		}
	}
	const total = 16
	if n := w.count("SELECT count(*) FROM order_outbox WHERE published_at IS NULL"); n != total {
		t.Fatalf("unpublished events = %d, want %d", n, total)
	}

	outbox := &order.Outbox{DB: w.db}
	killed := &messaging.Relay{Outbox: outbox, JS: w.js, Batch: 100, Interval: time.Hour, Observe: w.counters,
		Hooks: messaging.RelayHooks{AfterPublish: func(published int) error {
			if published == 3 {
				return errors.New("SIGKILL")
			}
			return nil
		}}}
	n, err := killed.Pass(context.Background())
	if err == nil || n != 0 {
		t.Fatalf("killed pass = %d, %v; want 0 marked and the kill", n, err)
	}
	if n := w.count("SELECT count(*) FROM order_outbox WHERE published_at IS NULL"); n != total {
		t.Fatalf("unpublished after the kill = %d, want %d: nothing was marked", n, total)
	}

	relay := &messaging.Relay{Outbox: outbox, JS: w.js, Batch: 100, Interval: time.Hour, Observe: w.counters}
	marked := 0
	for marked < total {
		n, err := relay.Pass(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("a pass published nothing with %d of %d marked", marked, total)
		}
		marked += n
	}

	stream, err := w.js.Stream(context.Background(), messaging.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := stream.Info(context.Background())
	t.Run("JetStream keeps exactly one copy per event id", func(t *testing.T) {
		if info.State.Msgs != total {
			t.Errorf("stream holds %d messages, want %d", info.State.Msgs, total)
		}
		// The killed batch held the four orders' first events (one per
		// order per batch), all four sent before the kill after the third
		// ack: the second relay's copies of them are the duplicates.
		if w.counters.duplicates != 4 || w.counters.published != total-4 {
			t.Errorf("relay publishes: %d new, %d duplicates; want %d and 4 (the killed batch)", w.counters.published, w.counters.duplicates, total-4)
		}
		if n := w.count("SELECT count(*) FROM order_outbox WHERE published_at IS NULL"); n != 0 {
			t.Errorf("unpublished = %d", n)
		}
	})

	byOrder := map[string][]string{}
	seen := map[string]bool{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		var ev order.EventMessage
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(messaging.HeaderMsgID) != ev.EventID || seen[ev.EventID] {
			t.Errorf("Nats-Msg-Id %q, event id %q (seen before: %v)", m.Header.Get(messaging.HeaderMsgID), ev.EventID, seen[ev.EventID])
		}
		seen[ev.EventID] = true
		if m.Subject != messaging.EventSubject("acme", ev.Event) {
			t.Errorf("subject %s for event %s", m.Subject, ev.Event)
		}
		byOrder[ev.OrderID] = append(byOrder[ev.OrderID], ev.Event)
		if ev.Event == "shipped" {
			get := w.api.Do(t, http.MethodGet, "/v1/orders/"+ev.OrderID, "", nil)
			if !bytes.Equal(bytes.TrimSpace(get.Body), ev.Order) {
				t.Errorf("snapshot of the shipped event:\n%s\nGET:\n%s", ev.Order, get.Body)
			}
		}
	}
	t.Run("each order's events are in the stream in the order they happened", func(t *testing.T) {
		for _, id := range ids {
			if got := strings.Join(byOrder[id], ","); got != "created,payment_pending,paid,shipped" {
				t.Errorf("order %s: %s", id, got)
			}
		}
	})
}

func TestTenantCannotPublishUnderAnotherTenantsPrefix(t *testing.T) {
	w := newWorld(t)
	violations := make(chan error, 4)
	acme := w.tenantConn("acme", nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))

	if err := acme.Publish(messaging.CommandSubject("globex", "create"), []byte(createBody("cus_intruder"))); err != nil {
		t.Fatal(err)
	}
	_ = acme.Flush()
	select {
	case err := <-violations:
		if !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("error = %v, want a permissions violation", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the broker did not refuse the publish")
	}

	t.Run("its own prefix is accepted", func(t *testing.T) {
		js, _ := jetstream.New(acme)
		publish(t, js, messaging.CommandSubject("acme", "create"), "own-prefix", createBody("cus_own"))
	})
	t.Run("the stream holds no command under the other tenant", func(t *testing.T) {
		stream, _ := w.js.Stream(context.Background(), messaging.CommandsStream)
		info, err := stream.Info(context.Background(), jetstream.WithSubjectFilter("orders.commands.globex.>"))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(info.State.Subjects); n != 0 {
			t.Errorf("subjects under globex: %v", info.State.Subjects)
		}
		if info.State.Msgs != 1 {
			t.Errorf("commands in the stream = %d, want 1 (acme's own)", info.State.Msgs)
		}
	})
	t.Run("it cannot read another tenant's results", func(t *testing.T) {
		if _, err := acme.SubscribeSync(messaging.ResultSubject("globex", "create")); err != nil {
			t.Fatal(err)
		}
		_ = acme.Flush()
		select {
		case err := <-violations:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("error = %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the broker did not refuse the subscription")
		}
	})
	t.Run("a wrong password does not connect", func(t *testing.T) {
		nc, err := nats.Connect(w.nats.URL(), nats.UserInfo("acme", "not-the-key"))
		if err == nil {
			nc.Close()
			t.Fatal("connected with a wrong password")
		}
	})
}

func TestTwoRelaysAtOnceKeepEachOrdersEventsInOrder(t *testing.T) {
	w := newWorld(t)
	if err := w.db.Exec("UPDATE order_outbox SET published_at = now() WHERE published_at IS NULL").Error; err != nil {
		t.Fatal(err)
	}
	const orders = 12
	ids := map[string]bool{}
	for i := range orders {
		key := fmt.Sprintf("two-relays-%d-%d", i, time.Now().UnixNano())
		id := jsonField(t, w.api.Do(t, http.MethodPost, "/v1/orders", key, createBody("cus_"+key)).Body, "id")
		ids[id] = true
		for _, step := range []struct{ op, body string }{
			{"pay", `{"payment_method":"pm_ok"}`}, {"ship", `{"carrier":"DHL","tracking_number":"T1"}`}, {"deliver", ""},
		} {
			var body any
			if step.body != "" {
				body = step.body
			}
			if r := w.api.Do(t, http.MethodPost, "/v1/orders/"+id+"/"+step.op, key+"-"+step.op, body); r.Status != http.StatusOK {
				t.Fatalf("%s: %d %s", step.op, r.Status, r.Body)
			}
		}
	}
	const total = orders * 5 // created, payment_pending, paid, shipped, delivered

	// Two instances' relays with small batches, racing until the outbox is empty.
	outbox := &order.Outbox{DB: w.db}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &messaging.Relay{Outbox: outbox, JS: w.js, Batch: 5, Interval: time.Millisecond, Observe: w.counters}
			for {
				n, err := r.Pass(context.Background())
				if err != nil {
					errs <- err
					return
				}
				var left int64
				if err := w.db.Raw("SELECT count(*) FROM order_outbox WHERE published_at IS NULL").Scan(&left).Error; err != nil {
					errs <- err
					return
				}
				if n == 0 && left == 0 {
					return
				}
				if n == 0 { // the other relay holds every head: wait for it
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	stream, _ := w.js.Stream(context.Background(), messaging.EventsStream)
	info, _ := stream.Info(context.Background())
	if info.State.Msgs != total || w.counters.published != total || w.counters.duplicates != 0 {
		t.Fatalf("stream %d messages, relays published %d (+%d duplicates), want %d, each once", info.State.Msgs,
			w.counters.published, w.counters.duplicates, total)
	}
	byOrder := map[string][]string{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		var ev order.EventMessage
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		byOrder[ev.OrderID] = append(byOrder[ev.OrderID], ev.Event)
	}
	for id := range ids {
		if got := strings.Join(byOrder[id], ","); got != "created,payment_pending,paid,shipped,delivered" {
			t.Errorf("order %s: %s", id, got)
		}
	}
}
