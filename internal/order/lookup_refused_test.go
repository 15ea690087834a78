package order_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/internal/problem"
	"github.com/orderservice/orderservice/tests/testdb"
)

// A lookup the channel (or anything on the way to it: a gateway, a WAF, a
// key gone to another region) answers with a 4xx other than 404 says
// nothing about the charge under the key. Taken as "the channel refused
// the charge", it once stored the payment failed while the channel held a
// succeeded charge, and the next pay charged a second time.

// refusingLookups is a proxy in front of a real mock channel that answers
// every lookup (GET of a charge or refund by key) with the status it holds,
// while it holds one; the channel's POSTs pass.
type refusingLookups struct {
	status atomic.Int32
	*mockchannel.Server
	client *payment.Client
}

func channelBehindAProxy(t *testing.T) *refusingLookups {
	t.Helper()
	srv, err := mockchannel.Open(context.Background(), testdb.Fresh(t, "lookupchannel"), mockchannel.Options{AsyncDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	settlesUnrecorded(t)
	real := httptest.NewServer(srv.Handler())
	t.Cleanup(real.Close)
	target, _ := url.Parse(real.URL)
	p := &refusingLookups{Server: srv}
	forward := httputil.NewSingleHostReverseProxy(target)
	forward.ErrorLog = log.New(io.Discard, "", 0) // pm_lost_response drops the connection: a 502 here
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status := int(p.status.Load()); status != 0 && r.Method == http.MethodGet {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"status":%d,"code":"refused_by_the_proxy","detail":"not this lookup"}`, status)
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	p.client = payment.NewClient(proxy.URL, nil)
	return p
}

// chargesFor counts the charges the channel holds for the order, and how
// many of them succeeded.
func (p *refusingLookups) chargesFor(orderID string) (all, succeeded int) {
	for _, c := range p.Charges() {
		if c.Reference == orderID {
			all++
			if c.Status == payment.StatusSucceeded {
				succeeded++
			}
		}
	}
	return all, succeeded
}

// settled waits until the channel has settled every charge of the order.
func (p *refusingLookups) settled(t *testing.T, orderID string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		all, pending := 0, 0
		for _, c := range p.Charges() {
			if c.Reference == orderID {
				all++
				if c.Status == payment.StatusPending {
					pending++
				}
			}
		}
		if all > 0 && pending == 0 {
			return
		}
	}
	t.Fatalf("the channel did not settle the charge of order %s", orderID)
}

// refusedLookups are the proxy's answers to a lookup; its 404 carries no
// channel code (a gateway's, a wrong path): no proof that nothing is there.
var refusedLookups = []int{http.StatusBadRequest, http.StatusForbidden, http.StatusNotFound, http.StatusGone, http.StatusUnprocessableEntity}

func TestARefusedLookupIsNotADecline(t *testing.T) {
	t.Run("a webhook's or the sweeper's lookup leaves the payment pending", func(t *testing.T) {
		ch := channelBehindAProxy(t)
		s := useCases(t, ch.client, 5*time.Second)
		s.Money.PendingCheckEvery = time.Millisecond
		ctx := context.Background()
		id, _, key := pendingPay(t, s)
		ch.settled(t, id)

		for _, status := range refusedLookups {
			ch.status.Store(int32(status))
			late, err := s.ResolvePending(ctx, key)
			if code := problem.CodeOf(err); code != problem.ServiceUnavailable {
				t.Errorf("webhook, lookup answered %d: %q, %v; want service_unavailable (resolved later)", status, late, err)
			}
			time.Sleep(2 * time.Millisecond)
			if n, err := s.SweepPending(ctx, 100); n != 0 {
				t.Errorf("sweeper, lookup answered %d: resolved %d (%v); want none", status, n, err)
			}
			if got := orderStatus(t, s.DB, id); got != string(order.StatusPaymentPending) {
				t.Fatalf("after a lookup answered %d the order is %s, want PAYMENT_PENDING: the channel holds a succeeded charge", status, got)
			}
		}
		ch.status.Store(0)
		if late, err := s.ResolvePending(ctx, key); err != nil || late != order.ReceiptApplied {
			t.Fatalf("the webhook once the lookup works: %q, %v; want applied", late, err)
		}
		if got := orderStatus(t, s.DB, id); got != string(order.StatusPaid) {
			t.Errorf("order %s, want PAID", got)
		}
		if all, ok := ch.chargesFor(id); all != 1 || ok != 1 {
			t.Errorf("the channel holds %d charges (%d succeeded) for the order, want 1 succeeded", all, ok)
		}
	})

	t.Run("a pay resumed past the key window does not give up", func(t *testing.T) {
		ch := channelBehindAProxy(t)
		s := useCases(t, ch.client, 5*time.Second)
		s.Money.ChannelKeyWindow = 24 * time.Hour
		ctx := context.Background()
		id := placeOrder(t, s)
		pay := acme("lookup-refused-pay-" + uuid.NewString()[:8])
		// The channel charges; its first answer under the key is lost.
		if _, err := s.Pay(ctx, pay, id, payWith(payment.MethodLostResponse)); problem.CodeOf(err) != problem.ServiceUnavailable {
			t.Fatalf("the pay whose answer was lost: %v, want service_unavailable", err)
		}
		ageIntent(t, s, pay.Key, 25*time.Hour)
		for _, status := range refusedLookups {
			ch.status.Store(int32(status))
			res, err := s.Pay(ctx, pay, id, payWith(payment.MethodLostResponse))
			if code := problem.CodeOf(err); code != problem.ServiceUnavailable {
				t.Errorf("resumed, lookup answered %d: %+v, %v; want service_unavailable", status, res.Failure, err)
			}
			if got := orderStatus(t, s.DB, id); got == string(order.StatusPaymentFailed) {
				t.Fatalf("after a lookup answered %d the order is PAYMENT_FAILED: the channel holds a succeeded charge", status)
			}
		}
		// Another pay of the same order, with another key: with the order
		// wrongly failed, it would charge a second time.
		_, _ = s.Pay(ctx, acme("lookup-refused-other-"+uuid.NewString()[:8]), id, payWith(payment.MethodOK))
		ch.status.Store(0)
		if res, err := s.Pay(ctx, pay, id, payWith(payment.MethodLostResponse)); err != nil || res.Failure != nil {
			t.Fatalf("resumed once the lookup works: %+v, %v; want the order paid", res.Failure, err)
		}
		if got := orderStatus(t, s.DB, id); got != string(order.StatusPaid) {
			t.Errorf("order %s, want PAID", got)
		}
		if all, ok := ch.chargesFor(id); all != 1 || ok != 1 {
			t.Errorf("the channel holds %d charges (%d succeeded) for the order, want 1 succeeded", all, ok)
		}
	})
}
