package mockchannel_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
)

// eventually polls cond until it holds, or fails the test after 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within 10s", what)
		}
	}
}

// settled waits until the charge under key is no longer pending.
func (h *harness) settled(key string) payment.Charge {
	h.t.Helper()
	var ch payment.Charge
	eventually(h.t, key+" settling", func() bool {
		ch = decode[payment.Charge](h.t, h.lookup("charges", key))
		return ch.Status != payment.StatusPending
	})
	return ch
}

func TestPaymentsThatFinishLater(t *testing.T) {
	for _, c := range []struct {
		method, settlesAs string
		replayStatus      int
	}{
		{payment.MethodAsyncOK, payment.StatusSucceeded, http.StatusCreated},
		{payment.MethodAsyncDeclined, payment.StatusDeclined, http.StatusPaymentRequired},
	} {
		t.Run(c.method+" is pending (202), replayed as pending, then "+c.settlesAs+" after the delay", func(t *testing.T) {
			const delay = 300 * time.Millisecond
			h := newHarness(t, mockchannel.Options{AsyncDelay: delay})
			req := withMethod(ok(1500), c.method)
			start := time.Now()
			first := h.charge("k1", req)
			expectStatus(t, first, http.StatusAccepted, "")
			made := decode[payment.Charge](t, first)
			if made.Status != payment.StatusPending || first.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("first answer = %s, replayed %q; want a fresh pending charge", first.body, first.header.Get("Idempotent-Replayed"))
			}
			again := h.charge("k1", req)
			expectStatus(t, again, http.StatusAccepted, "")
			if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
				t.Errorf("replay while pending = %s replayed %q, want %s replayed", again.body, again.header.Get("Idempotent-Replayed"), first.body)
			}
			if s := h.srv.Stats(); s.Pending != 1 || s.Charges+s.Declined != 0 {
				t.Errorf("stats while pending = %+v, want one pending charge and nothing else", s)
			}

			ch := h.settled("k1")
			if ch.Status != c.settlesAs || ch.ID != made.ID {
				t.Errorf("settled charge = %+v, want %s %s", ch, made.ID, c.settlesAs)
			}
			if d := time.Since(start); d < delay {
				t.Errorf("settled after %v, before the %v delay", d, delay)
			}
			after := h.charge("k1", req)
			expectStatus(t, after, c.replayStatus, "")
			if after.header.Get("Idempotent-Replayed") != "true" || decode[payment.Charge](t, after) != ch {
				t.Errorf("replay after settling = %s, want %+v replayed", after.body, ch)
			}
			if s := h.srv.Stats(); s.Pending != 0 || s.Charges+s.Declined != 1 || s.DuplicatesAbsorbed != 2 {
				t.Errorf("stats after settling = %+v, want one %s charge, two duplicates", s, c.settlesAs)
			}
		})
	}

	t.Run("a pending charge cannot be refunded until it has succeeded", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{AsyncDelay: 200 * time.Millisecond})
		ch := decode[payment.Charge](t, h.charge("k1", withMethod(ok(1000), payment.MethodAsyncOK)))
		refund := payment.RefundRequest{ChargeID: ch.ID, Amount: 400}
		expectStatus(t, h.must(http.MethodPost, "/v1/refunds", "r1", refund), http.StatusUnprocessableEntity, "refund_invalid")
		h.settled("k1")
		expectStatus(t, h.must(http.MethodPost, "/v1/refunds", "r2", refund), http.StatusCreated, "")
	})

	t.Run("a charge due while the channel is down settles when it is back", func(t *testing.T) {
		const delay = 300 * time.Millisecond
		h := freshHarness(t, mockchannel.Options{AsyncDelay: delay})
		expectStatus(t, h.charge("k1", withMethod(ok(100), payment.MethodAsyncOK)), http.StatusAccepted, "")
		// Stopped before the charge is due, and kept down past it: no timer
		// of the first process can settle it.
		h.stop()
		time.Sleep(2 * delay)
		h.start()
		if ch := h.settled("k1"); ch.Status != payment.StatusSucceeded {
			t.Errorf("status after the restart = %q, want succeeded", ch.Status)
		}
	})

	t.Run("two channels on one database settle each charge once", func(t *testing.T) {
		// Each process logs how many charges it settled: together, n.
		logA, logB := &lockedBuffer{}, &lockedBuffer{}
		opts := func(w io.Writer) mockchannel.Options {
			return mockchannel.Options{AsyncDelay: 200 * time.Millisecond,
				Logger: slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))}
		}
		a := freshHarness(t, opts(logA))
		b := openHarness(t, a.dbURL, opts(logB))
		const n = 32 // each channel takes both methods, evenly
		for i := range n {
			h := []*harness{a, b}[i%2]
			method := []string{payment.MethodAsyncOK, payment.MethodAsyncDeclined}[i/2%2]
			expectStatus(t, h.charge(fmt.Sprintf("k%d", i), withMethod(ok(10), method)), http.StatusAccepted, "")
		}
		eventually(t, "every charge settling", func() bool { return a.srv.Stats().Pending == 0 })
		if s := b.srv.Stats(); s.Charges != n/2 || s.Declined != n/2 {
			t.Errorf("stats = %+v, want %d succeeded and %d declined", s, n/2, n/2)
		}
		byA, byB := settledIn(t, logA), settledIn(t, logB)
		if byA+byB != n {
			t.Errorf("the channels settled %d + %d charges, want %d in all", byA, byB, n)
		}
		// Each settling writes its event in its transaction: one per charge.
		told := map[string]int{}
		for _, d := range a.srv.Webhooks() {
			told[d.IdempotencyKey]++
		}
		for i := range n {
			if k := fmt.Sprintf("k%d", i); told[k] != 1 {
				t.Errorf("%s was told %d times, want once", k, told[k])
			}
		}
	})
}

// lockedBuffer is a log both a channel's loops and the test use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// settledIn sums the settlings a channel logged.
func settledIn(t *testing.T, log *lockedBuffer) int {
	t.Helper()
	log.mu.Lock()
	defer log.mu.Unlock()
	total := 0
	for _, line := range bytes.Split(log.buf.Bytes(), []byte("\n")) {
		var entry struct {
			Msg   string `json:"msg"`
			Count int    `json:"count"`
		}
		if json.Unmarshal(line, &entry) == nil && entry.Msg == "pending charges settled" {
			total += entry.Count
		}
	}
	return total
}
