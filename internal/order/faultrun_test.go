package order_test

// A short fault run of two instances: two services on one database and one
// channel, pays of the same intents arriving at both, crashes injected at
// the phase boundaries, the leases run out and both sweep. Its recorded run
// is one of those make model replays against the model (model/README.md,
// "Trace validation"); here it must end with every order paid, once.

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
)

func TestTwoInstancesWithCrashesChargeEachOrderOnce(t *testing.T) {
	const orders = 4
	a := newAcquirer()
	db := openDB(t, 3*time.Second)
	one := useCasesOn(t, db, a.channel(), 5*time.Second)
	two := useCasesOn(t, db, a.channel(), 5*time.Second)
	crash := errors.New("injected crash")
	// Instance one dies after every other channel call, instance two after
	// every other phase 1: each intent meets at least one crash, whichever
	// instance claims it.
	var calls, opens atomic.Int32
	one.Hooks.AfterChannelCall = func() error {
		if calls.Add(1)%2 == 1 {
			return crash
		}
		return nil
	}
	two.Hooks.AfterPhase1 = func() error {
		if opens.Add(1)%2 == 1 {
			return crash
		}
		return nil
	}
	ids, keys := make([]string, orders), make([]string, orders)
	for i := range orders {
		ids[i], keys[i] = placeOrder(t, one), newKey("faultrun")
	}
	var wg sync.WaitGroup
	for i := range orders {
		for _, s := range []*order.Service{one, two} {
			wg.Go(func() { _, _ = s.Pay(t.Context(), acme(keys[i]), ids[i], payWith(payment.MethodOK)) })
		}
	}
	wg.Wait()
	// What crashed is left to the leases and the sweepers, on both
	// instances at once; a crash in a sweep leaves it to the next round.
	for round := 0; round < 6; round++ {
		for i := range orders {
			if rec := recordOf(t, one, order.OpPay, keys[i]); rec.State == idempotency.Processing {
				leaseRunsOut(t, one, order.OpPay, keys[i])
			}
		}
		for _, s := range []*order.Service{one, two} {
			wg.Go(func() { _, _ = s.Sweep(t.Context(), orders) })
		}
		wg.Wait()
	}
	for i := range orders {
		if got := orderStatus(t, db, ids[i]); got != string(order.StatusPaid) {
			t.Errorf("order %d = %s, want PAID", i, got)
		}
		res, err := two.Pay(t.Context(), acme(keys[i]), ids[i], payWith(payment.MethodOK))
		wantOutcome(t, "the replay", res, err, idempotency.OutcomeDone)
	}
	wantCounted(t, a, ledger{charges: orders, declined: 0, refunds: 0, requests: -1, lookups: -1, duplicates: -1})
}
