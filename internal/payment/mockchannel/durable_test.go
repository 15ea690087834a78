package mockchannel_test

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/tests/testdb"
)

// freshHarness serves a channel on a database of its own, which Open
// creates: the restart tests must not share a ledger with anyone.
func freshHarness(t *testing.T, opts mockchannel.Options) *harness {
	t.Helper()
	return openHarness(t, testdb.Fresh(t, "channel_restart"), opts)
}

func TestRestart(t *testing.T) {
	t.Run("a charge made before a restart is found after it", func(t *testing.T) {
		h := freshHarness(t, mockchannel.Options{})
		made := h.charge("k1", ok(2500))
		expectStatus(t, made, http.StatusCreated, "")
		h.restart()
		found := h.lookup("charges", "k1")
		expectStatus(t, found, http.StatusOK, "")
		if decode[payment.Charge](t, found) != decode[payment.Charge](t, made) {
			t.Errorf("after the restart the lookup found %s, want %s", found.body, made.body)
		}
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, Requests: 1, Lookups: 1, AmountCharged: 2500})
	})

	t.Run("a retried charge after a restart is replayed, not charged again", func(t *testing.T) {
		h := freshHarness(t, mockchannel.Options{})
		first := h.charge("k1", ok(2500))
		h.restart()
		again := h.charge("k1", ok(2500))
		expectStatus(t, again, http.StatusCreated, "")
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.body, again.body) {
			t.Errorf("retry after the restart: replayed %q, body %s; want %s replayed",
				again.header.Get("Idempotent-Replayed"), again.body, first.body)
		}
		expectStatus(t, h.charge("k1", ok(2600)), http.StatusUnprocessableEntity, "idempotency_key_reused")
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, DuplicatesAbsorbed: 1, Requests: 3, AmountCharged: 2500})
		if recs := h.srv.Charges(); len(recs) != 1 || recs[0].Requests != 3 {
			t.Errorf("charges = %+v, want one charge with 3 requests", recs)
		}
	})

	t.Run("a refund made before a restart is replayed after it and still counts against the charge", func(t *testing.T) {
		h := freshHarness(t, mockchannel.Options{})
		ch := decode[payment.Charge](t, h.charge("k1", ok(1000)))
		first := h.must(http.MethodPost, "/v1/refunds", "r1", payment.RefundRequest{ChargeID: ch.ID, Amount: 700})
		expectStatus(t, first, http.StatusCreated, "")
		h.restart()
		again := h.must(http.MethodPost, "/v1/refunds", "r1", payment.RefundRequest{ChargeID: ch.ID, Amount: 700})
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.body, again.body) {
			t.Errorf("refund retry after the restart = %d %s, want the first refund replayed", again.status, again.body)
		}
		expectStatus(t, h.lookup("refunds", "r1"), http.StatusOK, "")
		expectStatus(t, h.must(http.MethodPost, "/v1/refunds", "r2", payment.RefundRequest{ChargeID: ch.ID, Amount: 301}),
			http.StatusUnprocessableEntity, "refund_invalid")
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, Refunds: 1, DuplicatesAbsorbed: 1, Requests: 4, Lookups: 1,
			AmountCharged: 1000, AmountRefunded: 700})
	})

	t.Run("a response lost before a restart is not lost again after it", func(t *testing.T) {
		h := freshHarness(t, mockchannel.Options{})
		req := withMethod(ok(1200), payment.MethodLostResponse)
		if r, err := h.do(context.Background(), http.MethodPost, "/v1/charges", "k1", req); err == nil {
			t.Fatalf("first response arrived: %d %s", r.status, r.body)
		}
		h.restart()
		again := h.charge("k1", req)
		expectStatus(t, again, http.StatusCreated, "")
		if again.header.Get("Idempotent-Replayed") != "true" {
			t.Error("retry after the restart is not a replay")
		}
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, DuplicatesAbsorbed: 1, Requests: 2, LostResponses: 1, AmountCharged: 1200})
	})

	t.Run("pm_unavailable_once answers 503 once per key across a restart", func(t *testing.T) {
		h := freshHarness(t, mockchannel.Options{})
		req := withMethod(ok(900), payment.MethodUnavailableOnce)
		expectStatus(t, h.charge("k1", req), http.StatusServiceUnavailable, "service_unavailable")
		h.restart()
		expectStatus(t, h.charge("k1", req), http.StatusCreated, "")
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, Requests: 2, UnavailableResponses: 1, AmountCharged: 900})
	})

	t.Run("reset survives a restart: nothing comes back", func(t *testing.T) {
		h := freshHarness(t, mockchannel.Options{})
		h.charge("k1", ok(100))
		expectStatus(t, h.must(http.MethodPost, "/admin/reset", "", nil), http.StatusNoContent, "")
		h.restart()
		expectStatus(t, h.lookup("charges", "k1"), http.StatusNotFound, "charge_not_found")
		expectStats(t, h.srv, mockchannel.Stats{Lookups: 1})
	})
}

func TestRefundRefused(t *testing.T) {
	t.Run("pm_refund_refused refuses every refund", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		made := h.charge("k1", withMethod(ok(1000), payment.MethodRefundRefused))
		expectStatus(t, made, http.StatusCreated, "")
		ch := decode[payment.Charge](t, made)
		if ch.Status != payment.StatusSucceeded {
			t.Fatalf("charge status = %q, want succeeded", ch.Status)
		}
		for _, r := range []struct {
			key    string
			amount int64
		}{{"r1", 1000}, {"r1", 1000}, {"r2", 1}, {"r3", 500}} {
			refused := h.must(http.MethodPost, "/v1/refunds", r.key, payment.RefundRequest{ChargeID: ch.ID, Amount: r.amount})
			expectStatus(t, refused, http.StatusUnprocessableEntity, "refund_refused")
			if refused.header.Get("Idempotent-Replayed") != "" {
				t.Errorf("refusal of %s is marked replayed", r.key)
			}
		}
		expectStatus(t, h.lookup("refunds", "r1"), http.StatusNotFound, "refund_not_found")
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, Requests: 5, Lookups: 1, AmountCharged: 1000})
		if recs := h.srv.Charges(); len(recs) != 1 || recs[0].AmountRefunded != 0 {
			t.Errorf("charges = %+v, want one charge with nothing refunded", recs)
		}
	})
}

func TestOneChannelOnManyProcesses(t *testing.T) {
	t.Run("one key from 50 goroutines makes one charge", func(t *testing.T) {
		// Two channels on one database, as two processes would be: only the
		// database's unique key can make them agree.
		a := freshHarness(t, mockchannel.Options{})
		b := openHarness(t, a.dbURL, mockchannel.Options{})
		const n = 50
		var wg sync.WaitGroup
		replies := make([]reply, n)
		for i := range n {
			h := []*harness{a, b}[i%2]
			wg.Go(func() {
				r, err := h.do(context.Background(), http.MethodPost, "/v1/charges", "same-key", ok(4200))
				if err != nil {
					t.Errorf("request %d: %v", i, err)
				}
				replies[i] = r
			})
		}
		wg.Wait()
		fresh := 0
		for i, r := range replies {
			if r.status != http.StatusCreated || !bytes.Equal(r.body, replies[0].body) {
				t.Fatalf("reply %d = %d %s, want 201 %s", i, r.status, r.body, replies[0].body)
			}
			if r.header.Get("Idempotent-Replayed") != "true" {
				fresh++
			}
		}
		if fresh != 1 {
			t.Errorf("%d replies were not replays, want exactly 1", fresh)
		}
		expectStats(t, a.srv, mockchannel.Stats{Charges: 1, DuplicatesAbsorbed: n - 1, Requests: n, AmountCharged: 4200})
		if recs := b.srv.Charges(); len(recs) != 1 || recs[0].Requests != n {
			t.Errorf("charges = %+v, want one charge with %d requests", recs, n)
		}
	})

	t.Run("refunds from two processes never exceed the charge", func(t *testing.T) {
		a := freshHarness(t, mockchannel.Options{})
		b := openHarness(t, a.dbURL, mockchannel.Options{})
		ch := decode[payment.Charge](t, a.charge("k1", ok(1000)))
		var wg sync.WaitGroup
		var mu sync.Mutex
		statuses := map[int]int{}
		for i := range 30 {
			h := []*harness{a, b}[i%2]
			wg.Go(func() {
				r, err := h.do(context.Background(), http.MethodPost, "/v1/refunds", "r-"+string(rune('A'+i)),
					payment.RefundRequest{ChargeID: ch.ID, Amount: 100})
				if err != nil {
					t.Errorf("refund %d: %v", i, err)
				}
				mu.Lock()
				statuses[r.status]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if statuses[http.StatusCreated] != 10 || statuses[http.StatusUnprocessableEntity] != 20 {
			t.Errorf("statuses = %v, want 10 created and 20 refused", statuses)
		}
		if s := b.srv.Stats(); s.Refunds != 10 || s.AmountRefunded != 1000 {
			t.Errorf("stats = %+v", s)
		}
	})
}
