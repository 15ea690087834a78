package mockchannel_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/tests/testdb"
)

// channelDB is the package's channel database: every harness opens it
// afresh and resets it, and the restart tests use databases of their own.
var channelDB string

func TestMain(m *testing.M) {
	var drop func()
	channelDB, drop = testdb.NewURL("channel")
	code := m.Run()
	drop()
	os.Exit(code)
}

// harness is a channel served on a real listener.
type harness struct {
	t     *testing.T
	srv   *mockchannel.Server
	url   string
	dbURL string
	opts  mockchannel.Options
	stop  func()
}

// newHarness serves a channel with an empty ledger.
func newHarness(t *testing.T, opts mockchannel.Options) *harness {
	t.Helper()
	h := openHarness(t, channelDB, opts)
	h.srv.Reset()
	return h
}

// openHarness serves a channel on the ledger found in dbURL.
func openHarness(t *testing.T, dbURL string, opts mockchannel.Options) *harness {
	t.Helper()
	h := &harness{t: t, dbURL: dbURL, opts: opts}
	h.start()
	t.Cleanup(func() { h.stop() })
	return h
}

func (h *harness) start() {
	h.t.Helper()
	srv, err := mockchannel.Open(context.Background(), h.dbURL, h.opts)
	if err != nil {
		h.t.Fatalf("open channel: %v", err)
	}
	ts := httptest.NewServer(srv.Handler())
	h.srv, h.url = srv, ts.URL
	var once sync.Once
	h.stop = func() {
		once.Do(func() {
			ts.Close()
			if err := srv.Close(); err != nil {
				h.t.Errorf("close channel: %v", err)
			}
		})
	}
}

// restart stops the channel, as a process exit would, and starts a new one
// on the same database and a new listener: nothing survives but the ledger.
func (h *harness) restart() {
	h.t.Helper()
	h.stop()
	h.start()
}

// reply is one HTTP answer, read in full.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) problemCode() string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(r.body, &p)
	return p.Code
}

func (h *harness) do(ctx context.Context, method, path, key string, body any) (reply, error) {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			h.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.url+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	req.GetBody = nil // no transparent resend by net/http: a lost response must show
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// must is do for requests that must get an answer.
func (h *harness) must(method, path, key string, body any) reply {
	h.t.Helper()
	r, err := h.do(context.Background(), method, path, key, body)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func (h *harness) charge(key string, req payment.ChargeRequest) reply {
	h.t.Helper()
	return h.must(http.MethodPost, "/v1/charges", key, req)
}

func (h *harness) lookup(kind, key string) reply {
	h.t.Helper()
	return h.must(http.MethodGet, "/v1/"+kind+"?idempotency_key="+url.QueryEscape(key), "", nil)
}

func decode[T any](t *testing.T, r reply) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decoding %q: %v", r.body, err)
	}
	return v
}

func expectStatus(t *testing.T, r reply, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d (body %s)", r.status, status, r.body)
	}
	if code == "" {
		return
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json", ct)
	}
	if got := r.problemCode(); got != code {
		t.Errorf("problem code = %q, want %q", got, code)
	}
}

func expectStats(t *testing.T, srv *mockchannel.Server, want mockchannel.Stats) {
	t.Helper()
	if got := srv.Stats(); got != want {
		t.Errorf("stats:\n got %+v\nwant %+v", got, want)
	}
}

func ok(amount int64) payment.ChargeRequest {
	return payment.ChargeRequest{Amount: amount, Currency: "EUR", Reference: "order-1", PaymentMethod: payment.MethodOK}
}

func withMethod(req payment.ChargeRequest, method string) payment.ChargeRequest {
	req.PaymentMethod = method
	return req
}

func TestCharges(t *testing.T) {
	t.Run("creates a charge and replays it for the same key", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		first := h.charge("k1", ok(2500))
		expectStatus(t, first, http.StatusCreated, "")
		ch := decode[payment.Charge](t, first)
		if ch.Status != payment.StatusSucceeded || ch.Amount != 2500 || ch.IdempotencyKey != "k1" || !strings.HasPrefix(ch.ID, "ch_") {
			t.Errorf("charge = %+v", ch)
		}
		if first.header.Get("Idempotent-Replayed") != "" {
			t.Error("first response is marked replayed")
		}
		again := h.charge("k1", ok(2500))
		expectStatus(t, again, http.StatusCreated, "")
		if again.header.Get("Idempotent-Replayed") != "true" {
			t.Error("replay lacks Idempotent-Replayed: true")
		}
		if !bytes.Equal(first.body, again.body) {
			t.Errorf("replay body differs:\n%s\n%s", first.body, again.body)
		}
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, DuplicatesAbsorbed: 1, Requests: 2, AmountCharged: 2500})
	})

	t.Run("treats a lower-case currency as the same intent", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		expectStatus(t, h.charge("k1", ok(100)), http.StatusCreated, "")
		lower := ok(100)
		lower.Currency = "eur"
		expectStatus(t, h.charge("k1", lower), http.StatusCreated, "")
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, DuplicatesAbsorbed: 1, Requests: 2, AmountCharged: 100})
	})

	t.Run("rejects the same key with other parameters", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		h.charge("k1", ok(2500))
		expectStatus(t, h.charge("k1", ok(2600)), http.StatusUnprocessableEntity, "idempotency_key_reused")
		expectStatus(t, h.charge("k1", withMethod(ok(2500), payment.MethodDeclined)), http.StatusUnprocessableEntity, "idempotency_key_reused")
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, Requests: 3, AmountCharged: 2500})
	})

	t.Run("declines pm_declined with 402 and replays the 402", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		first := h.charge("k1", withMethod(ok(700), payment.MethodDeclined))
		expectStatus(t, first, http.StatusPaymentRequired, "")
		if ch := decode[payment.Charge](t, first); ch.Status != payment.StatusDeclined {
			t.Errorf("status = %q, want declined", ch.Status)
		}
		again := h.charge("k1", withMethod(ok(700), payment.MethodDeclined))
		expectStatus(t, again, http.StatusPaymentRequired, "")
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.body, again.body) {
			t.Error("declined charge was not replayed")
		}
		expectStats(t, h.srv, mockchannel.Stats{Declined: 1, DuplicatesAbsorbed: 1, Requests: 2})
	})

	t.Run("requires an Idempotency-Key", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		expectStatus(t, h.charge("", ok(100)), http.StatusBadRequest, "idempotency_key_missing")
		expectStatus(t, h.charge("has space", ok(100)), http.StatusBadRequest, "idempotency_key_invalid")
		expectStatus(t, h.charge(strings.Repeat("k", 256), ok(100)), http.StatusBadRequest, "idempotency_key_invalid")
		expectStats(t, h.srv, mockchannel.Stats{Requests: 3})
	})

	t.Run("rejects invalid bodies without charging", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		bodies := map[string]any{
			"zero amount":     ok(0),
			"negative amount": ok(-5),
			"long currency":   payment.ChargeRequest{Amount: 1, Currency: "EURO", PaymentMethod: payment.MethodOK},
			"digit currency":  payment.ChargeRequest{Amount: 1, Currency: "E1R", PaymentMethod: payment.MethodOK},
			"unknown method":  withMethod(ok(1), "pm_unknown"),
			"string amount":   map[string]any{"amount": "12", "currency": "EUR", "payment_method": "pm_ok"},
			"not an object":   []int{1, 2},
		}
		for name, body := range bodies {
			r := h.must(http.MethodPost, "/v1/charges", "k-"+strings.ReplaceAll(name, " ", "-"), body)
			if r.status != http.StatusBadRequest || r.problemCode() != "invalid_request" {
				t.Errorf("%s: got %d %s, want 400 invalid_request", name, r.status, r.body)
			}
		}
		expectStats(t, h.srv, mockchannel.Stats{Requests: int64(len(bodies))})
	})

	t.Run("answers 503 once for pm_unavailable_once before charging", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		req := withMethod(ok(900), payment.MethodUnavailableOnce)
		first := h.charge("k1", req)
		expectStatus(t, first, http.StatusServiceUnavailable, "service_unavailable")
		if first.header.Get("Retry-After") != "1" {
			t.Errorf("Retry-After = %q, want 1", first.header.Get("Retry-After"))
		}
		expectStatus(t, h.lookup("charges", "k1"), http.StatusNotFound, "charge_not_found")
		expectStatus(t, h.charge("k1", req), http.StatusCreated, "")
		expectStatus(t, h.charge("k2", req), http.StatusServiceUnavailable, "service_unavailable")
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, Requests: 3, Lookups: 1, UnavailableResponses: 2, AmountCharged: 900})
	})

	t.Run("charges pm_lost_response but loses the first response", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		req := withMethod(ok(1200), payment.MethodLostResponse)
		if r, err := h.do(context.Background(), http.MethodPost, "/v1/charges", "k1", req); err == nil {
			t.Fatalf("first response arrived: %d %s", r.status, r.body)
		}
		found := h.lookup("charges", "k1")
		expectStatus(t, found, http.StatusOK, "")
		again := h.charge("k1", req)
		expectStatus(t, again, http.StatusCreated, "")
		if again.header.Get("Idempotent-Replayed") != "true" {
			t.Error("retry after a lost response is not a replay")
		}
		if decode[payment.Charge](t, found).ID != decode[payment.Charge](t, again).ID {
			t.Error("lookup and replay name different charges")
		}
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, DuplicatesAbsorbed: 1, Requests: 2, Lookups: 1, LostResponses: 1, AmountCharged: 1200})
	})

	t.Run("answers pm_slow after the delay", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{SlowDelay: 150 * time.Millisecond})
		start := time.Now()
		expectStatus(t, h.charge("k1", withMethod(ok(100), payment.MethodSlow)), http.StatusCreated, "")
		if d := time.Since(start); d < 150*time.Millisecond {
			t.Errorf("answered after %v, want at least 150ms", d)
		}
	})

	t.Run("still makes a pm_slow charge when the caller leaves early", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{SlowDelay: time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		left := make(chan error, 1)
		go func() {
			_, err := h.do(ctx, http.MethodPost, "/v1/charges", "k1", withMethod(ok(100), payment.MethodSlow))
			left <- err
		}()
		// The caller leaves once its charge is in the ledger (a fixed
		// timeout could fire before the request reached the channel).
		eventually(t, "the charge in the ledger", func() bool { return h.srv.Stats().Charges == 1 })
		cancel()
		if err := <-left; err == nil {
			t.Fatal("expected the caller to give up")
		}
		// The lookup waits for the charge in flight, so it reports the settled outcome.
		found := h.lookup("charges", "k1")
		expectStatus(t, found, http.StatusOK, "")
		if ch := decode[payment.Charge](t, found); ch.Status != payment.StatusSucceeded {
			t.Errorf("status = %q, want succeeded", ch.Status)
		}
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, Requests: 1, Lookups: 1, AmountCharged: 100})
	})
}

func TestConcurrentDuplicates(t *testing.T) {
	for _, method := range []string{payment.MethodOK, payment.MethodSlow} {
		t.Run("makes exactly one "+method+" charge for 100 concurrent requests with one key", func(t *testing.T) {
			h := newHarness(t, mockchannel.Options{SlowDelay: 100 * time.Millisecond})
			const n = 100
			var wg sync.WaitGroup
			bodies := make([][]byte, n)
			for i := range n {
				wg.Go(func() {
					r := h.charge("same-key", withMethod(ok(4200), method))
					if r.status != http.StatusCreated {
						t.Errorf("status = %d %s", r.status, r.body)
					}
					bodies[i] = r.body
				})
			}
			wg.Wait()
			for i := range bodies {
				if !bytes.Equal(bodies[i], bodies[0]) {
					t.Fatalf("response %d differs: %s vs %s", i, bodies[i], bodies[0])
				}
			}
			expectStats(t, h.srv, mockchannel.Stats{Charges: 1, DuplicatesAbsorbed: n - 1, Requests: n, AmountCharged: 4200})
			if recs := h.srv.Charges(); len(recs) != 1 || recs[0].Requests != n {
				t.Errorf("charges = %+v, want one charge with %d requests", recs, n)
			}
		})
	}

	t.Run("keeps many keys apart under concurrency", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		const keys, perKey = 50, 4
		var wg sync.WaitGroup
		for k := range keys {
			for range perKey {
				wg.Go(func() {
					key := "key-" + string(rune('A'+k%26)) + string(rune('a'+k/26))
					if r := h.charge(key, ok(10)); r.status != http.StatusCreated {
						t.Errorf("status = %d", r.status)
					}
					h.lookup("charges", key)
					h.srv.Stats()
				})
			}
		}
		wg.Wait()
		expectStats(t, h.srv, mockchannel.Stats{Charges: keys, DuplicatesAbsorbed: keys * (perKey - 1), Requests: keys * perKey,
			Lookups: keys * perKey, AmountCharged: keys * 10})
	})
}

func TestRefunds(t *testing.T) {
	setup := func(t *testing.T, method string) (*harness, payment.Charge) {
		h := newHarness(t, mockchannel.Options{})
		r := h.charge("charge-key", withMethod(ok(1000), method))
		if method == payment.MethodUnavailableOnce {
			r = h.charge("charge-key", withMethod(ok(1000), method))
		}
		return h, decode[payment.Charge](t, r)
	}
	refund := func(h *harness, key string, chargeID string, amount int64) reply {
		h.t.Helper()
		return h.must(http.MethodPost, "/v1/refunds", key, payment.RefundRequest{ChargeID: chargeID, Amount: amount})
	}

	t.Run("refunds and replays for the same key", func(t *testing.T) {
		h, ch := setup(t, payment.MethodOK)
		first := refund(h, "r1", ch.ID, 400)
		expectStatus(t, first, http.StatusCreated, "")
		rf := decode[payment.Refund](t, first)
		if rf.ChargeID != ch.ID || rf.Amount != 400 || rf.Status != payment.StatusSucceeded || !strings.HasPrefix(rf.ID, "re_") {
			t.Errorf("refund = %+v", rf)
		}
		again := refund(h, "r1", ch.ID, 400)
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.body, again.body) {
			t.Errorf("not replayed: %d %s", again.status, again.body)
		}
		expectStatus(t, refund(h, "r1", ch.ID, 500), http.StatusUnprocessableEntity, "idempotency_key_reused")
		expectStatus(t, h.lookup("refunds", "r1"), http.StatusOK, "")
		expectStatus(t, h.lookup("refunds", "nope"), http.StatusNotFound, "refund_not_found")
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, Refunds: 1, DuplicatesAbsorbed: 1, Requests: 4, Lookups: 2,
			AmountCharged: 1000, AmountRefunded: 400})
		if recs := h.srv.Charges(); recs[0].AmountRefunded != 400 {
			t.Errorf("charge record refunded = %d, want 400", recs[0].AmountRefunded)
		}
	})

	t.Run("refuses refunds the charge cannot cover", func(t *testing.T) {
		h, ch := setup(t, payment.MethodOK)
		expectStatus(t, refund(h, "r1", "ch_unknown", 1), http.StatusNotFound, "charge_not_found")
		expectStatus(t, refund(h, "r2", ch.ID, 1001), http.StatusUnprocessableEntity, "refund_invalid")
		expectStatus(t, refund(h, "r3", ch.ID, 600), http.StatusCreated, "")
		expectStatus(t, refund(h, "r4", ch.ID, 401), http.StatusUnprocessableEntity, "refund_invalid")
		expectStatus(t, refund(h, "r5", ch.ID, 400), http.StatusCreated, "")
		expectStatus(t, refund(h, "r6", ch.ID, 0), http.StatusBadRequest, "invalid_request")
		expectStatus(t, refund(h, "", ch.ID, 1), http.StatusBadRequest, "idempotency_key_missing")
	})

	t.Run("refuses to refund a declined charge", func(t *testing.T) {
		h, ch := setup(t, payment.MethodDeclined)
		expectStatus(t, refund(h, "r1", ch.ID, 1), http.StatusUnprocessableEntity, "refund_invalid")
	})

	t.Run("never refunds more than the charge under concurrency", func(t *testing.T) {
		h, ch := setup(t, payment.MethodOK)
		var wg sync.WaitGroup
		var mu sync.Mutex
		statuses := map[int]int{}
		for i := range 20 {
			wg.Go(func() {
				r := refund(h, "r-"+string(rune('a'+i)), ch.ID, 100)
				mu.Lock()
				statuses[r.status]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if statuses[http.StatusCreated] != 10 || statuses[http.StatusUnprocessableEntity] != 10 {
			t.Errorf("statuses = %v, want 10 created and 10 refused", statuses)
		}
		if s := h.srv.Stats(); s.Refunds != 10 || s.AmountRefunded != 1000 {
			t.Errorf("stats = %+v", s)
		}
	})

	t.Run("loses the first refund response per refund key for pm_lost_response", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		if _, err := h.do(context.Background(), http.MethodPost, "/v1/charges", "charge-key", withMethod(ok(1000), payment.MethodLostResponse)); err == nil {
			t.Fatal("charge response arrived")
		}
		ch := decode[payment.Charge](t, h.lookup("charges", "charge-key"))
		body := payment.RefundRequest{ChargeID: ch.ID, Amount: 300}
		if _, err := h.do(context.Background(), http.MethodPost, "/v1/refunds", "r1", body); err == nil {
			t.Fatal("first refund response arrived")
		}
		again := refund(h, "r1", ch.ID, 300)
		expectStatus(t, again, http.StatusCreated, "")
		if again.header.Get("Idempotent-Replayed") != "true" {
			t.Error("refund retry is not a replay")
		}
		if s := h.srv.Stats(); s.Refunds != 1 || s.LostResponses != 2 || s.AmountRefunded != 300 {
			t.Errorf("stats = %+v", s)
		}
	})

	t.Run("answers 503 once per refund key for pm_unavailable_once", func(t *testing.T) {
		h, ch := setup(t, payment.MethodUnavailableOnce)
		expectStatus(t, refund(h, "r1", ch.ID, 300), http.StatusServiceUnavailable, "service_unavailable")
		expectStatus(t, h.lookup("refunds", "r1"), http.StatusNotFound, "refund_not_found")
		expectStatus(t, refund(h, "r1", ch.ID, 300), http.StatusCreated, "")
		if s := h.srv.Stats(); s.Refunds != 1 || s.UnavailableResponses != 2 {
			t.Errorf("stats = %+v", s)
		}
	})
}

func TestLookups(t *testing.T) {
	h := newHarness(t, mockchannel.Options{})
	t.Run("finds the charge made under a key", func(t *testing.T) {
		made := decode[payment.Charge](t, h.charge("k1", ok(100)))
		found := h.lookup("charges", "k1")
		expectStatus(t, found, http.StatusOK, "")
		if decode[payment.Charge](t, found) != made {
			t.Errorf("lookup = %s, want %+v", found.body, made)
		}
	})
	t.Run("answers 404 for a key never charged", func(t *testing.T) {
		expectStatus(t, h.lookup("charges", "unknown"), http.StatusNotFound, "charge_not_found")
	})
	t.Run("requires the idempotency_key parameter", func(t *testing.T) {
		expectStatus(t, h.must(http.MethodGet, "/v1/charges", "", nil), http.StatusBadRequest, "invalid_request")
	})
	expectStats(t, h.srv, mockchannel.Stats{Charges: 1, Requests: 1, Lookups: 3, AmountCharged: 100})
}

func TestFaults(t *testing.T) {
	setFaults := func(h *harness, f any) reply {
		h.t.Helper()
		return h.must(http.MethodPost, "/admin/faults", "", f)
	}

	t.Run("refuses settings out of range", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		for _, f := range []mockchannel.Faults{{LostResponseRate: 1.5}, {UnavailableRate: -0.1}, {LatencyMS: -1}, {LatencyJitterMS: 60_001}} {
			expectStatus(t, setFaults(h, f), http.StatusBadRequest, "invalid_request")
		}
		if h.srv.Faults() != (mockchannel.Faults{}) {
			t.Errorf("faults changed to %+v", h.srv.Faults())
		}
	})

	t.Run("reports the faults in force", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		want := mockchannel.Faults{LostResponseRate: 0.25, UnavailableRate: 0.5, LatencyMS: 3, LatencyJitterMS: 2}
		set := setFaults(h, want)
		expectStatus(t, set, http.StatusOK, "")
		if got := decode[mockchannel.Faults](t, set); got != want {
			t.Errorf("POST answered %+v", got)
		}
		if got := decode[mockchannel.Faults](t, h.must(http.MethodGet, "/admin/faults", "", nil)); got != want {
			t.Errorf("GET answered %+v", got)
		}
	})

	t.Run("answers 503 before doing anything at unavailable_rate 1", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		setFaults(h, mockchannel.Faults{UnavailableRate: 1})
		expectStatus(t, h.charge("k1", ok(100)), http.StatusServiceUnavailable, "service_unavailable")
		expectStatus(t, h.lookup("charges", "k1"), http.StatusServiceUnavailable, "service_unavailable")
		expectStats(t, h.srv, mockchannel.Stats{Requests: 1, Lookups: 1, UnavailableResponses: 2})
	})

	t.Run("charges and then drops the connection at lost_response_rate 1", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		setFaults(h, mockchannel.Faults{LostResponseRate: 1})
		if _, err := h.do(context.Background(), http.MethodPost, "/v1/charges", "k1", ok(100)); err == nil {
			t.Fatal("response arrived")
		}
		expectStatus(t, h.lookup("charges", "k1"), http.StatusOK, "") // lookups are never lost
		expectStats(t, h.srv, mockchannel.Stats{Charges: 1, Requests: 1, Lookups: 1, LostResponses: 1, AmountCharged: 100})
	})

	t.Run("adds latency to every request", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		setFaults(h, mockchannel.Faults{LatencyMS: 80})
		start := time.Now()
		h.lookup("charges", "k1")
		if d := time.Since(start); d < 80*time.Millisecond {
			t.Errorf("answered after %v, want at least 80ms", d)
		}
	})

	t.Run("applies rates with the given random source", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{Rand: rand.NewPCG(1, 2)})
		if err := h.srv.SetFaults(mockchannel.Faults{UnavailableRate: 0.5}); err != nil {
			t.Fatal(err)
		}
		const n = 200
		for i := range n {
			h.charge(fmt.Sprintf("k-%d", i), ok(1))
		}
		s := h.srv.Stats()
		if s.Charges+s.UnavailableResponses != n || s.UnavailableResponses < 60 || s.UnavailableResponses > 140 {
			t.Errorf("stats = %+v, want about half of %d unavailable", s, n)
		}
	})
}

func TestAdmin(t *testing.T) {
	t.Run("lists charges with the requests made per key", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		req := withMethod(ok(100), payment.MethodUnavailableOnce)
		h.charge("k1", req)
		h.charge("k1", req)
		h.charge("k1", req)
		list := decode[struct {
			Charges []mockchannel.ChargeRecord `json:"charges"`
		}](t, h.must(http.MethodGet, "/admin/charges", "", nil))
		if len(list.Charges) != 1 || list.Charges[0].Requests != 3 || list.Charges[0].IdempotencyKey != "k1" {
			t.Errorf("charges = %+v", list.Charges)
		}
	})

	t.Run("serves stats with every counter", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		h.charge("k1", ok(100))
		stats := decode[map[string]int64](t, h.must(http.MethodGet, "/admin/stats", "", nil))
		for _, field := range []string{"charges", "declined", "pending", "refunds", "duplicates_absorbed", "lookups", "requests",
			"lost_responses", "unavailable_responses", "amount_charged", "amount_refunded"} {
			if _, ok := stats[field]; !ok {
				t.Errorf("stats lack %q", field)
			}
		}
		if stats["charges"] != 1 || stats["amount_charged"] != 100 {
			t.Errorf("stats = %v", stats)
		}
	})

	t.Run("reset forgets charges, counters and faults", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		h.charge("k1", ok(100))
		_ = h.srv.SetFaults(mockchannel.Faults{LatencyMS: 1})
		expectStatus(t, h.must(http.MethodPost, "/admin/reset", "", nil), http.StatusNoContent, "")
		expectStats(t, h.srv, mockchannel.Stats{})
		if len(h.srv.Charges()) != 0 || h.srv.Faults() != (mockchannel.Faults{}) {
			t.Error("state survived reset")
		}
		expectStatus(t, h.lookup("charges", "k1"), http.StatusNotFound, "charge_not_found")
	})

	t.Run("answers health and unknown routes", func(t *testing.T) {
		h := newHarness(t, mockchannel.Options{})
		expectStatus(t, h.must(http.MethodGet, "/healthz", "", nil), http.StatusOK, "")
		expectStatus(t, h.must(http.MethodGet, "/nope", "", nil), http.StatusNotFound, "not_found")
		expectStatus(t, h.must(http.MethodDelete, "/v1/charges", "", nil), http.StatusMethodNotAllowed, "method_not_allowed")
	})
}
