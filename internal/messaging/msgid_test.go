package messaging_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/messaging"
)

// JetStream deduplicates Nats-Msg-Id across the whole
// of ORDER_COMMANDS, every tenant's commands together, before the service
// sees them, and the broker has no way to scope an id by subject. So a
// command may not carry one: the door refuses it at once. A tenant that
// follows the rule can then never lose a command to another tenant's id;
// what makes its command safe to send again is the Idempotency-Key, whose
// scope is (tenant, operation, key).
func TestNoTenantsMessageIdCanSuppressAnotherTenantsCommand(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil)
	dead := subscribe(t, w.nc, messaging.DLQPrefix+">")
	acme, globex := w.tenantConn("acme"), w.tenantConn("globex")
	acmeResults := subscribe(t, acme, messaging.ResultSubject("acme", "create"))
	globexResults := subscribe(t, globex, messaging.ResultSubject("globex", "create"))
	acmeJS, err := jetstream.New(acme)
	if err != nil {
		t.Fatal(err)
	}
	globexJS, err := jetstream.New(globex)
	if err != nil {
		t.Fatal(err)
	}
	// Both tenants' checkouts number their orders alike.
	id := fmt.Sprintf("order-1001-%d", time.Now().UnixNano())
	acmeCustomer, globexCustomer := "cus_acme_"+id, "cus_globex_"+id

	t.Run("a command carrying a Nats-Msg-Id is refused at once, with the rule as its reason", func(t *testing.T) {
		publish(t, acmeJS, messaging.CommandSubject("acme", "create"), id, createBody(acmeCustomer), messaging.HeaderMsgID, id)
		d := within(t, dead, 30*time.Second, "dead letter")
		if reason := d.Header.Get(messaging.HeaderReason); !strings.Contains(reason, messaging.HeaderMsgID) {
			t.Errorf("Dead-Letter-Reason = %q, want the rule about %s", reason, messaging.HeaderMsgID)
		}
		// Its tenant is told the rule, as a 400: the command did not run.
		r := within(t, acmeResults, 30*time.Second, "refusal")
		if r.Header.Get(messaging.HeaderStatus) != "400" || !strings.Contains(jsonField(t, r.Data, "detail"), messaging.HeaderMsgID) {
			t.Fatalf("the command was answered %s %s: its id stays in %s's duplicate window for every tenant",
				r.Header.Get(messaging.HeaderStatus), r.Data, messaging.CommandsStream)
		}
		if n := w.count("SELECT count(*) FROM orders WHERE customer_id = ?", acmeCustomer); n != 0 {
			t.Errorf("orders = %d, want 0", n)
		}
	})

	t.Run("why: the broker drops another tenant's command with the same id before the service sees it", func(t *testing.T) {
		m := nats.NewMsg(messaging.CommandSubject("globex", "create"))
		m.Header.Set(messaging.HeaderKey, id)
		m.Header.Set(messaging.HeaderMsgID, id)
		m.Data = []byte(createBody(globexCustomer))
		ack, err := globexJS.PublishMsg(context.Background(), m)
		if err != nil || !ack.Duplicate {
			t.Errorf("publish = %+v, %v; JetStream no longer deduplicates ids across subjects, and the rule could be relaxed", ack, err)
		}
	})

	t.Run("each tenant's command with the same Idempotency-Key and no Nats-Msg-Id gets its own result", func(t *testing.T) {
		publish(t, acmeJS, messaging.CommandSubject("acme", "create"), id, createBody(acmeCustomer))
		publish(t, globexJS, messaging.CommandSubject("globex", "create"), id, createBody(globexCustomer))
		a := within(t, acmeResults, 30*time.Second, "result of acme's create")
		g := within(t, globexResults, 30*time.Second, "result of globex's create")
		for _, r := range []*nats.Msg{a, g} {
			if r.Header.Get(messaging.HeaderStatus) != "201" || r.Header.Get(messaging.HeaderReplayed) != "" {
				t.Errorf("result = %v %s, want a first 201", r.Header, r.Data)
			}
		}
		if jsonField(t, a.Data, "id") == jsonField(t, g.Data, "id") {
			t.Errorf("both tenants got order %s", jsonField(t, a.Data, "id"))
		}
		if got := w.api.Do(t, http.MethodGet, "/v1/orders/"+jsonField(t, a.Data, "id"), "", nil); got.Status != http.StatusOK {
			t.Errorf("acme's order: %d", got.Status)
		}
	})
}

// A result or dead letter is published again one COMMAND_ACK_WAIT after
// its handler died: the streams it goes to must still remember the first
// copy's id then, whatever the ack wait, and no longer than they keep it.
func TestTheDuplicateWindowsCoverARepublicationAfterTheAckWait(t *testing.T) {
	for _, tc := range []struct {
		ackWait, maxAge, want time.Duration
	}{
		{30 * time.Second, time.Hour, 2 * time.Minute},
		{5 * time.Minute, time.Hour, 10 * time.Minute},
		{5 * time.Minute, 3 * time.Minute, 3 * time.Minute}, // never past max_age, which the server refuses
	} {
		for _, cfg := range messaging.StreamConfigs(messaging.StreamWindows{Redelivery: tc.maxAge, Compensation: tc.maxAge, AckWait: tc.ackWait}) {
			if cfg.Name != messaging.ResultsStream && cfg.Name != messaging.DLQStream {
				continue
			}
			if cfg.Duplicates != tc.want {
				t.Errorf("ack wait %s, max_age %s: %s's duplicate window = %s, want %s", tc.ackWait, tc.maxAge, cfg.Name, cfg.Duplicates, tc.want)
			}
		}
	}
}
