package order_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// The model is checked with at most two faults (one for convergence) and a
// few arrivals (model/README.md, "the bounds chosen"). The code does not
// count faults: a pay meets four in a row here, each of a kind the model
// knows, and still ends with one charge and one answer, finished by the
// sweeper alone, and twenty retries that arrive at once replay it.
func TestAPayBeyondTheModelsBoundsStillChargesOnce(t *testing.T) {
	a := newAcquirer()
	ch := a.channel()
	var refuseLookups atomic.Bool
	lookup := ch.lookupCharge
	ch.lookupCharge = func(ctx context.Context, key string) (payment.Charge, error) {
		if refuseLookups.Load() {
			return payment.Charge{}, &payment.StatusError{StatusCode: 403, Code: "forbidden", Lookup: true}
		}
		return lookup(ctx, key)
	}
	const lease = 2 * time.Second
	s := useCases(t, ch, lease)
	ctx := t.Context()
	id, key := placeOrder(t, s), newKey("R2-faults")
	sweep := func(what string) {
		t.Helper()
		leaseRunsOut(t, s, order.OpPay, key)
		if n, err := s.Sweep(ctx, 100); err != nil || n != 1 {
			t.Fatalf("%s: the sweep took %d intents (%v), want the pay", what, n, err)
		}
	}
	unfinished := func(what string) {
		t.Helper()
		if rec := recordOf(t, s, order.OpPay, key); rec.State.Definitive() {
			t.Fatalf("after %s the record is %s, want the intent still unfinished", what, rec.State)
		}
		if got := orderNow(t, s, id).Status; got != "PAYMENT_PENDING" {
			t.Fatalf("after %s the order is %s, want PAYMENT_PENDING", what, got)
		}
	}

	// 1. The channel charges and its answer is lost; the client goes away.
	_, err := s.Pay(ctx, acme(key), id, payWith(payment.MethodLostResponse))
	wantError(t, "the pay whose answer was lost", err, problem.ServiceUnavailable)
	unfinished("the lost answer")
	// 2. The sweeper takes it over and dies after the channel answered.
	s.Hooks.AfterChannelCall = crashOnce(true)
	if p := panicOf(func() { sweep("the first sweep") }); p != nil {
		t.Fatalf("the sweeper's panic was not contained: %v", p)
	}
	s.Hooks.AfterChannelCall = nil
	unfinished("the sweeper's crash")
	// 3. The next sweeper's lookup is refused by something on the way.
	refuseLookups.Store(true)
	sweep("the second sweep")
	refuseLookups.Store(false)
	unfinished("the refused lookup")
	// 4. The next sweeper stalls past its lease before its call.
	s.Hooks.BeforeChannelCall = func() error { time.Sleep(lease + 200*time.Millisecond); return nil }
	sweep("the third sweep")
	stalled := recordOf(t, s, order.OpPay, key)
	s.Hooks.BeforeChannelCall = nil
	if stalled.State.Definitive() {
		// A stall after the decision ends in the call's deadline, so the
		// call never leaves and the intent is given back.
		t.Fatalf("the stalled sweeper finished the intent (%s)", stalled.State)
	}
	// Then a sweep with nothing in its way finishes it.
	sweep("the last sweep")
	rec := recordOf(t, s, order.OpPay, key)
	if rec.State != idempotency.Succeeded || orderNow(t, s, id).Status != "PAID" {
		t.Fatalf("after the last sweep: record %s, order %s; want SUCCEEDED and PAID", rec.State, orderNow(t, s, id).Status)
	}

	as := make([]attempt, 20)
	atOnce(len(as), func(i int) {
		as[i] = untilDefinitive(key, func(c order.Caller) (idempotency.Result, error) {
			return s.Pay(context.Background(), c, id, payWith(payment.MethodLostResponse))
		})
	})
	wantDefinitive(t, as)
	for _, at := range as {
		if !at.res.Replayed || at.res.Outcome != idempotency.OutcomeDone || string(at.res.Body) != string(as[0].res.Body) {
			t.Errorf("a retry got %s %s (replayed %v), want the sweeper's answer replayed", at.res.Outcome, at.res.Body, at.res.Replayed)
		}
	}
	if got, want := eventsOf(t, s, id), "create,pay,payment_succeeded"; got != want {
		t.Errorf("history = %s, want %s", got, want)
	}
	// One charge, made by the first POST; every later owner looked it up.
	wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: -1, duplicates: 0})
}
