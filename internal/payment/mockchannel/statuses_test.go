package mockchannel_test

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
)

// Statuses beyond a charge's three outcomes, which the channel can play so
// that the order service is tested against them: a charge that requires
// the customer's action, and refunds that are pending or fail.
func TestStatusesBeyondTheThreeOutcomes(t *testing.T) {
	// Long enough that what is asserted while a charge or refund waits
	// (its replay, the stats) is asked before it settles on a loaded
	// machine; eventually waits up to 10s for the settling.
	const delay = 3 * time.Second
	refund := func(h *harness, key, chargeID string, amount int64) reply {
		h.t.Helper()
		return h.must(http.MethodPost, "/v1/refunds", key, payment.RefundRequest{ChargeID: chargeID, Amount: amount})
	}

	t.Run("pm_requires_action is taken on (202, requires_action), replayed so, then succeeds after the delay", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{AsyncDelay: delay})
		req := withMethod(ok(1500), payment.MethodRequiresAction)
		first := h.charge("k1", req)
		expectStatus(t, first, http.StatusAccepted, "")
		made := decode[payment.Charge](t, first)
		if made.Status != payment.StatusRequiresAction {
			t.Fatalf("first answer = %s, want a charge that requires action", first.body)
		}
		again := h.charge("k1", req)
		if again.status != http.StatusAccepted || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
			t.Errorf("replay while it requires action = %d %s, want %s replayed", again.status, again.body, first.body)
		}
		if s := h.srv.Stats(); s.Pending != 1 || s.Charges+s.Declined != 0 || s.AmountCharged != 0 {
			t.Errorf("stats while it requires action = %+v, want one charge taken on and no money moved", s)
		}
		var ch payment.Charge
		eventually(t, "k1 settling", func() bool {
			ch = decode[payment.Charge](t, h.lookup("charges", "k1"))
			return ch.Status != payment.StatusRequiresAction
		})
		if ch.Status != payment.StatusSucceeded || ch.ID != made.ID {
			t.Errorf("settled charge = %+v, want %s succeeded", ch, made.ID)
		}
		expectStatus(t, h.charge("k1", req), http.StatusCreated, "")
		if s := h.srv.Stats(); s.Pending != 0 || s.Charges != 1 || s.AmountCharged != 1500 {
			t.Errorf("stats after settling = %+v, want one succeeded charge", s)
		}
	})

	t.Run("a refund of a pm_refund_pending charge is pending, holds its amount, then succeeds after the delay", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{AsyncDelay: delay})
		ch := decode[payment.Charge](t, h.charge("k1", withMethod(ok(1000), payment.MethodRefundPending)))
		first := refund(h, "r1", ch.ID, 1000)
		expectStatus(t, first, http.StatusCreated, "")
		rf := decode[payment.Refund](t, first)
		if rf.Status != payment.StatusPending {
			t.Fatalf("first answer = %s, want a pending refund", first.body)
		}
		again := refund(h, "r1", ch.ID, 1000)
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
			t.Errorf("replay while pending = %s, want %s replayed", again.body, first.body)
		}
		expectStatus(t, refund(h, "r2", ch.ID, 1), http.StatusUnprocessableEntity, "refund_invalid")
		if s := h.srv.Stats(); s.Refunds != 0 || s.RefundsPending != 1 || s.AmountRefunded != 0 {
			t.Errorf("stats while pending = %+v, want one pending refund and nothing refunded", s)
		}
		var settled payment.Refund
		eventually(t, "r1 settling", func() bool {
			settled = decode[payment.Refund](t, h.lookup("refunds", "r1"))
			return settled.Status != payment.StatusPending
		})
		if settled.Status != payment.StatusSucceeded || settled.ID != rf.ID {
			t.Errorf("settled refund = %+v, want %s succeeded", settled, rf.ID)
		}
		if s := h.srv.Stats(); s.Refunds != 1 || s.RefundsPending != 0 || s.AmountRefunded != 1000 {
			t.Errorf("stats after settling = %+v, want one refund of 1000", s)
		}
	})

	t.Run("a refund of a pm_refund_failed charge fails at once, is replayed so, and returns nothing", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		ch := decode[payment.Charge](t, h.charge("k1", withMethod(ok(1000), payment.MethodRefundFailed)))
		first := refund(h, "r1", ch.ID, 1000)
		expectStatus(t, first, http.StatusCreated, "")
		if rf := decode[payment.Refund](t, first); rf.Status != payment.StatusFailed {
			t.Fatalf("answer = %s, want a failed refund", first.body)
		}
		again := refund(h, "r1", ch.ID, 1000)
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
			t.Errorf("replay = %s, want %s replayed", again.body, first.body)
		}
		// Nothing was held: another refund of the whole amount is made (and fails too).
		expectStatus(t, refund(h, "r2", ch.ID, 1000), http.StatusCreated, "")
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, RefundsFailed: 2, DuplicatesAbsorbed: 1, Requests: 4, AmountCharged: 1000})
		if recs := h.srv.Charges(); recs[0].AmountRefunded != 0 {
			t.Errorf("the charge's refunded amount = %d, want 0", recs[0].AmountRefunded)
		}
	})
}
