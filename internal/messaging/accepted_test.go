package messaging_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/internal/payment"
)

// A pay the channel takes on to finish later, here a charge that waits
// for the customer's action (pm_requires_action), answers 202 over the
// broker as over HTTP: a definitive result, published and acknowledged at
// its first delivery. It is not a failure tried again while the customer
// takes their time, nor a dead letter when they take longer than the
// deliveries last.
func TestAPayTheChannelTookOnIsAnsweredAtItsFirstDelivery(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil)
	acme := w.tenantConn("acme")
	acmeJS, _ := jetstream.New(acme)
	results := subscribe(t, acme, messaging.ResultSubject("acme", "pay"))

	created := w.api.Do(t, http.MethodPost, "/v1/orders", "taken-on-create", createBody("cus_taken_on"))
	if created.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.Status, created.Body)
	}
	id := jsonField(t, created.Body, "id")
	publish(t, acmeJS, messaging.CommandSubject("acme", "pay"), "taken-on-pay",
		fmt.Sprintf(`{"order_id":%q,"payment_method":%q}`, id, payment.MethodRequiresAction))

	r := next(t, results, "result")
	<-w.counters.ackedCh
	if r.Header.Get(messaging.HeaderStatus) != "202" || jsonField(t, r.Data, "status") != "PAYMENT_PENDING" {
		t.Errorf("result = %s %s, want 202 with the order PAYMENT_PENDING", r.Header.Get(messaging.HeaderStatus), r.Data)
	}
	if got := w.counters.get(w.counters.received, "pay"); got != 1 {
		t.Errorf("the pay was delivered %d times, want once", got)
	}
	if got := w.counters.get(w.counters.dead, "pay"); got != 0 {
		t.Errorf("the pay was dead-lettered %d times, want never", got)
	}
	again := w.api.Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", "taken-on-pay",
		fmt.Sprintf(`{"payment_method":%q}`, payment.MethodRequiresAction))
	if again.Status != http.StatusAccepted || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the same key over HTTP = %d (replayed %q), want the 202 replayed", again.Status, again.Header.Get("Idempotent-Replayed"))
	}
}
