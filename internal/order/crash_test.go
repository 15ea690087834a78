package order_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// crashOnce returns a hook that crashes (by error or by panic) the first
// time it runs and does nothing afterwards, as a process that died once and
// was replaced would behave.
func crashOnce(panics bool) func() error {
	var calls atomic.Int32
	return func() error {
		if calls.Add(1) != 1 {
			return nil
		}
		if panics {
			panic("injected crash")
		}
		return errors.New("injected crash")
	}
}

// payThatCrashes runs a pay whose owner crashes (a hook errs or panics) and
// fails the test unless it crashed as the hook did: an error that is not
// final, or the panic itself.
func payThatCrashes(t *testing.T, s *order.Service, key, id string, panics bool) {
	t.Helper()
	var err error
	panicked := panicOf(func() { _, err = s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK)) })
	switch {
	case panics && panicked != "injected crash":
		t.Fatalf("the crashed pay panicked with %v (err %v), want the injected panic", panicked, err)
	case !panics && (panicked != nil || err == nil || problem.CodeOf(err) != problem.Internal):
		t.Fatalf("the crashed pay = %v (panic %v), want the injected error, an internal one", err, panicked)
	}
}

func TestCrashAtAPhaseBoundaryIsRecovered(t *testing.T) {
	boundaries := []struct {
		name    string
		set     func(h *order.Hooks, f func() error)
		charged bool // the channel charged before the crash
	}{
		{"after phase 1", func(h *order.Hooks, f func() error) { h.AfterPhase1 = f }, false},
		{"after the channel call", func(h *order.Hooks, f func() error) { h.AfterChannelCall = f }, true},
		{"before phase 3 commits", func(h *order.Hooks, f func() error) { h.BeforeReplyCommit = f }, true},
	}
	const lease = 3 * time.Second
	for _, recoverer := range []string{"the sweeper", "a client retry after the lease"} {
		for _, b := range boundaries {
			for _, panics := range []bool{false, true} {
				crash := "an error"
				if panics {
					crash = "a panic"
				}
				t.Run(fmt.Sprintf("%s %s is finished by %s with one charge", crash, b.name, recoverer), func(t *testing.T) {
					a := newAcquirer()
					s := useCases(t, a.channel(), lease)
					ctx := t.Context()
					id, key := placeOrder(t, s), newKey("R2-crash")
					b.set(&s.Hooks, crashOnce(panics))

					payThatCrashes(t, s, key, id, panics)
					if got := orderNow(t, s, id).Status; got != "PAYMENT_PENDING" {
						t.Errorf("order right after the crash = %s, want PAYMENT_PENDING", got)
					}
					if rec := recordOf(t, s, order.OpPay, key); rec.State != idempotency.Processing || rec.LeaseToken != 1 || rec.RecoveryPoint != paymentCreated {
						t.Errorf("record right after the crash = %s token %d at %q, want PROCESSING token 1 at %q", rec.State, rec.LeaseToken, rec.RecoveryPoint, paymentCreated)
					}
					charged := int64(0)
					if b.charged {
						charged = 1
					}
					wantCounted(t, a, ledger{charges: charged, declined: 0, refunds: 0, requests: charged, lookups: 0, duplicates: 0})

					var finisher idempotency.Result
					if recoverer == "the sweeper" {
						leaseRunsOut(t, s, order.OpPay, key)
						if n, err := s.Sweep(ctx, 100); err != nil || n != 1 {
							t.Fatalf("the sweep took %d intents (%v), want the crashed pay", n, err)
						}
						if rec, o := recordOf(t, s, order.OpPay, key), orderNow(t, s, id); rec.State != idempotency.Succeeded || o.Status != "PAID" {
							t.Fatalf("after the sweep: record %s, order %s; want SUCCEEDED and PAID", rec.State, o.Status)
						}
					} else {
						_, err := s.Pay(ctx, acme(key), id, payWith(payment.MethodOK))
						early := wantError(t, "a retry while the dead owner's lease runs", err, problem.RequestInProgress)
						if early.RetryAfter < time.Second || early.RetryAfter > lease {
							t.Errorf("retry after %s, want 1s..3s (what is left of a 3s lease)", early.RetryAfter)
						}
						leaseRunsOut(t, s, order.OpPay, key)
						finisher, err = s.Pay(ctx, acme(key), id, payWith(payment.MethodOK))
						wantOutcome(t, "retry after the lease", finisher, err, idempotency.OutcomeDone)
						if got := shownBy(t, finisher).Status; got != "PAID" {
							t.Fatalf("retry after the lease shows %s, want PAID", got)
						}
						wantExecuted(t, finisher)
					}

					// The successor asked the channel under the same key first; it
					// charged only if nothing had been charged before the crash.
					wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 1, duplicates: 0})
					if got, want := eventsOf(t, s, id), "create,pay,payment_succeeded"; got != want {
						t.Errorf("history = %s, want %s", got, want)
					}
					rec := recordOf(t, s, order.OpPay, key)
					if rec.State != idempotency.Succeeded || rec.LeaseToken != 2 || rec.Attempts != 2 || rec.RecoveryPoint != idempotency.Finished {
						t.Errorf("record = %s token %d attempts %d at %q, want SUCCEEDED token 2 attempts 2 finished", rec.State, rec.LeaseToken, rec.Attempts, rec.RecoveryPoint)
					}

					replay, err := s.Pay(ctx, acme(key), id, payWith(payment.MethodOK))
					if err != nil || !replay.Replayed {
						t.Fatalf("client retry after recovery = %+v, %v; want the stored result", replay, err)
					}
					if o := shownBy(t, replay); o.Status != "PAID" || o.Payment == nil || o.Payment.Status != "succeeded" {
						t.Errorf("stored result = %s", replay.Body)
					}
					if finisher.Body != nil && !bytes.Equal(replay.Body, finisher.Body) {
						t.Errorf("replay %s differs from the retry's result %s", replay.Body, finisher.Body)
					}
					again, err := s.Pay(ctx, acme(key), id, payWith(payment.MethodOK))
					if err != nil {
						t.Fatal(err)
					}
					wantReplay(t, replay, again)
					if got := a.counted().requests; got != 1 {
						t.Errorf("channel POSTs after the replays = %d, want 1", got)
					}
				})
			}
		}
	}
}

func TestSupersededOwnerCannotWrite(t *testing.T) {
	t.Run("a completion with the superseded token affects 0 rows and is ErrFenced", func(t *testing.T) {
		s := useCases(t, newAcquirer().channel(), 5*time.Second)
		store := s.Records
		fp, err := idempotency.Fingerprint(order.OpPay, "fence-order", map[string]string{"payment_method": "pm_ok"})
		if err != nil {
			t.Fatal(err)
		}
		in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "acme", Operation: order.OpPay, Key: newKey("fence")},
			Fingerprint: fp}
		t.Cleanup(func() {
			s.DB.Exec("DELETE FROM idempotency_records WHERE tenant_id = ? AND idempotency_key = ?", in.TenantID, in.Key)
		})
		row := func() string { return recordRow(t, s.DB, in.Scope) }
		late := func(resource string) idempotency.Result { return idempotency.Done(resource, []byte(`{"late":true}`)) }
		lateFailure := idempotency.Failed("", problem.Errorf(order.CodeNotFound, "late"))

		old, err := store.ClaimOrReplay(s.DB, in)
		if err != nil || old.Token() != 1 || old.Replay != nil || old.Resumes() {
			t.Fatalf("first claim = %+v, %v", old, err)
		}
		if _, err := store.ClaimOrReplay(s.DB, in); problem.CodeOf(err) != problem.RequestInProgress {
			t.Fatalf("claim while the lease runs = %v, want request_in_progress", err)
		}
		leaseRunsOut(t, s, in.Operation, in.Key)
		next, err := store.ClaimOrReplay(s.DB, in)
		if err != nil || next.Token() != 2 || !next.Resumes() || next.ResumedFrom != idempotency.Processing {
			t.Fatalf("takeover = %+v, %v; want token 2 resumed from PROCESSING", next, err)
		}

		before := row()
		if err := store.Complete(s.DB, in.Scope, old.Token(), late("late-resource")); !errors.Is(err, idempotency.ErrFenced) {
			t.Errorf("Complete with the old token = %v, want ErrFenced", err)
		}
		if err := store.Fail(s.DB, in.Scope, old.Token(), time.Second); !errors.Is(err, idempotency.ErrFenced) {
			t.Errorf("Fail with the old token = %v, want ErrFenced", err)
		}
		if after := row(); after != before {
			t.Errorf("the superseded owner changed the record:\nbefore %s\nafter  %s", before, after)
		}

		// Inside a transaction the fence undoes the business write as well.
		err = s.DB.Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("UPDATE idempotency_records SET attempts = attempts + 100 WHERE tenant_id = ? AND idempotency_key = ?",
				in.TenantID, in.Key).Error; err != nil {
				return err
			}
			return store.Complete(tx, in.Scope, old.Token(), late(""))
		})
		if !errors.Is(err, idempotency.ErrFenced) || row() != before {
			t.Errorf("fenced transaction = %v; record %s, want it rolled back to %s", err, row(), before)
		}

		if err := store.Complete(s.DB, in.Scope, next.Token(), late("r-1")); err != nil {
			t.Fatalf("Complete by the current owner: %v", err)
		}
		done := row()
		if err := store.Complete(s.DB, in.Scope, old.Token(), lateFailure); !errors.Is(err, idempotency.ErrFenced) || row() != done {
			t.Errorf("late Complete after the successor finished = %v, record changed: %v", err, row() != done)
		}
		if rec, _ := store.Get(s.DB, in.Scope); rec.State != idempotency.Succeeded || rec.LeaseToken != 2 {
			t.Errorf("record = %s token %d, want SUCCEEDED token 2", rec.State, rec.LeaseToken)
		}
	})

	// blockFirstStore makes the first owner stop right after the channel
	// answered, before it stores the reply, until release is called (at
	// the latest when the test ends); later owners pass through.
	blockFirstStore := func(t *testing.T, h *order.Hooks) (reached chan struct{}, release func()) {
		reached, released := make(chan struct{}), make(chan struct{})
		var calls atomic.Int32
		h.AfterChannelCall = func() error {
			if calls.Add(1) == 1 {
				close(reached)
				<-released
			}
			return nil
		}
		release = sync.OnceFunc(func() { close(released) })
		t.Cleanup(release)
		return reached, release
	}

	t.Run("the first owner's late reply is fenced after a retry took over and finished", func(t *testing.T) {
		a := newAcquirer()
		s := useCases(t, a.channel(), 5*time.Second)
		id, key := placeOrder(t, s), newKey("R2-fenced")
		reached, release := blockFirstStore(t, &s.Hooks)

		firstOwner := payInBackground(s, acme(key), id, payment.MethodOK)
		<-reached
		leaseRunsOut(t, s, order.OpPay, key)
		successor, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
		wantOutcome(t, "the retry that took over", successor, err, idempotency.OutcomeDone)
		if got := shownBy(t, successor).Status; got != "PAID" {
			t.Fatalf("the retry that took over shows %s, want PAID", got)
		}
		release()
		late := <-firstOwner

		wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 1, duplicates: 0})
		if got, want := eventsOf(t, s, id), "create,pay,payment_succeeded"; got != want {
			t.Errorf("history = %s, want %s (exactly one payment_succeeded)", got, want)
		}
		rec := recordOf(t, s, order.OpPay, key)
		if rec.State != idempotency.Succeeded || rec.LeaseToken != 2 {
			t.Errorf("record = %s token %d, want SUCCEEDED token 2 (the successor's)", rec.State, rec.LeaseToken)
		}
		again, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, successor, again)
		// Checked last: the superseded owner must be told to retry for the
		// successor's result, not given a business failure for a payment
		// that succeeded.
		wantError(t, "the superseded owner's answer", late.err, problem.RequestInProgress)
	})

	// tookOver is a pay whose first owner stopped right after the channel
	// answered, and whose intent a successor then took over (token 2)
	// without finishing it. release lets the first owner go on to phase 3;
	// firstOwner is its answer.
	type tookOver struct {
		a          *acquirer
		s          *order.Service
		id, key    string
		release    func()
		firstOwner <-chan answer
	}
	takenOverBeforeStore := func(t *testing.T, prefix string) tookOver {
		a := newAcquirer()
		s := useCases(t, a.channel(), 5*time.Second)
		id, key := placeOrder(t, s), newKey(prefix)
		reached, release := blockFirstStore(t, &s.Hooks)
		firstOwner := payInBackground(s, acme(key), id, payment.MethodOK)
		<-reached
		leaseRunsOut(t, s, order.OpPay, key)
		in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "acme", Operation: order.OpPay, Key: key},
			Fingerprint: recordOf(t, s, order.OpPay, key).Fingerprint}
		held, err := s.Records.ClaimOrReplay(s.DB, in)
		if err != nil || held.Token() != 2 {
			t.Fatalf("successor's takeover = %+v, %v", held, err)
		}
		playedClaim(t, id, held) // the test plays the successor, by the store
		return tookOver{a, s, id, key, release, firstOwner}
	}

	// The fence is the first thing phase 3 checks: a superseded owner is
	// stopped before it takes the order's lock, so it neither waits behind
	// its successor nor holds up anyone else.
	t.Run("the superseded owner is stopped before it waits for the order", func(t *testing.T) {
		pay := takenOverBeforeStore(t, "R2-before-lock")
		a, s, id, key := pay.a, pay.s, pay.id, pay.key
		// Someone else holds the order's row until the first owner answers.
		locker := s.DB.Begin()
		t.Cleanup(func() { locker.Rollback() })
		var locked, lockerPID int
		if err := locker.Raw("SELECT 1 FROM orders WHERE id = ? FOR UPDATE", id).Scan(&locked).Error; err != nil || locked != 1 {
			t.Fatalf("lock the order: %v (%d rows)", err, locked)
		}
		if err := locker.Raw("SELECT pg_backend_pid()").Scan(&lockerPID).Error; err != nil {
			t.Fatal(err)
		}
		pay.release()
		// Until it answers, nobody may wait for the order's lock
		// (lock_timeout would turn such a wait into the same 409, so the
		// answer alone does not show it).
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
	waiting:
		for {
			select {
			case late := <-pay.firstOwner:
				wantError(t, "the superseded owner's answer", late.err, problem.RequestInProgress)
				break waiting
			case <-tick.C:
				if n := count(t, s.DB, `SELECT count(*) FROM pg_stat_activity WHERE ? = ANY(pg_blocking_pids(pid))`, lockerPID); n > 0 {
					t.Fatal("the superseded owner waits for the order's lock: phase 3 did not stop it at the fence first")
				}
			}
		}
		// The successor dies; a retry finishes the intent, one charge.
		locker.Rollback()
		leaseRunsOut(t, s, order.OpPay, key)
		done, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
		wantOutcome(t, "retry after the successor's lease", done, err, idempotency.OutcomeDone)
		wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 1, duplicates: 0})
	})

	t.Run("the first owner's reply is fenced while a successor holds the intent", func(t *testing.T) {
		pay := takenOverBeforeStore(t, "R2-held")
		a, s, id, key := pay.a, pay.s, pay.id, pay.key
		pay.release()
		late := <-pay.firstOwner
		wantError(t, "the superseded owner's answer", late.err, problem.RequestInProgress)
		wantRetryAfter(t, "request_in_progress", late.err)
		if got := orderNow(t, s, id).Status; got != "PAYMENT_PENDING" {
			t.Errorf("order after the fenced reply = %s, want PAYMENT_PENDING (its write rolled back)", got)
		}
		if n := count(t, s.DB, "SELECT count(*) FROM payments WHERE order_id = ? AND status = 'pending'", id); n != 1 {
			t.Errorf("pending payments after the fenced reply = %d, want 1", n)
		}
		if rec := recordOf(t, s, order.OpPay, key); rec.State != idempotency.Processing || rec.LeaseToken != 2 {
			t.Errorf("record = %s token %d, want PROCESSING token 2", rec.State, rec.LeaseToken)
		}

		// The successor dies too; a client retry after its lease finishes
		// the intent from the channel's record, without a second charge.
		leaseRunsOut(t, s, order.OpPay, key)
		done, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
		wantOutcome(t, "retry after the successor's lease", done, err, idempotency.OutcomeDone)
		if got := shownBy(t, done).Status; got != "PAID" {
			t.Fatalf("retry after the successor's lease shows %s, want PAID", got)
		}
		wantCounted(t, a, ledger{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 1, duplicates: 0})
		if got, want := eventsOf(t, s, id), "create,pay,payment_succeeded"; got != want {
			t.Errorf("history = %s, want %s", got, want)
		}
	})
}

// The sweeper takes over an intent whose owner died after phase 1, but
// MaxChannelCalls (PAYMENT_CHANNEL_MAX_IN_FLIGHT) bounds the sweeper's
// calls too. While another pay holds the only slot, the sweeper claims
// nothing (a claim it could not start would let the lease run out while it
// waited), so the intent does not reach the channel, not even to ask it for
// the verdict; once the slot is free it is taken over and finished, with
// one charge.
func TestTheSweeperWaitsForASlotAtTheChannel(t *testing.T) {
	a := newAcquirer()
	s := withChannelBound(useCases(t, a.channel(), 3*time.Second), 1)
	holding, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	s.Hooks.AfterPhase1 = crashOnce(false)
	s.Hooks.AfterChannelCall = func() error { // the second pay's call holds its slot here
		if calls.Add(1) == 1 {
			close(holding)
			<-release
		}
		return nil
	}

	orphan, orphanKey := placeOrder(t, s), newKey("pay-orphan")
	payThatCrashes(t, s, orphanKey, orphan, false)

	holder := placeOrder(t, s)
	held := payInBackground(s, acme(newKey("pay-holder")), holder, payment.MethodOK)
	<-holding
	wantCounted(t, a, ledger{charges: 1, requests: 1})

	leaseRunsOut(t, s, order.OpPay, orphanKey)
	// A sweep now claims nothing: the only slot is held. One that ignored
	// the bound would take the orphan.
	if n, err := s.Sweep(t.Context(), 100); err != nil || n != 0 {
		t.Fatalf("a sweep while the slot is held took %d intents (%v), want 0", n, err)
	}
	wantCounted(t, a, ledger{charges: 1, requests: 1})
	if rec := recordOf(t, s, order.OpPay, orphanKey); rec.State != idempotency.Processing || rec.LeaseToken != 1 {
		t.Errorf("the orphan while the slot is held = %s token %d, want PROCESSING token 1", rec.State, rec.LeaseToken)
	}

	close(release)
	got := <-held
	wantOutcome(t, "the pay that held the slot", got.res, got.err, idempotency.OutcomeDone)
	if st := shownBy(t, got.res).Status; st != "PAID" {
		t.Fatalf("the pay that held the slot shows %s, want PAID", st)
	}
	if n, err := s.Sweep(t.Context(), 100); err != nil || n != 1 {
		t.Fatalf("a sweep once the slot is free took %d intents (%v), want the orphan", n, err)
	}
	if rec, o := recordOf(t, s, order.OpPay, orphanKey), orderNow(t, s, orphan); rec.State != idempotency.Succeeded || o.Status != "PAID" {
		t.Errorf("the orphan after the sweep: record %s, order %s; want SUCCEEDED and PAID", rec.State, o.Status)
	}
	// The sweeper asked the channel for the orphan's verdict (none), then charged it.
	wantCounted(t, a, ledger{charges: 2, requests: 2, lookups: 1})
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
// starts its lease. With a slow channel, a sweeper that finished its batch
// one intent after another left the last ones waiting past their leases,
// and a second instance's sweeper took them over: both then asked the
// channel for the same intent, and one of them was fenced. The sweeper
// finishes its batch side by side (as many as it has slots at the channel
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
