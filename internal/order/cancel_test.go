package order_test

import (
	"context"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/internal/problem"
)

// A cancel of a paid order is a money intent of its own: its refund runs
// the pay's three phases under its own key, and meets the same faults (its
// answer lost, its owner dead or superseded) and other intents racing it
// on the same order. model/README.md leaves these out of the model ("the
// cancel has no faults of its own"); these tests hold the code to them,
// against the real mock channel, with exact counts.

// paidThrough pays a new acme order on s with method, sending the same key
// again once if the channel's answer was lost, and returns the order's id.
func paidThrough(t *testing.T, s *order.Service, method string) string {
	t.Helper()
	id, key := placeOrder(t, s), newKey("R2")
	res, err := s.Pay(t.Context(), acme(key), id, payWith(method))
	if problem.CodeOf(err) == problem.ServiceUnavailable {
		res, err = s.Pay(t.Context(), acme(key), id, payWith(method))
	}
	wantOutcome(t, "pay with "+method, res, err, idempotency.OutcomeDone)
	return id
}

// cancelOf is a cancel of order id on s, for untilDefinitive.
func cancelOf(s *order.Service, id string) func(order.Caller) (idempotency.Result, error) {
	return func(c order.Caller) (idempotency.Result, error) {
		return s.Cancel(context.Background(), c, id, order.CancelRequest{})
	}
}

// wantCancelled fails the test unless res shows the order cancelled and
// refunded, with the history of one charge and one refund.
func wantCancelled(t *testing.T, s *order.Service, what string, res idempotency.Result, err error, id string) {
	t.Helper()
	wantOutcome(t, what, res, err, idempotency.OutcomeDone)
	if o := shownBy(t, res); o.Status != "CANCELLED" || o.Payment == nil || o.Payment.Status != "refunded" || o.Payment.RefundID == "" {
		t.Errorf("%s shows %s", what, res.Body)
	}
	if got, want := eventsOf(t, s, id), "create,pay,payment_succeeded,refund,refund_succeeded"; got != want {
		t.Errorf("history = %s, want %s", got, want)
	}
}

func TestACancelsRefundMeetsTheFaultsAPayMeets(t *testing.T) {
	const lease = 3 * time.Second
	onTheMock := func(t *testing.T) (realChannel, *order.Service) {
		ch := openChannel(t, mockchannel.Options{})
		return ch, useCases(t, payment.NewClient(ch.url, nil), lease)
	}

	t.Run("its answer lost: the retry's refund is the channel's replay, one refund", func(t *testing.T) {
		ch, s := onTheMock(t)
		id := paidThrough(t, s, payment.MethodLostResponse)
		key := newKey("R3-lost")
		_, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		wantResumable(t, "the cancel whose answer was lost", s, err, order.OpCancel, key, id, order.StatusRefundPending)
		res, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		wantCancelled(t, s, "the retry", res, err, id)
		again, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, res, again)
		// Two POSTs for the charge and two for the refund, each second one a
		// replay of an answer lost.
		wantStats(t, ch.srv, mockchannel.Stats{Charges: 1, Refunds: 1, Requests: 4, DuplicatesAbsorbed: 2, LostResponses: 2,
			AmountCharged: purchaseTotal, AmountRefunded: purchaseTotal})
	})

	for _, finisher := range []string{"a client retry", "the sweeper"} {
		t.Run("its owner dead after the refund: "+finisher+" looks the refund up, one refund", func(t *testing.T) {
			ch, s := onTheMock(t)
			id := paidThrough(t, s, payment.MethodOK)
			key := newKey("R3-crash")
			s.Hooks.AfterChannelCall = crashOnce(false)
			_, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
			wantError(t, "the cancel whose owner died", err, problem.Internal)
			if rec := recordOf(t, s, order.OpCancel, key); rec.State != idempotency.Processing {
				t.Fatalf("record after the crash = %s, want PROCESSING", rec.State)
			}
			leaseRunsOut(t, s, order.OpCancel, key)
			var res idempotency.Result
			if finisher == "the sweeper" {
				if n, err := s.Sweep(t.Context(), 100); err != nil || n != 1 {
					t.Fatalf("sweep took %d intents (%v), want the cancel", n, err)
				}
				res, err = s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
				if err == nil && !res.Replayed {
					t.Errorf("the client's retry after the sweep executed, want the sweeper's result replayed")
				}
			} else {
				res, err = s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
			}
			wantCancelled(t, s, "the cancel finished by "+finisher, res, err, id)
			wantStats(t, ch.srv, mockchannel.Stats{Charges: 1, Refunds: 1, Requests: 2, Lookups: 1,
				AmountCharged: purchaseTotal, AmountRefunded: purchaseTotal})
		})
	}

	t.Run("its owner superseded: the late refund reply is fenced, one refund", func(t *testing.T) {
		ch, s := onTheMock(t)
		id := paidThrough(t, s, payment.MethodOK)
		key := newKey("R3-fenced")
		reached, release := make(chan struct{}), make(chan struct{})
		s.Hooks.AfterChannelCall = func() error {
			select {
			case <-reached: // the successor passes
			default:
				close(reached)
				<-release
			}
			return nil
		}
		first := make(chan answer, 1)
		go func() {
			res, err := s.Cancel(context.Background(), acme(key), id, order.CancelRequest{})
			first <- answer{res, err}
		}()
		<-reached
		leaseRunsOut(t, s, order.OpCancel, key)
		successor, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		wantCancelled(t, s, "the successor", successor, err, id)
		close(release)
		late := <-first
		wantError(t, "the superseded owner's answer", late.err, problem.RequestInProgress)
		if rec := recordOf(t, s, order.OpCancel, key); rec.State != idempotency.Succeeded || rec.LeaseToken != 2 {
			t.Errorf("record = %s token %d, want SUCCEEDED token 2 (the successor's)", rec.State, rec.LeaseToken)
		}
		wantStats(t, ch.srv, mockchannel.Stats{Charges: 1, Refunds: 1, Requests: 2, Lookups: 1,
			AmountCharged: purchaseTotal, AmountRefunded: purchaseTotal})
	})

	t.Run("refused: refund_refused is stored and replayed, the order PAID and shippable, nothing refunded", func(t *testing.T) {
		ch, s := onTheMock(t)
		id := paidThrough(t, s, payment.MethodRefundRefused)
		key := newKey("R3-refused")
		first, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		wantFailed(t, "the cancel whose refund is refused", first, err, order.CodeRefundRefused)
		again, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, first, again)
		other, err := s.Cancel(t.Context(), acme(newKey("R3-other")), id, order.CancelRequest{})
		wantFailed(t, "a cancel with a new key", other, err, order.CodeRefundRefused)
		if got, want := eventsOf(t, s, id), "create,pay,payment_succeeded,refund,refund_failed,refund,refund_failed"; got != want {
			t.Errorf("history = %s, want %s", got, want)
		}
		shipped, err := s.Ship(t.Context(), acme(newKey("ship")), id, shipDetails)
		wantOutcome(t, "ship after the refused refunds", shipped, err, idempotency.OutcomeDone)
		wantStats(t, ch.srv, mockchannel.Stats{Charges: 1, Requests: 3, AmountCharged: purchaseTotal})
	})

	t.Run("nine cancels with new keys while the refund is at the channel: refused by the state machine, one refund", func(t *testing.T) {
		ch := openChannel(t, mockchannel.Options{})
		c := payment.NewClient(ch.url, nil)
		f := &funcChannel{charge: c.Charge, lookupCharge: c.LookupCharge, refund: c.Refund, lookupRefund: c.LookupRefund}
		arrived, release := make(chan struct{}), make(chan struct{})
		refund := f.refund
		f.refund = func(ctx context.Context, key string, req payment.RefundRequest) (payment.Result[payment.Refund], error) {
			select {
			case <-release:
			default:
				arrived <- struct{}{}
				if err := heldUntil(t, ctx, release); err != nil {
					return payment.Result[payment.Refund]{}, err
				}
			}
			return refund(ctx, key, req)
		}
		// The refund is held while nine cancels contend for the order: its
		// call's deadline (half the lease) must outlast them on any machine.
		s := useCases(t, f, 2*time.Minute)
		id := paidThrough(t, s, payment.MethodOK)
		first := make(chan answer, 1)
		go func() {
			res, err := s.Cancel(context.Background(), acme(newKey("R3-first")), id, order.CancelRequest{})
			first <- answer{res, err}
		}()
		<-arrived
		as := make([]attempt, 9)
		atOnce(len(as), func(i int) { as[i] = untilDefinitive(newKey("R3-more"), cancelOf(s, id)) })
		wantDefinitive(t, as)
		for _, a := range as {
			wantInvalidTransition(t, a.res, nil, order.StatusRefundPending, order.EventCancel)
		}
		close(release)
		got := <-first
		wantCancelled(t, s, "the first cancel", got.res, got.err, id)
		wantStats(t, ch.srv, mockchannel.Stats{Charges: 1, Refunds: 1, Requests: 2,
			AmountCharged: purchaseTotal, AmountRefunded: purchaseTotal})
	})
}

// Intents racing on one order, each with its own key: the state machine,
// not the idempotency layer, answers the one that comes second (409
// invalid_transition, stored and replayed), and money moves once.
func TestIntentsRacingOnOneOrder(t *testing.T) {
	// heldOnTheMock is the mock channel whose charges wait at the channel
	// until release is closed.
	heldOnTheMock := func(t *testing.T, opts mockchannel.Options) (realChannel, *order.Service, chan struct{}, chan struct{}) {
		ch := openChannel(t, opts)
		c := payment.NewClient(ch.url, nil)
		f := &funcChannel{charge: c.Charge, lookupCharge: c.LookupCharge, refund: c.Refund, lookupRefund: c.LookupRefund}
		arrived, release := heldAtTheChannel(t, f)
		// The charge is held while the test sends other intents: its
		// call's deadline (half the lease) must outlast them on any machine.
		return ch, useCases(t, f, 2*time.Minute), arrived, release
	}

	t.Run("a cancel while the pay is at the channel is refused, and stays refused once the order is PAID", func(t *testing.T) {
		ch, s, arrived, release := heldOnTheMock(t, mockchannel.Options{})
		id := placeOrder(t, s)
		paying := payInBackground(s, acme(newKey("R2")), id, payment.MethodOK)
		<-arrived
		key := newKey("R3-early")
		early, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		wantInvalidTransition(t, early, err, order.StatusPaymentPending, order.EventCancel)
		close(release)
		paid := <-paying
		wantOutcome(t, "the pay", paid.res, paid.err, idempotency.OutcomeDone)
		again, err := s.Cancel(t.Context(), acme(key), id, order.CancelRequest{})
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, early, again) // a stored final answer never changes
		res, err := s.Cancel(t.Context(), acme(newKey("R3-later")), id, order.CancelRequest{})
		wantCancelled(t, s, "a cancel with a new key once PAID", res, err, id)
		wantStats(t, ch.srv, mockchannel.Stats{Charges: 1, Refunds: 1, Requests: 2,
			AmountCharged: purchaseTotal, AmountRefunded: purchaseTotal})
	})

	t.Run("a second pay with a new key while the first is at the channel: one charge, the second 409", func(t *testing.T) {
		ch, s, arrived, release := heldOnTheMock(t, mockchannel.Options{})
		id := placeOrder(t, s)
		paying := payInBackground(s, acme(newKey("R2-first")), id, payment.MethodOK)
		<-arrived
		key := newKey("R2-second")
		second, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
		wantInvalidTransition(t, second, err, order.StatusPaymentPending, order.EventPay)
		close(release)
		first := <-paying
		wantOutcome(t, "the first pay", first.res, first.err, idempotency.OutcomeDone)
		again, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, second, again)
		if n := count(t, s.DB, "SELECT count(*) FROM payments WHERE order_id = ?", id); n != 1 {
			t.Errorf("%d payments, want 1", n)
		}
		wantStats(t, ch.srv, mockchannel.Stats{Charges: 1, Requests: 1, AmountCharged: purchaseTotal})
	})

	t.Run("a cancel first: the order is CANCELLED, the pay refused, the channel never asked", func(t *testing.T) {
		ch, s, _, release := heldOnTheMock(t, mockchannel.Options{})
		close(release)
		id := placeOrder(t, s)
		res, err := s.Cancel(t.Context(), acme(newKey("R3")), id, order.CancelRequest{})
		wantOutcome(t, "the cancel", res, err, idempotency.OutcomeDone)
		pay, err := s.Pay(t.Context(), acme(newKey("R2")), id, payWith(payment.MethodOK))
		wantInvalidTransition(t, pay, err, order.StatusCancelled, order.EventPay)
		wantStats(t, ch.srv, mockchannel.Stats{})
	})

	t.Run("a cancel while the charge is taken on (202) is refused; after it settles a new cancel refunds", func(t *testing.T) {
		ch, s, _, release := heldOnTheMock(t, mockchannel.Options{AsyncDelay: 300 * time.Millisecond})
		close(release)
		id := placeOrder(t, s)
		accepted, err := s.Pay(t.Context(), acme(newKey("R2")), id, payWith(payment.MethodAsyncOK))
		wantOutcome(t, "the pay taken on", accepted, err, idempotency.OutcomeAccepted)
		early, err := s.Cancel(t.Context(), acme(newKey("R3-early")), id, order.CancelRequest{})
		wantInvalidTransition(t, early, err, order.StatusPaymentPending, order.EventCancel)
		ch.settledAll(t, "charges")
		s.Money.PendingCheckEvery = time.Millisecond // no webhook comes: the sweeper asks at once
		if n, err := s.SweepPending(t.Context(), 100); err != nil || n != 1 {
			t.Fatalf("SweepPending resolved %d (%v), want the charge", n, err)
		}
		res, err := s.Cancel(t.Context(), acme(newKey("R3-later")), id, order.CancelRequest{})
		wantCancelled(t, s, "a cancel once PAID", res, err, id)
		wantStats(t, ch.srv, mockchannel.Stats{Charges: 1, Refunds: 1, Requests: 2, Lookups: 1,
			AmountCharged: purchaseTotal, AmountRefunded: purchaseTotal})
	})
}
