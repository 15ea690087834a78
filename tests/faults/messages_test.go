//go:build faults

package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/messaging"
)

// TestCommandsByMessageConvergeWhileInstancesAreKilled is the suite's
// convergence property for the second door: creates and pays arrive as
// JetStream commands on a broker the instances share, two instances are
// SIGKILLed (and restarted) while they run them, and in the end every
// command has an answer, every answer to one command is the same bytes,
// there is one order per create and one charge per pay, nothing is left
// unfinished and nothing was dead-lettered.
func TestCommandsByMessageConvergeWhileInstancesAreKilled(t *testing.T) {
	const password = "faults-nats-service"
	broker, err := messaging.StartEmbedded(messaging.EmbeddedOptions{Addr: "127.0.0.1:0", StoreDir: t.TempDir(),
		Tenants: map[string]string{tenant: apiKey}, ServicePassword: password})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	natsURL := fmt.Sprintf("nats://%s:%s@%s", messaging.ServiceUser, password, broker.Addr())
	c := startCluster(t, 3, 2*time.Second, "NATS_URL="+natsURL, "COMMAND_ACK_WAIT=2s",
		"COMMAND_BACKOFF=50ms", "COMMAND_BACKOFF_MAX=1s", "COMMAND_MAX_DELIVER=10")
	c.channel.setLatency(t, 150*time.Millisecond)
	db := openDB(t, c.dbURL)

	nc, err := nats.Connect(broker.URL(), nats.UserInfo(tenant, apiKey), nats.CustomInboxPrefix(messaging.InboxPrefix(tenant)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	var mu sync.Mutex
	answers := map[string][][]byte{} // op/key -> result bodies
	statuses := map[string]string{}
	arrived := make(chan string, 4096)
	if _, err := nc.Subscribe(messaging.ResultPrefix+tenant+".>", func(m *nats.Msg) {
		id := m.Subject[len(messaging.ResultPrefix+tenant+"."):] + "/" + m.Header.Get(messaging.HeaderKey)
		mu.Lock()
		answers[id] = append(answers[id], m.Data)
		statuses[id] = m.Header.Get(messaging.HeaderStatus)
		mu.Unlock()
		arrived <- id
	}); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	publish := func(op, key string, body any) {
		t.Helper()
		m := nats.NewMsg(messaging.CommandSubject(tenant, op))
		m.Header.Set(messaging.HeaderKey, key)
		m.Data, _ = json.Marshal(body)
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatalf("publish %s %s: %v", op, key, err)
		}
	}
	// waitFirst waits until every id has at least one answer.
	seen := map[string]bool{}
	waitFirst := func(ids []string, onEach func(n int)) {
		t.Helper()
		deadline := time.After(3 * time.Minute)
		for pending := len(ids); pending > 0; {
			select {
			case id := <-arrived:
				if !seen[id] {
					seen[id] = true
					pending--
					onEach(len(ids) - pending)
				}
			case <-deadline:
				t.Fatalf("%d of %d commands never answered", pending, len(ids))
			}
		}
	}

	const n = 40
	var creates []string
	for i := range n {
		key := fmt.Sprintf("msg-create-%d", i)
		creates = append(creates, "create/"+key)
		publish("create", key, createBody("msg", i))
	}
	waitFirst(creates, func(done int) {
		if done == n/4 { // mid-burst: one instance dies between commits and acks
			c.instances[0].Kill(t)
		}
	})
	if err := c.instances[0].restart(t); err != nil {
		t.Fatal(err)
	}

	var pays []string
	for i, id := range creates {
		mu.Lock()
		var order struct{ ID string }
		_ = json.Unmarshal(answers[id][0], &order)
		mu.Unlock()
		key := fmt.Sprintf("msg-pay-%d", i)
		pays = append(pays, "pay/"+key)
		publish("pay", key, map[string]string{"order_id": order.ID, "payment_method": "pm_ok"})
	}
	waitFirst(pays, func(done int) {
		if done == n/4 { // mid-payment: another instance dies with charges in flight
			c.instances[1].Kill(t)
		}
	})

	// Let every redelivery of a command that died unacknowledged arrive.
	cons, err := jetstream.New(mustConnect(t, broker.URL(), password))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		info, err := cons.Consumer(context.Background(), messaging.CommandsStream, messaging.ConsumerFor(tenant))
		if err != nil {
			t.Fatal(err)
		}
		ci, err := info.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumPending == 0 && ci.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("commands still unacknowledged: pending %d, ack pending %d", ci.NumPending, ci.NumAckPending)
		}
		time.Sleep(200 * time.Millisecond)
	}

	mu.Lock()
	defer mu.Unlock()
	redelivered := 0
	for _, id := range append(creates, pays...) {
		bodies := answers[id]
		for _, b := range bodies[1:] {
			if !bytes.Equal(b, bodies[0]) {
				t.Errorf("%s: answers differ:\n%s\n%s", id, bodies[0], b)
			}
		}
		redelivered += len(bodies) - 1
		want := map[bool]string{true: "201", false: "200"}[id[:6] == "create"]
		if statuses[id] != want {
			t.Errorf("%s: status %s, want %s", id, statuses[id], want)
		}
	}
	t.Logf("%d commands, %d extra (replayed) answers after the kills", 2*n, redelivered)
	if got := count(t, db, "SELECT count(*) FROM orders"); got != n {
		t.Errorf("orders = %d, want %d", got, n)
	}
	if got := count(t, db, "SELECT count(*) FROM orders WHERE status = 'PAID'"); got != n {
		t.Errorf("paid orders = %d, want %d", got, n)
	}
	if s := c.channel.stats(t); s.Charges != n {
		t.Errorf("charges = %d, want %d", s.Charges, n)
	}
	if u := unfinishedRecords(t, db); u != 0 {
		t.Errorf("%d records left unfinished", u)
	}
	dlq, err := cons.Stream(context.Background(), messaging.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := dlq.Info(context.Background()); info.State.Msgs != 0 {
		t.Errorf("%d commands dead-lettered", info.State.Msgs)
	}
}

func mustConnect(t *testing.T, url, password string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(messaging.ServiceUser, password))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
