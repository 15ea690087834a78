package order_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
)

// Use-case tests drive order.Service directly, against the package's real
// PostgreSQL and a payment channel made of functions: no HTTP, no broker,
// no process, so a failure points at the use case.

// funcChannel is an order.Channel whose every method is a function field.
type funcChannel struct {
	charge       func(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error)
	lookupCharge func(ctx context.Context, key string) (payment.Charge, error)
	refund       func(ctx context.Context, key string, req payment.RefundRequest) (payment.Result[payment.Refund], error)
	lookupRefund func(ctx context.Context, key string) (payment.Refund, error)
}

func (f *funcChannel) Charge(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
	return f.charge(ctx, key, req)
}

func (f *funcChannel) LookupCharge(ctx context.Context, key string) (payment.Charge, error) {
	return f.lookupCharge(ctx, key)
}

func (f *funcChannel) Refund(ctx context.Context, key string, req payment.RefundRequest) (payment.Result[payment.Refund], error) {
	return f.refund(ctx, key, req)
}

func (f *funcChannel) LookupRefund(ctx context.Context, key string) (payment.Refund, error) {
	return f.lookupRefund(ctx, key)
}

// useCases is an order.Service on the package's database with ch as its
// channel and lease as its records' lease.
func useCases(t *testing.T, ch order.Channel, lease time.Duration) *order.Service {
	t.Helper()
	db, err := database.Open(context.Background(), dbURL, database.Options{MaxConns: 10, StatementTimeout: 5 * time.Second, LockTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(db) })
	policy := idempotency.Policy{Windows: []idempotency.Window{{Name: "client_retry", Duration: time.Hour}}, Margin: time.Hour,
		MoneyOperations: order.MoneyOperations, Operations: order.Operations}
	return &order.Service{DB: db, Channel: ch, Records: &idempotency.Store{Lease: lease, Policy: policy},
		Money: order.MoneyConfig{ChannelTimeout: lease / 2, RetryAfter: time.Second}}
}

// orphanPays creates n orders and pays each under a key whose owner dies
// right after phase 1: n PROCESSING intents with their pending payments,
// whose leases are then made to have run out.
func orphanPays(t *testing.T, s *order.Service, n int) (orders, keys []string) {
	t.Helper()
	ctx := context.Background()
	tenant := "acme"
	s.Hooks.AfterPhase1 = func() error { return errors.New("the owner died after phase 1") }
	defer func() { s.Hooks.AfterPhase1 = nil }()
	run := uuid.NewString()[:8]
	for i := range n {
		c := order.Caller{TenantID: tenant, Key: fmt.Sprintf("orphan-create-%s-%d", run, i)}
		res, err := s.Create(ctx, c, order.CreateRequest{CustomerID: "cus_orphan", Currency: "EUR",
			Items: []order.ItemRequest{{SKU: "S", Quantity: 1, UnitPrice: 900}}})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		id := res.Resource
		key := fmt.Sprintf("orphan-pay-%s-%d", run, i)
		if _, err := s.Pay(ctx, order.Caller{TenantID: tenant, Key: key}, id, order.PayRequest{PaymentMethod: payment.MethodOK}); err == nil {
			t.Fatal("the pay whose owner died answered")
		}
		orders, keys = append(orders, id), append(keys, key)
	}
	if err := s.DB.Exec("UPDATE idempotency_records SET lease_expires_at = now() - interval '1s' WHERE idempotency_key IN ?", keys).Error; err != nil {
		t.Fatal(err)
	}
	return orders, keys
}

// The sweeper claims a batch of intents whose owners died, and each claim
// starts its lease. With a slow channel, a sweeper that settled its batch
// one intent after another left the last ones waiting past their leases,
// and a second instance's sweeper took them over: both then asked the
// channel for the same intent, and one of them was fenced. The sweeper
// settles its batch side by side (as many as it has places at the channel
// for), so each intent of the batch reaches the channel once, within its
// lease, even with two sweepers running.
func TestTwoSweepersAskTheChannelOncePerIntentOfASlowBatch(t *testing.T) {
	const n, lease, slow = 5, 2 * time.Second, 600 * time.Millisecond
	var mu sync.Mutex
	charges, lookups := map[string]int{}, map[string]int{}
	ch := &funcChannel{
		lookupCharge: func(_ context.Context, key string) (payment.Charge, error) {
			mu.Lock()
			lookups[key]++
			mu.Unlock()
			return payment.Charge{}, payment.ErrNotFound
		},
		charge: func(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
			mu.Lock()
			charges[key]++
			mu.Unlock()
			select { // the acquirer is slow today
			case <-time.After(slow):
			case <-ctx.Done():
				return payment.Result[payment.Charge]{}, ctx.Err()
			}
			return payment.Result[payment.Charge]{Value: payment.Charge{ID: "ch_" + key, Status: payment.StatusSucceeded,
				Amount: req.Amount, Currency: req.Currency}}, nil
		},
	}
	s := useCases(t, ch, lease)
	orders, keys := orphanPays(t, s, n)

	// Two instances' sweepers, until every intent is finished.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && !allSucceeded(s.DB, keys) {
				if _, err := s.Sweep(ctx, 100); err != nil && ctx.Err() == nil {
					t.Errorf("sweep: %v", err)
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if !allSucceeded(s.DB, keys) {
		t.Fatal("the intents were not all finished")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, key := range keys {
		var channelKey string
		s.DB.Raw("SELECT channel_key FROM payments WHERE idempotency_key = ?", key).Scan(&channelKey)
		if charges[channelKey] != 1 || lookups[channelKey] != 1 {
			t.Errorf("intent %s: %d charges and %d lookups at the channel, want 1 and 1", key, charges[channelKey], lookups[channelKey])
		}
	}
	for _, id := range orders {
		var status string
		s.DB.Raw("SELECT status FROM orders WHERE id = ?", id).Scan(&status)
		if status != "PAID" {
			t.Errorf("order %s = %s, want PAID", id, status)
		}
	}
}

func allSucceeded(db *gorm.DB, keys []string) bool {
	var n int64
	db.Raw("SELECT count(*) FROM idempotency_records WHERE idempotency_key IN ? AND state = 'SUCCEEDED'", keys).Scan(&n)
	return n == int64(len(keys))
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
			if err := s.DB.Exec("UPDATE idempotency_records SET created_at = created_at - make_interval(secs => ?) WHERE idempotency_key = ?",
				tc.age.Seconds(), pay.Key).Error; err != nil {
				t.Fatal(err)
			}

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
