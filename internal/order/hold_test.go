package order_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
)

// Phase 3 is one step in the model: the fence checked and the answer
// stored at once. In the code it is a transaction, and Hold makes it one
// step by locking the record (model/README.md, "Hold locks the row"): a
// retry that would take the intent over while phase 3 stores its answer
// waits for it, and then replays that answer. Without the lock the retry
// takes the intent over under phase 3's feet: phase 3 is fenced at its
// last statement, its client told 409 for a charge that succeeded, and the
// retry asks the channel again.
func TestARetryDuringPhase3WaitsForItAndReplaysItsAnswer(t *testing.T) {
	a := newAcquirer()
	// A lock wait long enough for a loaded machine: the test ends it.
	s := useCasesOn(t, openDB(t, 30*time.Second), a.channel(), 3*time.Second)
	id, key := placeOrder(t, s), newKey("R2-hold")
	var called, storing atomic.Int32
	s.Hooks.AfterChannelCall = func() error {
		if called.Add(1) == 1 { // the owner got its answer but is now past its lease
			leaseRunsOut(t, s, order.OpPay, key)
		}
		return nil
	}
	inPhase3, release := make(chan struct{}), make(chan struct{})
	s.Hooks.BeforeReplyCommit = func() error {
		if storing.Add(1) == 1 {
			close(inPhase3)
			<-release
		}
		return nil
	}
	owner := payInBackground(s, acme(key), id, payment.MethodOK)
	<-inPhase3
	retry := payInBackground(s, acme(key), id, payment.MethodOK)
	// Release phase 3 once the retry waits for a lock, wherever it waits.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if count(t, s.DB, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0 {
			break
		}
		if time.Now().After(deadline) {
			close(release)
			t.Fatal("the retry never waited for phase 3")
		}
	}
	close(release)

	first, second := <-owner, <-retry
	wantOutcome(t, "the owner whose phase 3 the retry met", first.res, first.err, idempotency.OutcomeDone)
	wantExecuted(t, first.res)
	if second.err != nil {
		t.Fatalf("the retry = %v, want the owner's answer replayed", second.err)
	}
	wantReplay(t, first.res, second.res)
	if rec := recordOf(t, s, order.OpPay, key); rec.State != idempotency.Succeeded || rec.LeaseToken != 1 {
		t.Errorf("record = %s token %d, want SUCCEEDED by the owner (token 1)", rec.State, rec.LeaseToken)
	}
	wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 0, duplicates: 0})
}
