package messaging_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/decode"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/internal/order"
)

// statesRead counts the intent records the consumer reads: it reads one
// only for a command delivered more often than COMMAND_MAX_DELIVER.
type statesRead struct {
	*order.Service
	n atomic.Int32
}

func (s *statesRead) IntentState(ctx context.Context, c order.Caller, op string) (idempotency.State, error) {
	s.n.Add(1)
	return s.Service.IntentState(ctx, c, op)
}

// paysInFlight creates one order per key for tenant and starts its pay,
// which the gate holds at the channel: each intent is in flight until the
// gate is released. It returns the orders' ids by key.
func paysInFlight(t *testing.T, svc *order.Service, gate *channelGate, tenant string, keys ...string) map[string]string {
	t.Helper()
	var create order.CreateRequest
	if err := decode.JSON([]byte(createBody("cus_"+tenant)), &create); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, key := range keys {
		created, err := svc.Create(context.Background(), order.Caller{TenantID: tenant, Key: "create-" + key}, create)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		ids[key] = created.Resource
		go func() {
			_, _ = svc.Pay(context.Background(), order.Caller{TenantID: tenant, Key: key}, created.Resource, order.PayRequest{PaymentMethod: "pm_ok"})
		}()
		gate.waitHeld(t)
	}
	return ids
}

// A hostile tenant sends, for each of its three intents in flight, two
// commands; its share of waiters is two. It gets two waiters, one per
// intent, and every other command of its is handed back, again and again
// while its intent stays in flight, spending no delivery. The quiet tenant
// beside it gets its waiter and its create answered all the while. Once
// the intents complete, every command is answered once, with the intent's
// outcome.
func TestAHostileTenantsWaitersAreBoundedAndTheQuietTenantKeepsItsOwn(t *testing.T) {
	w := newWorld(t)
	gate := newChannelGate(t, w.channel, http.MethodPost)
	svc := gatedService(t, w, gate)
	orders := &statesRead{Service: svc}
	c := w.consumer(messaging.ConsumerHooks{}, nil, func(c *messaging.Consumer) {
		c.Orders, c.MaxDeliver, c.WaitersPerTenant = orders, 1, 2
	})
	results := subscribe(t, w.nc, messaging.ResultPrefix+">")
	run := time.Now().UnixNano()
	hostile := paysInFlight(t, svc, gate, "acme", fmt.Sprint("acme-1-", run), fmt.Sprint("acme-2-", run), fmt.Sprint("acme-3-", run))
	quiet := paysInFlight(t, svc, gate, "globex", fmt.Sprint("globex-1-", run))
	globexJS, err := jetstream.New(w.tenantConn("globex"))
	if err != nil {
		t.Fatal(err)
	}
	for key, id := range hostile {
		for range 2 {
			publish(t, w.js, messaging.CommandSubject("acme", "pay"), key, fmt.Sprintf(`{"order_id":%q,"payment_method":"pm_ok"}`, id))
		}
	}
	for key, id := range quiet {
		publish(t, globexJS, messaging.CommandSubject("globex", "pay"), key, fmt.Sprintf(`{"order_id":%q,"payment_method":"pm_ok"}`, id))
	}

	// Three waiters (two of acme's, globex's), and each of acme's four
	// others handed back at least once. No waiter leaves while the gate
	// holds every intent, so there is no fourth.
	for range 3 {
		nextCount(t, w.counters.postponedCh, "a postponement")
	}
	for w.counters.get(w.counters.handedBack, "pay") < 4 {
		nextCount(t, w.counters.handedCh, "a command handed back")
	}
	t.Run("the hostile tenant has its share of waiters, the quiet one its own", func(t *testing.T) {
		if a, g := c.Waiting("acme"), c.Waiting("globex"); a != 2 || g != 1 {
			t.Errorf("waiting: acme %d, globex %d; want 2, 1", a, g)
		}
		if n := w.counters.get(w.counters.postponed, "pay"); n != 3 {
			t.Errorf("postponed %d, want 3", n)
		}
	})
	t.Run("the quiet tenant's create is answered meanwhile", func(t *testing.T) {
		key := fmt.Sprint("globex-create-", run)
		publish(t, globexJS, messaging.CommandSubject("globex", "create"), key, createBody("cus_quiet"))
		r := next(t, results, "globex's create")
		if r.Header.Get(messaging.HeaderKey) != key || r.Header.Get(messaging.HeaderStatus) != "201" {
			t.Errorf("answered %s %v %s, want globex's create, 201, while every pay is in flight", r.Subject, r.Header, r.Data)
		}
	})

	gate.release()
	answered := map[string]int{} // by result id: one per command
	for len(answered) < 2*len(hostile)+len(quiet) {
		r := next(t, results, "a pay's result")
		if r.Header.Get(messaging.HeaderStatus) != "200" || jsonField(t, r.Data, "status") != "PAID" {
			t.Errorf("%s: %v %s, want 200 PAID", r.Subject, r.Header, r.Data)
		}
		answered[r.Header.Get(messaging.HeaderMsgID)]++
	}
	waitAckPending(t, w, 0)
	t.Run("every command is answered once, and the channel charged once per intent", func(t *testing.T) {
		for id, n := range answered {
			if n != 1 {
				t.Errorf("%s answered %d times", id, n)
			}
		}
		if stats := w.channelStats(); stats["charges"] != float64(len(hostile)+len(quiet)) {
			t.Errorf("channel stats %v, want %d charges", stats, len(hostile)+len(quiet))
		}
		if dead := w.counters.get(w.counters.dead, "pay"); dead != 0 {
			t.Errorf("dead-lettered %d, want 0", dead)
		}
		waitDLQDepth(t, w, 0)
	})
	t.Run("a command handed back spent no delivery", func(t *testing.T) {
		// COMMAND_MAX_DELIVER is 1: a delivery that brought a command
		// handed back, counted as spent, would be over it and make the
		// consumer read the intent's record.
		if n := orders.n.Load(); n != 0 {
			t.Errorf("the consumer read %d intent records, want 0: a delivery after a hand-back was counted as spent", n)
		}
	})
	t.Run("no waiter is left", func(t *testing.T) {
		if a, g := c.Waiting("acme"), c.Waiting("globex"); a != 0 || g != 0 {
			t.Errorf("waiting: acme %d, globex %d; want 0, 0", a, g)
		}
	})
}

// A command waiting for its intent when its consumer stops is handed back
// (a nak), neither acknowledged nor lost: Stop does not wait for the
// intent, and the instance that takes over answers the command.
func TestAPostponedCommandIsHandedBackWhenItsConsumerStops(t *testing.T) {
	w := newWorld(t)
	gate := newChannelGate(t, w.channel, http.MethodPost)
	svc := gatedService(t, w, gate)
	first := w.consumer(messaging.ConsumerHooks{}, nil, func(c *messaging.Consumer) { c.Orders = svc })
	results := subscribe(t, w.nc, messaging.ResultSubject("acme", "pay"))
	key := fmt.Sprint("stop-", time.Now().UnixNano())
	ids := paysInFlight(t, svc, gate, "acme", key)
	publish(t, w.js, messaging.CommandSubject("acme", "pay"), key, fmt.Sprintf(`{"order_id":%q,"payment_method":"pm_ok"}`, ids[key]))
	nextCount(t, w.counters.postponedCh, "the postponement")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := first.Stop(ctx); err != nil {
		t.Fatalf("stop while a command waits for its intent: %v", err)
	}
	cons, err := w.js.Consumer(context.Background(), messaging.CommandsStream, messaging.ConsumerFor("acme"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("the command is not acknowledged", func(t *testing.T) {
		if info.AckFloor.Stream != 0 || info.Delivered.Stream != 1 {
			t.Errorf("ack floor %d, delivered %d; want 0, 1", info.AckFloor.Stream, info.Delivered.Stream)
		}
		select {
		case r := <-results:
			t.Errorf("answered before its intent: %v", r.Header)
		default:
		}
	})
	t.Run("the next instance answers it once its intent is", func(t *testing.T) {
		second := newCounters()
		w.consumer(messaging.ConsumerHooks{}, second, func(c *messaging.Consumer) { c.Orders = svc })
		gate.release()
		r := next(t, results, "the result")
		if r.Header.Get(messaging.HeaderStatus) != "200" || r.Header.Get(messaging.HeaderKey) != key || jsonField(t, r.Data, "status") != "PAID" {
			t.Errorf("result %v %s", r.Header, r.Data)
		}
		waitAckPending(t, w, 0)
		if n := w.counters.get(w.counters.acked, "pay"); n != 0 {
			t.Errorf("the stopped instance acknowledged %d, want 0", n)
		}
		if got, again, acked := second.get(second.received, "pay"), second.get(second.redelivered, "pay"), second.get(second.acked, "pay"); got < 1 || again != got || acked != 1 {
			t.Errorf("the next instance: received %d (redelivered %d), acknowledged %d; want every one a redelivery, 1 acknowledged", got, again, acked)
		}
	})
}

// nextCount waits for the next count on ch; the bound only keeps a broken
// test from hanging.
func nextCount(t *testing.T, ch chan string, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(60 * time.Second):
		t.Fatalf("no %s", what)
	}
}
