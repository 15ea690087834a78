package order_test

import (
	"context"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// An owner that stalls between its claim and its call to the channel for
// longer than its lease does not call: the intent may have been taken over
// meanwhile, and a call that late may reach a channel that has forgotten
// the key (the model assumes no owner stalls that long; this makes it so).
// It gives the intent back instead, and the retry finishes it: one charge.
func TestAnOwnerWhoseLeaseRanOutBeforeItsCallDoesNotCall(t *testing.T) {
	a := newAcquirer()
	// A lease long enough that the retry, on a loaded machine, finishes
	// well within its own; the stall outlasts it.
	const lease = 2 * time.Second
	s := useCases(t, a.channel(), lease)
	ctx := context.Background()
	id := placeOrder(t, s)
	pay := acme(newKey("lapsed"))

	s.Hooks.AfterPhase1 = func() error { time.Sleep(lease + 200*time.Millisecond); return nil } // a stall past the lease
	_, err := s.Pay(ctx, pay, id, payWith(payment.MethodOK))
	if code := problem.CodeOf(err); code != problem.ServiceUnavailable {
		t.Fatalf("the pay whose lease ran out before its call = %v, want service_unavailable (given back)", err)
	}
	if got := a.counted(); got.requests != 0 || got.lookups != 0 {
		t.Fatalf("the lapsed owner called the channel: %d POSTs, %d lookups; want none", got.requests, got.lookups)
	}

	s.Hooks.AfterPhase1 = nil
	res, err := s.Pay(ctx, pay, id, payWith(payment.MethodOK))
	if err != nil || res.Failure != nil {
		t.Fatalf("the retry = %+v, %v; want the order paid", res.Failure, err)
	}
	if got := orderStatus(t, s.DB, id); got != string(order.StatusPaid) {
		t.Errorf("order %s, want PAID", got)
	}
	if got := a.counted(); got.charges != 1 {
		t.Errorf("%d charges, want 1", got.charges)
	}
}
