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
	"github.com/orderservice/orderservice/internal/payment/channel"
	"github.com/orderservice/orderservice/internal/problem"
)

// The edge of the channel's key window (model/idempotency.pml, variant
// AGE_ONLY). A pay whose channel answer was lost is resumed by a retry;
// the retry may send the same key again only if the channel will still
// deduplicate it when the call reaches it. The call takes up to
// ChannelTimeout, so the service asks the channel first once the intent's
// age plus ChannelTimeout reaches the window: at window - ChannelTimeout/2
// the intent is younger than the window, yet a slow call lands past it.
//
// The channel here is the real mock, which forgets a key for deduplication
// after its window while a lookup by the key still finds the charge
// (docs/api.md). The intent (its record and payment) and the channel's
// charge are aged in their databases; the channel's charge by the call's
// duration more, as the channel's clock has moved on by then.
func TestAResumedPayAtTheEdgeOfTheChannelsKeyWindow(t *testing.T) {
	const (
		lease   = 4 * time.Second
		timeout = lease / 2 // useCases: ChannelTimeout is half the lease
		window  = 24 * time.Hour
		call    = 3 * timeout / 4 // how long the retry's call takes to reach the channel
	)
	for _, tc := range []struct {
		name    string
		age     time.Duration // the intent's age when the retry claims it
		lookups int64         // the retry asks the channel first
	}{
		{"at window - 3/2 ChannelTimeout the key is sent again, and the channel still knows it", window - 3*timeout/2, 0},
		{"at window - ChannelTimeout/2 the channel is asked first, for the call would land past the window", window - timeout/2, 1},
		{"past the window the channel is asked first", window + time.Hour, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := openChannel(t, channel.Options{KeyWindow: window})
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
// and its call"). A pay's answer is lost; its retry claims the intent
// ChannelTimeout + 1s short of the channel's key window, so the key may be
// sent again, and decides so. Then it stalls (BeforeChannelCall) until the
// window has passed at the channel. A call made now would reach a channel
// that has forgotten the key and charge again. The decision is made where
// the call's deadline starts, so the stall runs the deadline out and no
// request leaves; the next retry, past the window, looks the key up.
func TestAStallBetweenDecidingToSendAndTheCallNeverChargesTwice(t *testing.T) {
	const (
		lease  = 2 * time.Second
		window = 24 * time.Hour
	)
	ch := openChannel(t, channel.Options{KeyWindow: window})
	s := useCases(t, payment.NewClient(ch.url, nil), lease)
	s.Money.ChannelKeyWindow = window
	ctx := context.Background()
	id := placeOrder(t, s)
	pay := acme(newKey("kw-stall"))

	chargedButLost(t, s, pay, id)
	age := window - s.Money.ChannelTimeout - time.Second
	ageIntent(t, s, pay.Key, age)
	ch.ageCharge(t, id, age)
	var stalled atomic.Bool
	s.Hooks.BeforeChannelCall = func() error {
		if stalled.CompareAndSwap(false, true) {
			time.Sleep(ch.untilForgotten(t, id, window) + 200*time.Millisecond)
		}
		return nil
	}
	before := ch.srv.Stats()

	res, err := s.Pay(ctx, pay, id, payWith(payment.MethodLostResponse))
	if !stalled.Load() {
		t.Fatal("the retry never reached the channel call")
	}
	if err != nil { // the stall ran the call's deadline out: the next retry finishes
		wantError(t, "the stalled retry", err, problem.ServiceUnavailable)
		res, err = s.Pay(ctx, pay, id, payWith(payment.MethodLostResponse))
	}
	after := ch.srv.Stats()
	if n := ch.succeeded(id); n != 1 {
		t.Errorf("the channel charged the order %d times, want once", n)
	}
	if posts, lookups := after.Requests-before.Requests, after.Lookups-before.Lookups; posts != 0 || lookups != 1 {
		t.Errorf("after the stall the channel saw %d POSTs and %d lookups, want none and one", posts, lookups)
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
