package mockchannel_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
)

// age makes what the channel made under key (in table charges or refunds)
// older by d, as if d had passed since. Its created_at, part of its body,
// changes with it: the tests compare ids after it.
func (h *harness) age(table, key string, d time.Duration) {
	h.t.Helper()
	db, err := database.Open(context.Background(), h.dbURL, database.Options{MaxConns: 1, StatementTimeout: 5 * time.Second,
		LockTimeout: 5 * time.Second, ApplicationName: "keywindow_test"})
	if err != nil {
		h.t.Fatal(err)
	}
	defer database.Close(db)
	res := db.Exec("UPDATE "+table+" SET created_at = created_at - make_interval(secs => ?) WHERE idempotency_key = ?", d.Seconds(), key)
	if res.Error != nil || res.RowsAffected != 1 {
		h.t.Fatalf("ageing %s %q: %d rows, %v", table, key, res.RowsAffected, res.Error)
	}
}

// The channel contract the order service's key-window fix relies on
// (docs/api.md): like a real acquirer, the channel deduplicates a key for a
// window only (a day by default); a lookup by the key outlives it.
func TestAKeyIsForgottenForDeduplicationAfterItsWindowButALookupStillFindsTheCharge(t *testing.T) {
	t.Run("a day by default: within it the key is deduplicated, past it a POST charges again", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		first := h.charge("kw", ok(2500))
		expectStatus(t, first, http.StatusCreated, "")
		old := decode[payment.Charge](t, first)

		h.age("charges", "kw", 24*time.Hour-time.Minute)
		again := h.charge("kw", ok(2500))
		if again.header.Get("Idempotent-Replayed") != "true" || decode[payment.Charge](t, again).ID != old.ID {
			t.Fatalf("a minute short of the window the key was not deduplicated: %d %s", again.status, again.body)
		}

		h.age("charges", "kw", 2*time.Minute) // now a minute past it
		found := h.lookup("charges", "kw")
		expectStatus(t, found, http.StatusOK, "")
		if decode[payment.Charge](t, found).ID != old.ID {
			t.Errorf("past the window the lookup found %s, want the charge made under the key, %s", found.body, old.ID)
		}

		fresh := h.charge("kw", ok(2500))
		expectStatus(t, fresh, http.StatusCreated, "")
		made := decode[payment.Charge](t, fresh)
		if fresh.header.Get("Idempotent-Replayed") != "" || made.ID == old.ID || made.IdempotencyKey != "kw" {
			t.Fatalf("past the window a POST got %s (replayed %q); want a new charge under the key",
				fresh.body, fresh.header.Get("Idempotent-Replayed"))
		}
		expectStats(t, h.srv, mockchannel.Stats{Charges: 2, DuplicatesAbsorbed: 1, Requests: 3, Lookups: 1, AmountCharged: 5000})

		// The key names its new charge now, and deduplicates it for a window
		// of its own; the old charge keeps its id and its money.
		if got := decode[payment.Charge](t, h.lookup("charges", "kw")); got.ID != made.ID {
			t.Errorf("after the new charge the lookup found %s, want %s", got.ID, made.ID)
		}
		if again := h.charge("kw", ok(2500)); again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, fresh.body) {
			t.Errorf("the new charge was not deduplicated: %d %s", again.status, again.body)
		}
		var kept bool
		for _, rec := range h.srv.Charges() {
			if rec.ID == old.ID {
				kept = rec.Amount == 2500 && rec.Status == payment.StatusSucceeded && strings.HasPrefix(rec.IdempotencyKey, "kw forgotten ")
			}
		}
		if !kept {
			t.Errorf("the old charge %s is not kept under its forgotten key: %+v", old.ID, h.srv.Charges())
		}
	})

	t.Run("two POSTs past the window at once make one new charge", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		expectStatus(t, h.charge("kw-race", ok(2500)), http.StatusCreated, "")
		h.age("charges", "kw-race", 25*time.Hour)
		const racers = 8
		ids := make(chan string, racers)
		var wg sync.WaitGroup
		for range racers {
			wg.Go(func() {
				r, err := h.do(context.Background(), http.MethodPost, "/v1/charges", "kw-race", ok(2500))
				if err != nil || r.status != http.StatusCreated {
					t.Errorf("a racing POST: %v %d %s", err, r.status, r.body)
					return
				}
				ids <- decode[payment.Charge](t, r).ID
			})
		}
		wg.Wait()
		close(ids)
		distinct := map[string]bool{}
		for id := range ids {
			distinct[id] = true
		}
		if len(distinct) != 1 {
			t.Errorf("%d racing POSTs past the window were answered with %d charges, want one new charge for all", racers, len(distinct))
		}
		if st := h.srv.Stats(); st.Charges != 2 {
			t.Errorf("the channel made %d charges, want 2 (the old one and one new)", st.Charges)
		}
	})

	t.Run("Options.KeyWindow sets the window", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{KeyWindow: time.Hour})
		first := h.charge("kw", withMethod(ok(700), payment.MethodDeclined))
		expectStatus(t, first, http.StatusPaymentRequired, "")
		h.age("charges", "kw", time.Hour+time.Minute)
		if found := h.lookup("charges", "kw"); found.status != http.StatusOK || decode[payment.Charge](t, found).ID != decode[payment.Charge](t, first).ID {
			t.Errorf("past the window the lookup found %d %s, want the declined charge", found.status, found.body)
		}
		expectStatus(t, h.charge("kw", withMethod(ok(700), payment.MethodDeclined)), http.StatusPaymentRequired, "")
		expectStats(t, h.srv, mockchannel.Stats{Declined: 2, Requests: 2, Lookups: 1})
	})

	t.Run("a refund's key likewise", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		ch := decode[payment.Charge](t, h.charge("c1", ok(1000)))
		first := h.must(http.MethodPost, "/v1/refunds", "r1", payment.RefundRequest{ChargeID: ch.ID, Amount: 300})
		expectStatus(t, first, http.StatusCreated, "")
		h.age("refunds", "r1", 25*time.Hour)
		if found := h.lookup("refunds", "r1"); found.status != http.StatusOK || decode[payment.Refund](t, found).ID != decode[payment.Refund](t, first).ID {
			t.Errorf("past the window the refund lookup found %d %s, want %s", found.status, found.body, first.body)
		}
		again := h.must(http.MethodPost, "/v1/refunds", "r1", payment.RefundRequest{ChargeID: ch.ID, Amount: 300})
		expectStatus(t, again, http.StatusCreated, "")
		if again.header.Get("Idempotent-Replayed") != "" || decode[payment.Refund](t, again).ID == decode[payment.Refund](t, first).ID {
			t.Errorf("past the window the refund POST got %s, want a new refund", again.body)
		}
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, Refunds: 2, Requests: 3, Lookups: 1, AmountCharged: 1000, AmountRefunded: 600})
	})

	t.Run("a charge still pending is not forgotten", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{AsyncDelay: time.Hour})
		req := withMethod(ok(1500), payment.MethodAsyncOK)
		first := h.charge("kw", req)
		expectStatus(t, first, http.StatusAccepted, "")
		h.age("charges", "kw", 25*time.Hour)
		again := h.charge("kw", req)
		if again.header.Get("Idempotent-Replayed") != "true" || decode[payment.Charge](t, again).ID != decode[payment.Charge](t, first).ID {
			t.Errorf("a pending charge past the window: %d %s, want it replayed", again.status, again.body)
		}
		expectStats(t, h.srv, mockchannel.Stats{Pending: 1, DuplicatesAbsorbed: 1, Requests: 2})
	})
}
