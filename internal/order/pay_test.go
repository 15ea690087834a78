package order_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// attempt is the story of one intent sent until it got a definitive answer.
type attempt struct {
	key      string
	res      idempotency.Result
	retried  int      // answers that the verdict is not known yet, sent again with the same key
	err      error    // an error that is no such answer, or none came in time
	unwanted []string // such answers that did not say when to come back
}

// untilDefinitive sends an intent, and again with the same key while the
// answer is that its verdict is not known yet (service_unavailable,
// request_in_progress), as a client told to retry does. Safe in goroutines.
func untilDefinitive(key string, send func(c order.Caller) (idempotency.Result, error)) attempt {
	a := attempt{key: key}
	for range 500 {
		res, err := send(acme(key))
		if err == nil {
			a.res = res
			return a
		}
		if code := problem.CodeOf(err); code != problem.ServiceUnavailable && code != problem.RequestInProgress {
			a.err = err
			return a
		}
		if problem.As(err).RetryAfter <= 0 {
			a.unwanted = append(a.unwanted, fmt.Sprintf("%v without a Retry-After", err))
		}
		a.retried++
		time.Sleep(20 * time.Millisecond)
	}
	a.err = errors.New("no definitive answer after 500 attempts")
	return a
}

// wantDefinitive fails the test, at once, on intents that ended in an
// error or were told to retry without being told when.
func wantDefinitive(t *testing.T, as []attempt) {
	t.Helper()
	for _, a := range as {
		if a.err != nil {
			t.Errorf("key %s: %v (after %d retries)", a.key, a.err, a.retried)
		}
		for _, u := range a.unwanted {
			t.Errorf("key %s: %s", a.key, u)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

func TestPayingTwiceChargesOnce(t *testing.T) {
	a := newAcquirer()
	s := useCases(t, a.channel(), 5*time.Second)
	ctx := t.Context()
	id := placeOrder(t, s)
	r2 := newKey("R2")

	first, err := s.Pay(ctx, acme(r2), id, payWith(payment.MethodOK))
	t.Run("the first pay charges the total and the order is PAID", func(t *testing.T) {
		wantOutcome(t, "pay", first, err, idempotency.OutcomeDone)
		wantExecuted(t, first)
		o := shownBy(t, first)
		if o.Status != "PAID" || o.Payment == nil || o.Payment.Status != "succeeded" || o.Payment.Amount != purchaseTotal || o.Payment.ChargeID == "" {
			t.Errorf("paid order = %s", first.Body)
		}
		wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 0, duplicates: 0})
		if got := a.counted().charged; got != purchaseTotal {
			t.Errorf("amount charged = %d, want %d", got, purchaseTotal)
		}
	})

	t.Run("the same key replays the first result and never reaches the channel", func(t *testing.T) {
		before := a.counted()
		again, err := s.Pay(ctx, acme(r2), id, payWith(payment.MethodOK))
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, first, again)
		if after := a.counted(); after.requests != before.requests || after.lookups != before.lookups {
			t.Errorf("the replay reached the channel: requests %d -> %d, lookups %d -> %d",
				before.requests, after.requests, before.lookups, after.lookups)
		}
	})

	t.Run("a new key on the PAID order is forbidden as invalid_transition and charges nothing", func(t *testing.T) {
		r2b := newKey("R2-prime")
		forbidden, err := s.Pay(ctx, acme(r2b), id, payWith(payment.MethodOK))
		wantFailed(t, "pay with a new key", forbidden, err, order.CodeInvalidTransition)
		again, err := s.Pay(ctx, acme(r2b), id, payWith(payment.MethodOK))
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, forbidden, again)
		if rec := recordOf(t, s, order.OpPay, r2b); rec.State != idempotency.FailedFinal {
			t.Errorf("record of the forbidden pay is %s, want FAILED_FINAL", rec.State)
		}
		wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 0, duplicates: 0})
		if got := orderNow(t, s, id).Status; got != "PAID" {
			t.Errorf("order = %s, want PAID", got)
		}
		if n := count(t, s.DB, "SELECT count(*) FROM payments WHERE order_id = ?", id); n != 1 {
			t.Errorf("payment rows = %d, want 1", n)
		}
	})
}

func TestDeclinedPaymentMayBePaidAgainWithANewKey(t *testing.T) {
	a := newAcquirer()
	s := useCases(t, a.channel(), 5*time.Second)
	ctx := t.Context()
	id := placeOrder(t, s)
	declinedKey := newKey("R2-declined")

	declined, err := s.Pay(ctx, acme(declinedKey), id, payWith(payment.MethodDeclined))
	t.Run("a declined charge is payment_declined and the order PAYMENT_FAILED", func(t *testing.T) {
		wantFailed(t, "declined pay", declined, err, order.CodePaymentDeclined)
		o := orderNow(t, s, id)
		if o.Status != "PAYMENT_FAILED" || o.Payment == nil || o.Payment.Status != "declined" {
			t.Errorf("order after decline: status %s payment %+v", o.Status, o.Payment)
		}
		if rec := recordOf(t, s, order.OpPay, declinedKey); rec.State != idempotency.FailedFinal {
			t.Errorf("record = %s, want FAILED_FINAL", rec.State)
		}
	})

	t.Run("the same key replays the decline without asking the channel again", func(t *testing.T) {
		before := a.counted()
		again, err := s.Pay(ctx, acme(declinedKey), id, payWith(payment.MethodDeclined))
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, declined, again)
		if after := a.counted(); after.requests != before.requests || after.lookups != before.lookups {
			t.Errorf("the replay reached the channel: %+v -> %+v", before, after)
		}
	})

	t.Run("a new key with pm_ok moves PAYMENT_FAILED to PAID", func(t *testing.T) {
		res, err := s.Pay(ctx, acme(newKey("R2-ok")), id, payWith(payment.MethodOK))
		wantOutcome(t, "second pay", res, err, idempotency.OutcomeDone)
		if got := shownBy(t, res).Status; got != "PAID" {
			t.Fatalf("second pay shows %s, want PAID", got)
		}
		wantCounted(t, a, ledger{charges: 1, declined: 1, refunds: 0, requests: 2, lookups: 0, duplicates: 0})
		if got := a.counted().charged; got != purchaseTotal {
			t.Errorf("amount charged = %d, want %d", got, purchaseTotal)
		}
		if got, want := eventsOf(t, s, id), "create,pay,payment_failed,pay,payment_succeeded"; got != want {
			t.Errorf("history = %s, want %s", got, want)
		}
	})
}

func TestUnknownChannelOutcomeIsRetriedUnderTheSameKey(t *testing.T) {
	t.Run("a retry after a lost answer charges once under the same channel key", func(t *testing.T) {
		a := newAcquirer()
		s := useCases(t, a.channel(), 5*time.Second)
		ctx := t.Context()
		id := placeOrder(t, s)
		key := newKey("R2-lost")

		_, err := s.Pay(ctx, acme(key), id, payWith(payment.MethodLostResponse))
		lost := wantError(t, "pay whose channel answer was lost", err, problem.ServiceUnavailable)
		if lost.RetryAfter != time.Second {
			t.Errorf("retry after %s, want 1s (PAYMENT_RETRY_AFTER)", lost.RetryAfter)
		}
		if rec := recordOf(t, s, order.OpPay, key); rec.State != idempotency.FailedRetryable {
			t.Errorf("record after the lost answer = %s, want FAILED_RETRYABLE", rec.State)
		}
		if got := orderNow(t, s, id).Status; got != "PAYMENT_PENDING" {
			t.Errorf("order after the lost answer = %s, want PAYMENT_PENDING", got)
		}

		retry, err := s.Pay(ctx, acme(key), id, payWith(payment.MethodLostResponse))
		wantOutcome(t, "retry", retry, err, idempotency.OutcomeDone)
		if got := shownBy(t, retry).Status; got != "PAID" {
			t.Fatalf("retry shows %s, want PAID", got)
		}
		wantExecuted(t, retry)
		wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 2, lookups: 0, duplicates: 1})
		keys := a.chargeKeys()
		if len(keys) != 1 {
			t.Fatalf("channel charges = %d, want 1", len(keys))
		}
		if n := a.postsUnder(keys[0]); n != 2 {
			t.Errorf("POSTs under the charge's key = %d, want 2 (both attempts used one key)", n)
		}
		var channelKey string
		if err := s.DB.Raw("SELECT channel_key FROM payments WHERE order_id = ? AND kind = 'charge'", id).Scan(&channelKey).Error; err != nil {
			t.Fatal(err)
		}
		if channelKey == "" || channelKey != keys[0] {
			t.Errorf("stored channel_key %q, channel saw %q", channelKey, keys[0])
		}
		if channelKey == key {
			t.Errorf("the client's key was sent downstream as it is; want a key derived from tenant, order and key")
		}
		if n := count(t, s.DB, "SELECT count(*) FROM payments WHERE order_id = ?", id); n != 1 {
			t.Errorf("payment rows = %d, want 1", n)
		}
		again, err := s.Pay(ctx, acme(key), id, payWith(payment.MethodLostResponse))
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, retry, again)
	})

	t.Run("a retry after a channel 503 charges once", func(t *testing.T) {
		a := newAcquirer()
		s := useCases(t, a.channel(), 5*time.Second)
		ctx := t.Context()
		id := placeOrder(t, s)
		key := newKey("R2-unavailable")

		_, err := s.Pay(ctx, acme(key), id, payWith(payment.MethodUnavailableOnce))
		wantError(t, "pay while the channel is unavailable", err, problem.ServiceUnavailable)
		wantRetryAfter(t, "service_unavailable", err)
		retry, err := s.Pay(ctx, acme(key), id, payWith(payment.MethodUnavailableOnce))
		wantOutcome(t, "retry", retry, err, idempotency.OutcomeDone)
		if got := shownBy(t, retry).Status; got != "PAID" {
			t.Fatalf("retry shows %s, want PAID", got)
		}
		wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 2, lookups: 0, duplicates: 0})
		if got := a.counted().unavailable; got != 1 {
			t.Errorf("503s given by the channel = %d, want 1", got)
		}
		if keys := a.chargeKeys(); len(keys) != 1 || a.postsUnder(keys[0]) != 2 {
			t.Errorf("charges under %v, want one charge reached by 2 POSTs", keys)
		}
	})
}

func TestConcurrentPaysChargeOnce(t *testing.T) {
	const n = 100
	pay := func(s *order.Service, id string) func(order.Caller) (idempotency.Result, error) {
		return func(c order.Caller) (idempotency.Result, error) {
			return s.Pay(context.Background(), c, id, payWith(payment.MethodOK))
		}
	}

	t.Run("100 concurrent requests with one key make one charge and one result", func(t *testing.T) {
		a := newAcquirer()
		s := useCases(t, a.channel(), 5*time.Second)
		id := placeOrder(t, s)
		key := newKey("R2-shared")
		as := make([]attempt, n)
		atOnce(n, func(i int) { as[i] = untilDefinitive(key, pay(s, id)) })
		wantDefinitive(t, as)

		executed, retried := 0, 0
		for _, at := range as {
			retried += at.retried
			if at.res.Outcome != idempotency.OutcomeDone || !bytes.Equal(at.res.Body, as[0].res.Body) {
				t.Errorf("final result = %s %s, want the one order paid", at.res.Outcome, at.res.Body)
			}
			if !at.res.Replayed {
				executed++
			}
		}
		t.Logf("%d answers that the verdict was not known yet, sent again with the same key", retried)
		if executed != 1 {
			t.Errorf("%d requests executed, want 1 (the rest replayed)", executed)
		}
		wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: -1, duplicates: 0})
		if got := orderNow(t, s, id).Status; got != "PAID" {
			t.Errorf("order = %s, want PAID", got)
		}
	})

	t.Run("100 concurrent pays with different keys make one charge", func(t *testing.T) {
		a := newAcquirer()
		s := useCases(t, a.channel(), 5*time.Second)
		id := placeOrder(t, s)
		as := make([]attempt, n)
		atOnce(n, func(i int) { as[i] = untilDefinitive(newKey(fmt.Sprintf("R2-%03d", i)), pay(s, id)) })
		wantDefinitive(t, as)

		paid, forbidden, retried := 0, 0, 0
		for _, at := range as {
			retried += at.retried
			switch {
			case at.res.Outcome == idempotency.OutcomeDone:
				paid++
			case at.res.Failure != nil && at.res.Failure.Code == order.CodeInvalidTransition:
				forbidden++
			default:
				t.Errorf("key %s: final result %+v", at.key, at.res)
			}
		}
		t.Logf("%d answers that the verdict was not known yet, sent again with the same key", retried)
		if paid != 1 || forbidden != n-1 {
			t.Errorf("paid %d, forbidden %d; want 1 and %d", paid, forbidden, n-1)
		}
		wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: -1, duplicates: 0})
		if got := orderNow(t, s, id).Status; got != "PAID" {
			t.Errorf("order = %s, want PAID", got)
		}
		if n := count(t, s.DB, "SELECT count(*) FROM payments WHERE order_id = ?", id); n != 1 {
			t.Errorf("payment rows = %d, want 1", n)
		}
	})
}

func TestCancellingAPaidOrderRefundsOnce(t *testing.T) {
	// paidAfterALostAnswer pays an order with pm_lost_response (the answer
	// lost, then the retry's), so that its refund's first answer is lost too.
	paidAfterALostAnswer := func(t *testing.T, s *order.Service) string {
		t.Helper()
		id := placeOrder(t, s)
		key := newKey("R2-lost")
		_, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodLostResponse))
		wantError(t, "first pay", err, problem.ServiceUnavailable)
		res, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodLostResponse))
		wantOutcome(t, "retried pay", res, err, idempotency.OutcomeDone)
		return id
	}
	cancel := func(s *order.Service, id string) func(order.Caller) (idempotency.Result, error) {
		return func(c order.Caller) (idempotency.Result, error) {
			return s.Cancel(context.Background(), c, id, order.CancelRequest{})
		}
	}

	t.Run("retries of a cancel whose refund answer was lost refund once", func(t *testing.T) {
		a := newAcquirer()
		s := useCases(t, a.channel(), 5*time.Second)
		id := paidAfterALostAnswer(t, s)
		key := newKey("R3-cancel")

		_, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		wantError(t, "cancel whose refund answer was lost", err, problem.ServiceUnavailable)
		if got := orderNow(t, s, id).Status; got != "REFUND_PENDING" {
			t.Errorf("order after the lost refund answer = %s, want REFUND_PENDING", got)
		}

		// Ten clients retry at once: one takes the intent over, the others
		// are told it is in progress and then replay its result.
		as := make([]attempt, 10)
		atOnce(len(as), func(i int) { as[i] = untilDefinitive(key, cancel(s, id)) })
		wantDefinitive(t, as)
		for _, at := range as {
			if at.res.Outcome != idempotency.OutcomeDone || !bytes.Equal(at.res.Body, as[0].res.Body) {
				t.Errorf("retried cancel = %s %s", at.res.Outcome, at.res.Body)
			}
		}
		o := shownBy(t, as[0].res)
		if o.Status != "CANCELLED" || o.Payment == nil || o.Payment.Status != "refunded" || o.Payment.RefundID == "" {
			t.Errorf("cancelled order = %s", as[0].res.Body)
		}
		wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 1, requests: 4, lookups: 0, duplicates: 2})
		if got := a.counted(); got.charged != purchaseTotal || got.refunded != purchaseTotal {
			t.Errorf("charged %d, refunded %d; want %d both", got.charged, got.refunded, purchaseTotal)
		}
		if got, want := eventsOf(t, s, id), "create,pay,payment_succeeded,refund,refund_succeeded"; got != want {
			t.Errorf("history = %s, want %s", got, want)
		}

		again, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, as[0].res, again)
		res, err := s.Cancel(t.Context(), acme(newKey("R3-again")), id, order.CancelRequest{})
		wantFailed(t, "cancel of the CANCELLED order with a new key", res, err, order.CodeInvalidTransition)
		if got := a.counted().refunds; got != 1 {
			t.Errorf("refunds = %d, want 1", got)
		}
	})

	t.Run("the sweeper finishes a cancel whose refund answer was lost", func(t *testing.T) {
		a := newAcquirer()
		s := useCases(t, a.channel(), 5*time.Second)
		id := paidAfterALostAnswer(t, s)
		key := newKey("R3-cancel")

		_, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		wantError(t, "cancel", err, problem.ServiceUnavailable)
		// Nobody retries; once its Retry-After has passed, the sweeper does.
		leaseRunsOut(t, s, order.OpCancel, key)
		if n, err := s.Sweep(t.Context(), 100); err != nil || n != 1 {
			t.Fatalf("sweep took %d intents (%v), want the cancel", n, err)
		}
		if got := orderNow(t, s, id).Status; got != "CANCELLED" {
			t.Errorf("order after the sweep = %s, want CANCELLED", got)
		}
		if rec := recordOf(t, s, order.OpCancel, key); rec.State != idempotency.Succeeded {
			t.Errorf("cancel record = %s, want SUCCEEDED", rec.State)
		}
		wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 1, requests: 3, lookups: 1, duplicates: 1})
		again, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		if err != nil || !again.Replayed {
			t.Errorf("client retry after the sweep = %+v, %v; want the sweeper's result replayed", again, err)
		}
		if o := shownBy(t, again); o.Status != "CANCELLED" || o.Payment == nil || o.Payment.Status != "refunded" {
			t.Errorf("replayed cancel = %s", again.Body)
		}
	})
}

func TestPaysRacingCancelsKeepTheMoneyConsistent(t *testing.T) {
	const rounds, each = 3, 50
	s := useCases(t, nil, 5*time.Second)
	for round := range rounds {
		a := newAcquirer()
		s.Channel = a.channel()
		id := placeOrder(t, s)
		as := make([]attempt, 2*each)
		atOnce(2*each, func(i int) {
			if i < each {
				as[i] = untilDefinitive(newKey(fmt.Sprintf("pay-%02d", i)), func(c order.Caller) (idempotency.Result, error) {
					return s.Pay(context.Background(), c, id, payWith(payment.MethodOK))
				})
				return
			}
			as[i] = untilDefinitive(newKey(fmt.Sprintf("cancel-%02d", i-each)), func(c order.Caller) (idempotency.Result, error) {
				return s.Cancel(context.Background(), c, id, order.CancelRequest{})
			})
		})
		wantDefinitive(t, as)

		paid, cancelled := 0, 0
		for i, at := range as {
			switch {
			case at.res.Outcome == idempotency.OutcomeDone && i < each:
				paid++
			case at.res.Outcome == idempotency.OutcomeDone:
				cancelled++
			case at.res.Failure != nil && at.res.Failure.Code == order.CodeInvalidTransition:
			default:
				t.Errorf("key %s: final result %+v", at.key, at.res)
			}
		}
		o := orderNow(t, s, id)
		history := eventsOf(t, s, id)
		money := a.counted()
		t.Logf("round %d: %s after %s; %d pays and %d cancels succeeded; channel %+v", round, o.Status, history, paid, cancelled, money)

		switch history {
		case "create,cancel":
			if o.Status != "CANCELLED" || paid != 0 || cancelled != 1 || money.charges != 0 || money.refunds != 0 {
				t.Errorf("cancelled before payment, yet status %s, %d pays, %d cancels, %d charges, %d refunds",
					o.Status, paid, cancelled, money.charges, money.refunds)
			}
		case "create,pay,payment_succeeded,refund,refund_succeeded":
			if o.Status != "CANCELLED" || paid != 1 || cancelled != 1 || money.charges != 1 || money.refunds != 1 {
				t.Errorf("paid then cancelled, yet status %s, %d pays, %d cancels, %d charges, %d refunds",
					o.Status, paid, cancelled, money.charges, money.refunds)
			}
		case "create,pay,payment_succeeded":
			if o.Status != "PAID" || paid != 1 || cancelled != 0 || money.charges != 1 || money.refunds != 0 {
				t.Errorf("paid while every cancel lost, yet status %s, %d pays, %d cancels, %d charges, %d refunds",
					o.Status, paid, cancelled, money.charges, money.refunds)
			}
		default:
			t.Errorf("unexpected history %s (status %s)", history, o.Status)
		}
		held := int64(0)
		if o.Status == "PAID" {
			held = o.TotalAmount
		}
		if got := money.charged - money.refunded; got != held {
			t.Errorf("channel charged %d and refunded %d (net %d), but the %s order holds %d",
				money.charged, money.refunded, got, o.Status, held)
		}
	}
}

// An acquirer remembers an idempotency key for a while (a day is common),
// not for ever; its charges it keeps. A pay whose channel answer was lost
// is resumed by a retry, a redelivered command or a replayed dead letter,
// possibly days later. Within the channel's key window the same key sent
// again is absorbed; past it, sending it again would charge a second time,
// so the resumed intent asks the channel what it holds first. The model
// (model/idempotency.pml, variant NO_LOOKUP) found this.
func TestAPayResumedPastTheChannelsKeyWindowAsksFirst(t *testing.T) {
	for _, tc := range []struct {
		name           string
		age            time.Duration // how old the intent is when it is resumed
		remembers      bool          // whether the channel still knows the key
		sends, lookups int
	}{
		{"within the window the same key is sent again and absorbed", 0, true, 2, 0},
		{"past the window the channel is asked first", 25 * time.Hour, false, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			charged := map[string]payment.Charge{} // the acquirer's charges, kept for ever
			moved, sends, lookups := 0, 0, 0
			lose := true
			ch := &funcChannel{
				lookupCharge: func(_ context.Context, key string) (payment.Charge, error) {
					mu.Lock()
					defer mu.Unlock()
					lookups++
					if c, ok := charged[key]; ok {
						return c, nil
					}
					return payment.Charge{}, payment.ErrNotFound
				},
				charge: func(_ context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
					mu.Lock()
					defer mu.Unlock()
					sends++
					if c, ok := charged[key]; ok && tc.remembers {
						return payment.Result[payment.Charge]{Value: c, Replayed: true}, nil
					}
					moved++
					c := payment.Charge{ID: fmt.Sprintf("ch_%d", moved), Status: payment.StatusSucceeded, Amount: req.Amount, Currency: req.Currency}
					charged[key] = c
					if lose {
						lose = false
						return payment.Result[payment.Charge]{}, errors.New("the answer was lost on the way back")
					}
					return payment.Result[payment.Charge]{Value: c}, nil
				},
			}
			s := useCases(t, ch, 5*time.Second)
			s.Money.ChannelKeyWindow = 24 * time.Hour
			ctx := context.Background()
			run := uuid.NewString()[:8]
			created, err := s.Create(ctx, order.Caller{TenantID: "acme", Key: "kw-create-" + run}, order.CreateRequest{
				CustomerID: "cus_kw", Currency: "EUR", Items: []order.ItemRequest{{SKU: "S", Quantity: 1, UnitPrice: 700}}})
			if err != nil {
				t.Fatal(err)
			}
			pay := order.Caller{TenantID: "acme", Key: "kw-pay-" + run}
			if _, err := s.Pay(ctx, pay, created.Resource, order.PayRequest{PaymentMethod: payment.MethodOK}); err == nil {
				t.Fatal("the pay whose answer was lost answered")
			}
			var state string
			s.DB.Raw("SELECT state FROM idempotency_records WHERE idempotency_key = ?", pay.Key).Scan(&state)
			if state != string(idempotency.FailedRetryable) {
				t.Fatalf("after the lost answer the intent is %s, want FAILED_RETRYABLE", state)
			}
			ageIntent(t, s, pay.Key, tc.age)

			res, err := s.Pay(ctx, pay, created.Resource, order.PayRequest{PaymentMethod: payment.MethodOK})
			if err != nil || res.Failure != nil {
				t.Fatalf("the resumed pay = %+v, %v; want the order paid", res.Failure, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if moved != 1 || sends != tc.sends || lookups != tc.lookups {
				t.Errorf("the channel moved money %d times (%d sends, %d lookups); want once (%d sends, %d lookups)",
					moved, sends, lookups, tc.sends, tc.lookups)
			}
		})
	}
}

// heldAtTheChannel makes the calls to ch's charge that arrive before
// release is closed wait there (heldUntil); each says it arrived on
// arrived.
func heldAtTheChannel(t *testing.T, ch *funcChannel) (arrived, release chan struct{}) {
	arrived, release = make(chan struct{}), make(chan struct{})
	charge := ch.charge
	ch.charge = func(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
		select {
		case <-release:
		default:
			arrived <- struct{}{}
			if err := heldUntil(t, ctx, release); err != nil {
				return payment.Result[payment.Charge]{}, err
			}
		}
		return charge(ctx, key, req)
	}
	return arrived, release
}

// heldUntil holds a call at the channel until release is closed. A call
// whose deadline (ChannelTimeout, half the test's lease) passes first
// fails the test, saying so: the test gave a loaded machine too little
// room, and the call would otherwise end as an unknown outcome that
// fails some later assertion for no visible reason.
func heldUntil(t *testing.T, ctx context.Context, release <-chan struct{}) error {
	select {
	case <-release:
		return nil
	case <-ctx.Done():
		t.Errorf("a call held at the channel ran out its deadline before the test released it: the test's lease is too short for this machine")
		return fmt.Errorf("%w: %w", payment.ErrUnavailable, ctx.Err())
	}
}

// payInBackground runs a pay; its answer comes on the channel.
func payInBackground(s *order.Service, c order.Caller, id, method string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		res, err := s.Pay(context.Background(), c, id, payWith(method))
		out <- answer{res, err}
	}()
	return out
}

func TestAPayTheChannelHasNoRoomForIsRefusedBeforeAnythingIsRecorded(t *testing.T) {
	a := newAcquirer()
	ch := a.channel()
	arrived, release := heldAtTheChannel(t, ch)
	s := withChannelBound(useCases(t, ch, 2*time.Minute), 2) // the two held calls outlast the test
	var first []<-chan answer
	for range 2 {
		first = append(first, payInBackground(s, acme(newKey("pay")), placeOrder(t, s), payment.MethodOK))
		<-arrived
	}

	// Two intents hold the channel's two slots: the third is shed in
	// phase 1, which rolls back its claim, its payment and its transition.
	id, key := placeOrder(t, s), newKey("pay-shed")
	_, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
	wantError(t, "a pay while the channel's slots are taken", err, problem.ServiceUnavailable)
	wantRetryAfter(t, "the shed pay", err)
	if _, err := s.Records.Get(s.DB, idempotency.Scope{TenantID: "acme", Operation: order.OpPay, Key: key}); !errors.Is(err, gorm.ErrRecordNotFound) {
		t.Errorf("the shed pay's record: %v, want none", err)
	}
	if n := count(t, s.DB, "SELECT count(*) FROM payments WHERE order_id = ?", id); n != 0 {
		t.Errorf("the shed pay left %d payments", n)
	}
	if got := orderNow(t, s, id).Status; got != "CREATED" {
		t.Errorf("the shed pay's order is %s, want CREATED", got)
	}

	close(release)
	for i, answered := range first {
		got := <-answered
		wantOutcome(t, fmt.Sprintf("pay %d", i), got.res, got.err, idempotency.OutcomeDone)
		if st := shownBy(t, got.res).Status; st != "PAID" {
			t.Errorf("pay %d shows %s, want PAID", i, st)
		}
	}
	// Their slots are free again: the same key is a fresh first attempt.
	res, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
	wantOutcome(t, "the shed pay sent again", res, err, idempotency.OutcomeDone)
	if got := shownBy(t, res).Status; got != "PAID" {
		t.Errorf("the shed pay sent again shows %s, want PAID", got)
	}
	wantExecuted(t, res)
	if got := a.counted(); got.charges != 3 || got.requests != 3 {
		t.Errorf("the channel made %d charges from %d requests, want 3 from 3", got.charges, got.requests)
	}
}

// A duplicate of a pay that is at the channel is told to come back when
// its result is likely: once the channel call's own deadline has passed
// (plus a second to record it), not when the lease runs out.
func TestADuplicateIsToldWhenTheOutcomeIsLikely(t *testing.T) {
	ch := newAcquirer().channel()
	arrived, release := heldAtTheChannel(t, ch)
	const lease = 10 * time.Second
	s := useCases(t, ch, lease)
	id, key := placeOrder(t, s), newKey("R2-409")
	first := payInBackground(s, acme(key), id, payment.MethodOK)
	<-arrived

	_, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
	p := wantError(t, "an impatient duplicate", err, problem.RequestInProgress)
	if p.RetryAfter < time.Second || p.RetryAfter > s.Money.ChannelTimeout+time.Second || p.RetryAfter >= lease {
		t.Errorf("retry after %s, want 1s..%s (the channel timeout left + 1s), not the %s lease", p.RetryAfter, s.Money.ChannelTimeout+time.Second, lease)
	}
	close(release)
	got := <-first
	wantOutcome(t, "first pay", got.res, got.err, idempotency.OutcomeDone)
}
