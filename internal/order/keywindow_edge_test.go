package order_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/internal/problem"
)

// The edge of the channel's key window (model/idempotency.pml, variant
// AGE_ONLY). A pay whose channel answer was lost is resumed by a retry;
// the retry may send the same key again only if the channel will still
// deduplicate it when the call reaches it. The call takes up to
// ChannelTimeout, so the service asks the channel first once the intent's
// age plus ChannelTimeout, plus order.KeyWindowMargin, reaches the window:
// at window - ChannelTimeout/2 the intent is younger than the window, yet
// a slow call lands past it.
//
// The channel here is the real mock, which forgets a key for deduplication
// after its window while a lookup by the key still finds the charge
// (docs/api.md). The intent (its record and payment) and the channel's
// charge are aged in their databases; the channel's charge by the call's
// duration more, as the channel's clock has moved on by then. The retry
// decides at most slack after the ageing, however slow the machine.
func TestAResumedPayAtTheEdgeOfTheChannelsKeyWindow(t *testing.T) {
	const (
		lease   = 40 * time.Second
		timeout = lease / 2 // useCases: ChannelTimeout is half the lease
		window  = 24 * time.Hour
		call    = 3 * timeout / 4 // how long the retry's call takes to reach the channel
		slack   = 10 * time.Second
		margin  = order.KeyWindowMargin
	)
	for _, tc := range []struct {
		name    string
		age     time.Duration // the intent's age when the retry claims it
		lookups int64         // the retry asks the channel first
	}{
		{"with its deadline and the margin inside the window the key is sent again, and the channel still knows it", window - timeout - margin - slack, 0},
		{"within the margin the channel is asked first, though the call's deadline falls inside the window", window - timeout - margin/2, 1},
		{"at window - ChannelTimeout/2 the channel is asked first, for the call would land past the window", window - timeout/2, 1},
		{"past the window the channel is asked first", window + time.Hour, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := openChannel(t, mockchannel.Options{KeyWindow: window})
			s := useCases(t, payment.NewClient(ch.url, nil), lease)
			if s.Money.ChannelTimeout != timeout {
				t.Fatalf("ChannelTimeout = %s, want %s", s.Money.ChannelTimeout, timeout)
			}
			s.Money.ChannelKeyWindow = window
			ctx := context.Background()
			id := placeOrder(t, s)
			pay := acme("kw-edge-" + uuid.NewString()[:8])

			// The channel charges; its answer is lost on the way back.
			chargedButLost(t, s, pay, id)
			ageIntent(t, s, pay.Key, tc.age)
			ch.ageCharge(t, id, tc.age+call)
			before := ch.srv.Stats()

			res, err := s.Pay(ctx, pay, id, payWith(payment.MethodLostResponse))
			succeeded := ch.succeeded(id)
			lookups := ch.srv.Stats().Lookups - before.Lookups
			if succeeded != 1 || lookups != tc.lookups {
				t.Errorf("the intent, resumed at age %s, charged %d times with %d lookups; want once, with %d",
					tc.age, succeeded, lookups, tc.lookups)
			}
			if err != nil || res.Failure != nil {
				t.Fatalf("the resumed pay = %+v, %v; want the order paid", res.Failure, err)
			}
			if got := orderNow(t, s, id); got.Status != string(order.StatusPaid) {
				t.Errorf("the order is %s, want PAID", got.Status)
			}
		})
	}
}

// A stall between deciding to send the key again and the call itself
// (model/README.md: "it never forgets while an owner is between its claim
// and its call"; issue 50). A pay's answer is lost; its retry claims the
// intent with room to spare (its call's deadline, plus the margin, falls
// slack inside the channel's key window), so it decides to send the key
// again. Then it stalls (BeforeChannelCall) for an hour: past its call's
// deadline, which the test waits for, and past the window at the channel,
// whose clock the test moves on by ageing the charge (and the intent).
// A request sent now would reach a channel that has forgotten the key and
// charge again. The deadline was fixed with the decision, so no request
// leaves; the next retry, past the window, looks the key up.
func TestAStallBetweenDecidingToSendAndTheCallNeverChargesTwice(t *testing.T) {
	const (
		lease  = 8 * time.Second // the real mock's calls get ChannelTimeout, 4s
		window = 24 * time.Hour
		slack  = 10 * time.Second
	)
	ch := openChannel(t, mockchannel.Options{KeyWindow: window})
	c := payment.NewClient(ch.url, nil)
	var posts, lookups atomic.Int64 // the calls the service made, whether or not they left
	f := &funcChannel{
		charge: func(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
			posts.Add(1)
			return c.Charge(ctx, key, req)
		},
		lookupCharge: func(ctx context.Context, key string) (payment.Charge, error) {
			lookups.Add(1)
			return c.LookupCharge(ctx, key)
		},
		refund: c.Refund, lookupRefund: c.LookupRefund}
	s := useCases(t, f, lease)
	s.Money.ChannelKeyWindow = window
	ctx := context.Background()
	id := placeOrder(t, s)
	pay := acme(newKey("kw-stall"))

	chargedButLost(t, s, pay, id)
	age := window - s.Money.ChannelTimeout - order.KeyWindowMargin - slack
	ageIntent(t, s, pay.Key, age)
	ch.ageCharge(t, id, age)
	var stalled atomic.Bool
	s.Hooks.BeforeChannelCall = func() error {
		if stalled.CompareAndSwap(false, true) {
			time.Sleep(s.Money.ChannelTimeout + 200*time.Millisecond) // the call's deadline passes
			ageIntent(t, s, pay.Key, time.Hour)                       // and the window, at the channel
			ch.ageCharge(t, id, time.Hour)
			if left := ch.untilForgotten(t, id, window); left > 0 {
				t.Fatalf("the channel still knows the key for %s", left)
			}
		}
		return nil
	}
	before, posted, looked := ch.srv.Stats(), posts.Load(), lookups.Load()

	_, err := s.Pay(ctx, pay, id, payWith(payment.MethodLostResponse))
	if !stalled.Load() {
		t.Fatal("the retry never reached the channel call")
	}
	if p, l := posts.Load()-posted, lookups.Load()-looked; p != 1 || l != 0 {
		t.Fatalf("the stalled retry made %d POSTs and %d lookups; want one POST: it decided to send the key again", p, l)
	}
	if got := ch.srv.Stats(); got.Requests != before.Requests {
		t.Errorf("the channel received %d POSTs from the stalled retry, want none: its deadline had passed", got.Requests-before.Requests)
	}
	wantError(t, "the stalled retry", err, problem.ServiceUnavailable)

	posted, looked = posts.Load(), lookups.Load()
	res, err := s.Pay(ctx, pay, id, payWith(payment.MethodLostResponse))
	if p, l := posts.Load()-posted, lookups.Load()-looked; p != 0 || l != 1 {
		t.Errorf("the retry past the window made %d POSTs and %d lookups; want none and one", p, l)
	}
	if n := ch.succeeded(id); n != 1 {
		t.Errorf("the channel charged the order %d times, want once", n)
	}
	if err != nil || res.Failure != nil {
		t.Fatalf("the retry after the stall = %+v, %v; want the order paid", res.Failure, err)
	}
	if got := orderNow(t, s, id); got.Status != string(order.StatusPaid) {
		t.Errorf("the order is %s, want PAID", got.Status)
	}
}

// chargedButLost pays order id with pm_lost_response: the channel charges
// and the answer is lost, so the intent is left FAILED_RETRYABLE.
func chargedButLost(t *testing.T, s *order.Service, pay order.Caller, id string) {
	t.Helper()
	if _, err := s.Pay(context.Background(), pay, id, payWith(payment.MethodLostResponse)); err == nil {
		t.Fatal("the pay whose answer was lost answered")
	}
	if rec := recordOf(t, s, order.OpPay, pay.Key); rec.State != idempotency.FailedRetryable {
		t.Fatalf("after the lost answer the intent is %s, want FAILED_RETRYABLE", rec.State)
	}
}

// ageIntent makes the acme intent under key, its record and its payment,
// older by d.
func ageIntent(t *testing.T, s *order.Service, key string, d time.Duration) {
	t.Helper()
	for _, q := range []string{
		"UPDATE idempotency_records SET created_at = created_at - make_interval(secs => ?) WHERE tenant_id = 'acme' AND idempotency_key = ?",
		"UPDATE payments SET created_at = created_at - make_interval(secs => ?) WHERE tenant_id = 'acme' AND idempotency_key = ?",
	} {
		if res := s.DB.Exec(q, d.Seconds(), key); res.Error != nil || res.RowsAffected != 1 {
			t.Fatalf("%s: %d rows, %v", q, res.RowsAffected, res.Error)
		}
	}
}
