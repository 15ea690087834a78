package order_test

// Every intent converges (issue 11): each test is named by the behaviour it
// proves, and each was a reproduced hole before.

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

func TestARefusedChargeEndsTheIntentAndLeavesTheOrderPayable(t *testing.T) {
	// The channel refuses the charge (a 4xx that is no decline) while
	// refuse holds; asked counts the charges it was asked for.
	var refuse atomic.Bool
	var asked atomic.Int64
	refuse.Store(true)
	ch := newAcquirer().channel()
	charge := ch.charge
	ch.charge = func(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
		asked.Add(1)
		if refuse.Load() {
			return payment.Result[payment.Charge]{}, &payment.StatusError{StatusCode: 422, Code: "currency_not_supported",
				Detail: "this acquirer does not take the currency"}
		}
		return charge(ctx, key, req)
	}
	s := useCases(t, ch, 5*time.Second)
	ctx := t.Context()
	id, key := placeOrder(t, s), newKey("R2-refused")

	first, err := s.Pay(ctx, acme(key), id, payWith(payment.MethodOK))
	t.Run("the refusal is payment_refused, not a retry later", func(t *testing.T) {
		p := wantFailed(t, "refused pay", first, err, order.CodePaymentRefused)
		if !strings.Contains(p.Detail, "currency_not_supported") || p.Extensions["order_id"] != id {
			t.Errorf("the refusal names neither the channel's reason nor the order: %s", failureText(p))
		}
	})
	t.Run("the intent is FAILED_FINAL and the order PAYMENT_FAILED", func(t *testing.T) {
		if rec := recordOf(t, s, order.OpPay, key); rec.State != idempotency.FailedFinal || rec.Attempts != 1 {
			t.Errorf("record = %s after %d attempts, want FAILED_FINAL after 1", rec.State, rec.Attempts)
		}
		if got, want := eventsOf(t, s, id), "create,pay,payment_failed"; got != want {
			t.Errorf("history = %s, want %s", got, want)
		}
	})
	t.Run("the sweeper leaves it alone and the same key replays the refusal", func(t *testing.T) {
		if n, err := s.Sweep(ctx, 100); err != nil || n != 0 {
			t.Errorf("the sweeper took %d intents (%v), want none", n, err)
		}
		again, err := s.Pay(ctx, acme(key), id, payWith(payment.MethodOK))
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, first, again)
		if rec := recordOf(t, s, order.OpPay, key); rec.Attempts != 1 {
			t.Errorf("attempts = %d, want 1: something kept retrying a refusal", rec.Attempts)
		}
		if n := asked.Load(); n != 1 {
			t.Errorf("the channel was asked to charge %d times, want 1", n)
		}
	})
	t.Run("a new key pays the order once the channel accepts", func(t *testing.T) {
		refuse.Store(false)
		res, err := s.Pay(ctx, acme(newKey("R3")), id, payWith(payment.MethodOK))
		wantOutcome(t, "pay with a new key", res, err, idempotency.OutcomeDone)
		if got := shownBy(t, res).Status; got != "PAID" {
			t.Fatalf("pay with a new key shows %s, want PAID", got)
		}
	})
}

func TestAnUnknownPaymentMethodIsRefusedBeforeAnythingIsRecorded(t *testing.T) {
	a := newAcquirer()
	s := useCases(t, a.channel(), 5*time.Second)
	id, key := placeOrder(t, s), newKey("R2-bogus")

	_, err := s.Pay(t.Context(), acme(key), id, payWith("pm_bogus"))
	wantError(t, "pay with pm_bogus", err, problem.InvalidRequest)
	if n := count(t, s.DB, "SELECT count(*) FROM idempotency_records WHERE idempotency_key = ?", key); n != 0 {
		t.Errorf("%d records written for a rejected request", n)
	}
	if got := orderNow(t, s, id).Status; got != "CREATED" {
		t.Errorf("order = %s, want CREATED", got)
	}
	wantCounted(t, a, ledger{charges: 0, declined: 0, refunds: 0, requests: 0, lookups: 0, duplicates: 0})
	res, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
	wantOutcome(t, "the same key with a real token", res, err, idempotency.OutcomeDone)
}

func TestARefusedRefundPutsTheOrderBackToPaid(t *testing.T) {
	a := newAcquirer()
	s := useCases(t, a.channel(), 5*time.Second)
	ctx := t.Context()
	id := placeOrder(t, s)
	// The charge of pm_refund_refused succeeds; every refund of it is refused.
	res, err := s.Pay(ctx, acme(newKey("R2")), id, payWith(payment.MethodRefundRefused))
	wantOutcome(t, "pay", res, err, idempotency.OutcomeDone)
	key := newKey("R3-cancel")

	first, err := s.Cancel(ctx, acme(key), id, order.CancelRequest{})
	wantFailed(t, "cancel whose refund is refused", first, err, order.CodeRefundRefused)
	if rec := recordOf(t, s, order.OpCancel, key); rec.State != idempotency.FailedFinal {
		t.Errorf("record = %s, want FAILED_FINAL", rec.State)
	}
	if o := orderNow(t, s, id); o.Status != "PAID" || o.Payment == nil || o.Payment.Status != "succeeded" {
		t.Errorf("order = %+v, want PAID with its charge succeeded", o)
	}
	if got, want := eventsOf(t, s, id), "create,pay,payment_succeeded,refund,refund_failed"; got != want {
		t.Errorf("history = %s, want %s", got, want)
	}
	again, err := s.Cancel(ctx, acme(key), id, order.CancelRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wantReplay(t, first, again)
	// One POST for the charge, one for the refund: the replay asked nothing.
	wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 2, lookups: 0, duplicates: 0})
	shipped, err := s.Ship(ctx, acme(newKey("ship")), id, order.ShipRequest{Carrier: "DHL", TrackingNumber: "T1"})
	wantOutcome(t, "ship after the refused refund", shipped, err, idempotency.OutcomeDone)
}

// cutPhase3 makes the database drop phase 3's connection before it commits,
// as a failover or a restart would, for as long as cut holds.
func cutPhase3(t *testing.T, s *order.Service, cut *atomic.Bool) {
	s.Hooks.BeforeReplyCommit = func() error {
		if cut.Load() {
			if err := s.DB.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND state = 'idle in transaction' AND application_name = 'orderservice'`).Error; err != nil {
				t.Errorf("terminate phase 3's backend: %v", err)
			}
		}
		return nil
	}
}

func TestADatabaseBlipAfterTheChannelAnsweredIsRidenOutByPhase3(t *testing.T) {
	a := newAcquirer()
	s := useCases(t, a.channel(), 30*time.Second)
	id := placeOrder(t, s)
	var cut atomic.Bool
	cut.Store(true)
	cutPhase3(t, s, &cut)
	var attempts atomic.Int32
	s.Hooks.BeforeReplyCommit = func(next func() error) func() error {
		return func() error {
			if attempts.Add(1) > 1 {
				cut.Store(false) // the new primary is up: the next try commits
			}
			return next()
		}
	}(s.Hooks.BeforeReplyCommit)

	res, err := s.Pay(t.Context(), acme(newKey("R2-blip")), id, payWith(payment.MethodOK))
	wantOutcome(t, "pay through a dropped phase-3 connection, without a client retry", res, err, idempotency.OutcomeDone)
	if got := shownBy(t, res).Status; got != "PAID" {
		t.Fatalf("the pay shows %s, want PAID", got)
	}
	if n := attempts.Load(); n < 2 {
		t.Errorf("phase 3 ran %d times, want a second try after the dropped connection", n)
	}
	wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 0, duplicates: 0})
}

func TestADatabaseFailureAfterTheChannelAnsweredLeavesTheIntentRetryableAtOnce(t *testing.T) {
	a := newAcquirer()
	s := useCases(t, a.channel(), 30*time.Second)
	// Phase 3 tries again for up to a channel timeout: a short one keeps
	// the test short.
	s.Money.ChannelTimeout = 500 * time.Millisecond
	id, key := placeOrder(t, s), newKey("R2-phase3")
	var cut atomic.Bool
	cut.Store(true) // for longer than phase 3's patience
	cutPhase3(t, s, &cut)

	_, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
	wantError(t, "pay whose phase 3 kept losing its connection", err, problem.ServiceUnavailable)
	wantRetryAfter(t, "service_unavailable", err)
	if rec := recordOf(t, s, order.OpPay, key); rec.State != idempotency.FailedRetryable {
		t.Fatalf("record = %s, want FAILED_RETRYABLE (not PROCESSING under a 30s lease)", rec.State)
	}
	cut.Store(false)
	again, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
	wantOutcome(t, "the retry, at once", again, err, idempotency.OutcomeDone)
	if got := shownBy(t, again).Status; got != "PAID" {
		t.Fatalf("the retry shows %s, want PAID", got)
	}
	wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 2, lookups: 0, duplicates: 1})
}

// expireAndClean makes the records under keys expire and runs one pass of
// the retention job: money records are archived, then removed.
func expireAndClean(t *testing.T, s *order.Service, archived int, keys ...string) {
	t.Helper()
	if err := s.DB.Exec("UPDATE idempotency_records SET expires_at = now() - interval '1 second' WHERE idempotency_key IN ?", keys).Error; err != nil {
		t.Fatal(err)
	}
	cleaner := &idempotency.Cleaner{DB: s.DB, Store: s.Records, Batch: 100}
	if res, err := cleaner.Pass(context.Background()); err != nil || res.Archived < archived {
		t.Fatalf("cleanup = %+v, %v; want at least %d archived", res, err, archived)
	}
}

// wantFinalTwiceAlike sends a money intent whose key ran before and whose
// record is gone, twice: the first ends with a final error (a new record
// holds it), the second replays it.
func wantFinalTwiceAlike(t *testing.T, what string, send func() (idempotency.Result, error)) {
	t.Helper()
	first, err := send()
	wantFailed(t, what, first, err, problem.KeyReused)
	wantExecuted(t, first)
	again, err := send()
	if err != nil {
		t.Fatalf("%s again: %v", what, err)
	}
	wantReplay(t, first, again)
}

func TestAPayKeyWhoseRecordWasArchivedGetsAStableAnswer(t *testing.T) {
	a := newAcquirer()
	s := useCases(t, a.channel(), 5*time.Second)
	id, key := placeOrder(t, s), newKey("R2-archived")
	res, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodDeclined))
	wantFailed(t, "declined pay", res, err, order.CodePaymentDeclined)

	// Its retention passes: the cleanup archives and removes the record.
	expireAndClean(t, s, 1, key)

	wantFinalTwiceAlike(t, "the archived key sent again", func() (idempotency.Result, error) {
		return s.Pay(t.Context(), acme(key), id, payWith(payment.MethodDeclined))
	})
	if got := orderNow(t, s, id).Status; got != "PAYMENT_FAILED" {
		t.Errorf("order = %s, want PAYMENT_FAILED", got)
	}
	wantCounted(t, a, ledger{charges: 0, declined: 1, refunds: 0, requests: 1, lookups: 0, duplicates: 0})
}

// The retention job beside the pay intents it cleans up after. A finished
// pay whose retention has passed is removed, and its key, sent again, is
// refused as one that ran before. A pay in flight (its owner died after
// phase 1) whose expires_at has passed too, the provisional one its claim
// wrote, is kept: its retry takes it over, asks the channel first and
// charges once. The run is traced (model/traced_tests), and each record
// the cleanup removes is a step the model must explain: a cleanup that
// removed the pay in flight (make seedbugs, cleanup-inflight) is a step no
// path of the model explains, as well as a failure here.
func TestTheCleanupRemovesAFinishedPayAndKeepsOneInFlight(t *testing.T) {
	a := newAcquirer()
	s := useCases(t, a.channel(), 5*time.Second)
	ctx := t.Context()
	finished, flying := placeOrder(t, s), placeOrder(t, s)
	finishedKey, flyingKey := newKey("clean-finished"), newKey("clean-in-flight")
	res, err := s.Pay(ctx, acme(finishedKey), finished, payWith(payment.MethodOK))
	wantOutcome(t, "the pay that finishes", res, err, idempotency.OutcomeDone)
	s.Hooks.AfterPhase1 = crashOnce(false)
	payThatCrashes(t, s, flyingKey, flying, false)
	s.Hooks.AfterPhase1 = nil

	// Both retentions pass; the cleanup removes the finished record only.
	expireAndClean(t, s, 1, finishedKey, flyingKey)
	left := func(key string) int64 {
		return count(t, s.DB, `SELECT count(*) FROM idempotency_records
			WHERE tenant_id = 'acme' AND operation = ? AND idempotency_key = ?`, order.OpPay, key)
	}
	if n := left(finishedKey); n != 0 {
		t.Errorf("the finished pay's record is still there after its retention")
	}
	if n := left(flyingKey); n != 1 {
		t.Fatalf("the cleanup removed the pay in flight: its order would wait in PAYMENT_PENDING for ever")
	}

	wantFinalTwiceAlike(t, "the removed pay's key sent again", func() (idempotency.Result, error) {
		return s.Pay(ctx, acme(finishedKey), finished, payWith(payment.MethodOK))
	})
	leaseRunsOut(t, s, order.OpPay, flyingKey)
	res, err = s.Pay(ctx, acme(flyingKey), flying, payWith(payment.MethodOK))
	wantOutcome(t, "the retry of the pay in flight", res, err, idempotency.OutcomeDone)
	for _, id := range []string{finished, flying} {
		if got := orderNow(t, s, id).Status; got != "PAID" {
			t.Errorf("order %s = %s, want PAID", id, got)
		}
	}
	wantCounted(t, a, ledger{charges: 2, declined: 0, refunds: 0, requests: 2, lookups: 1, duplicates: 0})
}

// A money key whose record was archived and removed, sent again on another
// order of the tenant, is a definitive idempotency_key_reused: the
// payments' unique scope (tenant, operation, key) would stop a second
// payment under it, and that violation must not surface as an internal error,
// over and over. Pay and cancel (refund) alike; the other order is
// unchanged and the channel is asked nothing.
func TestAMoneyKeyWhoseRecordWasRemovedIsRefusedOnAnotherOrder(t *testing.T) {
	a := newAcquirer()
	s := useCases(t, a.channel(), 5*time.Second)
	ctx := t.Context()
	orderA, orderB := placeOrder(t, s), placeOrder(t, s)
	payKey, cancelKey := newKey("R2-pay"), newKey("R2-cancel")
	res, err := s.Pay(ctx, acme(payKey), orderA, payWith(payment.MethodOK))
	wantOutcome(t, "pay A", res, err, idempotency.OutcomeDone)
	res, err = s.Cancel(ctx, acme(cancelKey), orderA, order.CancelRequest{})
	wantOutcome(t, "cancel A", res, err, idempotency.OutcomeDone)
	expireAndClean(t, s, 2, payKey, cancelKey)

	wantFinalTwiceAlike(t, "A's removed pay key on B", func() (idempotency.Result, error) {
		return s.Pay(ctx, acme(payKey), orderB, payWith(payment.MethodOK))
	})
	if got := orderNow(t, s, orderB).Status; got != "CREATED" {
		t.Fatalf("B = %s after the pay under the removed key, want CREATED", got)
	}
	res, err = s.Pay(ctx, acme(newKey("pay-b")), orderB, payWith(payment.MethodOK))
	wantOutcome(t, "pay B with a new key", res, err, idempotency.OutcomeDone)
	wantFinalTwiceAlike(t, "A's removed cancel key on B", func() (idempotency.Result, error) {
		return s.Cancel(ctx, acme(cancelKey), orderB, order.CancelRequest{})
	})
	if got := orderNow(t, s, orderB).Status; got != "PAID" {
		t.Errorf("B = %s after the cancel under the removed key, want PAID", got)
	}
	wantCounted(t, a, ledger{charges: 2, declined: 0, refunds: 1, requests: 3, lookups: 0, duplicates: 0})
}

func TestOrderEventsArePaginated(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	ctx := t.Context()
	id := placeOrder(t, s)
	res, err := s.Pay(ctx, acme(newKey("pay")), id, payWith(payment.MethodOK))
	wantOutcome(t, "pay", res, err, idempotency.OutcomeDone)
	res, err = s.Ship(ctx, acme(newKey("ship")), id, order.ShipRequest{Carrier: "DHL", TrackingNumber: "T1"})
	wantOutcome(t, "ship", res, err, idempotency.OutcomeDone)
	res, err = s.Deliver(ctx, acme(newKey("deliver")), id, order.DeliverRequest{})
	wantOutcome(t, "deliver", res, err, idempotency.OutcomeDone)

	var names []string
	cursor, pages := "", 0
	for {
		page, err := s.History(ctx, "acme", id, order.PageRequest{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatalf("history page: %v", err)
		}
		if len(page.Events) > 2 {
			t.Fatalf("a page of limit 2 has %d events", len(page.Events))
		}
		pages++
		for _, e := range page.Events {
			names = append(names, string(e.Event))
		}
		if cursor = page.NextCursor; cursor == "" || pages > 5 {
			break
		}
	}
	if got, want := strings.Join(names, ","), "create,pay,payment_succeeded,ship,deliver"; got != want || pages != 3 {
		t.Errorf("paged history = %s over %d pages, want %s over 3", got, pages, want)
	}
	for name, pg := range map[string]order.PageRequest{"a limit of 101": {Limit: 101}, "a cursor this service never returned": {Cursor: "not-a-cursor"}} {
		_, err := s.History(ctx, "acme", id, pg)
		wantError(t, "history with "+name, err, problem.InvalidRequest)
	}
}
