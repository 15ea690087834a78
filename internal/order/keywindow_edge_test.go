package order_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/channel"
	"github.com/orderservice/orderservice/internal/testdb"
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
// (docs/api.md). The intent's record and the channel's charge are aged in
// their databases; the channel's charge by the call's duration more, as
// the channel's clock has moved on by then.
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
			chURL := testdb.Fresh(t, "keywindow")
			srv, err := channel.Open(context.Background(), chURL, channel.Options{KeyWindow: window})
			if err != nil {
				t.Fatalf("open channel: %v", err)
			}
			t.Cleanup(func() { _ = srv.Close() })
			hs := httptest.NewServer(srv.Handler())
			t.Cleanup(hs.Close)
			chDB, err := database.Open(context.Background(), chURL, database.Options{MaxConns: 1, StatementTimeout: 5 * time.Second, LockTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = database.Close(chDB) })

			s := useCases(t, payment.NewClient(hs.URL, nil), lease)
			if s.Money.ChannelTimeout != timeout {
				t.Fatalf("ChannelTimeout = %s, want %s", s.Money.ChannelTimeout, timeout)
			}
			s.Money.ChannelKeyWindow = window
			ctx := context.Background()
			id := placeOrder(t, s)
			pay := acme("kw-edge-" + uuid.NewString()[:8])

			// The channel charges; its answer is lost on the way back.
			if _, err := s.Pay(ctx, pay, id, payWith(payment.MethodLostResponse)); err == nil {
				t.Fatal("the pay whose answer was lost answered")
			}
			if n := count(t, s.DB, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'acme' AND idempotency_key = ? AND state = ?",
				pay.Key, idempotency.FailedRetryable); n != 1 {
				t.Fatal("after the lost answer the intent is not FAILED_RETRYABLE")
			}
			if err := s.DB.Exec("UPDATE idempotency_records SET created_at = created_at - make_interval(secs => ?) WHERE tenant_id = 'acme' AND idempotency_key = ?",
				tc.age.Seconds(), pay.Key).Error; err != nil {
				t.Fatal(err)
			}
			if res := chDB.Exec("UPDATE charges SET created_at = created_at - make_interval(secs => ?) WHERE reference = ?",
				(tc.age + call).Seconds(), id); res.Error != nil || res.RowsAffected != 1 {
				t.Fatalf("ageing the channel's charge: %d rows, %v", res.RowsAffected, res.Error)
			}
			before := srv.Stats()

			res, err := s.Pay(ctx, pay, id, payWith(payment.MethodLostResponse))
			var succeeded int
			for _, c := range srv.Charges() {
				if c.Reference == id && c.Status == payment.StatusSucceeded {
					succeeded++
				}
			}
			lookups := srv.Stats().Lookups - before.Lookups
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
