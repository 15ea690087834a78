package order_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/order/steps"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// asyncAcquirer is a channel that takes charges on as pending and settles
// them (reaches its verdict) when told: what an acquirer does with 3-D
// Secure or a bank transfer. A charge paid with pm_ok it makes at once. It
// counts the charges it made. It never forgets a key. When t records, it
// records its calls where it takes them and each settling, under its lock,
// so that a settle and the calls under the key are in the order it took
// them (model/README.md, "Trace validation").
type asyncAcquirer struct {
	mu      sync.Mutex
	charges map[string]payment.Charge // by key
	made    atomic.Int32
	log     *steps.Log // nil: nothing records
}

func newAsyncAcquirer(t *testing.T) *asyncAcquirer {
	return &asyncAcquirer{charges: map[string]payment.Charge{}, log: recorded(t)}
}

func (a *asyncAcquirer) channel() *funcChannel {
	return &funcChannel{
		charge: func(ctx context.Context, key string, req payment.ChargeRequest) (payment.Result[payment.Charge], error) {
			a.mu.Lock()
			defer a.mu.Unlock()
			if c, ok := a.charges[key]; ok {
				atTheChannel(ctx, steps.Channel{Call: "charge", Key: key, Status: c.Status, Replayed: true})
				return payment.Result[payment.Charge]{Value: c, Replayed: true}, nil
			}
			a.made.Add(1)
			c := payment.Charge{ID: "ch_" + key[:12], Status: payment.StatusPending, Amount: req.Amount, Currency: req.Currency, IdempotencyKey: key}
			if req.PaymentMethod == payment.MethodOK {
				c.Status = payment.StatusSucceeded
			}
			a.charges[key] = c
			atTheChannel(ctx, steps.Channel{Call: "charge", Key: key, Status: c.Status})
			return payment.Result[payment.Charge]{Value: c}, nil
		},
		lookupCharge: func(ctx context.Context, key string) (payment.Charge, error) {
			a.mu.Lock()
			defer a.mu.Unlock()
			if c, ok := a.charges[key]; ok {
				atTheChannel(ctx, steps.Channel{Call: "lookup_charge", Key: key, Status: c.Status})
				return c, nil
			}
			atTheChannel(ctx, steps.Channel{Call: "lookup_charge", Key: key})
			return payment.Charge{}, payment.ErrNotFound
		},
	}
}

// settle makes every pending charge end with status: each is a step of
// the channel's own, recorded as it takes it.
func (a *asyncAcquirer) settle(status string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, c := range a.charges {
		if c.Status != payment.StatusPending {
			continue
		}
		c.Status = status
		a.charges[k] = c
		settled(a.log, k, status)
	}
}

// settled records, when log is set, that a test's channel settled what it
// had taken on under key: a step of the channel's own (E_SETTLE).
func settled(log *steps.Log, key, status string) {
	if log != nil {
		log.Record(context.Background(), steps.Channel{Call: "settle", Key: key, Status: status})
	}
}

// pendingPay creates an order and pays it with a charge the acquirer takes
// on: it returns the order, the pay's caller and the charge's key.
func pendingPay(t *testing.T, s *order.Service) (orderID string, pay order.Caller, channelKey string) {
	t.Helper()
	ctx := context.Background()
	run := uuid.NewString()[:8]
	created, err := s.Create(ctx, order.Caller{TenantID: "acme", Key: "later-create-" + run}, order.CreateRequest{
		CustomerID: "cus_later", Currency: "EUR", Items: []order.ItemRequest{{SKU: "S", Quantity: 1, UnitPrice: 1200}}})
	if err != nil {
		t.Fatal(err)
	}
	pay = order.Caller{TenantID: "acme", Key: "later-pay-" + run}
	res, err := s.Pay(ctx, pay, created.Resource, order.PayRequest{PaymentMethod: payment.MethodAsyncOK})
	if err != nil || res.Outcome != idempotency.OutcomeAccepted {
		t.Fatalf("pay = %+v, %v; want it accepted (202)", res, err)
	}
	if got := orderStatus(t, s.DB, created.Resource); got != string(order.StatusPaymentPending) {
		t.Fatalf("after the accepted pay the order is %s, want PAYMENT_PENDING", got)
	}
	s.DB.Raw("SELECT channel_key FROM payments WHERE idempotency_key = ?", pay.Key).Scan(&channelKey)
	return created.Resource, pay, channelKey
}

func orderStatus(t *testing.T, db *gorm.DB, id string) string {
	t.Helper()
	var status string
	if err := db.Raw("SELECT status FROM orders WHERE id = ?", id).Scan(&status).Error; err != nil {
		t.Fatal(err)
	}
	return status
}

// transitionsTo counts the order's history entries and outbox events that
// moved it to status.
func transitionsTo(t *testing.T, db *gorm.DB, id, status string) (history, outbox int64) {
	t.Helper()
	db.Raw("SELECT count(*) FROM order_events WHERE order_id = ? AND to_status = ?", id, status).Scan(&history)
	db.Raw("SELECT count(*) FROM order_outbox WHERE order_id = ? AND convert_from(payload, 'UTF8')::jsonb ->> 'to_status' = ?", id, status).Scan(&outbox)
	return history, outbox
}

func TestAChargeTakenOnIsAcceptedAndItsRetryReplaysTheAcceptance(t *testing.T) {
	acq := newAsyncAcquirer(t)
	s := useCases(t, acq.channel(), 5*time.Second)
	id, pay, _ := pendingPay(t, s)
	again, err := s.Pay(context.Background(), pay, id, order.PayRequest{PaymentMethod: payment.MethodAsyncOK})
	if err != nil || again.Outcome != idempotency.OutcomeAccepted || !again.Replayed {
		t.Fatalf("the retry = %+v, %v; want the acceptance replayed", again, err)
	}
	if n := acq.made.Load(); n != 1 {
		t.Errorf("the acquirer made %d charges, want 1", n)
	}
	// A cancel while the verdict is unknown is forbidden: the money may move.
	cancel, err := s.Cancel(context.Background(), order.Caller{TenantID: "acme", Key: "later-cancel-" + pay.Key}, id, order.CancelRequest{})
	if err != nil || cancel.Failure == nil || cancel.Failure.Code != order.CodeInvalidTransition {
		t.Errorf("cancel of a pending payment = %+v, %v; want it forbidden with invalid_transition", cancel, err)
	}
}

// The same verdict arrives many times at once (a webhook delivered twice,
// the sweeper asking meanwhile, on two instances): the order moves once,
// with one history entry and one outbox event.
func TestALateOutcomeMovesTheOrderOnceHoweverOftenItArrives(t *testing.T) {
	for _, tc := range []struct{ settled, want string }{
		{payment.StatusSucceeded, string(order.StatusPaid)},
		{payment.StatusDeclined, string(order.StatusPaymentFailed)},
	} {
		t.Run(tc.settled, func(t *testing.T) {
			acq := newAsyncAcquirer(t)
			s := useCases(t, acq.channel(), 5*time.Second)
			id, _, key := pendingPay(t, s)

			// Before the verdict: every arrival is ignored, nothing moves.
			if receipt, err := s.ResolvePending(context.Background(), key); err != nil || receipt != order.ReceiptIgnored {
				t.Fatalf("while still pending: %s, %v; want ignored", receipt, err)
			}
			acq.settle(tc.settled)
			const n = 20
			var applied atomic.Int32
			var wg sync.WaitGroup
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					receipt, err := s.ResolvePending(context.Background(), key)
					if err != nil {
						t.Errorf("resolve: %v", err)
					}
					if receipt == order.ReceiptApplied {
						applied.Add(1)
					}
				}()
			}
			wg.Wait()
			if applied.Load() != 1 {
				t.Errorf("%d arrivals applied the verdict, want 1", applied.Load())
			}
			if got := orderStatus(t, s.DB, id); got != tc.want {
				t.Errorf("order = %s, want %s", got, tc.want)
			}
			if h, o := transitionsTo(t, s.DB, id, tc.want); h != 1 || o != 1 {
				t.Errorf("%d history entries and %d outbox events to %s, want 1 and 1", h, o, tc.want)
			}
		})
	}
}

// A delivery whose note in the inbox fails (here a webhook-id longer than
// the inbox's key allows) rolls the verdict back with it: the delivery and
// its effect commit together or not at all. The next delivery applies it,
// and its webhook-id, delivered again, is a duplicate.
func TestALateOutcomeAndItsNoteCommitTogether(t *testing.T) {
	acq := newAsyncAcquirer(t)
	s := useCases(t, acq.channel(), 5*time.Second)
	id, _, key := pendingPay(t, s)
	acq.settle(payment.StatusSucceeded)
	ctx := context.Background()
	_, err := s.ReceiveChannelEvent(ctx, strings.Repeat("w", 256), payment.EventChargeSucceeded, key)
	if err == nil {
		t.Fatal("a failed note was not reported")
	}
	if got := orderStatus(t, s.DB, id); got != string(order.StatusPaymentPending) {
		t.Errorf("after a failed note the order is %s, want PAYMENT_PENDING still", got)
	}
	webhookID := "wh_" + uuid.NewString()
	receipt, err := s.ReceiveChannelEvent(ctx, webhookID, payment.EventChargeSucceeded, key)
	if noted := inboxNote(t, s.DB, webhookID); err != nil || receipt != order.ReceiptApplied || noted != string(order.ReceiptApplied) {
		t.Errorf("the next delivery: %s (noted %q), %v; want applied", receipt, noted, err)
	}
	if again, err := s.ReceiveChannelEvent(ctx, webhookID, payment.EventChargeSucceeded, key); err != nil || again != order.ReceiptDuplicate {
		t.Errorf("the same delivery again: %s, %v; want duplicate", again, err)
	}
}

// inboxNote is what the inbox noted of the delivery webhookID ("" when it
// has no row).
func inboxNote(t *testing.T, db *gorm.DB, webhookID string) string {
	t.Helper()
	var noted string
	if err := db.Raw("SELECT outcome FROM webhook_inbox WHERE webhook_id = ?", webhookID).Scan(&noted).Error; err != nil {
		t.Fatal(err)
	}
	return noted
}

// No webhook ever comes: the sweeper asks the channel, a while after the
// pay, and stores the verdict; a verdict that arrives after that changes
// nothing.
func TestTheSweeperResolvesAPaymentNoWebhookTold(t *testing.T) {
	acq := newAsyncAcquirer(t)
	s := useCases(t, acq.channel(), 5*time.Second)
	s.Money.PendingCheckEvery = 50 * time.Millisecond
	id, _, key := pendingPay(t, s)
	ctx := context.Background()

	time.Sleep(100 * time.Millisecond)
	if n, err := s.SweepPending(ctx, 100); err != nil || n != 0 {
		t.Fatalf("sweep while the charge is pending: %d resolved, %v; want 0", n, err)
	}
	acq.settle(payment.StatusSucceeded)
	if n, err := s.SweepPending(ctx, 100); err != nil || n != 0 {
		t.Errorf("a sweep right after the last ask resolved %d (%v): the charge was asked about again too soon", n, err)
	}
	time.Sleep(100 * time.Millisecond)
	if n, err := s.SweepPending(ctx, 100); err != nil || n < 1 {
		t.Fatalf("sweep after the charge succeeded: %d resolved, %v; want ours", n, err)
	}
	if got := orderStatus(t, s.DB, id); got != string(order.StatusPaid) {
		t.Errorf("order = %s, want PAID", got)
	}
	if receipt, err := s.ResolvePending(ctx, key); err != nil || receipt != order.ReceiptIgnored {
		t.Errorf("the late webhook after the sweep: %s, %v; want ignored", receipt, err)
	}
	if h, o := transitionsTo(t, s.DB, id, string(order.StatusPaid)); h != 1 || o != 1 {
		t.Errorf("%d history entries and %d outbox events to PAID, want 1 and 1", h, o)
	}
}

// The channel's verdict arrives (by webhook) while the pay that started
// it has not stored the channel's reply yet: it is left to the pay, which
// stores it once; the two never race for the order.
func TestAnOutcomeThatArrivesWhileThePayRunsIsLeftToIt(t *testing.T) {
	acq := newAsyncAcquirer(t)
	s := useCases(t, acq.channel(), 5*time.Second) // pm_ok: a charge made at once …
	ctx := context.Background()
	var key string
	s.Hooks.AfterChannelCall = func() error { // … whose webhook is quicker than phase 3
		s.DB.Raw("SELECT channel_key FROM payments WHERE status = 'pending' ORDER BY created_at DESC LIMIT 1").Scan(&key)
		receipt, err := s.ResolvePending(ctx, key)
		if err == nil && receipt != order.ReceiptIgnored {
			err = fmt.Errorf("the early webhook was %s, want ignored", receipt)
		}
		return err
	}
	run := uuid.NewString()[:8]
	created, err := s.Create(ctx, order.Caller{TenantID: "acme", Key: "early-create-" + run}, order.CreateRequest{
		CustomerID: "cus_early", Currency: "EUR", Items: []order.ItemRequest{{SKU: "S", Quantity: 1, UnitPrice: 800}}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Pay(ctx, order.Caller{TenantID: "acme", Key: "early-pay-" + run}, created.Resource, order.PayRequest{PaymentMethod: payment.MethodOK})
	if err != nil || res.Outcome != idempotency.OutcomeDone {
		t.Fatalf("pay = %+v, %v; want done (200)", res, err)
	}
	if h, o := transitionsTo(t, s.DB, created.Resource, string(order.StatusPaid)); h != 1 || o != 1 {
		t.Errorf("%d history entries and %d outbox events to PAID, want 1 and 1", h, o)
	}
}

// The channel cannot be asked (down, or its answer lost): nothing is
// recorded, not even the note, and the verdict is resolved on a later try:
// the webhook is delivered again, or the sweeper asks again later.
func TestALateOutcomeTheChannelCannotConfirmChangesNothing(t *testing.T) {
	acq := newAsyncAcquirer(t)
	ch := acq.channel()
	s := useCases(t, ch, 5*time.Second)
	s.Money.PendingCheckEvery = time.Millisecond
	id, _, key := pendingPay(t, s)
	acq.settle(payment.StatusSucceeded)
	lookup := ch.lookupCharge
	ch.lookupCharge = func(context.Context, string) (payment.Charge, error) {
		return payment.Charge{}, fmt.Errorf("%w: the channel is down", payment.ErrUnavailable)
	}
	webhookID := "wh_" + uuid.NewString()
	_, err := s.ReceiveChannelEvent(context.Background(), webhookID, payment.EventChargeSucceeded, key)
	if noted := inboxNote(t, s.DB, webhookID); problem.CodeOf(err) != problem.ServiceUnavailable || noted != "" {
		t.Fatalf("a delivery with the channel down = %v (noted %q); want 503 service_unavailable and nothing noted", err, noted)
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := s.SweepPending(context.Background(), 100); err != nil {
		t.Fatalf("a sweep with the channel down failed: %v", err)
	}
	if got := orderStatus(t, s.DB, id); got != string(order.StatusPaymentPending) {
		t.Fatalf("with the channel down the order moved to %s", got)
	}
	ch.lookupCharge = lookup
	if receipt, err := s.ResolvePending(context.Background(), key); err != nil || receipt != order.ReceiptApplied {
		t.Errorf("once the channel is back: %s, %v; want applied", receipt, err)
	}
}
