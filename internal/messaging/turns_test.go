package messaging_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/messaging"
)

// One tenant's backlog does not queue another: acme has 5,000 creates
// stored before any runs, globex one after them, and globex's is answered
// among the first of acme's, not after all of them (as one consumer
// delivering in stream order answered it), while every one of acme's is
// still answered, once.
func TestATenantsBacklogDoesNotQueueAnother(t *testing.T) {
	const backlog = 5000
	w := newWorld(t)
	answered := subscribe(t, w.nc, messaging.ResultPrefix+">") // every tenant's results, in the order they come
	acmeJS, err := jetstream.New(w.tenantConn("acme"))
	if err != nil {
		t.Fatal(err)
	}
	globexJS, err := jetstream.New(w.tenantConn("globex"))
	if err != nil {
		t.Fatal(err)
	}
	run := fmt.Sprint(time.Now().UnixNano())
	for i := range backlog {
		m := nats.NewMsg(messaging.CommandSubject("acme", "create"))
		m.Header.Set(messaging.HeaderKey, fmt.Sprintf("backlog-%s-%d", run, i))
		m.Data = []byte(createBody("cus_backlog_" + run))
		if _, err := acmeJS.PublishMsgAsync(m); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	select {
	case <-acmeJS.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		t.Fatal("acme's backlog was not all stored")
	}
	globexKey := "after-the-backlog-" + run
	publish(t, globexJS, messaging.CommandSubject("globex", "create"), globexKey, createBody("cus_after_backlog_"+run))
	// 4 workers; no counters, whose channels hold fewer acks than this.
	w.consumer(messaging.ConsumerHooks{}, nil, func(c *messaging.Consumer) { c.Observe = nil })

	acmeBefore, acmeKeys, globexAt := 0, map[string]bool{}, -1
	for len(acmeKeys) < backlog || globexAt < 0 {
		r := next(t, answered, "result")
		if status := r.Header.Get(messaging.HeaderStatus); status != "201" {
			t.Fatalf("%s: status %s %s", r.Subject, status, r.Data)
		}
		switch r.Subject {
		case messaging.ResultSubject("globex", "create"):
			globexAt = len(acmeKeys)
		case messaging.ResultSubject("acme", "create"):
			if acmeKeys[r.Header.Get(messaging.HeaderKey)] {
				t.Errorf("acme's %s answered twice", r.Header.Get(messaging.HeaderKey))
			}
			acmeKeys[r.Header.Get(messaging.HeaderKey)] = true
			if globexAt < 0 {
				acmeBefore++
			}
		}
	}
	t.Logf("globex's create was answered after %d of acme's %d", acmeBefore, backlog)
	t.Run("globex's create is answered among the first of acme's", func(t *testing.T) {
		// 4 workers: one turn each for acme's first commands, then globex's.
		if acmeBefore >= backlog/100 {
			t.Errorf("globex's create waited for %d of acme's %d commands, want fewer than %d", acmeBefore, backlog, backlog/100)
		}
	})
	t.Run("every one of acme's is answered, once", func(t *testing.T) {
		if n := w.count("SELECT count(*) FROM orders WHERE customer_id = ?", "cus_backlog_"+run); n != backlog {
			t.Errorf("acme's orders = %d, want %d", n, backlog)
		}
		if n := w.count("SELECT count(*) FROM orders WHERE customer_id = ?", "cus_after_backlog_"+run); n != 1 {
			t.Errorf("globex's orders = %d, want 1", n)
		}
	})
}

// Each tenant's share of what ORDER_COMMANDS stores is bounded: past
// StreamWindows.CommandsPerSubject commands on one of its subjects (answered
// ones count until max_age), the broker refuses the tenant's publish with
// its error, and nobody else's.
func TestATenantOverItsShareOfTheStreamIsRefusedAlone(t *testing.T) {
	const share = 3
	w := newWorld(t)
	ctx := context.Background()
	if err := w.js.DeleteStream(ctx, messaging.CommandsStream); err != nil {
		t.Fatal(err)
	}
	if _, err := messaging.EnsureStreams(ctx, w.js, messaging.StreamWindows{Redelivery: 168 * time.Hour, Compensation: 720 * time.Hour, CommandsPerSubject: share}); err != nil {
		t.Fatal(err)
	}
	w.consumer(messaging.ConsumerHooks{}, nil)
	acme, globex := w.tenantConn("acme"), w.tenantConn("globex")
	acmeJS, _ := jetstream.New(acme)
	globexJS, _ := jetstream.New(globex)
	acmeResults := subscribe(t, acme, messaging.ResultSubject("acme", "create"))
	globexResults := subscribe(t, globex, messaging.ResultSubject("globex", "create"))
	send := func(js jetstream.JetStream, tenant, key string) error {
		m := nats.NewMsg(messaging.CommandSubject(tenant, "create"))
		m.Header.Set(messaging.HeaderKey, key)
		m.Data = []byte(createBody("cus_share_" + tenant))
		_, err := js.PublishMsg(ctx, m)
		return err
	}

	for i := range share {
		if err := send(acmeJS, "acme", fmt.Sprintf("share-%d", i)); err != nil {
			t.Fatalf("acme's command %d of its %d: %v", i+1, share, err)
		}
		next(t, acmeResults, "acme's result")
	}
	t.Run("acme's next publish is refused by the broker", func(t *testing.T) {
		err := send(acmeJS, "acme", "share-over")
		var api *jetstream.APIError
		if !errors.As(err, &api) || !strings.Contains(api.Description, "maximum messages per subject exceeded") {
			t.Fatalf("publish over the share: %v, want the broker's \"maximum messages per subject exceeded\"", err)
		}
		t.Log(err)
	})
	t.Run("globex's is stored and answered", func(t *testing.T) {
		if err := send(globexJS, "globex", "share-globex"); err != nil {
			t.Fatalf("globex's publish: %v", err)
		}
		if r := next(t, globexResults, "globex's result"); r.Header.Get(messaging.HeaderStatus) != "201" {
			t.Errorf("globex's result: %v %s", r.Header, r.Data)
		}
	})
	if n := w.count("SELECT count(*) FROM orders WHERE customer_id = 'cus_share_acme'"); n != share {
		t.Errorf("acme's orders = %d, want %d", n, share)
	}
}

// A deployment of earlier versions, whose instances shared one consumer of
// every command (orderservice), moves to a consumer per tenant without
// running again what that one acknowledged: the new consumers start past
// its ack floor, so a command it had delivered and not acknowledged (in
// flight at the upgrade) is delivered again, and it is removed.
func TestTheSingleConsumerOfEarlierVersionsIsReplacedWhereItStopped(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	legacy := messaging.ConsumerConfig(2 * time.Second)
	legacy.Durable, legacy.FilterSubject = "orderservice", messaging.CommandPrefix+">"
	old, err := w.js.CreateConsumer(ctx, messaging.CommandsStream, legacy)
	if err != nil {
		t.Fatal(err)
	}
	acme := w.tenantConn("acme")
	acmeJS, _ := jetstream.New(acme)
	results := subscribe(t, acme, messaging.ResultSubject("acme", "create"))
	for i := range 6 {
		publish(t, acmeJS, messaging.CommandSubject("acme", "create"), fmt.Sprintf("upgrade-%d", i), createBody(fmt.Sprintf("cus_upgrade_%d", i)))
	}
	// The earlier version answered the first four and held the fifth.
	batch, err := old.Fetch(5, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for msg := range batch.Messages() {
		if held++; held <= 4 {
			if err := msg.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if held != 5 {
		t.Fatalf("the earlier version's consumer delivered %d commands, want 5", held)
	}

	w.consumer(messaging.ConsumerHooks{}, nil)
	answered := map[string]bool{}
	for range 2 {
		answered[next(t, results, "result").Header.Get(messaging.HeaderKey)] = true
	}
	waitAckPending(t, w, 0)
	t.Run("the commands past its ack floor are answered", func(t *testing.T) {
		if !answered["upgrade-4"] || !answered["upgrade-5"] {
			t.Errorf("answered %v, want upgrade-4 (in flight at the upgrade) and upgrade-5", answered)
		}
	})
	t.Run("those it acknowledged do not run again", func(t *testing.T) {
		if n := w.count("SELECT count(*) FROM orders WHERE customer_id IN ('cus_upgrade_0','cus_upgrade_1','cus_upgrade_2','cus_upgrade_3')"); n != 0 {
			t.Errorf("%d orders made for commands the earlier version had acknowledged", n)
		}
	})
	t.Run("every new consumer starts there, and the old one is gone", func(t *testing.T) {
		for _, name := range []string{messaging.ConsumerFor("acme"), messaging.ConsumerFor("globex")} {
			c, err := w.js.Consumer(ctx, messaging.CommandsStream, name)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if cfg := c.CachedInfo().Config; cfg.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || cfg.OptStartSeq != 5 {
				t.Errorf("%s starts with %v at %d, want by start sequence at 5", name, cfg.DeliverPolicy, cfg.OptStartSeq)
			}
		}
		if _, err := w.js.Consumer(ctx, messaging.CommandsStream, "orderservice"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Errorf("the earlier versions' consumer: %v, want it removed", err)
		}
	})
	t.Run("a restart keeps the place of each", func(t *testing.T) {
		w.consumer(messaging.ConsumerHooks{}, nil) // a second instance, after the removal: updates, does not move them
		c, err := w.js.Consumer(ctx, messaging.CommandsStream, messaging.ConsumerFor("acme"))
		if err != nil || c.CachedInfo().Config.OptStartSeq != 5 {
			t.Errorf("acme's consumer after another start: %v %+v", err, c)
		}
	})
}

// Instances need not agree on API_KEYS: across a rolling restart that
// adds globex, an instance that does not know globex yet runs beside one
// that does. The one that does not leaves globex's commands alone (it once
// read every command and dead-lettered those of tenants it did not know,
// so globex's create was both answered and dead-lettered); the one that
// does answers it, once. A command of a tenant no instance knows stays in
// ORDER_COMMANDS, neither run nor dead-lettered, and is served once an
// instance is given that tenant.
func TestAnInstanceLeavesTheTenantsItDoesNotKnowAlone(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	before := newCounters()
	w.consumer(messaging.ConsumerHooks{}, before, func(c *messaging.Consumer) { c.Tenants = map[string]string{"acme": tenants["acme"]} })
	w.consumer(messaging.ConsumerHooks{}, nil) // acme and globex
	globex := w.tenantConn("globex")
	globexJS, _ := jetstream.New(globex)
	results := subscribe(t, w.nc, messaging.ResultPrefix+">")
	run := time.Now().UnixNano()

	publish(t, globexJS, messaging.CommandSubject("globex", "create"), fmt.Sprintf("rolling-%d", run), createBody(fmt.Sprint("cus_rolling_", run)))
	if r := next(t, results, "globex's result"); r.Subject != messaging.ResultSubject("globex", "create") || r.Header.Get(messaging.HeaderStatus) != "201" {
		t.Fatalf("result on %s: %v %s", r.Subject, r.Header, r.Data)
	}
	publish(t, w.js, messaging.CommandSubject("initech", "create"), fmt.Sprintf("stray-%d", run), createBody(fmt.Sprint("cus_stray_", run)))
	waitAckPending(t, w, 0) // every consumer there is has dealt with all it was given

	t.Run("globex's create is answered once, by the instance that knows globex", func(t *testing.T) {
		if n := w.counters.get(w.counters.received, "create"); n != 1 {
			t.Errorf("deliveries handled by the instance that knows globex = %d, want 1", n)
		}
		before.mu.Lock()
		defer before.mu.Unlock()
		if len(before.received) != 0 || len(before.dead) != 0 {
			t.Errorf("the instance that does not know globex handled %v and dead-lettered %v, want nothing", before.received, before.dead)
		}
		if n := w.count("SELECT count(*) FROM orders WHERE customer_id = ?", fmt.Sprint("cus_rolling_", run)); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})
	t.Run("a tenant no instance knows is neither run nor dead-lettered: its command stays in the stream", func(t *testing.T) {
		waitDLQDepth(t, w, 0)
		stream, err := w.js.Stream(ctx, messaging.CommandsStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(messaging.CommandPrefix+"initech.>"))
		if err != nil || info.State.Subjects[messaging.CommandSubject("initech", "create")] != 1 {
			t.Fatalf("ORDER_COMMANDS holds %v of initech (%v), want its one command", info.State.Subjects, err)
		}
		if n := w.count("SELECT count(*) FROM orders WHERE customer_id = ?", fmt.Sprint("cus_stray_", run)); n != 0 {
			t.Errorf("orders = %d, want 0", n)
		}
	})
	t.Run("and is served once an instance is given the tenant", func(t *testing.T) {
		w.consumer(messaging.ConsumerHooks{}, newCounters(), func(c *messaging.Consumer) {
			c.Tenants = map[string]string{"initech": "key-of-initech"}
		})
		if r := next(t, results, "initech's result"); r.Subject != messaging.ResultSubject("initech", "create") || r.Header.Get(messaging.HeaderStatus) != "201" {
			t.Errorf("result on %s: %v %s", r.Subject, r.Header, r.Data)
		}
	})
}

// A listening lane's pull ended by the broker because its consumer is gone
// (an operator deleted it) does not leave the tenant deaf: the lane makes
// the consumer again, and the tenant's next command is answered.
func TestALaneWhoseConsumerIsDeletedMakesItAgain(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.consumer(messaging.ConsumerHooks{}, nil)
	acme := w.tenantConn("acme")
	acmeJS, _ := jetstream.New(acme)
	results := subscribe(t, acme, messaging.ResultSubject("acme", "create"))
	run := time.Now().UnixNano()
	publish(t, acmeJS, messaging.CommandSubject("acme", "create"), fmt.Sprintf("gone-before-%d", run), createBody("cus_gone"))
	next(t, results, "result before the deletion")

	if err := w.js.DeleteConsumer(ctx, messaging.CommandsStream, messaging.ConsumerFor("acme")); err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("gone-after-%d", run)
	publish(t, acmeJS, messaging.CommandSubject("acme", "create"), key, createBody("cus_gone"))
	for {
		r := next(t, results, "result after the deletion")
		if r.Header.Get(messaging.HeaderKey) != key {
			continue // the consumer made again starts at the stream's beginning: the first command's replay
		}
		if r.Header.Get(messaging.HeaderStatus) != "201" || r.Header.Get(messaging.HeaderReplayed) == "true" {
			t.Errorf("result %v %s, want its first answer, 201", r.Header, r.Data)
		}
		break
	}
	if n := w.count("SELECT count(*) FROM orders WHERE customer_id = 'cus_gone'"); n != 2 {
		t.Errorf("orders = %d, want 2", n)
	}
}
