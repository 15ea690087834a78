package order_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/order/steps"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/internal/problem"
)

// The channel's statuses beyond its three outcomes for a charge
// (succeeded, declined, pending: model/README.md, "the channel's three
// outcomes"). A charge that requires the customer's action is pending by
// another name: taken on, its verdict told later. Any other status proves
// nothing: it is never stored as a decline, nor a refund counted as done,
// without the channel's word that the money did or did not move. The
// intent stays resumable and the key is asked about again, less often at
// each attempt, until it does.

// statusChannel is a channel whose charge or refund under any key has the
// status its test sets, answered to POSTs and lookups alike. Like a real
// channel it answers a POST under a key it answered before as a replay,
// and when its test moves a status from pending to an outcome, that is
// the channel settling what it took on: a step of its own, recorded (when
// log is set) for each key it holds, as asyncAcquirer records its settles.
type statusChannel struct {
	mu     sync.Mutex
	status string
	keys   map[string]bool // the keys it answered a POST under
	acq    *acquirer       // makes the charge a refund returns
	log    *steps.Log      // where its settles are recorded (nil: nowhere)
}

// newStatusChannel is a statusChannel answering status, recording into
// t's run when t records.
func newStatusChannel(t *testing.T, status string) *statusChannel {
	return &statusChannel{status: status, acq: newAcquirer(), log: recorded(t)}
}

func (c *statusChannel) set(status string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	taken := c.status == payment.StatusPending || c.status == payment.StatusRequiresAction
	if taken && slices.Contains([]string{payment.StatusSucceeded, payment.StatusDeclined, payment.StatusFailed}, status) {
		for _, k := range slices.Sorted(maps.Keys(c.keys)) {
			settled(c.log, k, status)
		}
	}
	c.status = status
}

// posted notes a POST under key and reports whether the channel answered
// one under it before.
func (c *statusChannel) posted(key string) (replayed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[string]bool{}
	}
	replayed = c.keys[key]
	c.keys[key] = true
	return replayed
}

func (c *statusChannel) now() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// charges is an order.Channel whose charges have the status set.
func (c *statusChannel) charges() *funcChannel {
	ch := c.acq.channel()
	charge := func(key string) payment.Charge {
		return payment.Charge{ID: "ch_" + key, Status: c.now(), Amount: purchaseTotal, Currency: "EUR", IdempotencyKey: key}
	}
	ch.charge = func(_ context.Context, key string, _ payment.ChargeRequest) (payment.Result[payment.Charge], error) {
		replayed := c.posted(key)
		return payment.Result[payment.Charge]{Value: charge(key), Replayed: replayed}, nil
	}
	ch.lookupCharge = func(_ context.Context, key string) (payment.Charge, error) { return charge(key), nil }
	return ch
}

// refunds is an order.Channel whose charges succeed and whose refunds have
// the status set.
func (c *statusChannel) refunds() *funcChannel {
	ch := c.acq.channel()
	refund := func(key string, chargeID string) payment.Refund {
		return payment.Refund{ID: "re_" + key, ChargeID: chargeID, Status: c.now(), Amount: purchaseTotal, IdempotencyKey: key}
	}
	ch.refund = func(_ context.Context, key string, req payment.RefundRequest) (payment.Result[payment.Refund], error) {
		replayed := c.posted(key)
		return payment.Result[payment.Refund]{Value: refund(key, req.ChargeID), Replayed: replayed}, nil
	}
	ch.lookupRefund = func(_ context.Context, key string) (payment.Refund, error) { return refund(key, ""), nil }
	return ch
}

// wantResumable fails the test unless err is the 503 of an intent whose
// verdict is not known yet, left for a retry or the sweeper: the record
// FAILED_RETRYABLE with nothing stored, the order waiting in status.
func wantResumable(t *testing.T, what string, s *order.Service, err error, op, key, id string, status order.Status) {
	t.Helper()
	wantError(t, what, err, problem.ServiceUnavailable)
	wantRetryAfter(t, what, err)
	if rec := recordOf(t, s, op, key); rec.State != idempotency.FailedRetryable || rec.Outcome != nil || rec.ResultCode != nil || rec.ResultBody != nil {
		t.Errorf("%s: record %s with outcome %q, want FAILED_RETRYABLE with nothing stored", what, rec.State, storedOutcome(rec))
	}
	if got := orderNow(t, s, id).Status; got != string(status) {
		t.Errorf("%s: order %s, want %s", what, got, status)
	}
}

func TestAChannelStatusThatProvesNothingIsNeverFinal(t *testing.T) {
	for _, status := range []string{"failed", "processing", "canceled", ""} {
		t.Run("a charge "+quoted(status)+" is asked about again until it succeeds", func(t *testing.T) {
			c := newStatusChannel(t, status)
			s := useCases(t, c.charges(), 5*time.Second)
			id, key := placeOrder(t, s), newKey("R2-status")

			_, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
			wantResumable(t, "the pay", s, err, order.OpPay, key, id, order.StatusPaymentPending)
			// The sweeper's takeover asks the channel, which still says the same.
			leaseRunsOut(t, s, order.OpPay, key)
			if n, err := s.Sweep(t.Context(), 100); err != nil || n != 1 {
				t.Fatalf("sweep took %d intents (%v), want the pay", n, err)
			}
			if rec := recordOf(t, s, order.OpPay, key); rec.State != idempotency.FailedRetryable {
				t.Errorf("after the sweep the record is %s, want FAILED_RETRYABLE", rec.State)
			}
			c.set(payment.StatusSucceeded)
			res, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
			wantOutcome(t, "the retry once the charge succeeded", res, err, idempotency.OutcomeDone)
			if got := shownBy(t, res).Status; got != "PAID" {
				t.Errorf("the retry shows %s, want PAID", got)
			}
			if got, want := eventsOf(t, s, id), "create,pay,payment_succeeded"; got != want {
				t.Errorf("history = %s, want %s", got, want)
			}
		})
	}
	for _, status := range []string{payment.StatusPending, "processing", "canceled", "requires_action", ""} {
		t.Run("a refund "+quoted(status)+" is not done: the order waits in REFUND_PENDING until it succeeds", func(t *testing.T) {
			c := newStatusChannel(t, status)
			s := useCases(t, c.refunds(), 5*time.Second)
			id := orderIn(t, s, order.StatusPaid)
			key := newKey("R3-status")

			_, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
			wantResumable(t, "the cancel", s, err, order.OpCancel, key, id, order.StatusRefundPending)
			again := newKey("R3-again")
			res, err := s.Cancel(t.Context(), acme(again), id, order.CancelRequest{})
			wantFailed(t, "a second cancel while the refund is not done", res, err, order.CodeInvalidTransition)
			c.set(payment.StatusSucceeded)
			res, err = s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
			wantOutcome(t, "the retry once the refund succeeded", res, err, idempotency.OutcomeDone)
			if o := shownBy(t, res); o.Status != "CANCELLED" || o.Payment == nil || o.Payment.Status != "refunded" {
				t.Errorf("the retry shows %s", res.Body)
			}
		})
	}
	t.Run("a refund that failed is final: refund_refused, and the order is PAID again", func(t *testing.T) {
		c := newStatusChannel(t, payment.StatusFailed)
		s := useCases(t, c.refunds(), 5*time.Second)
		id := orderIn(t, s, order.StatusPaid)
		key := newKey("R3-failed")
		first, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		wantFailed(t, "the cancel whose refund failed", first, err, order.CodeRefundRefused)
		if got, want := eventsOf(t, s, id), "create,pay,payment_succeeded,refund,refund_failed"; got != want {
			t.Errorf("history = %s, want %s", got, want)
		}
		c.set(payment.StatusSucceeded) // changes nothing: the answer is stored
		again, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, first, again)
	})
}

func quoted(s string) string { return `"` + s + `"` }

// chargeKeyOf is the channel key of order id's charge.
func chargeKeyOf(t *testing.T, s *order.Service, id string) string {
	t.Helper()
	var key string
	if err := s.DB.Raw("SELECT channel_key FROM payments WHERE order_id = ? AND kind = 'charge'", id).Scan(&key).Error; err != nil || key == "" {
		t.Fatalf("the channel key of %s's charge: %q, %v", id, key, err)
	}
	return key
}

// A charge that requires action is one the channel took on: the pay
// answers 202 at once, as for any pending charge, and the verdict settles
// it later, by webhook or, here, the sweeper's lookup. It is never left
// retryable to be asked about every few seconds until the customer acts.
func TestAChargeThatRequiresActionIsPending(t *testing.T) {
	c := newStatusChannel(t, payment.StatusRequiresAction)
	s := useCases(t, c.charges(), 5*time.Second)
	id, key := placeOrder(t, s), newKey("R2-action")

	first, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
	wantOutcome(t, "the pay", first, err, idempotency.OutcomeAccepted)
	if got := shownBy(t, first).Status; got != "PAYMENT_PENDING" {
		t.Errorf("the pay shows %s, want PAYMENT_PENDING", got)
	}
	// The sweeper's lookup, for this charge alone: the package's database
	// holds other tests' pending charges, which this channel would answer.
	channelKey := chargeKeyOf(t, s, id)
	if got, err := s.ResolvePending(t.Context(), channelKey); err != nil || got != order.ReceiptIgnored {
		t.Errorf("a lookup while the charge requires action: %s (%v), want it ignored", got, err)
	}
	c.set(payment.StatusSucceeded) // the customer acted
	if got, err := s.ResolvePending(t.Context(), channelKey); err != nil || got != order.ReceiptApplied {
		t.Fatalf("a lookup once the charge succeeded: %s (%v), want it applied", got, err)
	}
	if got := orderNow(t, s, id).Status; got != "PAID" {
		t.Errorf("the order is %s, want PAID", got)
	}
	again, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
	if err != nil {
		t.Fatal(err)
	}
	wantReplay(t, first, again)
	if got, want := eventsOf(t, s, id), "create,pay,payment_succeeded"; got != want {
		t.Errorf("history = %s, want %s", got, want)
	}
}

// Asking again at once only hears the same status again: an intent the
// channel answers without an outcome is told, and left by the sweeper,
// for longer at each attempt (PAYMENT_RETRY_AFTER doubled, up to five
// minutes), and each such answer is counted apart from the channel's
// outcomes and its silences. An answer lost is not slowed down so.
func TestAStatusThatProvesNothingIsAskedAboutLessOftenAndCounted(t *testing.T) {
	c := newStatusChannel(t, "failed")
	s := useCases(t, c.charges(), 5*time.Second)
	calls := &callsObserved{}
	s.Observe = calls
	id, key := placeOrder(t, s), newKey("R2-backoff")
	for attempt := 1; attempt <= 12; attempt++ {
		_, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
		p := wantError(t, fmt.Sprintf("attempt %d", attempt), err, problem.ServiceUnavailable)
		want := min(s.Money.RetryAfter<<(attempt-1), 5*time.Minute)
		if p.RetryAfter != want {
			t.Errorf("attempt %d: Retry-After %s, want %s", attempt, p.RetryAfter, want)
		}
		var leftFor float64
		if err := s.DB.Raw(`SELECT EXTRACT(EPOCH FROM lease_expires_at - updated_at)::float8 FROM idempotency_records
			WHERE tenant_id = 'acme' AND operation = ? AND idempotency_key = ?`, order.OpPay, key).Scan(&leftFor).Error; err != nil {
			t.Fatal(err)
		}
		if got := time.Duration(leftFor * float64(time.Second)).Round(time.Second); got != want {
			t.Errorf("attempt %d: the sweeper leaves the intent for %s, want %s", attempt, got, want)
		}
	}
	if got := calls.count("no_outcome"); got != 12 {
		t.Errorf("%d calls counted as answered without an outcome, want 12 (counted %v)", got, calls.all())
	}
	c.set(payment.StatusSucceeded)
	res, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
	wantOutcome(t, "the retry once the charge succeeded", res, err, idempotency.OutcomeDone)

	// An answer that never came is not slowed down: the channel may be
	// back in a moment.
	ch := newAcquirer().channel()
	charge := ch.charge
	ch.charge = func(context.Context, string, payment.ChargeRequest) (payment.Result[payment.Charge], error) {
		return payment.Result[payment.Charge]{}, errLost
	}
	a := useCases(t, ch, 5*time.Second)
	silences := &callsObserved{}
	a.Observe = silences
	id, key = placeOrder(t, a), newKey("R2-silence")
	for attempt := 1; attempt <= 3; attempt++ {
		_, err := a.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
		if p := wantError(t, fmt.Sprintf("unanswered attempt %d", attempt), err, problem.ServiceUnavailable); p.RetryAfter != a.Money.RetryAfter {
			t.Errorf("unanswered attempt %d: Retry-After %s, want %s", attempt, p.RetryAfter, a.Money.RetryAfter)
		}
	}
	if got := silences.count("unavailable"); got != 3 {
		t.Errorf("%d calls counted as unanswered, want 3 (counted %v)", got, silences.all())
	}
	ch.charge = charge
	res, err = a.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
	wantOutcome(t, "the retry once the channel answers", res, err, idempotency.OutcomeDone)
}

// callsObserved counts the channel calls an order.Service reports, by how
// each ended.
type callsObserved struct {
	mu      sync.Mutex
	byEnded map[string]int
}

func (o *callsObserved) ChannelCall(_ context.Context, _ string, _ time.Duration, outcome string, _ bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.byEnded == nil {
		o.byEnded = map[string]int{}
	}
	o.byEnded[outcome]++
}

func (o *callsObserved) Takeover(string, string) {}

func (o *callsObserved) count(outcome string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.byEnded[outcome]
}

func (o *callsObserved) all() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.byEnded)
}

// storedOutcome is the outcome rec stores, "" for none.
func storedOutcome(rec idempotency.Record) string {
	if rec.Outcome == nil {
		return ""
	}
	return string(*rec.Outcome)
}

// The same statuses, played by the real mock channel
// (pm_requires_action, pm_refund_pending, pm_refund_failed).
func TestTheMockChannelsStatusesThroughTheUseCases(t *testing.T) {
	const delay = 300 * time.Millisecond

	t.Run("pm_requires_action: 202 PAYMENT_PENDING, PAID once the customer acted, one charge", func(t *testing.T) {
		ch := openChannel(t, mockchannel.Options{AsyncDelay: delay})
		s := useCases(t, payment.NewClient(ch.url, nil), 5*time.Second)
		id, key := placeOrder(t, s), newKey("R2-action")

		res, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodRequiresAction))
		wantOutcome(t, "the pay that requires action", res, err, idempotency.OutcomeAccepted)
		if got := shownBy(t, res).Status; got != "PAYMENT_PENDING" {
			t.Errorf("the pay shows %s, want PAYMENT_PENDING", got)
		}
		ch.settledAll(t, "charges")
		// No webhook comes: the sweeper's lookup, for this charge alone.
		if got, err := s.ResolvePending(t.Context(), chargeKeyOf(t, s, id)); err != nil || got != order.ReceiptApplied {
			t.Fatalf("a lookup once the customer acted: %s (%v), want it applied", got, err)
		}
		if got := orderNow(t, s, id).Status; got != "PAID" {
			t.Errorf("after the customer acted the order is %s, want PAID", got)
		}
		wantStats(t, ch.srv, mockchannel.Stats{Charges: 1, Requests: 1, Lookups: 1, AmountCharged: purchaseTotal})
	})

	t.Run("pm_refund_pending: 503 while the refund is pending, then CANCELLED, one refund", func(t *testing.T) {
		ch := openChannel(t, mockchannel.Options{AsyncDelay: delay})
		s := useCases(t, payment.NewClient(ch.url, nil), 5*time.Second)
		id := placeOrder(t, s)
		paid, err := s.Pay(t.Context(), acme(newKey("R2")), id, payWith(payment.MethodRefundPending))
		wantOutcome(t, "the pay", paid, err, idempotency.OutcomeDone)
		key := newKey("R3-pending")

		_, err = s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		wantResumable(t, "the cancel whose refund is pending", s, err, order.OpCancel, key, id, order.StatusRefundPending)
		ch.settledAll(t, "refunds")
		res, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		wantOutcome(t, "the retry after the refund settled", res, err, idempotency.OutcomeDone)
		if o := shownBy(t, res); o.Status != "CANCELLED" || o.Payment == nil || o.Payment.Status != "refunded" {
			t.Errorf("the retry shows %s", res.Body)
		}
		wantStats(t, ch.srv, mockchannel.Stats{Charges: 1, Refunds: 1, Requests: 3, DuplicatesAbsorbed: 1,
			AmountCharged: purchaseTotal, AmountRefunded: purchaseTotal})
	})

	t.Run("pm_refund_failed: refund_refused, stored and replayed, the order PAID, nothing refunded", func(t *testing.T) {
		ch := openChannel(t, mockchannel.Options{})
		s := useCases(t, payment.NewClient(ch.url, nil), 5*time.Second)
		id := placeOrder(t, s)
		paid, err := s.Pay(t.Context(), acme(newKey("R2")), id, payWith(payment.MethodRefundFailed))
		wantOutcome(t, "the pay", paid, err, idempotency.OutcomeDone)
		key := newKey("R3-failed")

		first, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		wantFailed(t, "the cancel whose refund failed", first, err, order.CodeRefundRefused)
		again, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, first, again)
		if o := orderNow(t, s, id); o.Status != "PAID" || o.Payment == nil || o.Payment.Status != "succeeded" {
			t.Errorf("order = %+v, want PAID with its charge succeeded", o)
		}
		wantStats(t, ch.srv, mockchannel.Stats{Charges: 1, RefundsFailed: 1, Requests: 2, AmountCharged: purchaseTotal})
	})
}

// wantStats fails the test unless the mock channel counted exactly want.
func wantStats(t *testing.T, srv *mockchannel.Server, want mockchannel.Stats) {
	t.Helper()
	if got := srv.Stats(); got != want {
		t.Errorf("channel stats:\n got %+v\nwant %+v", got, want)
	}
}
