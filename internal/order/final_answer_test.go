package order_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// What the model checks of every answer, held in Go: a stored final
// answer never changes (model/README.md, "every answer given is the first
// one"), and a 503 is never stored as final (it tells the client to send
// the same key again, which must then resume the intent).

func TestAStoredFinalAnswerNeverChanges(t *testing.T) {
	// The fence on Fail: a superseded owner whose channel answer is lost
	// postpones with its old token. Its successor has finished the intent
	// meanwhile; the postponement must change nothing, or the next retry
	// would resume an intent whose payment is no longer pending and store
	// another answer over the first.
	t.Run("a superseded owner's lost answer does not reopen what its successor finished", func(t *testing.T) {
		a := newAcquirer()
		ch := a.channel()
		reached, release := make(chan struct{}), make(chan struct{})
		var calls atomic.Int32
		charge := ch.charge
		ch.charge = func(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
			res, err := charge(ctx, key, req)
			if calls.Add(1) == 1 { // the first owner: it charged, then stalls, and its answer is lost
				close(reached)
				<-release
				return payment.Result[payment.Charge]{}, errLost
			}
			return res, err
		}
		s := useCases(t, ch, 5*time.Second)
		id, key := placeOrder(t, s), newKey("R2-fail-fence")
		firstOwner := payInBackground(s, acme(key), id, payment.MethodOK)
		<-reached
		leaseRunsOut(t, s, order.OpPay, key)
		successor, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
		wantOutcome(t, "the successor", successor, err, idempotency.OutcomeDone)
		scope := idempotency.Scope{TenantID: "acme", Operation: order.OpPay, Key: key}
		stored := recordRow(t, s.DB, scope)

		close(release)
		late := <-firstOwner
		wantError(t, "the superseded owner's answer", late.err, problem.RequestInProgress)
		if now := recordRow(t, s.DB, scope); now != stored {
			t.Errorf("the superseded owner's postponement changed the finished record:\nbefore %s\nafter  %s", stored, now)
		}
		again, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, successor, again)
		wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 1, duplicates: 0})
	})

	// The fence's other half: the owner itself may write only while the
	// record is PROCESSING. Phase 3 tries its commit again when the
	// database drops it, and a commit that landed but whose acknowledgement
	// was lost is then followed by a second Complete, or by a Fail when the
	// database stays away: neither may touch the stored answer.
	t.Run("the owner's own Complete or Fail after its commit landed changes nothing", func(t *testing.T) {
		s := useCases(t, newAcquirer().channel(), 5*time.Second)
		fp, err := idempotency.Fingerprint(order.OpPay, "landed-order", map[string]string{"payment_method": "pm_ok"})
		if err != nil {
			t.Fatal(err)
		}
		in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "acme", Operation: order.OpPay, Key: newKey("landed")}, Fingerprint: fp}
		claim, err := s.Records.ClaimOrReplay(s.DB, in)
		if err != nil {
			t.Fatal(err)
		}
		first := idempotency.Done("landed-order", []byte(`{"status":"PAID"}`))
		if err := s.Records.Complete(s.DB, in.Scope, claim.Token(), first); err != nil {
			t.Fatalf("the first Complete: %v", err)
		}
		stored := recordRow(t, s.DB, in.Scope)
		other := idempotency.Failed("landed-order", problem.Errorf(order.CodePaymentDeclined, "declined after all"))
		if err := s.Records.Complete(s.DB, in.Scope, claim.Token(), other); !errors.Is(err, idempotency.ErrFenced) {
			t.Errorf("a second Complete by the owner = %v, want ErrFenced", err)
		}
		if err := s.Records.Fail(s.DB, in.Scope, claim.Token(), time.Second); !errors.Is(err, idempotency.ErrFenced) {
			t.Errorf("Fail by the owner after its Complete = %v, want ErrFenced", err)
		}
		if now := recordRow(t, s.DB, in.Scope); now != stored {
			t.Errorf("the stored answer changed:\nbefore %s\nafter  %s", stored, now)
		}
	})
}

// Every way a money intent answers 503 leaves its record resumable with
// nothing stored, and the same key, sent again, resumes and finishes it:
// a 503 is never a final answer.
func TestATransientAnswerIsNeverStoredAsFinal(t *testing.T) {
	type fault struct {
		name string
		// cause sets s up so that its next intent on a new acme order
		// answers 503 (op is the intent's operation) and returns a
		// function that makes the next attempt succeed.
		cause func(t *testing.T) (s *order.Service, op string, send func(key, id string) error, heal func())
	}
	payOn := func(s *order.Service, method string) func(key, id string) error {
		return func(key, id string) error {
			_, err := s.Pay(context.Background(), acme(key), id, payWith(method))
			return err
		}
	}
	const lease = 2 * time.Second
	faults := []fault{
		{"the channel answers 503", func(t *testing.T) (*order.Service, string, func(string, string) error, func()) {
			s := useCases(t, newAcquirer().channel(), lease)
			return s, order.OpPay, payOn(s, payment.MethodUnavailableOnce), func() {}
		}},
		{"the channel's answer is lost", func(t *testing.T) (*order.Service, string, func(string, string) error, func()) {
			s := useCases(t, newAcquirer().channel(), lease)
			return s, order.OpPay, payOn(s, payment.MethodLostResponse), func() {}
		}},
		{"the call times out", func(t *testing.T) (*order.Service, string, func(string, string) error, func()) {
			ch := newAcquirer().channel()
			var slow atomic.Bool
			slow.Store(true)
			charge := ch.charge
			ch.charge = func(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
				if slow.Load() {
					<-ctx.Done()
					return payment.Result[payment.Charge]{}, fmt.Errorf("%w: %w", payment.ErrUnavailable, ctx.Err())
				}
				return charge(ctx, key, req)
			}
			s := useCases(t, ch, lease)
			s.Money.ChannelTimeout = 200 * time.Millisecond
			return s, order.OpPay, payOn(s, payment.MethodOK), func() { slow.Store(false) }
		}},
		{"a takeover's lookup is refused", func(t *testing.T) (*order.Service, string, func(string, string) error, func()) {
			ch := newAcquirer().channel()
			var refuse atomic.Bool
			refuse.Store(true)
			lookup := ch.lookupCharge
			ch.lookupCharge = func(ctx context.Context, key string) (payment.Charge, error) {
				if refuse.Load() {
					return payment.Charge{}, &payment.StatusError{StatusCode: 403, Code: "forbidden", Lookup: true}
				}
				return lookup(ctx, key)
			}
			s := useCases(t, ch, lease)
			return s, order.OpPay, func(key, id string) error {
				s.Hooks.AfterPhase1 = crashOnce(false) // the first owner dies before its call
				defer func() { s.Hooks.AfterPhase1 = nil }()
				if err := payOn(s, payment.MethodOK)(key, id); problem.CodeOf(err) != problem.Internal {
					t.Fatalf("the first owner = %v, want its crash", err)
				}
				leaseRunsOut(t, s, order.OpPay, key)
				return payOn(s, payment.MethodOK)(key, id)
			}, func() { refuse.Store(false) }
		}},
		{"the charge's status proves nothing", func(t *testing.T) (*order.Service, string, func(string, string) error, func()) {
			c := newStatusChannel(t, "failed")
			s := useCases(t, c.charges(), lease)
			return s, order.OpPay, payOn(s, payment.MethodOK), func() { c.set(payment.StatusSucceeded) }
		}},
		{"the refund is still pending", func(t *testing.T) (*order.Service, string, func(string, string) error, func()) {
			c := newStatusChannel(t, payment.StatusPending)
			s := useCases(t, c.refunds(), lease)
			return s, order.OpCancel, func(key, id string) error {
				if got := orderNow(t, s, id).Status; got == "CREATED" {
					res, err := s.Pay(context.Background(), acme(newKey("R2")), id, payWith(payment.MethodOK))
					wantOutcome(t, "the pay before the cancel", res, err, idempotency.OutcomeDone)
				}
				_, err := s.Cancel(context.Background(), acme(key), id, order.CancelRequest{})
				return err
			}, func() { c.set(payment.StatusSucceeded) }
		}},
		{"phase 3 cannot store the answer", func(t *testing.T) (*order.Service, string, func(string, string) error, func()) {
			s := useCases(t, newAcquirer().channel(), lease)
			s.Money.ChannelTimeout = 500 * time.Millisecond // phase 3's patience
			var cut atomic.Bool
			cut.Store(true)
			cutPhase3(t, s, &cut)
			return s, order.OpPay, payOn(s, payment.MethodOK), func() { cut.Store(false) }
		}},
		{"the owner's lease runs out before its call", func(t *testing.T) (*order.Service, string, func(string, string) error, func()) {
			s := useCases(t, newAcquirer().channel(), lease)
			s.Hooks.AfterPhase1 = func() error { time.Sleep(lease + 200*time.Millisecond); return nil }
			return s, order.OpPay, payOn(s, payment.MethodOK), func() { s.Hooks.AfterPhase1 = nil }
		}},
	}
	for _, f := range faults {
		t.Run(f.name+": 503, nothing stored, and the same key finishes the intent", func(t *testing.T) {
			s, op, send, heal := f.cause(t)
			id, key := placeOrder(t, s), newKey("R-transient")
			err := send(key, id)
			wantError(t, "the intent", err, problem.ServiceUnavailable)
			wantRetryAfter(t, "the intent", err)
			if rec := recordOf(t, s, op, key); rec.State != idempotency.FailedRetryable || rec.Outcome != nil || rec.ResultCode != nil || rec.ResultBody != nil {
				t.Fatalf("after the 503 the record is %s with outcome %q, want FAILED_RETRYABLE with nothing stored", rec.State, storedOutcome(rec))
			}
			heal()
			if err := send(key, id); err != nil {
				t.Fatalf("the same key sent again = %v, want the intent finished", err)
			}
			if rec := recordOf(t, s, op, key); rec.State != idempotency.Succeeded {
				t.Errorf("after the retry the record is %s, want SUCCEEDED", rec.State)
			}
		})
	}
}
