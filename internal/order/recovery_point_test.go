package order_test

import (
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// paymentCreated is the recovery point a money intent's phase 1 stores with
// the payment it writes (a value migrations/009_recovery_points.up.sql
// allows).
const paymentCreated = idempotency.RecoveryPoint("payment_created")

// A resumed intent picks up where its record says, not where the rest of
// the database suggests. Here a pay's owner dies after phase 1, which
// stored payment_created with the payment; the point is then put back to
// started, the payment row left as it is. Code that inferred the point
// from the payment row would resume the payment and ask the channel;
// code that switches on the stored point does not: the sweeper, which
// cannot run phase 1, leaves the intent alone, and a retry runs phase 1,
// whose rule finds a payment already under the key and refuses for good.
// (TestCrashAtAPhaseBoundaryIsRecovered shows the point followed as phase 1
// stored it: the intent finished with one charge.)
func TestAResumedIntentFollowsItsStoredRecoveryPoint(t *testing.T) {
	a := newAcquirer()
	s := useCases(t, a.channel(), 3*time.Second)
	ctx := t.Context()
	id, key := placeOrder(t, s), newKey("R2-point")
	s.Hooks.AfterPhase1 = crashOnce(false)
	payThatCrashes(t, s, key, id, false)
	if rec := recordOf(t, s, order.OpPay, key); rec.State != idempotency.Processing || rec.RecoveryPoint != paymentCreated {
		t.Fatalf("record after phase 1 = %s at %q, want PROCESSING at %q", rec.State, rec.RecoveryPoint, paymentCreated)
	}
	if n := count(t, s.DB, "SELECT count(*) FROM payments WHERE idempotency_key = ? AND status = 'pending'", key); n != 1 {
		t.Fatalf("pending payments under the key = %d, want the one phase 1 wrote", n)
	}
	if err := s.DB.Exec("UPDATE idempotency_records SET recovery_point = 'started' WHERE tenant_id = 'acme' AND idempotency_key = ?", key).Error; err != nil {
		t.Fatal(err)
	}

	leaseRunsOut(t, s, order.OpPay, key)
	if n, err := s.Sweep(ctx, 100); err != nil || n != 1 {
		t.Fatalf("the sweep took %d intents (%v), want the one at started", n, err)
	}
	if rec := recordOf(t, s, order.OpPay, key); rec.State != idempotency.Processing || rec.RecoveryPoint != idempotency.Started || rec.LeaseToken != 2 {
		t.Errorf("record after the sweep = %s at %q token %d, want PROCESSING at started token 2: taken, and left", rec.State, rec.RecoveryPoint, rec.LeaseToken)
	}
	wantCounted(t, a, ledger{charges: 0, declined: 0, refunds: 0, requests: 0, lookups: 0, duplicates: 0})

	leaseRunsOut(t, s, order.OpPay, key)
	res, err := s.Pay(ctx, acme(key), id, payWith(payment.MethodOK))
	wantFailed(t, "a retry of an intent at started whose key has a payment", res, err, problem.KeyReused)
	if rec := recordOf(t, s, order.OpPay, key); rec.State != idempotency.FailedFinal || rec.RecoveryPoint != idempotency.Finished {
		t.Errorf("record after the retry = %s at %q, want FAILED_FINAL at finished", rec.State, rec.RecoveryPoint)
	}
	wantCounted(t, a, ledger{charges: 0, declined: 0, refunds: 0, requests: 0, lookups: 0, duplicates: 0})
}
